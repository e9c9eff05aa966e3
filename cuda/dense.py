"""The cuda stage (chapter 3): hand-written kernels (cuda/dense_kernels.cu) as the ops dense_cuda::forward/backward.

Check it (GPU):  python grad_check.py cuda --device cuda
"""

from __future__ import annotations

from pathlib import Path

import torch

import cli
import modes

HERE = Path(__file__).resolve().parent
catalog = cli.load_file("cuda/catalog.py")  # what dense_kernels.h declares
KERNELS = {v.id: v.idea for v in catalog.versions()}  # {0: "automatic: ...", 1: "naive, uncoalesced: ...", ...}
DTYPES = {v.id: v.dtypes for v in catalog.versions()}  # {1: ("f32", "f64"), ..., 11: ("f32", "f64", "bf16", "f16")}

# nvcc's flags and the GPU architectures come from modes (modes.cuda_build), as in setup.py.
BUILD = modes.load_extension(
    "dense_cuda_ext", [modes.ROOT / s for s in modes.cuda_stage_sources()],
    extra_include_paths=[str(HERE.parent / "cpp"), str(HERE)])
dense = modes.register_dense_op("dense_cuda")


def select_kernel(version: int) -> int:
    """Use GEMM version ``version`` (see KERNELS) from now on; returns the previous one."""
    return torch.ops.dense_cuda.select_kernel(version)
