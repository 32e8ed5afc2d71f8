# SPDX-License-Identifier: Apache-2.0
"""A rank that exits with a collective its peer never posts does not hold
its exit for the collective's timeout: wia_torch's shutdown waits
WIA_TORCH_SHUTDOWN_GRACE_MS (2 s here) for the work in flight, then aborts
the communicator, and the peer's next call fails at once naming the abort.
The group's timeout is 300 s, so waiting for it would fail the test. Run by
launch.py with 2 ranks."""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import wia_torch  # noqa: F401
from checks import timed_error

GRACE_S = 2
os.environ["WIA_TORCH_SHUTDOWN_GRACE_MS"] = str(GRACE_S * 1000)
rank = int(os.environ["RANK"])


def gone(pid):
    """Whether process pid has exited (a zombie counts: launch.py reaps
    its ranks in order)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def main():
    dist.init_process_group(backend="wia", timeout=timedelta(seconds=300))
    store = dist.distributed_c10d._get_default_store()
    t = torch.ones(1 << 10)
    dist.all_reduce(t)  # the group works
    if t[0].item() != 2.0:
        print(f"rank {rank}: FAIL: first all_reduce gave {t[0].item()}")
        return 1
    if rank == 1:
        dist.all_reduce(t, async_op=True)  # rank 0 never posts its match
        store.set("rank1_pid", str(os.getpid()))
        print(f"rank {rank}: 1 checks passed", flush=True)
        return 0
    pid = int(store.get("rank1_pid"))
    start = time.monotonic()
    while not gone(pid) and time.monotonic() - start < 120:
        time.sleep(0.05)
    took = time.monotonic() - start
    print(f"rank {rank}: rank 1 exited {took:.2f} s after posting", flush=True)
    if took > GRACE_S + 30:
        print(f"rank {rank}: FAIL: rank 1 took {took:.1f} s to exit, not about {GRACE_S} s")
        return 1
    error, took = timed_error(lambda: dist.all_reduce(t))
    print(f"rank {rank}: raised after {took:.2f} s: {error}", flush=True)
    if error is None:
        print(f"rank {rank}: FAIL: all_reduce with a peer that exited did not raise")
        return 1
    if took > 30:
        print(f"rank {rank}: FAIL: the error came after {took:.1f} s, not at once")
        return 1
    if "abort" not in error.lower():
        print(f"rank {rank}: FAIL: the error does not say rank 1 aborted: {error}")
        return 1
    print(f"rank {rank}: 3 checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
