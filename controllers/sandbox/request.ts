// What every sandbox subresource handler shares (controllers/sandbox/subresources.ts wires
// them): resolving the Sandbox of a request in its namespace, decoding bodies and query
// parameters, the exec result's JSON, and the Status every error leaves as. The handlers
// (exec.ts, files.ts, changes.ts) import this module, never subresources.ts, so the wiring
// and its handlers do not import each other.
import fs from 'node:fs';
import path from 'node:path';
import type { Sandbox } from '../../apis/zz_generated.types.js';
import type { ExecResult, Runtime } from '../../native/runtime.js';
import type { Client } from '../../runtime/client/client.js';
import type { Logger } from '../../runtime/controller/index.js';
import type {
  SubresourceHandler,
  SubresourceRequest,
  SubresourceTarget,
} from '../../runtime/apiserver/http/subresources.js';
import { errors, StatusError } from '../../runtime/meta/errors.js';
import { toStatusError } from '../common/errors.js';
import { sandboxesGVR } from '../common/kinds.js';
import { runtimeId } from './desired.js';
import type { SandboxStateStore } from './state.js';

export interface SubresourceDeps {
  client: Client;
  runtime: Runtime;
  state: SandboxStateStore;
  log?: Logger;
  /** Per-stream cap of buffered exec output (bytes). Default 1 MiB. */
  maxOutputBytes?: number;
  /** Largest file the files subresource returns (bytes). Default 64 MiB. */
  maxReadBytes?: number;
  /** Most entries one archive put through sandboxes/tar may hold. Default 200,000 (the manifest's file limit). */
  maxTarEntries?: number;
  /**
   * Runs a restore in place as the Sandbox controller's tracked work (SandboxReconciler.
   * restoreInPlace: status says Reconciling reason Restoring meanwhile and no pass touches the
   * instance). Without it (an API server whose controllers run elsewhere) the handler calls
   * runtime.restore itself.
   */
  restore?: (sbx: Sandbox, checkpointId: string, checkpointName: string) => Promise<void>;
}

/** A resolved, usable sandbox: the object and its runtime instance id. */
export interface Target {
  sbx: Sandbox;
  id: string;
}

/**
 * The Sandbox named by the request, in the request's namespace only. NotFound (404) when it
 * does not exist there; Conflict (409) when it is not Running or Paused.
 */
export async function resolveSandbox(d: SubresourceDeps, r: SubresourceTarget): Promise<Target> {
  if (!r.namespace) throw errors.notFound('sandboxes', sandboxesGVR.group, r.name);
  const sbx = await d.client.get<Sandbox>(sandboxesGVR, r.namespace, r.name);
  const ph = sbx.status?.phase;
  if (sbx.metadata.deletionTimestamp || (ph !== 'Running' && ph !== 'Paused' && ph !== 'Standby')) {
    const why = sbx.metadata.deletionTimestamp ? 'it is being deleted' : `it is not running (phase ${ph ?? 'Pending'})`;
    throw errors.conflict('sandboxes', sandboxesGVR.group, r.name, `cannot reach the sandbox: ${why}`);
  }
  return { sbx, id: runtimeId(sbx) };
}

/** The JSON body of a request; `optional` allows an empty body ({}). 400 for anything else. */
export function jsonBody(r: SubresourceRequest, optional = false): Record<string, unknown> {
  if (!r.body || r.body.length === 0) {
    if (optional) return {};
    throw errors.badRequest('a JSON request body is required');
  }
  let v: unknown;
  try {
    v = JSON.parse(r.body.toString('utf8'));
  } catch (e) {
    throw errors.badRequest(`the request body is not valid JSON: ${(e as Error).message}`);
  }
  if (!v || typeof v !== 'object' || Array.isArray(v))
    throw errors.badRequest('the request body must be a JSON object');
  return v as Record<string, unknown>;
}

/** The first value of query parameter `name`, undefined when absent. */
export function queryParam(r: SubresourceTarget, name: string): string | undefined {
  const v = r.query[name];
  return Array.isArray(v) ? v[0] : v;
}

/** A boolean query parameter: true/1/'' or false/0, `def` when absent; 400 for anything else. */
export function boolParam(r: SubresourceTarget, name: string, def = false): boolean {
  const v = queryParam(r, name);
  if (v === undefined) return def;
  if (v === 'false' || v === '0') return false;
  if (v === 'true' || v === '1' || v === '') return true;
  throw errors.badRequest(`invalid boolean value for ${name}: ${JSON.stringify(v)}`);
}

/** A command as an argv list: an array of strings, or a string run by `sh -c`. 400 otherwise. */
export function argvOf(v: unknown, field: string): string[] {
  if (typeof v === 'string') {
    if (!v) throw errors.badRequest(`${field} must not be empty`);
    return ['sh', '-c', v];
  }
  if (!Array.isArray(v) || v.length === 0 || v.some((a) => typeof a !== 'string')) {
    throw errors.badRequest(`${field} must be a non-empty list of strings (argv) or a shell command string`);
  }
  if ((v as string[]).some((a) => a.includes('\0')))
    throw errors.badRequest(`${field} must not contain NUL characters`);
  return v as string[];
}

/** timeoutSeconds as milliseconds: an integer in [1, 3600], default `def` seconds. 400 otherwise. */
export function timeoutOf(v: unknown, def: number): number {
  if (v === undefined || v === null || v === '') return def * 1000;
  const n = typeof v === 'string' ? Number(v) : v;
  if (typeof n !== 'number' || !Number.isInteger(n) || n < 1 || n > 3600) {
    throw errors.badRequest(`timeoutSeconds must be an integer between 1 and 3600, got ${JSON.stringify(v)}`);
  }
  return n * 1000;
}

/** A list of path strings (400 when not one); the path rules themselves are the runtime's. */
export function pathsOf(v: unknown, field = 'paths'): string[] {
  if (!Array.isArray(v) || v.some((p) => typeof p !== 'string'))
    throw errors.badRequest(`${field} must be a list of absolute paths`);
  return v as string[];
}

/** The JSON form of an exec result (exec and dryrun answer it): UTF-8 text, flags only when set. Pure. */
export function execResultJson(res: ExecResult) {
  return {
    exitCode: res.exitCode,
    stdout: res.stdout.toString('utf8'),
    stderr: res.stderr.toString('utf8'),
    durationMs: Math.round(res.durationMs * 1000) / 1000,
    truncated: res.truncated,
    timedOut: res.timedOut,
    ...(res.signal ? { signal: res.signal } : {}),
    ...(res.oomKilled ? { oomKilled: true } : {}),
  };
}

/**
 * 507 InsufficientStorage when `e` (or its cause) says the disk is full: an fs error with
 * code ENOSPC or EDQUOT, or a runtime error whose message carries the errno (the procbox
 * helper and the guest agent report strerror text). Undefined for anything else. Pure.
 */
export function noSpaceError(e: unknown): StatusError | undefined {
  for (let x: unknown = e, depth = 0; x && depth < 5; x = (x as { cause?: unknown }).cause, depth++) {
    const code = (x as { code?: unknown }).code;
    const message = x instanceof Error ? x.message : String(x);
    if (
      code === 'ENOSPC' ||
      code === 'EDQUOT' ||
      /\bENOSPC\b|\bEDQUOT\b|No space left on device|Disk quota exceeded/i.test(message)
    )
      return errors.insufficientStorage(`the sandbox's disk is full: ${message}`);
  }
  return undefined;
}

/**
 * True when the file system holding `dir` has less than 1 MiB left. A workspace operation
 * failing then is reported as the full disk it most likely is (overlayfs, for one, answers a
 * readdir on a full upper layer with EIO), the original error kept in the message.
 */
export function diskFullAt(dir: string | undefined): boolean {
  // The nearest directory that exists (the state dir's subdirectories are made lazily).
  for (let d = dir; d; d = path.dirname(d)) {
    try {
      const st = fs.statfsSync(d);
      return Number(st.bavail) * Number(st.bsize) < 1024 * 1024;
    } catch {
      if (d === path.dirname(d)) return false;
    }
  }
  return false;
}

/**
 * Wraps a handler so every error leaves as a Status (RuntimeErrors mapped by code; a full
 * disk 507: an ENOSPC-like error, or an internal error while `stateDir`'s disk is full).
 */
export function guarded(h: SubresourceHandler, stateDir?: string): SubresourceHandler {
  return {
    ...h,
    ...(h.handle
      ? {
          handle: async (r: SubresourceRequest) => {
            try {
              return await h.handle!(r);
            } catch (e) {
              // A full disk is the user's to fix (free space), never a 500.
              const st = toStatusError(e, { resource: 'sandboxes', group: sandboxesGVR.group, name: r.name });
              const full =
                (e instanceof StatusError ? undefined : noSpaceError(e)) ??
                (st.code === 500 && diskFullAt(stateDir)
                  ? errors.insufficientStorage(`the sandbox's disk is full: ${st.message}`)
                  : undefined);
              throw full ?? st;
            }
          },
        }
      : {}),
  };
}
