"""The CUDA chapter's kernels on the CPU: cuda/kernels/*.cuh built by the host compiler on top of
the execution-model emulation cuda/emulate/cuda_emu.h, loaded with ctypes, called on CPU tensors.

No torch headers, no GPU: the library builds in seconds. A GPU thread is a fiber here (a
user-space thread; cuda/emulate/fibers.h), so a call costs microseconds per thread and barrier:
for checking kernels on small shapes, never for speed.

Check it:  python grad_check.py cuda --emulate

Run as a script, it times one GEMM call per version on fibers and on OS threads (the build
ThreadSanitizer needs, -DCUDA_EMU_THREADS): the price of a barrier that wakes OS threads.

With --slices it prints instead how many slices of K version 0 gives a float32 product on
devices of that many SMs (1: no split, v8 runs), at M = 32, N = K = 4096 unless given.

Examples:
  python cuda/emulated.py                          # M = N = K = 64, every version
  python cuda/emulated.py -m 33 -n 17 -k 65 --versions 3 5 8
  python cuda/emulated.py --slices 2 8 114 132
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SOURCES = sorted([HERE / "dense_kernels.h", HERE / "gemm_choice.h", *(HERE / "kernels").glob("*.cuh"),
                  *(HERE / "tensor_cores").glob("*.cuh"),
                  *(HERE / "units").glob("*.cu"), *(HERE / "emulate").glob("*.h"), HERE / "emulate" / "emulate.cpp"])
CXX_FLAGS = ["-std=c++17", "-O2", "-pthread", "-shared", "-fPIC", "-fvisibility=hidden", f"-I{HERE}"]
KPLAIN, KBIAS_SIGMOID = 0, 1  # dense_kernels::Epilogue
# The emulated device's SM count: small, so that the small shapes of the tests already take
# the paths a real GPU takes for small batches (v9's split-K, the backward's v3 row blocks).
SM_COUNT = 8
ARCH = 0     # to emu_resolve: the emulated device's compute capability (sm_90a: 90, unless emu_set_arch)
ATEN = -1    # dense_kernels::kAten: version 0 found no kernel confirmed on a GPU; ATen's ops run

_lib: ctypes.CDLL | None = None


if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))
import cli  # noqa: E402

catalog = cli.load_file("cuda/catalog.py")  # what dense_kernels.h declares
# The element types the kernels take, in dense_kernels::DType order, and the accumulator of each.
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
DTYPE_NAMES = dict(zip(DTYPES, catalog.DTYPES))  # torch.bfloat16 -> "bf16"


def dtype_code(dtype: torch.dtype) -> int:
    """dense_kernels::DType of a torch dtype; ValueError for one the kernels do not take."""
    if dtype not in DTYPES:
        raise ValueError(f"the kernels take float32, float64, bfloat16 and float16, not {dtype}")
    return DTYPES.index(dtype)


def acc_dtype(dtype: torch.dtype) -> torch.dtype:
    """The accumulator's type: float64 for float64, float32 for every other (workspaces are of it)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def versions(dtype: torch.dtype | None = None) -> list[int]:
    """The GEMM versions, 0 (automatic) first, in cuda/dense_kernels.h's kVersionInfo; with a
    dtype, those built for it."""
    return [0, *catalog.version_ids(dtype=None if dtype is None else DTYPE_NAMES[dtype])]


def idea(version: int) -> str:
    """A version's idea in one line: its entry in cuda/dense_kernels.h's kVersionInfo."""
    return catalog.idea(version)


def unavailable_reason() -> str | None:
    """None if the emulation can be built here, else why not."""
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return "needs a C++ compiler (none found as $CXX or c++)"
    return None


def build(extra_flags: tuple[str, ...] = ()) -> Path:
    """Compile the library (once per source state) into build/emulate/; returns its path."""
    out = ROOT / "build" / "emulate" / f"libdense_emu_{cli.source_digest(SOURCES, *CXX_FLAGS, *extra_flags)}.so"
    if not out.exists():
        with cli.build_lock(out):
            _build(out, extra_flags)
    return out


def _build(out: Path, extra_flags: tuple[str, ...]) -> None:
    if not out.exists():  # (another process may have built it while this one waited for the lock)
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


def load(extra_flags: tuple[str, ...] = ()) -> ctypes.CDLL:
    """Build (if needed) and load the library with these extra compiler flags, e.g.
    ("-DCUDA_EMU_THREADS",) for the OS-thread emulation that ThreadSanitizer needs."""
    lib = ctypes.CDLL(str(build(extra_flags)))
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.emu_gemm.argtypes = [i32, ctypes.c_char_p, i32, p, p, p, p, i64, i64, i64, i32, i32, p]
    lib.emu_gemm_workspace.argtypes = [i32, i32, i64, i64, i64, i32]
    lib.emu_sigmoid_grad.argtypes = [i32, i32, i32, p, p, p, p, i64, i64, i32, p]
    lib.emu_sigmoid_grad_workspace.argtypes = [i32, i64, i64, i32]
    lib.emu_gemm.restype = lib.emu_sigmoid_grad.restype = i32
    lib.emu_gemm_workspace.restype = lib.emu_sigmoid_grad_workspace.restype = i64
    lib.emu_has_entry.argtypes, lib.emu_has_entry.restype = [i32, i32, i32, i32], i32
    lib.emu_resolve.argtypes = [i32, ctypes.c_char_p, i32, p, p, i64, i64, i64, i32, i32, i32]
    lib.emu_resolve.restype = i32
    lib.emu_grad_kernels_confirmed.argtypes, lib.emu_grad_kernels_confirmed.restype = [i32], i32
    lib.emu_uses_tma.argtypes, lib.emu_uses_tma.restype = [i32], i32
    return lib


def library() -> ctypes.CDLL:
    """The default build (fibers), loaded once."""
    global _lib
    if _lib is None:
        _lib = load()
    return _lib


INVALID, NEVER_FINISHED = 1, 2  # the launchers' return codes (cuda/emulate/emulate.cpp)


def _raise_for(rc: int, what: str) -> None:
    if rc == NEVER_FINISHED:
        raise RuntimeError(f"{what}: a block could not finish (a barrier not every thread reaches; "
                           "the emulation printed which on stderr)")
    if rc != 0:
        raise ValueError(f"no {what}")


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _check(*tensors: Tensor | None) -> None:
    for t in tensors:
        if t is not None and (t.device.type != "cpu" or not t.is_contiguous()):
            raise ValueError("the emulated kernels read contiguous CPU tensors")


def gemm(version: int, layout: str, a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None,
         m: int, n: int, k: int, epilogue: int, sm_count: int = SM_COUNT, lib: ctypes.CDLL | None = None) -> None:
    """c[m×n] = op(a)·op(b) (+ epilogue), the layouts of cuda/dense_kernels.h; writes c."""
    _check(a, b, c, bias)
    lib = lib or library()
    # the split-K workspace, allocated by the caller as cuda/dense_ops.h does on the GPU
    code = dtype_code(a.dtype)
    # version 0's choice depends on the operands' alignment (TMA): made once, for the workspace too
    version = lib.emu_resolve(version, layout.encode(), code, _ptr(a), _ptr(b), m, n, k, sm_count, ARCH, 0)
    if version == ATEN:
        _aten_gemm(layout, a, b, c, bias, epilogue)
        return
    size = lib.emu_gemm_workspace(version, code, m, n, k, sm_count)
    work = torch.empty(max(size, 0), dtype=acc_dtype(a.dtype))
    rc = lib.emu_gemm(version, layout.encode(), code, _ptr(a), _ptr(b), _ptr(c), _ptr(bias),
                      m, n, k, epilogue, sm_count, _ptr(work) if size > 0 else None)
    if rc == INVALID and lib.emu_uses_tma(version):
        contiguous = {"nt": "K", "nn": "K and N", "tn": "M and N"}.get(layout, "K")
        raise ValueError(f"GEMM version {version} takes its operands through TMA, which copies rows of whole 16-byte "
                         f"multiples from 16-byte-aligned tensors: {contiguous} must be multiples of "
                         f"{16 // a.element_size()} for {a.dtype} in layout {layout!r} (version 0 chooses another "
                         f"version where they are not)")
    _raise_for(rc, f"emulated GEMM version {version} for layout {layout!r} and dtype {a.dtype}")


def _aten_gemm(layout: str, a: Tensor, b: Tensor, c: Tensor, bias: Tensor | None, epilogue: int) -> None:
    """What cuda/dense_ops.h hands to ATen where version 0 has no confirmed kernel: the
    reference's own ops (one addmm, z rounded once after the bias, then the sigmoid)."""
    op_a, op_b = (a.t() if layout[0] == "t" else a), (b.t() if layout[1] == "t" else b)
    if epilogue == KBIAS_SIGMOID:
        c.copy_(torch.sigmoid(op_a @ op_b if bias is None else torch.addmm(bias, op_a, op_b)))
    else:
        c.copy_(op_a @ op_b)


# The versions that compute float32 in TF32 (10 bits of mantissa), judged against a TF32 GEMM's
# error (grad_check.TF32Linear); the split-TF32 ones (26, 34) are judged by float32's rule.
TF32_VERSIONS = (25,)


def row_multiple(version: int, dtype: torch.dtype) -> int:
    """What every dimension of a Dense layer must be a multiple of for GEMM version ``version``
    to run its forward and backward in ``dtype``: a TMA version copies rows of whole 16 bytes,
    and each of B, in and out is a row's length in one of the three layouts; 1 for the others."""
    return 16 // torch.empty((), dtype=dtype).element_size() if library().emu_uses_tma(version) else 1


def _tune_api(lib: ctypes.CDLL) -> ctypes.CDLL:
    p, i32 = ctypes.POINTER(ctypes.c_int), ctypes.c_int
    lib.emu_tune_count.argtypes, lib.emu_tune_count.restype = [], i32
    lib.emu_tune_id.argtypes, lib.emu_tune_id.restype = [i32], i32
    lib.emu_tune_shape.argtypes, lib.emu_tune_shape.restype = [i32, p], i32
    return lib


TUNE_FIELDS = ("bm", "bn", "bk", "wm", "wn", "tm", "tn", "min_blocks", "threads")


def tune_candidates(lib: ctypes.CDLL | None = None) -> list[dict]:
    """The autotuning candidates (dense_kernels::kTuneCandidates): each one's shape, and the
    "version" that gemm() launches it as (float32 only)."""
    lib = _tune_api(lib or library())
    out = []
    for i in range(lib.emu_tune_count()):
        shape = (ctypes.c_int * len(TUNE_FIELDS))()
        if lib.emu_tune_shape(i, shape) != 0:
            raise RuntimeError(f"the emulation has no autotuning candidate {i}")
        out.append({"candidate": i, "version": lib.emu_tune_id(i), **dict(zip(TUNE_FIELDS, shape))})
    return out


def resolve(version: int, m: int, n: int, k: int, dtype: torch.dtype, sm_count: int = SM_COUNT, layout: str = "nt",
            aligned: bool = True, arch: int | None = None, kernels_only: bool = False, predicted: bool = False,
            lib: ctypes.CDLL | None = None) -> int:
    """What a call asking for ``version`` (0: automatic) runs for an m×n×k product in ``layout``
    (dense_kernels::resolve_version, the one resolver): ATEN where version 0 has no kernel
    confirmed on a GPU for the type. ``aligned``: operands at 16-byte-aligned addresses (their
    rows' lengths decide the rest of what TMA needs); ``arch``: the device's compute capability
    (default: the emulated device's); ``kernels_only``: as a launcher or the PTX stage resolves
    (never ATEN); ``predicted``: from the table of predictions instead of the confirmed defaults."""
    lib = lib or library()
    ptr = None if aligned else 8  # a misaligned address; nothing is read through it
    flags = int(kernels_only) | 2 * int(predicted)
    return lib.emu_resolve(version, layout.encode(), dtype_code(dtype), ptr, ptr, m, n, k, sm_count,
                           ARCH if arch is None else arch, flags)


def grad_kernels_confirmed(dtype: torch.dtype, lib: ctypes.CDLL | None = None) -> bool:
    """Whether version 0's backward runs the sigmoid-grad kernels in ``dtype`` (else ATen's ops)."""
    return bool((lib or library()).emu_grad_kernels_confirmed(dtype_code(dtype)))


GRAD_VERSIONS = (1, 2, 3)  # dense_kernels::kGradVersions


def sigmoid_grad(g: Tensor, y: Tensor, dz: Tensor, db: Tensor | None, version: int = 0, x4: bool = False,
                 sm_count: int = SM_COUNT, lib: ctypes.CDLL | None = None) -> None:
    """dz = g·y·(1 − y); db = Σ_rows dz when db is given (rows × cols = y's shape)."""
    _check(g, y, dz, db)
    rows, cols = y.shape
    lib = lib or library()
    size = lib.emu_sigmoid_grad_workspace(version, rows, cols, sm_count) if db is not None else 0
    work = torch.empty(max(size, 0), dtype=acc_dtype(y.dtype))
    rc = lib.emu_sigmoid_grad(version, dtype_code(y.dtype), int(x4), _ptr(g), _ptr(y), _ptr(dz), _ptr(db), rows,
                              cols, sm_count, _ptr(work) if size > 0 else None)
    _raise_for(rc, f"emulated sigmoid-grad kernel v{version} for x4={x4}, dtype {y.dtype}, {cols} columns")


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
    if version == 0 and grad_version == 0 and not grad_kernels_confirmed(y.dtype):
        dz.copy_(torch.ops.aten.sigmoid_backward(g, y))  # ATen's ops, as cuda/dense_ops.h there
        if db is not None:
            db.copy_(dz.sum(0))
    else:
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


def time_call(version: int, m: int, n: int, k: int, lib: ctypes.CDLL, repeats: int = 3) -> float:
    """Seconds of one float32 nt GEMM call with the fused epilogue (the fastest of `repeats`)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    c, bias = torch.empty(m, n), torch.randn(n, generator=g)
    best = float("inf")
    for _ in range(repeats + 1):  # one more: the first maps the fibers' stacks / starts the threads
        start = time.perf_counter()
        gemm(version, "nt", a, b, c, bias, m, n, k, KBIAS_SIGMOID, lib=lib)
        best = min(best, time.perf_counter() - start)
    return best


def threads_per_block(version: int) -> int:
    """A float32 block's threads: BM·BN/(TM·TN) from cuda/static_report.py's TILES."""
    bm, bn, tm, tn, _ = cli.load_file("cuda/static_report.py").TILES[version]["f32"]
    return bm * bn // (tm * tn)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    size = cli.positive(int)
    parser.add_argument("-m", type=size, help="rows of C, the batch (default 64; --slices: 32)")
    parser.add_argument("-n", type=size, help="columns of C, out features (default 64; --slices: 4096)")
    parser.add_argument("-k", type=size, help="the reduction, in features (default 64; --slices: 4096)")
    parser.add_argument("--versions", type=int, nargs="+", metavar="N", default=catalog.cuda_core_versions())
    parser.add_argument("--slices", type=size, nargs="+", metavar="SMS",
                        help="print v9's slices of K on devices of these SM counts instead")
    args = parser.parse_args(argv)
    if any(v not in catalog.cuda_core_versions() for v in args.versions):
        parser.error(f"--versions takes {', '.join(map(str, catalog.cuda_core_versions()))}")
    if unavailable_reason():
        raise cli.UserError(f"cannot emulate: {unavailable_reason()}")
    if args.slices:
        m, n, k = args.m or 32, args.n or 4096, args.k or 4096
        print(f"float32, M={m} N={n} K={k}: slices of K (1: no split) on")
        for sms in args.slices:
            v = resolve(0, m, n, k, torch.float32, sms)
            work = library().emu_gemm_workspace(v, dtype_code(torch.float32), m, n, k, sms)
            print(f"  {sms:4d} SMs: {max(1, work // (m * n))}")
        return 0
    args.m, args.n, args.k = args.m or 64, args.n or 64, args.k or 64
    if args.m * args.n * args.k > 1 << 21:
        raise cli.UserError(f"M·N·K = {args.m * args.n * args.k:,} would take minutes on OS threads; "
                            "keep it at most 2,097,152 (128×128×128)")
    fibers, threads = library(), load(("-DCUDA_EMU_THREADS",))
    print(f"one float32 nt GEMM, M={args.m} N={args.n} K={args.k}, ms per call (fastest of 3)")
    print("| v | threads per block | fibers | OS threads | OS threads / fibers |")
    print("|---|---:|---:|---:|---:|")
    for v in args.versions:
        f, t = time_call(v, args.m, args.n, args.k, fibers), time_call(v, args.m, args.n, args.k, threads)
        print(f"| {v} | {threads_per_block(v)} | {1e3 * f:.2f} | {1e3 * t:.2f} | {t / f:.0f} |", flush=True)
    return 0


if __name__ == "__main__":
    cli.run(main)
