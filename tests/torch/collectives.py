# SPDX-License-Identifier: Apache-2.0
"""Every collective of backend "wia", every dtype and reduce op, against a gloo
group of the same processes computing the same thing, and against a
reference computed here in float64 / int64 from the inputs every rank can
rebuild. Run under torchrun (tests/torch/CMakeLists.txt: 2 and 4 ranks)."""
import os
import sys
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist

import wia_torch  # noqa: F401  (registers backend "wia")

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int8, torch.uint8, torch.int32, torch.int64]
SIZES = [0, 7, 1000, 1 << 17]

# torch 1.13 warns that the _base forms and all_reduce_coalesced will go;
# they are what DDP and FSDP call, so they are tested.
warnings.filterwarnings("ignore", category=UserWarning, module="torch.distributed")

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
checks = 0


def fail(msg):
    print(f"rank {rank}: FAIL: {msg}", flush=True)
    sys.exit(1)


def expect(cond, msg):
    global checks
    checks += 1
    if not cond:
        fail(msg)


def same(a, b, what):
    expect(a.dtype == b.dtype and a.shape == b.shape,
           f"{what}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}")
    if not torch.equal(a, b):
        diff = (a.double() - b.double()).abs()
        fail(f"{what}: differs at {int(diff.argmax())}: {a.flatten()[int(diff.argmax())]} "
             f"vs {b.flatten()[int(diff.argmax())]}")
    expect(True, what)


def values(r, n, dtype, op=None):
    """Rank r's input as int64: small integers, so every dtype holds every
    partial result exactly (products stay within 2^world)."""
    i = torch.arange(n, dtype=torch.int64)
    if op is not None and op == dist.ReduceOp.PRODUCT:
        return 1 + (i + r) % 2
    return (i * 7 + r * 3) % 11 + (1 if dtype == torch.uint8 else -5)


def data(r, n, dtype, op=None):
    return values(r, n, dtype, op).to(dtype)


def op_name(op):
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG"):
        if op == getattr(dist.ReduceOp, name):
            return name
    return str(op)


def reference(n, dtype, op):
    vs = torch.stack([values(r, n, dtype, op) for r in range(world)])
    if op == dist.ReduceOp.SUM:
        out = vs.sum(0)
    elif op == dist.ReduceOp.PRODUCT:
        out = vs.prod(0)
    elif op == dist.ReduceOp.MIN:
        out = vs.min(0).values
    elif op == dist.ReduceOp.MAX:
        out = vs.max(0).values
    else:  # AVG
        return (vs.double().sum(0) / world).to(dtype)
    return out.to(dtype)


def gloo_supports(fn):
    try:
        fn()
        return True
    except RuntimeError as e:
        if any(w in str(e) for w in ("nsupported", "not supported", "Invalid scalar type")):
            return False
        raise


def test_all_reduce(gloo):
    ops = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
           dist.ReduceOp.AVG]
    for dtype in FLOATS + INTS:
        for op in ops:
            if op == dist.ReduceOp.AVG and dtype in INTS:
                continue
            for n in SIZES:
                t = data(rank, n, dtype, op)
                dist.all_reduce(t, op=op)
                what = f"all_reduce {dtype} {op_name(op)} n={n}"
                same(t, reference(n, dtype, op), what)
                g = data(rank, n, dtype, op)
                if op != dist.ReduceOp.AVG and gloo_supports(
                        lambda: dist.all_reduce(g, op=op, group=gloo)):
                    same(t, g, what + " (gloo)")


def test_broadcast_reduce(gloo):
    for dtype in FLOATS + INTS:
        for root in range(world):
            n = 1 << 15
            t = data(rank, n, dtype)
            dist.broadcast(t, src=root)
            same(t, data(root, n, dtype), f"broadcast {dtype} root {root}")
        root = world - 1
        t = data(rank, 4099, dtype)
        dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
        if rank == root:
            same(t, reference(4099, dtype, dist.ReduceOp.SUM), f"reduce {dtype}")


def test_gathers(gloo):
    for dtype in [torch.float32, torch.bfloat16, torch.int64, torch.uint8]:
        for n in [0, 5, 1 << 16]:
            mine = data(rank, n, dtype)
            outs = [torch.empty(n, dtype=dtype) for _ in range(world)]
            dist.all_gather(outs, mine)
            for r in range(world):
                same(outs[r], data(r, n, dtype), f"all_gather {dtype} n={n} from {r}")
            flat = torch.empty(world * n, dtype=dtype)
            dist._all_gather_base(flat, mine)
            same(flat, torch.cat([data(r, n, dtype) for r in range(world)]),
                 f"_all_gather_base {dtype} n={n}")
        root = world // 2
        outs = [torch.empty(33, dtype=dtype) for _ in range(world)] if rank == root else None
        dist.gather(data(rank, 33, dtype), outs, dst=root)
        if rank == root:
            for r in range(world):
                same(outs[r], data(r, 33, dtype), f"gather {dtype} from {r}")
        out = torch.empty(33, dtype=dtype)
        ins = [data(r, 33, dtype) * 0 + r for r in range(world)] if rank == root else None
        dist.scatter(out, ins, src=root)
        same(out, data(rank, 33, dtype) * 0 + rank, f"scatter {dtype}")


def test_reduce_scatter(gloo):
    for dtype in [torch.float32, torch.float64, torch.int32]:
        for op in [dist.ReduceOp.SUM, dist.ReduceOp.MAX]:
            n = 3000
            full = data(rank, world * n, dtype)
            expected = reference(world * n, dtype, op)[rank * n:(rank + 1) * n]
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(out, list(full.chunk(world)), op=op)
            same(out, expected, f"reduce_scatter {dtype} {op_name(op)}")
            out2 = torch.empty(n, dtype=dtype)
            dist._reduce_scatter_base(out2, full, op=op)
            same(out2, expected, f"_reduce_scatter_base {dtype} {op_name(op)}")


def test_all_to_all(gloo):
    for dtype in [torch.float32, torch.int64, torch.float16]:
        # even: world x 1000 elements, block j to rank j
        n = 1000
        inp = torch.cat([data(rank, n, dtype) + j for j in range(world)])
        out = torch.empty_like(inp)
        dist.all_to_all_single(out, inp)
        same(out, torch.cat([data(r, n, dtype) + rank for r in range(world)]),
             f"all_to_all_single even {dtype}")
        # uneven: rank r sends r + j + 1 rows of 3 to rank j (and none to
        # rank 0 from rank 0, to include an empty split)
        rows = lambda src, dst: 0 if src == dst == 0 else src + dst + 1  # noqa: E731
        in_splits = [rows(rank, j) for j in range(world)]
        out_splits = [rows(j, rank) for j in range(world)]
        inp = torch.cat([torch.full((rows(rank, j), 3), rank * 100 + j).to(dtype)
                         for j in range(world)])
        out = torch.empty((sum(out_splits), 3), dtype=dtype)
        dist.all_to_all_single(out, inp, out_splits, in_splits)
        want = torch.cat([torch.full((rows(j, rank), 3), j * 100 + rank).to(dtype)
                          for j in range(world)])
        same(out, want, f"all_to_all_single uneven {dtype}")
        g = torch.empty_like(out)
        dist.all_to_all_single(g, inp, out_splits, in_splits, group=gloo)
        same(out, g, f"all_to_all_single uneven {dtype} (gloo)")
        # list form, tensors of different sizes
        ins = [torch.full((rank + j + 2,), rank - j).to(dtype) for j in range(world)]
        outs = [torch.empty(j + rank + 2, dtype=dtype) for j in range(world)]
        dist.all_to_all(outs, ins)
        for j in range(world):
            same(outs[j], torch.full((j + rank + 2,), j - rank).to(dtype),
                 f"all_to_all list {dtype} from {j}")


def test_coalesced_and_async(gloo):
    ts = [data(rank, n, torch.float32) for n in (1, 100, 4097)]
    dist.all_reduce_coalesced(ts)
    for t, n in zip(ts, (1, 100, 4097)):
        same(t, reference(n, torch.float32, dist.ReduceOp.SUM), f"all_reduce_coalesced n={n}")
    works, tensors = [], []
    for k in range(8):
        t = data(rank, 1 << 14, torch.float32) * (k + 1)
        works.append(dist.all_reduce(t, async_op=True))
        tensors.append(t)
    futs = [w.get_future() for w in works]
    for k, (w, f) in enumerate(zip(works, futs)):
        expect(w.wait() is True, "wait() returns True")
        expect(w.is_completed(), f"async #{k} completed after wait")
        value = f.wait()
        same(value[0], tensors[k], f"async #{k} future value")
        same(tensors[k], reference(1 << 14, torch.float32, dist.ReduceOp.SUM) * (k + 1),
             f"async all_reduce #{k}")
    # is_completed turns true by itself
    t = data(rank, 10, torch.float32)
    w = dist.all_reduce(t, async_op=True)
    deadline = time.time() + 30
    while not w.is_completed():
        expect(time.time() < deadline, "is_completed() turns true within 30 s")
        time.sleep(0.001)
    dist.barrier()


def test_send_recv(gloo):
    # even ranks send first, odd ranks receive first: completes on any
    # transport, buffered or not
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    for n in (3, 1 << 18):
        mine = data(rank, n, torch.float64)
        got = torch.empty(n, dtype=torch.float64)
        if rank % 2 == 0:
            dist.send(mine, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(mine, nxt)
        same(got, data(prv, n, torch.float64), f"send/recv n={n}")
    if world >= 2:
        mine = data(rank, 11, torch.int32)
        if rank == 0:
            req = dist.isend(mine, 1)
            req.wait()
        elif rank == 1:
            got = torch.empty(11, dtype=torch.int32)
            dist.irecv(got, 0).wait()
            same(got, data(0, 11, torch.int32), "isend/irecv")


def test_bad_input(gloo):
    def raises(fn, words, what):
        try:
            fn()
        except RuntimeError as e:
            msg = str(e)
            expect(all(w in msg for w in words), f"{what}: message {msg!r} lacks {words}")
            return
        fail(f"{what}: no error raised")

    raises(lambda: dist.all_reduce(torch.zeros(4, dtype=torch.bool)), ["wia", "dtype"],
           "bool all_reduce")
    raises(lambda: dist.all_reduce(torch.zeros(4, 4).t()), ["wia", "contiguous"],
           "non-contiguous all_reduce")
    raises(lambda: dist.all_reduce(torch.zeros(4), op=dist.ReduceOp.BAND), ["wia", "reduce op"],
           "BAND all_reduce")
    # The group still works after refused calls (nothing was posted).
    t = data(rank, 9, torch.float32)
    dist.all_reduce(t)
    same(t, reference(9, torch.float32, dist.ReduceOp.SUM), "all_reduce after refused calls")


def main():
    dist.init_process_group(backend="wia", timeout=timedelta(seconds=60))
    expect(dist.get_backend() == "wia", "backend is wia")
    expect(dist.get_rank() == rank and dist.get_world_size() == world, "rank and size")
    gloo = dist.new_group(backend="gloo")
    # A subgroup of backend wia: its own communicator through the same store.
    sub = dist.new_group(ranks=list(range(0, world, 2)), backend="wia")
    if rank % 2 == 0:
        t = torch.full((5,), float(rank))
        dist.all_reduce(t, group=sub)
        same(t, torch.full((5,), float(sum(range(0, world, 2)))), "subgroup all_reduce")
    tests = [test_all_reduce, test_broadcast_reduce, test_gathers, test_reduce_scatter,
             test_all_to_all, test_coalesced_and_async, test_send_recv, test_bad_input]
    only = os.environ.get("WIA_TORCH_TEST")
    for test in tests:
        if only and only != test.__name__:
            continue
        start = time.time()
        test(gloo)
        dist.barrier()
        if rank == 0:
            print(f"{test.__name__}: ok ({time.time() - start:.1f} s)", flush=True)
    print(f"rank {rank}: {checks} checks passed", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
