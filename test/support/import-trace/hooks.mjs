// Module hooks (run on the loader's thread): append each loaded URL to the trace file.
import { appendFileSync } from 'node:fs';

let file;
export function initialize(data) {
  file = data && data.file;
}
export async function load(url, context, next) {
  if (file) appendFileSync(file, url + '\n');
  return next(url, context);
}
