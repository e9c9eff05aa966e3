"""Chapter 8, tensor parallelism (README.md). Read the code in this order: layers.py (the
column- and row-parallel Dense layers, and their sequence-parallel, overlapped form),
training.py (the dp × tp process groups, checkpoints of the unsharded state, and
TensorParallel, the training loop's strategy); bench.py
times a step against torch's parallelize_module, report.py counts the bytes and draws the
figures.

    from parallel.tp import ColumnParallelDense, RowParallelDense
"""

from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name in ("ColumnParallelDense", "RowParallelDense"):  # looked up on first use, as in parallel/__init__.py
        return getattr(importlib.import_module("parallel.tp.layers"), name)
    raise AttributeError(f"module 'parallel.tp' has no attribute {name!r}")
