# SPDX-License-Identifier: Apache-2.0
"""libwia as a torch.distributed backend.

    import wia_torch                      # registers backend "wia"
    torch.distributed.init_process_group(backend="wia")

Each process group is one libwia process communicator, created through the
c10d store torch hands over (no second rendezvous). docs/torch.md lists the
collectives, dtypes and reduce ops, and what differs from gloo.
"""
import atexit as _atexit

import torch.distributed as _dist

from . import _C

# Groups are shut down while the interpreter is whole: a group still alive
# at finalization (destroy_process_group never called, as is common) had
# its completion thread release tensors while CPython was ending threads
# that ask for the GIL, which aborted the process now and then ("terminate
# called without an active exception").
_atexit.register(_C.shutdown_all)

__all__ = ["BACKEND", "create_process_group", "hooks"]

BACKEND = "wia"


def create_process_group(store, rank, world_size, timeout):
    """The creator torch.distributed calls for backend "wia"."""
    return _C.create_process_group(store, rank, world_size, timeout)


# Importing twice (or reloading) must not register twice: torch asserts.
if BACKEND.upper() not in _dist.Backend._plugins:
    _dist.Backend.register_backend(BACKEND, create_process_group)

from . import hooks  # noqa: E402  (needs the backend registered)
