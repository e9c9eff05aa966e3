"""The segmented ring with its loop in C++ (parallel/segmented_ring.cpp): an experiment.

The CPU benchmark (``python distributed.py --bench cpu``) runs it beside the Python version to
measure how much of our calls' CPU time is the interpreter's: both send the same messages
through the same process group, in the same order, and add the same segments (the results
are equal, bit for bit). It is not one of all_reduce's algorithms: it runs on gloo only and
needs a C++ build.

    from parallel import cpp_loop
    cpp_loop.build()                      # before the ranks start: a JIT build, about a minute once
    cpp_loop.segmented_ring(t)            # in every rank of the group, like all_reduce(t, algorithm="segmented_ring")
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from parallel import collectives
from parallel.ring import _buffer

NAME = "dense_collectives"
SOURCE = Path(__file__).resolve().parent / "segmented_ring.cpp"


def build() -> str:
    """Build (or find) and load the extension; returns how: "jit". Raises modes.BuildError if
    the compiler fails. Loading twice in a process is free."""
    import modes  # the one loader of extensions (JIT cache in build/jit/<name>, build lock)

    return modes.load_extension(NAME, [SOURCE])


def segmented_ring(tensor: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None) -> Tensor:
    """Sum (or average) ``tensor`` over the ranks of ``group`` in place, as
    ``all_reduce(tensor, op, "segmented_ring", group, check=False)`` does, with the loop in C++.
    Every rank must pass a tensor of the same numel and dtype (nothing is agreed first)."""
    collectives._validate(tensor, op, "segmented_ring")
    pg = group if group is not None else dist.group.WORLD
    if dist.get_backend(group) != "gloo" or tensor.device.type != "cpu":
        raise ValueError("the C++ segmented ring runs on gloo with CPU tensors only")
    if not tensor.is_contiguous():
        raise ValueError("the C++ segmented ring needs a contiguous tensor")
    build()
    flat = tensor.view(-1)
    n = dist.get_world_size(group)
    chunk = -(-flat.numel() // n)  # the longest chunk, and its longest segment below
    s = collectives._segments_per_chunk(chunk * flat.element_size())
    scratch = _buffer(2 * -(-chunk // s), flat, "segmented_cpp")
    torch.ops.dense_collectives.segmented_ring_(flat, pg.group_name, collectives.SEGMENT_BYTES, op == "avg",
                                                scratch)
    return tensor
