// The object type of tests that read any field of what the API returned and assert on it
// (`KubeObject` itself has `unknown` spec and status). Production code uses the kind's own
// type (apis/zz_generated.types.ts); tests are outside the no-explicit-any lint.
import type { KubeObject } from '../../runtime/meta/types.js';

export type AnyObject = KubeObject<any, any> & { [field: string]: any };

/** `o` as an AnyObject (a test reading fields of what the registry, store or client returned). */
export function loose(o: KubeObject): AnyObject {
  return o;
}
