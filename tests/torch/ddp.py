# SPDX-License-Identifier: Apache-2.0
"""DDP on backend "wia", unchanged, against DDP on gloo in the same processes:
the same model from the same seed, the same per-rank data, 50 SGD steps;
the parameters must agree within 1e-5 and be equal on every rank. Then
wia_torch.hooks.compressed (fp16, and top-k 10 % with error feedback)
must train about as well as the dense all-reduce. Run under torchrun."""
import copy
import os
import sys
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import wia_torch
from wia_torch import hooks

warnings.filterwarnings("ignore", category=UserWarning)
torch.set_num_threads(1)

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
STEPS = 50
checks = 0


def expect(cond, msg):
    global checks
    checks += 1
    if not cond:
        print(f"rank {rank}: FAIL: {msg}", flush=True)
        sys.exit(1)


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 8))


def batches():
    g = torch.Generator().manual_seed(1000 + rank)
    w = torch.randn(32, 8, generator=torch.Generator().manual_seed(7))
    for _ in range(STEPS):
        x = torch.randn(64, 32, generator=g)
        yield x, torch.tanh(x @ w) + 0.01 * torch.randn(64, 8, generator=g)


def train(net, group, hook_state=None, hook=None):
    # A small bucket cap: several buckets per step, as a big model has.
    ddp = DDP(net, process_group=group, bucket_cap_mb=0.01)
    if hook is not None:
        ddp.register_comm_hook(hook_state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    losses = []
    for x, y in batches():
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return ddp.module, losses


def flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.parameters()])


def main():
    dist.init_process_group(backend="wia", timeout=timedelta(seconds=120))
    gloo = dist.new_group(backend="gloo")
    base = model()

    net_wia, loss_wia = train(copy.deepcopy(base), None)
    net_gloo, loss_gloo = train(copy.deepcopy(base), gloo)
    diff = (flat(net_wia) - flat(net_gloo)).abs().max().item()
    expect(diff <= 1e-5, f"DDP on wia vs gloo: parameters differ by {diff:.3g} > 1e-5")
    expect(not torch.equal(flat(net_wia), flat(base)), "training changed the parameters")

    # DDP keeps replicas equal: every rank's parameters, gathered over gloo.
    mine = flat(net_wia)
    every = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(every, mine, group=gloo)
    for r in range(world):
        expect(torch.equal(every[r], mine), f"rank {r}'s parameters differ from rank {rank}'s")

    # Compressed hooks train about as well as dense (same data, same steps).
    dense_final = sum(loss_wia[-5:]) / 5
    start = sum(loss_wia[:5]) / 5
    for method, tolerance in (("fp16", 0.01), ("topk:0.1", 0.25)):
        state = hooks.CompressionState(method, error_feedback=True)
        net_c, loss_c = train(copy.deepcopy(base), None, state, hooks.compressed)
        final = sum(loss_c[-5:]) / 5
        expect(final < 0.8 * start, f"{method}: loss did not fall ({start:.4f} -> {final:.4f})")
        expect(final <= dense_final * (1 + tolerance),
               f"{method}: final loss {final:.5f} vs dense {dense_final:.5f}")
        if rank == 0:
            print(f"{method}: final loss {final:.5f}, dense {dense_final:.5f}, start {start:.4f}",
                  flush=True)
        mine = flat(net_c)
        every = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(every, mine, group=gloo)
        expect(all(torch.equal(e, mine) for e in every), f"{method}: replicas differ")

    if rank == 0:
        print(f"DDP wia vs gloo: max parameter difference {diff:.3g} after {STEPS} steps; "
              f"final loss wia {loss_wia[-1]:.5f} gloo {loss_gloo[-1]:.5f}", flush=True)
    print(f"rank {rank}: {checks} checks passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
