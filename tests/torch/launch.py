# SPDX-License-Identifier: Apache-2.0
"""Runs N local ranks of a script with the environment torchrun gives its
workers (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT; init_method env://), each line prefixed "[rank]".

    launch.py [--timeout S] N script.py [args...]

The tests use it rather than torchrun: Debian 12's torchrun (torch 1.13 on
Python 3.11) cannot parse its own default --redirects/--tee, and with
"--redirects 1 --tee 1" its agent sometimes stays up after every worker
has exited (seen once in six runs here), which would make a test hang on
the launcher rather than on the code under test. Exit status: 0 when every
rank exited 0; otherwise 1, and every rank still running is killed."""
import errno
import os
import random
import socket
import subprocess
import sys
import threading
import time


def free_port():
    """A port for the TCPStore that rank 0 binds later. Not one the kernel
    hands out itself (bind to 0): in the time between asking and torch's
    bind, another test's connection can be given the same ephemeral port
    (torch_ddp_4 once failed so: "Address already in use"). So a random
    port below the ephemeral range, checked free on every address."""
    lo = 32768
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(10000, max(lo, 10001))
        try:
            with socket.socket(socket.AF_INET) as s4:
                s4.bind(("0.0.0.0", port))
        except OSError:
            continue
        try:
            with socket.socket(socket.AF_INET6) as s6:
                s6.bind(("::", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                continue  # (no IPv6 on this machine is no reason to refuse)
        return port
    with socket.socket() as s:  # no luck: the kernel's choice
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    timeout = 240.0
    if argv[:1] == ["--timeout"]:
        timeout, argv = float(argv[1]), argv[2:]
    n, script, args = int(argv[0]), argv[1], argv[2:]
    port = free_port()
    procs = []
    for r in range(n):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r),
                   LOCAL_WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        procs.append(subprocess.Popen([sys.executable, "-u", script] + args, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))

    def relay(r, p):
        for line in p.stdout:
            sys.stdout.write(f"[{r}] {line}")
            sys.stdout.flush()

    relays = [threading.Thread(target=relay, args=(r, p), daemon=True)
              for r, p in enumerate(procs)]
    for t in relays:
        t.start()
    deadline = time.monotonic() + timeout
    status = 0
    while any(p.poll() is None for p in procs):
        failed = [r for r, p in enumerate(procs) if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            why = (f"rank {failed[0]} exited with {procs[failed[0]].returncode}" if failed
                   else f"still running after {timeout:.0f} s")
            print(f"launch: FAIL: {why}; stopping the other ranks", flush=True)
            for p in procs:
                if p.poll() is None:
                    p.kill()
            status = 1
            break
        time.sleep(0.05)
    for p in procs:
        p.wait()
    for t in relays:
        t.join(timeout=5)
    for r, p in enumerate(procs):
        if p.returncode != 0:
            print(f"launch: FAIL: rank {r} exited with {p.returncode}", flush=True)
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
