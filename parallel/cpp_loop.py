"""The segmented ring with its loop in C++ (parallel/segmented_ring.cpp): an experiment.

The benchmarks (``python distributed.py --bench cpu`` and ``--bench allreduce``) run it beside
the Python version to measure how much of our calls' cost is the interpreter's: both send the
same messages through the same process group, in the same order, and add the same segments
(the results are equal, bit for bit). It is not one of all_reduce's algorithms: it runs on
CPU tensors only and needs a C++ build.

    from parallel import cpp_loop
    cpp_loop.unavailable()                # None, or why it cannot be built here
    cpp_loop.build()                      # before the ranks start: a JIT build, once
    cpp_loop.segmented_ring(t)            # in every rank of the group, like all_reduce(t, algorithm="segmented_ring")
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from parallel import collectives
from parallel.ring import _agree, _buffer

NAME = "dense_collectives"
SOURCE = Path(__file__).resolve().parent / "segmented_ring.cpp"


def unavailable() -> str | None:
    """None where the extension can be built (it is never installed: setup.py leaves it out),
    else why not."""
    import modes

    return modes._compiler_reason(NAME)


def build() -> str:
    """Build (or find) and load the extension; returns how ("jit"). Raises modes.BuildError if
    the compiler fails. Loading twice in a process is free."""
    import modes  # the one loader of extensions (JIT cache in build/jit/<name>, build lock)

    return modes.load_extension(NAME, [SOURCE])


def segmented_ring(tensor: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, *,
                   check: bool = True) -> Tensor:
    """Sum (or average) ``tensor`` over the ranks of ``group`` in place, as
    ``all_reduce(tensor, op, "segmented_ring", group)`` does, with the loop in C++.
    ``check=True`` first makes the ranks agree on numel, dtype and op (a RingError on every rank
    if they differ), as all_reduce does; the benchmarks pass ``check=False``."""
    collectives._validate(tensor, op, "segmented_ring")
    plan = collectives._plan(group)
    collectives._check_device(tensor, plan.backend)
    if tensor.device.type != "cpu":
        raise ValueError(f"the C++ segmented ring takes CPU tensors only; this tensor is on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError("the C++ segmented ring needs a contiguous tensor")
    if check:
        _agree("all_reduce", tensor, op, group)
    if plan.size == 1 or tensor.numel() == 0:
        return tensor
    build()
    flat = tensor.view(-1)
    chunk = -(-flat.numel() // plan.size)  # the longest chunk, and its longest segment below
    s = collectives._segments_per_chunk(chunk * flat.element_size())
    scratch = _buffer(2 * -(-chunk // s), flat, "segmented_cpp")
    pg = group if group is not None else dist.group.WORLD
    torch.ops.dense_collectives.segmented_ring_(flat, pg.group_name, s, op == "avg", scratch)
    return tensor
