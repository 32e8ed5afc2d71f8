# SPDX-License-Identifier: Apache-2.0
"""A rank SIGKILLed mid-training (DDP): every other rank's next step raises
a RuntimeError naming the failure, well within init_process_group's
timeout, and the survivors shut down cleanly.

Launched without torchrun (its agent would stop the survivors as soon as a
worker dies, which is the behaviour under test): `kill.py N` starts N ranks
of itself (`kill.py --rank R N PORT`) and checks what each one reports."""
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta

TIMEOUT_S = 30  # init_process_group's timeout: the bound a survivor must beat
VICTIM_STEP = 20


def rank_main(rank, world, port):
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import wia_torch  # noqa: F401

    dist.init_process_group(backend="wia", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world, timeout=timedelta(seconds=TIMEOUT_S))
    victim = world - 1
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                  torch.nn.Linear(256, 64)))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    last_ok = time.monotonic()
    for step in range(10 ** 6):
        if rank == victim and step == VICTIM_STEP:
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            opt.zero_grad()
            ddp(x).square().mean().backward()  # DDP all-reduces the gradients here
            opt.step()
            last_ok = time.monotonic()
        except RuntimeError as e:
            waited = time.monotonic() - last_ok
            print(f"rank {rank}: step {step}: raised after {waited:.2f} s: {e}", flush=True)
            if "allreduce" not in str(e) or f"rank {victim}" not in str(e):
                print(f"rank {rank}: FAIL: the message names neither the call nor the dead rank", flush=True)
                return 1
            if step < VICTIM_STEP:
                print(f"rank {rank}: FAIL: raised before the victim died", flush=True)
                return 1
            if waited > TIMEOUT_S:
                print(f"rank {rank}: FAIL: took longer than the timeout", flush=True)
                return 1
            break
        if time.monotonic() - last_ok > 2 * TIMEOUT_S:
            print(f"rank {rank}: FAIL: no error", flush=True)
            return 1
    start = time.monotonic()
    dist.destroy_process_group()
    print(f"rank {rank}: shut down in {time.monotonic() - start:.2f} s", flush=True)
    return 0


def launch(world):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), str(world), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(world)]
    failed = False
    deadline = time.monotonic() + 3 * TIMEOUT_S + 60
    for r, p in enumerate(procs):
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            print(f"rank {r}: FAIL: still running after {3 * TIMEOUT_S + 60} s (hang)")
            failed = True
        sys.stdout.write(out)
        victim = r == world - 1
        if victim and p.returncode != -signal.SIGKILL:
            print(f"rank {r}: FAIL: the victim exited with {p.returncode}, not SIGKILL")
            failed = True
        if not victim and (p.returncode != 0 or "raised after" not in out):
            print(f"rank {r}: FAIL: exit {p.returncode}")
            failed = True
    print("FAIL" if failed else f"all {world - 1} survivors raised within the timeout")
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) == 5 and sys.argv[1] == "--rank":
        sys.exit(rank_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])))
    sys.exit(launch(int(sys.argv[1]) if len(sys.argv) > 1 else 4))
