# SPDX-License-Identifier: Apache-2.0
"""Backend "wia" against gloo, side by side in the same processes and run:
all_reduce bus bandwidth from 1 MiB to 64 MiB, then the step time of DDP
training an MLP. Run by scripts/torch-bench.sh (torchrun, 4 ranks).

Bus bandwidth is nccl-tests': bytes x 2 (n - 1) / n / time. Each row gives
the median of `--iters` timed calls after warm-up, and wia/gloo."""
import argparse
import os
import statistics
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import wia_torch  # noqa: F401

warnings.filterwarnings("ignore", category=UserWarning)


def timed(fn, iters, warmup, group):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        dist.barrier(group=group)
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    # every rank's time counts: a collective is as slow as its slowest rank
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return t.item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--ddp-steps", type=int, default=20)
    args = ap.parse_args()

    dist.init_process_group(backend="wia", timeout=timedelta(seconds=300))
    rank, n = dist.get_rank(), dist.get_world_size()
    groups = {"wia": dist.new_group(backend="wia"), "gloo": dist.new_group(backend="gloo")}
    torch.set_num_threads(1)

    def size_of(s):
        return int(s[:-1]) << {"K": 10, "M": 20}[s[-1]] if s[-1] in "KM" else int(s)

    if rank == 0:
        print(f"all_reduce float32 sum, {n} ranks, median of {args.iters}")
        print(f"{'size':>8} {'wia ms':>9} {'wia busbw':>10} {'gloo ms':>9} {'gloo busbw':>10}"
              f" {'wia/gloo':>8}")
    for s in args.sizes.split(","):
        nbytes = size_of(s)
        row = {}
        for name, g in groups.items():
            t = torch.ones(nbytes // 4)
            secs = timed(lambda: dist.all_reduce(t, group=g), args.iters, 2, g)
            row[name] = (secs, nbytes * 2 * (n - 1) / n / secs / 1e9)
        if rank == 0:
            (tw, bw), (tg, bg) = row["wia"], row["gloo"]
            print(f"{s:>8} {tw * 1e3:9.2f} {bw:8.2f}GB {tg * 1e3:9.2f} {bg:8.2f}GB {bw / bg:8.2f}x",
                  flush=True)

    # DDP: the same model and data on each backend; a step is forward,
    # backward (with DDP's bucketed all-reduces) and the optimizer.
    def ddp_step_time(group):
        torch.manual_seed(0)
        net = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(1024, 1024),
                                                        torch.nn.ReLU()) for _ in range(8)])
        ddp = DDP(net, process_group=group)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        x = torch.randn(32, 1024)

        def step():
            opt.zero_grad()
            ddp(x).square().mean().backward()
            opt.step()

        return timed(step, args.ddp_steps, 3, group)

    steps = {name: ddp_step_time(g) for name, g in groups.items()}
    if rank == 0:
        params = 8 * (1024 * 1024 + 1024)
        print(f"DDP step, MLP of {params / 1e6:.1f} M float32 parameters, batch 32 per rank, "
              f"median of {args.ddp_steps}: wia {steps['wia'] * 1e3:.1f} ms, "
              f"gloo {steps['gloo'] * 1e3:.1f} ms, gloo/wia {steps['gloo'] / steps['wia']:.2f}x",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
