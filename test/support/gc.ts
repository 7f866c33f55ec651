// A full garbage collection from a test, without --expose-gc on node's command line (mocha runs
// the files in workers it starts itself): for tests that check what memory is let go of.
import v8 from 'node:v8';
import vm from 'node:vm';

v8.setFlagsFromString('--expose-gc');

/** Runs a full, synchronous GC. */
export const gc = vm.runInNewContext('gc') as () => void;
