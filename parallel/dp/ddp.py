"""Our ring inside torch's DistributedDataParallel: the library's bucketing drives our all-reduce.

DDP does what GradReducer (reducer.py) does: it groups the gradients into buckets in reverse
order of the parameters, and reduces each bucket as soon as backward has produced all of it,
while backward goes on with the earlier layers. By default it reduces a bucket with the process
group's own all_reduce. ``register_comm_hook`` replaces that call: DDP hands the hook each bucket
(``GradBucket``: one flat tensor holding the bucket's gradients) when it is ready, in the same
order on every rank, and waits for the future the hook returns before the optimiser may step.

    model = DistributedDataParallel(model)
    model.register_comm_hook(None, ring_hook)   # state: the process group (None: all ranks)

The hook must leave the average, not the sum, in the bucket: DDP's default divides by the
number of ranks, and every loss in a DDP loop is a per-rank mean. Our ring's op="avg" does that.
``ring_hook_bf16`` sends the bucket as bfloat16 (torch ships the same idea as
``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.bf16_compress_hook``).
A hook runs on the thread that runs backward, so a ring that blocks until it is done makes
backward wait for each bucket in turn: DDP's own all_reduce is asynchronous, and ``GradReducer``
hands its buckets to a thread of its own for that reason. The test compares the weights after
several steps with DDP's default (tests/test_parallel.py).
"""

# No `from __future__ import annotations` here: register_comm_hook checks the hook's annotations
# (dist.GradBucket in, torch.futures.Future[torch.Tensor] out) as objects, not as strings.
import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.nn.parallel import DistributedDataParallel

from parallel.dp.ring import ring_all_reduce


# region hook
def ring_hook(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """A DDP communication hook: average one bucket of gradients over ``group`` with our ring."""
    # check=False: DDP already made every rank agree on the buckets (it compares the parameters'
    # shapes across ranks when it is constructed), so the sizes match without asking.
    averaged = ring_all_reduce(bucket.buffer(), "avg", group, check=False)
    future: torch.futures.Future[Tensor] = torch.futures.Future()
    future.set_result(averaged)
    return future


def ring_hook_bf16(group: dist.ProcessGroup | None, bucket: dist.GradBucket) -> torch.futures.Future[Tensor]:
    """The same average, the bucket sent as bfloat16: half the bytes."""
    buffer = bucket.buffer()
    # Divided by n in float32, before the cast: the cast is then the one rounding before the
    # ring's additions. Dividing the bfloat16 sum instead would round once more wherever n is not
    # a power of two, and bfloat16's range (float32's) leaves no overflow to divide early against.
    wire = buffer.div(dist.get_world_size(group)).to(torch.bfloat16)
    ring_all_reduce(wire, "sum", group, check=False)
    future: torch.futures.Future[Tensor] = torch.futures.Future()
    future.set_result(buffer.copy_(wire))  # back into DDP's float32 bucket
    return future


HOOKS = {torch.float32: ring_hook, torch.bfloat16: ring_hook_bf16}  # by the dtype the buckets travel as


def ddp_with_our_ring(model: nn.Module, group: dist.ProcessGroup | None = None, grad_dtype: torch.dtype = torch.float32,
                      **ddp_kwargs) -> nn.Module:
    """``model`` wrapped in DistributedDataParallel, its buckets reduced by our ring in ``grad_dtype``."""
    if grad_dtype not in HOOKS:
        raise ValueError(f"grad_dtype must be one of {', '.join(map(str, HOOKS))}, got {grad_dtype}")
    ddp = DistributedDataParallel(model, process_group=group, **ddp_kwargs)
    ddp.register_comm_hook(group, HOOKS[grad_dtype])
    return ddp
# endregion
