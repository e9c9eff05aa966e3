"""Stage 3's kernels on the CPU: cuda/kernels/*.cuh built by the host compiler on top of the
execution-model emulation cuda/emulate/cuda_emu.h, loaded with ctypes, called on CPU tensors.

No torch headers, no GPU: the library builds in seconds. Slow (one OS thread per GPU thread):
for checking kernels on small shapes, never for speed.

Check it:  python grad_check.py cuda --emulate
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = sorted([HERE / "dense_kernels.h", *(HERE / "kernels").glob("*.cuh"), *(HERE / "emulate").glob("*.h"),
                  HERE / "emulate" / "emulate.cpp"])
CXX_FLAGS = ["-std=c++17", "-O2", "-pthread", "-shared", "-fPIC", f"-I{HERE}"]
KPLAIN, KBIAS_SIGMOID = 0, 1  # dense_kernels::Epilogue
# The emulated device's SM count: small, so that the small shapes of the tests already take
# the paths a real GPU takes for small batches (v9's split-K, the backward's v3 row blocks).
SM_COUNT = 8

_lib: ctypes.CDLL | None = None


def versions() -> range:
    """The GEMM versions (0: automatic), as many as cuda/dense_kernels.h's kVersions."""
    text = (HERE / "dense_kernels.h").read_text()
    return range(int(text.split("constexpr int kVersions = ", 1)[1].split(";", 1)[0]) + 1)


def unavailable_reason() -> str | None:
    """None if the emulation can be built here, else why not."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "needs a C++ compiler (none found as $CXX or c++)"
    return None


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the library (once per source state) into build/emulate/; returns its path."""
    digest = hashlib.sha256()
    for path in SOURCES:
        digest.update(path.name.encode() + path.read_bytes())
    digest.update(" ".join(CXX_FLAGS + list(extra_flags)).encode())
    out = ROOT / "build" / "emulate" / f"libdense_emu_{digest.hexdigest()[:12]}.so"
    if not out.exists():
        reason = unavailable_reason()
        if reason:
            raise RuntimeError(f"the CPU emulation {reason}")
        out.parent.mkdir(parents=True, exist_ok=True)
        print(f"building the CPU emulation of the kernels in {out.parent.relative_to(ROOT)} (seconds)...",
              file=sys.stderr, flush=True)
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [os.environ.get("CXX", "c++"), *CXX_FLAGS, *extra_flags, str(HERE / "emulate" / "emulate.cpp"),
               "-o", str(tmp)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"building the CPU emulation failed:\n{' '.join(cmd)}\n{result.stderr[-4000:]}")
        os.replace(tmp, out)  # atomic: a concurrent build never loads half a file
    return out


def library() -> ctypes.CDLL:
    global _lib
    if _lib is None:
        lib = ctypes.CDLL(str(build()))
        p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
        lib.emu_gemm.argtypes = [i32, ctypes.c_char_p, i32, p, p, p, p, i64, i64, i64, i32, i32, p]
        lib.emu_gemm_workspace.argtypes = [i32, i32, i64, i64, i64, i32]
        lib.emu_sigmoid_grad.argtypes = [i32, i32, i32, p, p, p, p, i64, i64, i32, p]
        lib.emu_sigmoid_grad_workspace.argtypes = [i32, i64, i64, i32]
        lib.emu_gemm.restype = lib.emu_sigmoid_grad.restype = i32
        lib.emu_gemm_workspace.restype = lib.emu_sigmoid_grad_workspace.restype = i64
        _lib = lib
    return _lib


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(*tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and (t.device.type != "cpu" or not t.is_contiguous()):
            raise ValueError("the emulated kernels read contiguous CPU tensors")


def gemm(version: int, layout: str, a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None,
         m: int, n: int, k: int, epilogue: int, sm_count: int = SM_COUNT) -> None:
    """c[m×n] = op(a)·op(b) (+ epilogue), the layouts of cuda/dense_kernels.h; writes c."""
    _check(a, b, c, bias)
    lib = library()
    # the split-K workspace, allocated by the caller as cuda/dense_ops.h does on the GPU
    size = lib.emu_gemm_workspace(version, a.element_size(), m, n, k, sm_count)
    work = torch.empty(max(size, 0), dtype=a.dtype)
    rc = lib.emu_gemm(version, layout.encode(), a.element_size(), _ptr(a), _ptr(b), _ptr(c), _ptr(bias),
                      m, n, k, epilogue, sm_count, _ptr(work) if size > 0 else None)
    if rc != 0:
        raise ValueError(f"no emulated GEMM version {version} for layout {layout!r} and dtype {a.dtype}")


GRAD_VERSIONS = (1, 2, 3)  # dense_kernels::kGradVersions


def sigmoid_grad(g: Tensor, y: Tensor, dz: Tensor, db: Tensor | None, version: int = 0, x4: bool = False,
                 sm_count: int = SM_COUNT) -> None:
    """dz = g·y·(1 − y); db = Σ_rows dz when db is given (rows × cols = y's shape)."""
    _check(g, y, dz, db)
    rows, cols = y.shape
    lib = library()
    size = lib.emu_sigmoid_grad_workspace(version, rows, cols, sm_count) if db is not None else 0
    work = torch.empty(max(size, 0), dtype=y.dtype)
    rc = lib.emu_sigmoid_grad(version, y.element_size(), int(x4), _ptr(g), _ptr(y), _ptr(dz), _ptr(db), rows, cols,
                              sm_count, _ptr(work) if size > 0 else None)
    if rc != 0:
        raise ValueError(f"no emulated sigmoid-grad kernel v{version} for x4={x4}, dtype {y.dtype}, {cols} columns")


# The two ops, step for step as cuda/dense_ops.h does them on the GPU.
def forward(x: Tensor, weight: Tensor, bias: Tensor | None, version: int = 0) -> Tensor:
    x2 = x.reshape(-1, weight.shape[1]).contiguous()
    w, b = weight.contiguous(), None if bias is None else bias.contiguous()
    m, n, k = x2.shape[0], w.shape[0], w.shape[1]
    out = torch.empty(*x.shape[:-1], n, dtype=x.dtype)
    gemm(version, "nt", x2, w, out.view(m, n), b, m, n, k, KBIAS_SIGMOID)
    return out


def backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor, mask: tuple[bool, bool, bool],
             version: int = 0, grad_version: int = 0) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    in_f, out_f = weight.shape[1], weight.shape[0]
    g = grad_out.reshape(-1, out_f).contiguous()
    y = out.reshape(-1, out_f).contiguous()
    rows = y.shape[0]
    dz = torch.empty_like(y)
    db = torch.empty(out_f, dtype=y.dtype) if mask[2] else None
    sigmoid_grad(g, y, dz, db, grad_version)
    w = weight.contiguous()
    dx = dw = None
    if mask[0]:
        dx = torch.empty(rows, in_f, dtype=x.dtype)
        gemm(version, "nn", dz, w, dx, None, rows, in_f, out_f, KPLAIN)
        dx = dx.view(x.shape)
    if mask[1]:
        x2 = x.reshape(-1, in_f).contiguous()
        dw = torch.empty(out_f, in_f, dtype=x.dtype)
        gemm(version, "tn", dz, x2, dw, None, out_f, in_f, rows, KPLAIN)
    return dx, dw, db


def dense(version: int = 0) -> Callable[[Tensor, Tensor, Tensor | None], Tensor]:
    """The layer y = sigmoid(x Wᵀ + b) with forward and backward on the emulated kernels."""

    class Emulated(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
            out = forward(x, weight, bias, version)
            ctx.save_for_backward(x, weight, out)
            ctx.has_bias = bias is not None
            return out

        @staticmethod
        def backward(ctx, grad_out: Tensor):
            x, weight, out = ctx.saved_tensors
            mask = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
            return backward(grad_out, x, weight, out, mask, version)

    def call(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
        import modes  # the repository's one set of input checks (shapes, dtypes, devices)

        modes.check_inputs(x, weight, bias)
        if x.device.type != "cpu":
            raise ValueError(f"the emulated kernels run on CPU tensors; x is on {x.device}")
        return Emulated.apply(x, weight, bias)

    call.__name__ = f"dense_cuda_emulated_v{version}"
    return call
