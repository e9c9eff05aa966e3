"""Stage 3: hand-written CUDA kernels (cuda/dense_kernels.cu) as the ops dense_cuda::forward/backward.

Check it (GPU):  python grad_check.py cuda --device cuda
"""

from __future__ import annotations

from pathlib import Path

import torch

import modes

HERE = Path(__file__).resolve().parent
KERNELS = {
    0: "automatic: v3 when its 128×128 tiles fill the GPU, else v4",
    1: "one thread per output",
    2: "32×32 shared-memory tiles",
    3: "register tiles (8×8 per thread, 128×128 per block), 128-bit loads",
    4: "register tiles, smaller (4×4 per thread, 64×64 per block) for small batches",
}

BUILD = modes.load_extension(
    "dense_cuda_ext", [HERE / "binding.cpp", HERE / "dense_kernels.cu"],
    extra_include_paths=[str(HERE.parent / "cpp"), str(HERE)],
    extra_cuda_cflags=["-O3", "-lineinfo", "-std=c++17"])
dense = modes.register_dense_op("dense_cuda")


def select_kernel(version: int) -> int:
    """Use GEMM version ``version`` (see KERNELS) from now on; returns the previous one."""
    return torch.ops.dense_cuda.select_kernel(version)
