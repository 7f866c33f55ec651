// QEMU migrations to and from files (memory checkpoints, forks, templates, restores): QEMU may
// not spawn (`-sandbox spawn=deny`), so a `cat` this process starts copies between a unix socket
// QEMU connects to and the file; and fsync by path. The command line and launch are in qemu.ts.
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { fdatasync, fsync, open, openSync, closeSync, rmSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { type QmpClient } from './qmp.js';
import { giveToQemu, INCOMING_FD, type QemuUser } from './qemu.js';
import { promisify } from 'node:util';
import { RuntimeError } from '../runtime.js';

/**
 * Saves the machine behind `qmp` (migrate) to `file`: QEMU connects to a unix socket this
 * process listens on in `sockDir` (QEMU may not spawn `cat` itself: -sandbox spawn=deny), and
 * a `cat` started by this process copies the connection into the file (the bytes never pass
 * through this event loop: pauseOnConnect hands the socket over unread). Resolves when the
 * migration completed and every byte is in the file; rejects (and removes the file) otherwise.
 */
export async function migrateToFile(
  qmp: QmpClient,
  sockDir: string,
  file: string,
  user?: QemuUser,
  opts: { flushWhileWriting?: boolean } = {},
): Promise<void> {
  const path = join(sockDir, `${randomBytes(8).toString('hex')}.mig`);
  const server = createServer({ pauseOnConnect: true });
  let copier: ReturnType<typeof spawn> | undefined;
  let outFd: number | undefined;
  let flushing: Promise<void> | undefined;
  let ended = false;
  const written = new Promise<void>((resolve, reject) => {
    server.once('connection', (s: Socket) => {
      server.close();
      const out = openSync(file, 'w', 0o600);
      try {
        copier = spawn('cat', [], { stdio: [s, out, 'pipe'] });
      } finally {
        if (opts.flushWhileWriting) outFd = out;
        else closeSync(out);
        s.destroy(); // cat holds its own copy of the connection
      }
      // While cat writes, flush what it wrote so far, so that the caller's fsync at the end
      // has only the tail left (the disk writes overlap the migration instead of following it).
      if (outFd !== undefined) {
        const fd = outFd;
        flushing = (async () => {
          while (!ended) {
            await fdatasyncP(fd);
            await new Promise((r) => setTimeout(r, 10));
          }
        })().catch(() => undefined);
      }
      let err = '';
      copier.stderr!.on('data', (d: Buffer) => (err += d.toString()));
      copier.once('error', reject);
      copier.once('exit', (code) =>
        code === 0
          ? resolve()
          : reject(new RuntimeError('Internal', `writing ${file}: ${err.trim() || `cat exited ${code}`}`)),
      );
    });
  });
  written.catch(() => undefined);
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  try {
    giveToQemu(path, user);
    await qmp.execute('migrate', { uri: `unix:${path}` });
    await qmp.waitMigration();
    await Promise.race([
      written,
      new Promise((_, rej) =>
        setTimeout(() => rej(new RuntimeError('Internal', 'migration stream did not end')), 30_000),
      ),
    ]);
  } catch (e) {
    copier?.kill('SIGKILL');
    rmSync(file, { force: true });
    throw e;
  } finally {
    ended = true;
    await flushing;
    if (outFd !== undefined) closeSync(outFd);
    server.close();
    rmSync(path, { force: true });
  }
}

const fdatasyncP = promisify(fdatasync);
const fsyncP = promisify(fsync);

/** fsync of a file or a directory (its entries) by path, off the event loop. */
export async function fsyncPath(path: string): Promise<void> {
  const fd = await promisify(open)(path, 'r');
  try {
    await fsyncP(fd);
  } finally {
    closeSync(fd);
  }
}

/**
 * Loads `file` (or the path the promise resolves to) into the QEMU behind `qmp`, which was
 * started with `-incoming defer`: QEMU listens on a unix socket in `sockDir` and a `cat`
 * started by this process streams the file into the connection. Resolves when the incoming
 * migration completed.
 */
export async function migrateFromFile(qmp: QmpClient, sockDir: string, file: string | Promise<string>): Promise<void> {
  const path = join(sockDir, `${randomBytes(8).toString('hex')}.mig`);
  const src = await file;
  await qmp.execute('migrate-incoming', { uri: `unix:${path}` });
  let copier: ReturnType<typeof spawn> | undefined;
  const sent = new Promise<void>((resolve, reject) => {
    const sock = connect(path);
    sock.once('error', reject);
    sock.once('connect', () => {
      sock.pause();
      try {
        copier = spawn('cat', [src], { stdio: ['ignore', sock, 'pipe'] });
      } finally {
        sock.destroy(); // cat holds its own copy of the connection
      }
      let err = '';
      copier.stderr!.on('data', (d: Buffer) => (err += d.toString()));
      copier.once('error', reject);
      copier.once('exit', (code) =>
        code === 0
          ? resolve()
          : reject(new RuntimeError('Internal', `reading ${src}: ${err.trim() || `cat exited ${code}`}`)),
      );
    });
  });
  sent.catch(() => undefined);
  try {
    await Promise.all([sent, qmp.waitMigration()]);
  } catch (e) {
    copier?.kill('SIGKILL');
    throw e;
  } finally {
    rmSync(path, { force: true });
  }
}

/**
 * Loads the stream a QEMU got at launch (LaunchSpec.incomingFile) into it (started with
 * `-incoming defer`). Resolves when the incoming migration completed.
 */
export async function migrateFromFd(qmp: QmpClient): Promise<void> {
  await qmp.execute('migrate-incoming', { uri: `fd:${INCOMING_FD}` });
  await qmp.waitMigration();
}
