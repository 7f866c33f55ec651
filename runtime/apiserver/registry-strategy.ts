// Per-kind write strategies of the built-in core kinds: what kube-apiserver's type-specific
// REST strategies and v1 conversion do to an object before admission, which a structural
// schema cannot declare. Only core/v1 Secret has one today:
//   - `stringData` is write-only: each entry is merged into `data` as base64 of its UTF-8
//     bytes (a stringData key wins over the same data key) and `stringData` is dropped, so it
//     is never stored nor returned (kube does this in the v1 -> internal conversion);
//   - an empty or absent `type` becomes `Opaque` (SetDefaults_Secret; the schema default
//     covers only an absent field, not the `type: ""` that kubectl's protobuf body carries).
// A `stringData` that is not a map of strings is left alone so admission reports it (422).
import type { KindDefinition } from '../../apis/types.js';
import type { KubeObject } from '../meta/types.js';
import { isPlainObject } from './patch.js';

/**
 * Applies the kind's write strategy to `obj` in place (create, update, every patch type and
 * apply, dry-run included), before admission. Idempotent; a no-op for kinds without one.
 */
export function prepareForWrite(def: KindDefinition, obj: KubeObject): void {
  if (def.group === '' && def.kind === 'Secret') prepareSecret(obj as KubeObject & Record<string, unknown>);
}

function prepareSecret(obj: Record<string, unknown>): void {
  const sd = obj.stringData;
  if (sd === null) delete obj.stringData;
  else if (isPlainObject(sd) && Object.values(sd).every((v) => typeof v === 'string')) {
    const data: Record<string, unknown> = isPlainObject(obj.data) ? { ...obj.data } : {};
    for (const [k, v] of Object.entries(sd)) data[k] = Buffer.from(v as string, 'utf8').toString('base64');
    if (Object.keys(data).length || obj.data !== undefined) obj.data = data;
    delete obj.stringData;
  }
  if (obj.type === undefined || obj.type === null || obj.type === '') obj.type = 'Opaque';
}
