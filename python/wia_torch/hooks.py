# SPDX-License-Identifier: Apache-2.0
"""DDP communication hooks on libwia's compressed all-reduce (spec 6.8).

    from wia_torch import hooks
    ddp.register_comm_hook(hooks.CompressionState("topk:0.01"), hooks.compressed)

The method spellings are wia-bench's: topk:R, randomk:R, int8, int4, onebit,
lowrank:R, fp16, bf16, none. Error feedback is kept by libwia per bucket
buffer (DDP reuses its buckets' buffers), so what one step drops is sent
in later steps. Needs a process group of backend "wia".
"""
import torch
import torch.distributed as dist

from . import _C


class CompressionState:
    """What compressed() sends: the method, error feedback, and the group
    (None: the default group)."""

    def __init__(self, method="topk:0.01", error_feedback=True, process_group=None):
        self.method = method
        self.error_feedback = error_feedback
        self.process_group = process_group


def compressed(state: CompressionState, bucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket's gradients over the group with a compressed
    all-reduce, in place, as DDP's default hook averages them uncompressed."""
    group = state.process_group
    if group is None:
        group = dist.distributed_c10d._get_default_group()
    work = _C.allreduce_compressed(group, bucket.buffer(), state.method, average=True,
                                   error_feedback=state.error_feedback)
    return work.get_future().then(lambda fut: fut.value()[0])
