// Reading manifests for -f: files, directories (their .yaml/.yml/.json files, sorted), and
// `-` for stdin; multi-document YAML; `kind: List` objects are flattened.
import fs from 'node:fs';
import path from 'node:path';
import yaml from 'js-yaml';
import type { KubeObject } from '../../runtime/meta/types.js';
import { CliError, type Io } from './util.js';

export interface Manifest {
  object: KubeObject;
  /** Where it came from, for messages: a file path or 'STDIN'. */
  source: string;
}

export async function readManifests(files: string[], io: Io, recursive = false): Promise<Manifest[]> {
  const out: Manifest[] = [];
  for (const f of files) {
    if (f === '-') {
      out.push(...parse(await io.stdin(), 'STDIN'));
      continue;
    }
    let st: fs.Stats;
    try {
      st = fs.statSync(f);
    } catch {
      throw new CliError(`error: the path "${f}" does not exist`);
    }
    if (st.isDirectory()) {
      for (const p of listDir(f, recursive)) out.push(...parse(fs.readFileSync(p, 'utf8'), p));
    } else {
      out.push(...parse(fs.readFileSync(f, 'utf8'), f));
    }
  }
  return out;
}

function listDir(dir: string, recursive: boolean): string[] {
  const out: string[] = [];
  for (const e of fs.readdirSync(dir, { withFileTypes: true }).sort((a, b) => (a.name < b.name ? -1 : 1))) {
    const p = path.join(dir, e.name);
    if (e.isDirectory()) {
      if (recursive) out.push(...listDir(p, recursive));
    } else if (/\.(ya?ml|json)$/.test(e.name)) out.push(p);
  }
  return out;
}

export function parse(text: string, source: string): Manifest[] {
  let docs: unknown[];
  try {
    docs = yaml.loadAll(text);
  } catch (e) {
    throw new CliError(`error: error parsing ${source}: ${(e as Error).message.split('\n')[0]}`);
  }
  const out: Manifest[] = [];
  for (const d of docs) {
    if (d === null || d === undefined) continue;
    if (typeof d !== 'object' || Array.isArray(d)) throw new CliError(`error: error parsing ${source}: not an object`);
    const o = d as KubeObject;
    const items = (o as KubeObject & { items?: unknown }).items;
    if (typeof o.kind === 'string' && o.kind.endsWith('List') && Array.isArray(items)) {
      for (const it of items) out.push({ object: it, source });
      continue;
    }
    if (!o.apiVersion || !o.kind) {
      throw new CliError(`error: error validating data: [apiVersion not set, kind not set] in ${source}`);
    }
    out.push({ object: o, source });
  }
  return out;
}
