# SPDX-License-Identifier: Apache-2.0
"""A process that exits with a collective still in flight, its tensor
dropped by Python, must exit cleanly: the backend's completion thread
completes the work and releases the tensor (which needs the GIL) before
the interpreter finalizes, not during it (CPython ends a thread that asks
for the GIL then, and the unwind through C++ destructors aborted the
process: "terminate called without an active exception"). Rank 1 joins
the all_reduce a second late; rank 0 posts it asynchronously and exits at
once. Run by launch.py with 2 ranks."""
import os
import sys
import time

import torch
import torch.distributed as dist

import wia_torch  # noqa: F401

rank = int(os.environ["RANK"])


def main():
    dist.init_process_group(backend="wia")
    t = torch.ones(1 << 16)
    dist.all_reduce(t)  # the group works
    if t[0].item() != 2.0:
        print(f"rank {rank}: FAIL: first all_reduce gave {t[0].item()}")
        return 1
    if rank == 1:
        time.sleep(1.0)
        dist.all_reduce(t)
        if t[0].item() != 4.0:
            print(f"rank {rank}: FAIL: second all_reduce gave {t[0].item()}")
            return 1
    else:
        dist.all_reduce(t, async_op=True)  # neither waited for nor kept
    print(f"rank {rank}: 1 checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
