// The checks every backend makes on a job's id and start request (procbox and vm alike), apart
// from native/jobs.ts so that the contract stays a types-only module runtime.ts can import.
import { DEFAULT_JOB_OUTPUT_BYTES, MAX_JOB_OUTPUT_BYTES, type JobRequest } from './jobs.js';
import { RuntimeError } from './runtime.js';

/** A job id: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit (a file name on every backend). */
export const JOB_ID = /^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/;
/** The longest timeout a job may ask for (a week). */
export const MAX_JOB_TIMEOUT_MS = 7 * 24 * 3600 * 1000;

/** Throws InvalidArgument unless `jobId` is a JOB_ID. */
export function checkJobId(jobId: string): void {
  if (typeof jobId !== 'string' || !JOB_ID.test(jobId))
    throw new RuntimeError(
      'InvalidArgument',
      'job id: 1-64 characters of A-Z a-z 0-9 . _ -, starting with a letter or digit',
    );
}

/** The checks every backend makes on a start (id, output cap, timeout, argv); returns the output cap. */
export function checkJobRequest(req: JobRequest): number {
  checkJobId(req?.id);
  const max = req.maxOutputBytes ?? DEFAULT_JOB_OUTPUT_BYTES;
  if (!Number.isInteger(max) || max < 0 || max > MAX_JOB_OUTPUT_BYTES)
    throw new RuntimeError('InvalidArgument', `maxOutputBytes must be an integer 0..${MAX_JOB_OUTPUT_BYTES}`);
  const t = req.timeoutMs;
  if (t !== undefined && (!Number.isInteger(t) || t < 1 || t > MAX_JOB_TIMEOUT_MS))
    throw new RuntimeError('InvalidArgument', `timeoutMs must be an integer 1..${MAX_JOB_TIMEOUT_MS}`);
  if (
    !Array.isArray(req.argv) ||
    req.argv.length === 0 ||
    req.argv.some((a) => typeof a !== 'string' || a.includes('\0'))
  )
    throw new RuntimeError('InvalidArgument', 'argv must be a non-empty list of strings without NUL');
  return max;
}
