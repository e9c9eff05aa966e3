"""The segmented ring with its loop in C++ (parallel/collectives/segmented_ring.cpp).

Both loops send the same messages through the same process group, in the same order, and add
the same segments (the results are equal, bit for bit; a test compares them). The benchmarks
(``python distributed.py --bench cpu`` and ``--bench allreduce``) run them side by side to
measure how much of a call's cost is the interpreter's. ``all_reduce(t, algorithm="auto")``
runs this loop wherever it picks the segmented ring for a CPU tensor in a process that has
loaded the extension; nothing builds it implicitly: it needs a C++ compiler and a minute.
A rank that has loaded it and one that has not still reduce together: the messages are the same.

    from parallel.collectives import cpp_loop
    cpp_loop.unavailable()                # None, or why it cannot be built here
    cpp_loop.build()                      # before the ranks start: a JIT build, once; then in
                                          # each rank, which loads the cached library
    cpp_loop.segmented_ring(t)            # in every rank of the group, like all_reduce(t, algorithm="segmented_ring")
"""

from __future__ import annotations

from pathlib import Path

import torch.distributed as dist
from torch import Tensor

from parallel.collectives import algorithms
from parallel.common.p2p import agree

NAME = "dense_collectives"
SOURCE = Path(__file__).resolve().parent / "segmented_ring.cpp"


def unavailable() -> str | None:
    """None where the extension can be built (it is never installed: setup.py leaves it out),
    else why not."""
    import modes

    return modes.compiler_reason(NAME)


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
    algorithms.validate(tensor, op, "segmented_ring")
    plan = algorithms.group_plan(group)
    algorithms.check_device(tensor, plan.backend)
    if tensor.device.type != "cpu":
        raise ValueError(f"the C++ segmented ring takes CPU tensors only; this tensor is on {tensor.device}")
    if not tensor.is_contiguous():
        raise ValueError("the C++ segmented ring needs a contiguous tensor")
    if check:
        agree("all_reduce", tensor, op, group)
    if plan.size == 1 or tensor.numel() == 0:
        return tensor
    build()
    algorithms.segmented_ring(tensor.view(-1), plan, op, group, cpp=True)
    return tensor
