# SPDX-License-Identifier: Apache-2.0
"""init_process_group's timeout applies: rank 1 is alive (its heartbeats go
on) but never posts the all_reduce rank 0 waits in, so rank 0's call must
raise a RuntimeError naming the timeout after about 3 s, never hang; rank 1
then finds the group failed. Run by launch.py with 2 ranks."""
import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import wia_torch  # noqa: F401
from checks import timed_error

TIMEOUT_S = 3
rank = int(os.environ["RANK"])


def main():
    dist.init_process_group(backend="wia", timeout=timedelta(seconds=TIMEOUT_S))
    t = torch.ones(1000)
    dist.all_reduce(t)  # both ranks: the group works
    if t[0].item() != 2.0:
        print(f"rank {rank}: FAIL: first all_reduce gave {t[0].item()}")
        return 1
    if rank == 1:
        time.sleep(TIMEOUT_S + 3)
    error, took = timed_error(lambda: dist.all_reduce(t))
    if error is None:
        print(f"rank {rank}: FAIL: all_reduce returned although rank 1 never joined in time")
        return 1
    print(f"rank {rank}: raised after {took:.2f} s: {error}", flush=True)
    if rank == 0 and not (0.8 * TIMEOUT_S <= took <= TIMEOUT_S + 10):
        print(f"rank {rank}: FAIL: expected the error after about {TIMEOUT_S} s")
        return 1
    if rank == 0 and "time" not in error.lower():
        print(f"rank {rank}: FAIL: the message does not say it timed out")
        return 1
    print(f"rank {rank}: 1 checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
