// `node --import <this file>`: every module URL the process loads is written to the file named by
// IMPORT_TRACE_FILE, one per line (test/cmd/fluxctl/startup-imports.test.ts: what a command pulls in).
import { register } from 'node:module';

register('./hooks.mjs', import.meta.url, { data: { file: process.env.IMPORT_TRACE_FILE } });
