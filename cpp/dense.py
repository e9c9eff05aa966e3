"""Chapter 2: the Dense layer as C++ ops (cpp/dense.cpp), with their autograd formula in C++ too.

Loading the extension runs its TORCH_LIBRARY blocks (the ops, their CPU/CUDA kernels and their
Autograd kernel, dense::DenseFunction in dense_common.h); modes.register_dense_op adds what only
Python registers: the fake kernels for torch.compile and torch.export, and the vmap rules.

Check it:  python grad_check.py cpp
"""

from __future__ import annotations

from pathlib import Path

import modes

HERE = Path(__file__).resolve().parent
BUILD = modes.load_extension("dense_cpp_ext", [HERE / "dense.cpp"])
dense = modes.register_dense_op("dense_cpp")
