// The rule for a command's environment entry, one place for every caller: exec and job bodies
// (controllers/sandbox/exec.ts, controllers/common/jobs.ts) and a claim's env set on a running
// sandbox (procbox setEnv). A name is a shell identifier; a value is a string without NUL (it
// becomes one C string of the command's environment block).
export const ENV_NAME_RE = /^[A-Za-z_][A-Za-z0-9_]*$/;

/** Whether `name=value` may be passed to a sandbox command. Pure. */
export function validEnvEntry(name: string, value: unknown): value is string {
  return ENV_NAME_RE.test(name) && typeof value === 'string' && !value.includes('\0');
}
