"""The PTX stage (chapter 4): chapter 3's kernels as hand-edited PTX (ptx/dense_kernels.ptx), loaded
at run time by ptx/loader.cpp through the CUDA driver API, as the ops dense_ptx::forward/backward.

Check it (GPU):  python grad_check.py ptx --device cuda
"""

from __future__ import annotations

from pathlib import Path

import torch

import modes

HERE = Path(__file__).resolve().parent
EDITED = HERE / "dense_kernels.ptx"
GENERATED = HERE / "generated" / "dense_kernels.ptx"  # bash ptx/regen.sh writes it

# with_cuda: torch's CUDA headers and libraries; the driver (libcuda) is not linked, the loader
# finds it at run time.
BUILD = modes.load_extension(
    "dense_ptx_ext", [HERE / "loader.cpp"], extra_include_paths=[str(HERE.parent / "cpp"), str(HERE.parent / "cuda")],
    with_cuda=True)
dense = modes.register_dense_op("dense_ptx")


def load_ptx(path: Path | str = EDITED) -> None:
    """Use the kernels of this PTX file from now on (the compiler's own, to measure the edits)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} does not exist" + (" (run: bash ptx/regen.sh)" if path == GENERATED else ""))
    torch.ops.dense_ptx.load_ptx(path.read_text())


def select_kernel(version: int) -> int:
    """Use GEMM version ``version`` (see cuda/dense.py's KERNELS); returns the previous one."""
    return torch.ops.dense_ptx.select_kernel(version)


load_ptx(EDITED)
