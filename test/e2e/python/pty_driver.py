"""Runs a program on a new pseudo-terminal for the e2e tests, driven over stdin/stdout.

Usage: python3 pty_driver.py ROWS COLS ARGV...

The program gets a fresh pty (its controlling terminal, stdin, stdout, stderr) of ROWS x COLS,
set before it starts. Commands, one JSON object per line on stdin:
  {"send": "text"}           type text (UTF-8) into the terminal
  {"resize": [ROWS, COLS]}   change the window size (the program gets SIGWINCH)
  {"signal": "SIGTERM"}      send a signal to the program
  {"termios": true}          report the terminal's modes now
Events, one JSON object per line on stdout:
  {"termios": [...]}         the terminal's modes (tcgetattr: iflag, oflag, cflag, lflag,
                             ispeed, ospeed, cc), first before the program starts, then on asking
  {"out": "<base64>"}        bytes the program wrote to the terminal
  {"exit": N, "termios": [...]}
                             the program ended (N = its exit code, or 128+signal), after its
                             output has been drained, and the modes it left; the driver then exits 0
When stdin closes (the test ended) the program's process group is killed.
"""
import base64
import fcntl
import json
import os
import select
import signal
import struct
import sys
import termios

rows, cols, argv = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
master, slave = os.openpty()
fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
initial = termios.tcgetattr(slave)
pid = os.fork()
if pid == 0:
    os.setsid()
    fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
    for fd in (0, 1, 2):
        os.dup2(slave, fd)
    os.close(master)
    os.close(slave)
    os.execvp(argv[0], argv)
os.close(slave)


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def modes():
    # On a pty master, tcgetattr reads the terminal's (the slave's) modes.
    a = termios.tcgetattr(master)
    return a[:6] + [[c if isinstance(c, int) else ord(c) for c in a[6]]]


emit({"termios": initial[:6] + [[c if isinstance(c, int) else ord(c) for c in initial[6]]]})
status = None
stdin_open = True
buf = b""
while True:
    fds = [master] + ([0] if stdin_open else [])
    ready, _, _ = select.select(fds, [], [], 0.05)
    if master in ready:
        try:
            data = os.read(master, 65536)
        except OSError:
            data = b""
        if data:
            emit({"out": base64.b64encode(data).decode()})
        elif status is not None:
            break
    if 0 in ready:
        chunk = os.read(0, 65536)
        if not chunk:
            # The test that drives us is gone: so is the program (nothing outlives a failed test).
            stdin_open = False
            if status is None:
                os.killpg(pid, signal.SIGKILL)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            cmd = json.loads(line)
            if "send" in cmd:
                os.write(master, cmd["send"].encode())
            elif "resize" in cmd:
                r, c = cmd["resize"]
                fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", r, c, 0, 0))
            elif "signal" in cmd:
                os.kill(pid, getattr(signal, cmd["signal"]))
            elif "termios" in cmd:
                emit({"termios": modes()})
    if status is None:
        done, st = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(st)
            if status < 0:
                status = 128 - status
    elif master not in ready:
        break  # exited and nothing more to read
emit({"exit": status, "termios": modes()})
