"""The cuda stage (chapter 4): hand-written kernels (cuda/dense_kernels.cu) as the ops dense_cuda::forward/backward.

Check it (GPU):  python grad_check.py cuda --device cuda
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

import modes

HERE = Path(__file__).resolve().parent


def _version_ideas() -> dict[int, str]:
    """dense_kernels.h's kVersionIdeas, the one list of the versions and their ideas."""
    text = (HERE / "dense_kernels.h").read_text()
    block = text.split("kVersionIdeas[kVersions + 1] = {", 1)[1].split("};", 1)[0]
    return dict(enumerate(re.findall(r'"((?:[^"\\]|\\.)*)"', block)))


KERNELS = _version_ideas()  # {0: "automatic: ...", 1: "naive, uncoalesced: ...", ...}

# nvcc's flags and the GPU architectures come from modes (modes.cuda_build), as in setup.py.
BUILD = modes.load_extension(
    "dense_cuda_ext", [HERE / "binding.cpp", HERE / "dense_kernels.cu"],
    extra_include_paths=[str(HERE.parent / "cpp"), str(HERE)])
dense = modes.register_dense_op("dense_cuda")


def select_kernel(version: int) -> int:
    """Use GEMM version ``version`` (see KERNELS) from now on; returns the previous one."""
    return torch.ops.dense_cuda.select_kernel(version)
