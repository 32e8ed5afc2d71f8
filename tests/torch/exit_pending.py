# SPDX-License-Identifier: Apache-2.0
"""Groups are shut down at exit, while the interpreter is whole.

Rank 1 posts an all_reduce asynchronously, drops it and its tensor, and
exits at once: wia_torch's atexit handler must complete that work and
release the tensor (which takes the GIL) before CPython finalizes; a
release during finalization aborted the process ("terminate called
without an active exception"; launch.py reports the exit status). Rank 0
joins that all_reduce a second late (its sum shows rank 1's part), then
calls the same shutdown itself: a later call must fail, naming it. Run by
launch.py with 2 ranks."""
import os
import sys
import time

import torch
import torch.distributed as dist

import wia_torch
from checks import timed_error

rank = int(os.environ["RANK"])


def main():
    dist.init_process_group(backend="wia")
    t = torch.ones(1 << 16)
    dist.all_reduce(t)  # the group works
    if t[0].item() != 2.0:
        print(f"rank {rank}: FAIL: first all_reduce gave {t[0].item()}")
        return 1
    if rank == 1:
        dist.all_reduce(t, async_op=True)  # neither waited for nor kept
        print(f"rank {rank}: 1 checks passed", flush=True)
        return 0
    time.sleep(1.0)
    dist.all_reduce(t)
    if t[0].item() != 4.0:
        print(f"rank {rank}: FAIL: second all_reduce gave {t[0].item()}")
        return 1
    wia_torch._C.shutdown_all()
    error, _ = timed_error(lambda: dist.all_reduce(t))
    if error is None:
        print(f"rank {rank}: FAIL: all_reduce on a shut-down group did not raise")
        return 1
    if "shut down" not in error:
        print(f"rank {rank}: FAIL: the refusal does not say the group was shut down: {error}")
        return 1
    print(f"rank {rank}: 2 checks passed", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
