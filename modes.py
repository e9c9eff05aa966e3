"""The one door to the stages of the Dense layer, y = sigmoid(x Wᵀ + b).

Every script and test reaches a stage through this module:

    >>> import modes, torch
    >>> layer = modes.Dense(16, 4, mode="py")
    >>> layer(torch.randn(8, 16)).shape
    torch.Size([8, 4])

It also holds the plumbing the stages share, written once: the input checks, the Python
half of every compiled stage's registration (fake kernels for torch.compile, vmap rules; the
autograd formula is registered in C++, cpp/dense_common.h), the loader that prefers an
installed (setup.py) build and otherwise JIT-builds one, and the search for the CUDA toolkit
and the GPU architectures that setup.py and the JIT loader both build the GPU stages with.

Stage folders are loaded by path, by cli.load_file, which names a module by its path
(``py/dense.py`` is ``py_dense``): the folder ``py/`` cannot be imported as a package called
``py`` because pytest ships a module of that name.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.util
import math
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent
MODES: tuple[str, ...] = ("py", "cpp", "triton", "cuda", "ptx")
FOLDERS = {"triton": "tiles"}  # a stage's folder, where it is not named as its mode (see _triton_reason)
# The element types Dense takes, as nn.Linear does: float32 and float64, and bfloat16 and float16,
# which every stage that takes them accumulates in float32 (and rounds once, at the store).
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)
# What each mode takes. A mode that does not take a type says so, and names the modes that do.
MODE_DTYPES: dict[str, tuple[torch.dtype, ...]] = {
    "py": DTYPES, "cpp": DTYPES, "triton": DTYPES, "cuda": DTYPES, "ptx": (torch.float32, torch.float64),
}
# Host compiler flags for every extension, JIT or setup.py. Without -fopenmp the
# at::parallel_for in a header compiles to a serial loop; the libgomp it links is the one
# torch already loaded (same soname), so there is still one OpenMP runtime. -march=native:
# both builds run on the machine that built them, so use all of its vector instructions.
CXX_FLAGS = ["-O3", "-fopenmp", "-march=native"]
LD_FLAGS = ["-fopenmp"]
# nvcc's flags for the GPU stages' kernels (architectures: cuda_build()). -lineinfo maps the
# SASS back to source lines for the profilers, at no cost in speed.
NVCC_FLAGS = ["-O3", "-lineinfo"]

DenseFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]


def cuda_stage_sources() -> list[Path]:
    """The cuda stage's sources, relative to the repository: its binding, the kernels' host side,
    and one translation unit per GEMM version (cuda/units/), which ninja compiles side by side.
    The JIT build (cuda/dense.py) and setup.py both build this list."""
    units = sorted((ROOT / "cuda" / "units").glob("*.cu"))
    return [Path("cuda/binding.cpp"), Path("cuda/dense_kernels.cu"), *(u.relative_to(ROOT) for u in units)]

_stages: dict[str, ModuleType] = {}
_build_kind: dict[str, str] = {}  # extension name -> "installed" | "jit"
_verbose_builds = False  # modes.build(mode, verbose=True): show the JIT build's commands and warnings


# ---------------------------------------------------------------------------
# Which modes work here
# ---------------------------------------------------------------------------

def _no_gpu_reason() -> str | None:
    if not torch.cuda.is_available():
        return (f"needs a GPU: torch {torch.__version__} is a CUDA build, but torch.cuda.is_available() "
                "is False (no GPU or no NVIDIA driver here)")
    return None


def compiler_reason(ext_name: str, cuda: bool = False) -> str | None:
    """None if the extension is installed or can be JIT-built here (a GPU is not asked for)."""
    if importlib.util.find_spec(ext_name) is not None:
        return None
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return f"needs a C++ compiler to build {ext_name} (none found as $CXX or c++)"
    if cuda:
        try:
            cuda_build()
        except CudaBuildError as e:
            return str(e)
    return None


# triton is optional (not in requirements.txt). CI installs the release the GPU machines' torch
# ships with, 3.6.0, whose interpreter (the stage's CPU path) needs numpy < 2.4.
TRITON_INSTALL = 'pip install triton==3.6.0 "numpy<2.4"'


# Triton's interpreter (chapter 6's CPU path) must be chosen before Triton is first imported: its
# own language functions (tl.zeros, tl.cdiv...) are decorated then, compiled or interpreted for good.
# torch.compile imports Triton wherever it is installed, so where no GPU could run compiled kernels
# the choice is made here, as the one door loads, unless the user made it already.
if "triton" not in sys.modules and not os.environ.get("TRITON_INTERPRET") and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"


def _triton_reason() -> str | None:
    """None if the triton package is installed. A folder named triton/ on sys.path without an
    __init__.py would import as a namespace package (a spec with no origin): that is not Triton.
    (So chapter 6 lives in tiles/: as triton/, from the repository root it would pass for
    Triton wherever Triton is missing, and torch.compile would fail on it.)"""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return f"needs Triton (optional): {TRITON_INSTALL}"
    return None


def _cpp_reason() -> str | None:
    return compiler_reason("dense_cpp_ext")


def _gpu_build_reason(mode: str) -> str | None:
    if torch.version.cuda is None:
        return f"needs a CUDA build of torch; this torch is {torch.__version__}"
    return compiler_reason(f"dense_{mode}_ext", cuda=True)


def _gpu_stage_reason(mode: str) -> str | None:
    if torch.version.cuda is None:
        return f"needs a CUDA build of torch and a GPU; this torch is {torch.__version__}"
    reasons = [r for r in (_gpu_build_reason(mode), _no_gpu_reason()) if r]
    return "; and ".join(reasons) or None


# Why each mode cannot run here (None: it can). A new stage adds its mode to MODES and a line here.
_REASONS: dict[str, Callable[[], str | None]] = {
    "py": lambda: None,
    "cpp": _cpp_reason,
    "triton": _triton_reason,
    "cuda": lambda: _gpu_stage_reason("cuda"),
    "ptx": lambda: _gpu_stage_reason("ptx"),
}
# Why a stage cannot even be built and loaded here, for the stages that need more to run
# (a GPU) than to load; the others' reasons are the same as above.
_BUILD_REASONS: dict[str, Callable[[], str | None]] = {
    "cuda": lambda: _gpu_build_reason("cuda"),
    "ptx": lambda: _gpu_build_reason("ptx"),
}


def available() -> dict[str, str | None]:
    """Map each mode to None where it works here, else to a one-line reason."""
    return {mode: _REASONS[mode]() for mode in MODES}


def _require(mode: str, run: bool = True) -> None:
    """Raise the clear error for a mode that is unknown or cannot run here.

    With run=False the stage need only build and load here: a GPU stage loads, and its ops
    trace on fake tensors, on a machine without a GPU.
    """
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    reason = (_REASONS if run else {**_REASONS, **_BUILD_REASONS})[mode]()
    if reason is not None:
        raise RuntimeError(f"mode {mode!r} is not available here: {reason}")


def resolve(mode: str) -> tuple[list[str], dict[str, str]]:
    """A mode or "all" -> (the modes to run here, {skipped mode: why}), for the scripts.

    A single mode that cannot run here raises RuntimeError with the reason.
    """
    if mode != "all":
        _require(mode)
        return [mode], {}
    reasons = available()
    return [m for m in MODES if reasons[m] is None], {m: r for m, r in reasons.items() if r is not None}


def _stage(mode: str) -> ModuleType:
    if mode in _stages:
        return _stages[mode]
    _require(mode, run=False)
    import cli  # the one loader (after _require: its refusals need nothing of cli)

    module = _stages[mode] = cli.load_file(f"{FOLDERS.get(mode, mode)}/dense.py")
    return module


def stage(mode: str) -> ModuleType:
    """The stage's own module (``<mode>/dense.py``), loaded on first use.

    Loading builds (or finds) the stage's extension and registers its ops; it needs no GPU.
    """
    return _stage(mode)


def build(mode: str, verbose: bool = False) -> str | None:
    """Build (or find) and load the stage's extension, and run nothing; no GPU is needed.

    Returns "installed" or "jit" (None for the py stage, which has nothing to build). With
    verbose=True a JIT build shows the compiler's command lines and warnings.
    """
    global _verbose_builds
    _verbose_builds, before = verbose, _verbose_builds
    try:
        module = _stage(mode)
    finally:
        _verbose_builds = before
    return getattr(module, "BUILD", None)


_dense_fns: dict[str, DenseFn] = {}


def dense(mode: str) -> DenseFn:
    """The stage's differentiable functional op: ``dense(mode)(x, weight, bias)``.

    Inputs are checked once. The compiled stages check them in C++ (cpp/dense_common.h), so
    the hot path pays for no Python checks; if the op rejects its inputs, modes.check_inputs
    runs then, to replace the C++ message by the clear TypeError/ValueError. py checks first:
    its torch ops would accept some inputs that Dense must refuse (float16, integers).
    """
    if mode in _dense_fns:
        return _dense_fns[mode]
    # A GPU stage runs only where there is a GPU; under a FakeTensorMode (tracing, export) its
    # ops compute shapes alone, and a machine without one can trace it.
    from torch._guards import detect_fake_mode

    _require(mode, run=detect_fake_mode() is None)
    op = _stage(mode).dense

    if mode == "py":
        def checked(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
            x, weight, bias = autocast_inputs(x, weight, bias)  # the compiled ops' Autocast kernel does this
            check_inputs(x, weight, bias, mode)
            return op(x, weight, bias)
    else:
        def checked(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
            try:
                return op(x, weight, bias)
            except (TypeError, ValueError, RuntimeError):
                # raises the clear error if the inputs (as the op saw them) are at fault
                check_inputs(*autocast_inputs(x, weight, bias), mode)
                raise

    checked.__name__ = checked.__qualname__ = f"dense_{mode}"
    _dense_fns[mode] = checked
    return checked


# ---------------------------------------------------------------------------
# The one Dense module
# ---------------------------------------------------------------------------

class Dense(nn.Module):
    """sigmoid(nn.Linear(x)) computed by one of the stages.

    Parameters, shapes and default initialisation are nn.Linear's, so a state_dict moves
    between the two in either direction.
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        mode: str = "py",
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        dense(mode)  # fails early, with the reason, if the mode cannot run here
        self.in_features, self.out_features, self.mode = in_features, out_features, mode
        factory = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # The same calls in the same order as nn.Linear, so a seed gives the same weights.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.weight.shape[1]
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: Tensor) -> Tensor:
        # Looked up by name, not held: a module holding a local function cannot be pickled
        # (torch.save of the whole module), and after unpickling the stage loads on first use.
        return dense(self.mode)(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, mode={self.mode!r}")


# ---------------------------------------------------------------------------
# Shared plumbing: input checks, op registration, extension loading
# ---------------------------------------------------------------------------

def _names(dtypes: Sequence[torch.dtype]) -> str:
    words = [str(d).removeprefix("torch.") for d in dtypes]
    return ", ".join(words[:-1]) + " and " + words[-1] if len(words) > 1 else words[0]


def check_inputs(x: Tensor, weight: Tensor, bias: Tensor | None, mode: str | None = None) -> None:
    """Raise a clear TypeError/ValueError for anything the op cannot compute on; with a mode,
    also for an element type that mode does not take (naming the modes that do).

    The C++ stages repeat these checks (cpp/dense_common.h) for callers who reach the
    op through torch.ops directly.
    """
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; Dense supports {_names(DTYPES)}")
        if mode is not None and t.dtype not in MODE_DTYPES[mode]:
            others = [m for m in MODES if t.dtype in MODE_DTYPES[m]]
            raise TypeError(f"{name} has dtype {t.dtype}; mode {mode!r} takes {_names(MODE_DTYPES[mode])} "
                            f"({str(t.dtype).removeprefix('torch.')} runs in modes {', '.join(others)})")
    if x.dim() == 0:
        raise ValueError("x is 0-d; Dense needs x of shape (*, in_features)")
    if weight.dim() != 2:
        raise ValueError(f"weight must be 2-d (out_features, in_features), got shape {tuple(weight.shape)}")
    if x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x has in_features={x.shape[-1]} (its last dimension) but weight "
                         f"{tuple(weight.shape)} expects in_features={weight.shape[1]}")
    if weight.dtype != x.dtype:
        raise TypeError(f"dtype mismatch: x is {x.dtype} but weight is {weight.dtype}")
    if weight.device != x.device:
        raise ValueError(f"device mismatch: x is on {x.device} but weight is on {weight.device}")
    if bias is not None:
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"bias must have shape ({weight.shape[0]},) to match weight "
                             f"{tuple(weight.shape)}, got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise TypeError(f"dtype mismatch: x is {x.dtype} but bias is {bias.dtype}")
        if bias.device != x.device:
            raise ValueError(f"device mismatch: x is on {x.device} but bias is on {bias.device}")


# ---------------------------------------------------------------------------
# torch.autocast: the rule of F.linear
# ---------------------------------------------------------------------------
AUTOCAST_DEVICES = ("cpu", "cuda")


def autocast_inputs(x: Tensor, weight: Tensor, bias: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """The inputs as F.linear computes on them under torch.autocast: where autocast is on for x's
    device, every floating-point tensor but a float64 one cast to the autocast dtype (ATen's
    "lower_precision_fp" rule, which linear and matmul follow); elsewhere unchanged. The casts are
    differentiable: gradients reach float32 parameters in float32."""
    device = x.device.type if isinstance(x, Tensor) else None
    if device not in AUTOCAST_DEVICES or not torch.is_autocast_enabled(device):
        return x, weight, bias
    dtype = torch.get_autocast_dtype(device)

    def cast(t: Tensor | None) -> Tensor | None:
        eligible = isinstance(t, Tensor) and t.is_floating_point() and t.dtype != torch.float64
        return t.to(dtype) if eligible and t.device.type == device else t

    return cast(x), cast(weight), cast(bias)


_autocast_libraries: dict[str, torch.library.Library] = {}


def _register_autocast(namespace: str) -> None:
    """Give ``<namespace>::forward`` linear's autocast behaviour on CPU and CUDA: an Autocast kernel
    (torch.library's registration for a dispatch key, as torch.library.register_autocast makes
    one, but following the autocast context's dtype as linear does, where register_autocast
    casts to one fixed dtype) that casts the inputs, then calls the op with autocast off."""
    library = _autocast_libraries.setdefault(namespace, torch.library.Library(namespace, "FRAGMENT"))
    op = getattr(torch.ops, namespace).forward.default
    for device in AUTOCAST_DEVICES:
        def kernel(keyset, x: Tensor, weight: Tensor, bias: Tensor | None, device: str = device) -> Tensor:
            x, weight, bias = autocast_inputs(x, weight, bias)
            with torch.autocast(device, enabled=False):
                return op(x, weight, bias)

        library.impl("forward", kernel, "Autocast" + ("CPU" if device == "cpu" else "CUDA"), with_keyset=True)


def register_dense_op(namespace: str) -> Callable[..., Tensor]:
    """Make ``torch.ops.<namespace>.forward`` traceable and vmap-able; returns the op.

    Every compiled stage defines the same two ops in C++ (schema in cpp/dense_common.h):
    ``forward(x, weight, bias?) -> out`` and
    ``backward(grad_out, x, weight, out, output_mask) -> (grad_x, grad_weight, grad_bias)``,
    and registers their autograd formula in C++ too (dense::implement_autograd, also in
    dense_common.h: no Python runs on the hot path). This adds, once for all stages, what
    only Python can register: the fake (shape-only) kernels torch.compile traces with, the
    batching rules of torch.func.vmap, and linear's autocast behaviour (autocast_inputs).
    """
    ops = getattr(torch.ops, namespace)

    @torch.library.register_fake(f"{namespace}::forward")
    def _(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        check_inputs(x, weight, bias)
        return x.new_empty((*x.shape[:-1], weight.shape[0]))

    @torch.library.register_fake(f"{namespace}::backward")
    def _(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor,
          output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
        # Gradients nobody asked for come back as empty tensors: the schema returns Tensor.
        shapes = (x.shape, weight.shape, weight.shape[:1])
        return tuple(x.new_empty(s if m else (0,)) for s, m in zip(shapes, output_mask))

    def pick(t: Tensor | None, dim: int | None, i: int) -> Tensor | None:
        return t if t is None or dim is None else t.select(dim, i)

    @torch.library.register_vmap(f"{namespace}::forward")
    def _(info, in_dims, x: Tensor, weight: Tensor, bias: Tensor | None):
        x_dim, w_dim, b_dim = in_dims
        if w_dim is None and b_dim is None:
            # One layer, a batch of inputs: the op already folds leading dimensions into rows.
            return ops.forward(x.movedim(x_dim, 0), weight, bias), 0
        # A batch of layers: one call per layer (correct, not fast).
        return torch.stack([ops.forward(pick(x, x_dim, i), pick(weight, w_dim, i), pick(bias, b_dim, i))
                            for i in range(info.batch_size)]), 0

    @torch.library.register_vmap(f"{namespace}::backward")
    def _(info, in_dims, grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor, output_mask: Sequence[bool]):
        # Per-sample gradients (jacrev, vmap of grad) need one weight gradient per sample:
        # one call per sample, stacked.
        calls = [ops.backward(*(pick(t, d, i) for t, d in zip((grad_out, x, weight, out), in_dims)), output_mask)
                 for i in range(info.batch_size)]
        return tuple(torch.stack(gs) for gs in zip(*calls)), (0, 0, 0)

    _register_autocast(namespace)
    return ops.forward.default


def load_extension(name: str, sources: Sequence[Path], extra_ldflags: Sequence[str] = (),
                   **jit_kwargs) -> str:
    """Load the C++/CUDA extension ``name``: an installed build if there is one, else JIT.

    Loading runs the library's TORCH_LIBRARY registrations, after which its ops live in
    ``torch.ops``. Returns "installed" or "jit". A JIT build is cached in build/jit/<name>
    and rebuilt only when a source changes.
    """
    if name in _build_kind:
        return _build_kind[name]
    spec = importlib.util.find_spec(name)
    if spec is not None and os.environ.get("DENSE_FORCE_JIT") != "1":
        built = Path(spec.origin or "").stat().st_mtime
        stale = [s.name for s in _source_files(sources) if s.stat().st_mtime > built]
        if stale:
            warnings.warn(f"the installed {name} is older than {', '.join(stale)}; rebuild it with "
                          "`pip install --no-build-isolation .` or set DENSE_FORCE_JIT=1", stacklevel=2)
        importlib.import_module(name)
        kind = "installed"
    else:
        cuda = None
        if jit_kwargs.get("with_cuda") or any(Path(src).suffix == ".cu" for src in sources):
            cuda = cuda_build()  # raises CudaBuildError with what is missing, before any compiling
            jit_kwargs["with_cuda"] = True
            jit_kwargs["extra_cuda_cflags"] = [*NVCC_FLAGS, *cuda.nvcc_flags, *jit_kwargs.get("extra_cuda_cflags", [])]
        build_dir = ROOT / "build" / "jit" / name
        build_dir.mkdir(parents=True, exist_ok=True)
        built_libs = list(build_dir.glob("*.so"))
        newest = max((p.stat().st_mtime for p in built_libs), default=0.0)
        if any(s.stat().st_mtime > newest for s in _source_files(sources)):
            with_toolkit = f" with the CUDA toolkit in {cuda.home}, for GPUs {cuda.archs}" if cuda else ""
            print(f"building the {name} extension in {build_dir.relative_to(ROOT)}{with_toolkit} "
                  "(about a minute the first time)...", file=sys.stderr, flush=True)
        with _build_guard(build_dir):
            jit_build(name, sources, build_dir, [*CXX_FLAGS, *(cuda.cxx_flags if cuda else ())], extra_ldflags,
                       jit_kwargs)
        kind = "jit"
    _build_kind[name] = kind
    return kind


class BuildError(RuntimeError):
    """A stage's C++/CUDA extension failed to compile or link; the message has the first errors."""


def jit_build(name: str, sources: Sequence[Path], build_dir: Path, cflags: Sequence[str],
               extra_ldflags: Sequence[str], jit_kwargs: dict) -> None:
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(name=name, sources=[str(s) for s in sources], build_directory=str(build_dir),
                           is_python_module=False, extra_cflags=list(cflags),
                           extra_ldflags=LD_FLAGS + list(extra_ldflags), verbose=_verbose_builds, **jit_kwargs)
    except RuntimeError as e:
        text = str(e)
        if not text.startswith(f"Error building extension '{name}"):
            raise  # not a compiler failure (e.g. loading the library): torch's message is the right one
        log = build_dir / "build.log"
        log.write_text(text + "\n")
        lines = text.splitlines()
        # gcc/nvcc say "error:", the linker "undefined reference"; show the first few with context.
        hits = [i for i, line in enumerate(lines) if "error" in line.lower() or "undefined reference" in line]
        hits = [i for i in hits if not lines[i].startswith(("FAILED:", "ninja: build stopped", "Error building"))]
        first = lines[hits[0]:hits[0] + 6] if hits else lines[-6:]
        raise BuildError(f"building the {name} extension failed; the compiler said:\n  " + "\n  ".join(first)
                         + f"\nfull log: {log}") from None


# ---------------------------------------------------------------------------
# Building the GPU stages: the CUDA toolkit and the GPU architectures
# ---------------------------------------------------------------------------
# Used by setup.py and by the JIT loader alike. Nothing here asks for a GPU: what a build
# needs is a CUDA build of torch and nvcc.

# The GPUs the chapters target: sm_80 (A100, the oldest with cp.async and mma.sync's bfloat16,
# which GEMM v8, v9 and v21-v26 use), with its PTX, which the driver of a newer GPU compiles for
# itself when the extension loads, and sm_90a (H100, H200: "a" for the Hopper-only instructions of
# v31-v35, wgmma, TMA, setmaxnreg, which no PTX of another architecture can carry).
# TORCH_CUDA_ARCH_LIST, when set, replaces this list (without 9.0a, the Hopper versions do not run).
DEFAULT_CUDA_ARCHS = "8.0+PTX;9.0a"
# Headers of CUDA's maths libraries that torch's CUDA headers include. A toolkit may lack them
# (a minimal one, without cuBLAS); the nvidia-* pip wheels a CUDA torch depends on ship them.
LIBRARY_HEADERS = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")
FALLBACK_CUDA_HOME = Path("/usr/local/cuda")  # where the toolkit's installers put it, when nvcc is not on PATH


class CudaBuildError(BuildError):
    """A GPU stage cannot be built here (no CUDA torch, no nvcc, missing headers); one line says why."""


@dataclass(frozen=True)
class CudaBuild:
    """How this machine builds the GPU stages: see cuda_build()."""

    home: Path                   # the toolkit: bin/nvcc, include/cuda_runtime_api.h, lib64/libcudart.so
    archs: str                   # e.g. "8.0+PTX;9.0a", and where it came from
    nvcc_flags: tuple[str, ...]  # -gencode flags (none when TORCH_CUDA_ARCH_LIST decides)
    cxx_flags: tuple[str, ...]   # -idirafter <nvidia wheel include/> where the toolkit lacks a header


@functools.cache
def cuda_build() -> CudaBuild:
    """Find what building the GPU stages needs, and point torch's build helpers at it.

    - the toolkit is $CUDA_HOME (or $CUDA_PATH) if set, else the folder nvcc really lives in:
      an nvcc found on PATH may be a link or a wrapper script in a general bin/ folder, whose
      parent torch would take for the toolkit; nvcc itself reports its folder (``--dryrun``);
    - the architectures are TORCH_CUDA_ARCH_LIST if set, else DEFAULT_CUDA_ARCHS (torch would
      ask the visible GPUs, and without one it fails);
    - headers in LIBRARY_HEADERS that the toolkit lacks are taken from the nvidia pip wheels,
      searched after every other include folder, so that they never replace the toolkit's.

    Sets torch.utils.cpp_extension.CUDA_HOME to the toolkit found (the one variable torch's
    build helpers read it from). Raises CudaBuildError with one line saying what to install
    or set.
    """
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        raise CudaBuildError(f"needs a CUDA build of torch; this torch is {torch.__version__}")
    home = _cuda_home()
    cpp_extension.CUDA_HOME = str(home)
    archs, nvcc_flags = _arch_flags()
    return CudaBuild(home, archs, nvcc_flags, _idirafter(_library_include_dirs(home / "include")))


def _arch_flags() -> tuple[str, tuple[str, ...]]:
    """(the architectures and where they came from, nvcc's -gencode flags for them)."""
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        return f"{archs} (TORCH_CUDA_ARCH_LIST)", ()  # torch makes the flags from the variable itself
    flags = []
    for arch in DEFAULT_CUDA_ARCHS.split(";"):
        num = arch.removesuffix("+PTX").replace(".", "")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
        if arch.endswith("+PTX"):
            flags.append(f"-gencode=arch=compute_{num},code=compute_{num}")
    return f"{DEFAULT_CUDA_ARCHS} (modes.DEFAULT_CUDA_ARCHS)", tuple(flags)


def _library_include_dirs(include: Path) -> list[str]:
    """The nvidia wheels' include folders that hold the LIBRARY_HEADERS missing from ``include``."""
    dirs: list[str] = []
    for header in LIBRARY_HEADERS:
        if (include / header).is_file():
            continue
        wheels = (p.parent for root in _nvidia_wheel_roots() for p in sorted(root.glob(f"*/include/{header}")))
        found = str(next(wheels, "")) or None
        if found is None:
            raise CudaBuildError(f"{header} (CUDA's maths libraries) is neither in {include} nor in an nvidia-* pip "
                                 "wheel; reinstall the CUDA torch with its dependencies, or the full CUDA toolkit")
        if found not in dirs:
            dirs.append(found)
    return dirs


def _idirafter(dirs: Sequence[str]) -> tuple[str, ...]:
    return tuple(flag for d in dirs for flag in ("-idirafter", d))


def _cuda_home() -> Path:
    """The CUDA toolkit's folder (see cuda_build), or CudaBuildError."""
    set_to = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if set_to:
        if not _is_toolkit(Path(set_to)):
            raise CudaBuildError(f"CUDA_HOME={set_to} is not a CUDA toolkit (it needs bin/nvcc and "
                                 "include/cuda_runtime_api.h)")
        return Path(set_to)
    nvcc = shutil.which("nvcc")
    candidates = []
    if nvcc is not None:
        candidates.append(Path(nvcc).resolve().parent.parent)  # a link into the toolkit
        candidates.append(_nvcc_top(nvcc))                     # a wrapper script: nvcc knows
    candidates.append(FALLBACK_CUDA_HOME)
    for home in candidates:
        if home is not None and _is_toolkit(home):
            return home
    where = f"the nvcc on PATH ({nvcc}) is not in one" if nvcc else "nvcc is not on PATH"
    raise CudaBuildError(f"needs the CUDA toolkit (nvcc) to build the GPU stages, and {where}: install it, or set "
                         "CUDA_HOME to its folder (the one holding bin/nvcc)")


def _is_toolkit(home: Path) -> bool:
    return (home / "bin" / "nvcc").is_file() and (home / "include" / "cuda_runtime_api.h").is_file()


def _nvcc_top(nvcc: str) -> Path | None:
    """The toolkit folder nvcc reports in a dry run (``#$ TOP=<toolkit>/bin/..``)."""
    try:
        result = subprocess.run([nvcc, "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                                capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (result.stdout + result.stderr).splitlines():
        if line.startswith("#$ TOP="):
            return Path(line.removeprefix("#$ TOP=").strip()).resolve()
    return None


def _nvidia_wheel_roots() -> list[Path]:
    """The folders of NVIDIA's pip wheels (the namespace package ``nvidia``)."""
    spec = importlib.util.find_spec("nvidia")
    return [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []


QUIET_WAIT_S = 2.0  # how long a process waits on the build lock before it says so


@contextlib.contextmanager
def _build_guard(build_dir: Path) -> Iterator[None]:
    """Hold an OS lock on the build folder while torch builds or loads the extension there.

    torch's own guard (a FileBaton, up to torch 2.13) is the file ``<build_dir>/lock``,
    created at the start and deleted at the end; a build killed by SIGTERM/SIGKILL never
    deletes it, and every later load then waits for it forever. An flock, unlike that file, is
    released by the kernel when its holder dies, however it dies. So whoever holds our flock
    is the only process of ours building here, and a ``lock`` file it finds is stale: it is
    removed before torch looks. (torch 2.14 holds an OS lock on that file instead and leaves
    the file in place: there is nothing stale to remove then.)
    (Another build in progress makes us wait on the flock, which ends when that build does.
    Ranks that load a built extension at once hold it in turn for a moment each: the message
    comes only after QUIET_WAIT_S, so that they do not all announce a build that is not there.)
    """
    import fcntl

    from torch.utils import cpp_extension

    baton = hasattr(cpp_extension, "FileBaton")  # torch's guard is the file's existence

    def locked_within(handle, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)

    with open(build_dir / "build.flock", "w") as handle:
        if not locked_within(handle, QUIET_WAIT_S):
            print(f"waiting for another process building in {build_dir}...", file=sys.stderr, flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        stale = build_dir / "lock"
        if baton and stale.exists():
            print(f"removing {stale}, left by a build that was killed", file=sys.stderr, flush=True)
            stale.unlink(missing_ok=True)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _source_files(sources: Sequence[Path]) -> list[Path]:
    # Headers next to the sources count: editing one must trigger the message too.
    folders = {Path(s).parent for s in sources}
    headers = [h for f in folders for h in f.glob("*.h")]
    return [Path(s) for s in sources] + headers


def build_kind(name: str) -> str | None:
    """How the extension ``name`` was loaded in this process: "installed", "jit" or None."""
    return _build_kind.get(name)
