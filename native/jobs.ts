// Background jobs: the runtime's contract (spec/agent-sessions.md "Background jobs"). A job is a
// command that outlives the request that started it: a supervisor of ours inside the sandbox's
// confinement (procbox) or the guest agent (vm) runs it in its own process group with separate
// stdout/stderr spools, an optional stdin pipe with end-of-file, a timeout and signals to the
// whole tree. Output past `maxOutputBytes` per stream is drained and counted, never SIGPIPE'd,
// so the real exit status is kept. Jobs survive a restart of the server: their metadata and
// spools live outside the server's memory and `listJobs`/`job` refresh the state.
//
// Every byte of a spool is written by the sandbox: readers get bytes (never parsed text) and
// every length they are told is bounded by what was asked.

/** The most output kept per stream (256 MiB); the default is 16 MiB. */
export const MAX_JOB_OUTPUT_BYTES = 256 * 1024 * 1024;
export const DEFAULT_JOB_OUTPUT_BYTES = 16 * 1024 * 1024;
/** The most bytes one stdin write carries. */
export const MAX_JOB_STDIN_WRITE = 48 * 1024;
/** The longest a read may wait for output. */
export const MAX_JOB_WAIT_MS = 25_000;

/** argv, env and cwd as ExecRequest's (runtime.ts; not imported: runtime.ts imports this file). */
export interface JobRequest {
  argv: string[];
  env?: Record<string, string>;
  /** Working directory inside the sandbox; default the workspace path. */
  cwd?: string;
  /** The job's id, chosen by the caller (unique in the sandbox; a repeat with the same id returns the existing job). */
  id: string;
  /** Give the job a stdin pipe (written with writeJobStdin); without it stdin is /dev/null. */
  stdin?: boolean;
  /** Output kept per stream; the rest is drained and counted in droppedBytes. */
  maxOutputBytes?: number;
  /** Killed (the whole tree, SIGKILL) after this long; state `timed_out`. */
  timeoutMs?: number;
}

export type JobState = 'running' | 'exited' | 'killed' | 'signaled' | 'timed_out' | 'lost';

export interface JobInfo {
  id: string;
  argv: string[];
  state: JobState;
  /** Set once the job ended by exiting. */
  exitCode?: number;
  /** Set once the job ended by a signal (e.g. 'SIGTERM'). */
  signal?: string;
  startedAt: string; // RFC 3339
  endedAt?: string;
  /** Bytes kept so far per stream (the spool's length; offsets run 0..this). */
  stdoutBytes: number;
  stderrBytes: number;
  /** Bytes drained past maxOutputBytes, over both streams. */
  droppedBytes: number;
  /** True while the job has a stdin pipe that is not closed. */
  stdinOpen: boolean;
  /** Which engine ran it (the document's `engine`). */
  engine: 'supervisor';
}

export interface JobReadRequest {
  stream: 'stdout' | 'stderr';
  /** Byte offset in the stream's spool to read from. */
  offset: number;
  /** At most this many bytes back. */
  maxBytes: number;
  /** Wait up to this long (<= MAX_JOB_WAIT_MS) for bytes past `offset` or for the job's end. */
  waitMs?: number;
  /** Aborts the wait (the client went away). */
  signal?: AbortSignal;
}

export interface JobReadResult {
  data: Buffer;
  /** offset + data.length. */
  nextOffset: number;
  /** True when the job has ended and nextOffset is the stream's end: nothing more will come. */
  eof: boolean;
  /** The job's state at the time of the read. */
  job: JobInfo;
}

/** Implemented by procbox and vm (and routed by RuntimeRouter). RuntimeError NotFound for an unknown sandbox or job. */
export interface JobRuntime {
  startJob(id: string, req: JobRequest): Promise<JobInfo>;
  listJobs(id: string): Promise<JobInfo[]>;
  job(id: string, jobId: string): Promise<JobInfo>;
  readJob(id: string, jobId: string, req: JobReadRequest): Promise<JobReadResult>;
  /**
   * `data` written to the job's stdin (at most MAX_JOB_STDIN_WRITE); `close` then sends end-of-file. Conflict once the
   * job ended or stdin is closed.
   */
  writeJobStdin(id: string, jobId: string, data: Buffer, opts?: { close?: boolean }): Promise<void>;
  /** Signals the job's whole process tree (default SIGTERM); state becomes `killed` when it ends. */
  killJob(id: string, jobId: string, signal?: string): Promise<void>;
}
