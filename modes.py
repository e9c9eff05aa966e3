"""The one door to the stages of the Dense layer, y = sigmoid(x Wᵀ + b).

Every script and test reaches a stage through this module:

    >>> import modes, torch
    >>> layer = modes.Dense(16, 4, mode="py")
    >>> layer(torch.randn(8, 16)).shape
    torch.Size([8, 4])

It also holds the plumbing the stages share, written once: the input checks, the
torch.library registration (autograd + fake kernels) used by every compiled stage, and
the loader that prefers an installed (setup.py) build and otherwise JIT-builds one.

Stage folders are loaded by path under names of their own (``dense_stage_py``...):
the folder ``py/`` cannot be imported as a package called ``py`` because pytest ships a
module of that name.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parent
MODES: tuple[str, ...] = ("py", "cpp", "triton", "cuda", "ptx")
FOLDERS = {"triton": "tiles"}  # a stage's folder, where it is not named as its mode (see _triton_reason)
DTYPES = (torch.float32, torch.float64)
# Host compiler flags for every extension, JIT or setup.py. Without -fopenmp the
# at::parallel_for in a header compiles to a serial loop; the libgomp it links is the one
# torch already loaded (same soname), so there is still one OpenMP runtime. -march=native:
# both builds run on the machine that built them, so use all of its vector instructions.
CXX_FLAGS = ["-O3", "-fopenmp", "-march=native"]
LD_FLAGS = ["-fopenmp"]

DenseFn = Callable[[Tensor, Tensor, "Tensor | None"], Tensor]

_stages: dict[str, ModuleType] = {}
_build_kind: dict[str, str] = {}  # extension name -> "installed" | "jit"


# ---------------------------------------------------------------------------
# Which modes work here
# ---------------------------------------------------------------------------

def _gpu_reason() -> str | None:
    if torch.version.cuda is None:
        return f"needs a CUDA build of torch and a GPU; this torch is {torch.__version__}"
    if not torch.cuda.is_available():
        return "needs a GPU; torch.cuda.is_available() is False"
    return None


def _compiler_reason(ext_name: str, cuda: bool = False) -> str | None:
    """None if the extension is installed or can be JIT-built here."""
    if importlib.util.find_spec(ext_name) is not None:
        return None
    if shutil.which(os.environ.get("CXX", "c++")) is None:
        return f"needs a C++ compiler to build {ext_name} (none found as $CXX or c++)"
    if cuda:
        from torch.utils.cpp_extension import CUDA_HOME

        if CUDA_HOME is None:
            return f"needs nvcc (CUDA_HOME) to build {ext_name}"
    return None


# triton is optional (not in requirements.txt). CI installs the release the GPU machines' torch
# ships with, 3.6.0, whose interpreter (the stage's CPU path) needs numpy < 2.4.
TRITON_INSTALL = 'pip install triton==3.6.0 "numpy<2.4"'


def _triton_reason() -> str | None:
    """None if the triton package is installed. A folder named triton/ on sys.path without an
    __init__.py would import as a namespace package (a spec with no origin): that is not Triton.
    (So chapter 3 lives in tiles/: as triton/, from the repository root it would pass for
    Triton wherever Triton is missing, and torch.compile would fail on it.)"""
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return f"needs Triton (optional): {TRITON_INSTALL}"
    return None


def available() -> dict[str, str | None]:
    """Map each mode to None where it works here, else to a one-line reason."""
    reasons: dict[str, str | None] = {"py": None, "cpp": _compiler_reason("dense_cpp_ext"),
                                      "triton": _triton_reason()}
    for mode in ("cuda", "ptx"):
        reasons[mode] = _gpu_reason() or _compiler_reason(f"dense_{mode}_ext", cuda=True)
    return reasons


def _require(mode: str) -> None:
    """Raise the clear error for a mode that is unknown or cannot run here."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    reason = available()[mode]
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
    _require(mode)
    name = f"dense_stage_{mode}"
    spec = importlib.util.spec_from_file_location(name, ROOT / FOLDERS.get(mode, mode) / "dense.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    _stages[mode] = module
    return module


def stage(mode: str) -> ModuleType:
    """The stage's own module (``<mode>/dense.py``), loaded on first use."""
    return _stage(mode)


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
    op = _stage(mode).dense

    if mode == "py":
        def checked(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
            check_inputs(x, weight, bias)
            return op(x, weight, bias)
    else:
        def checked(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
            try:
                return op(x, weight, bias)
            except (TypeError, ValueError, RuntimeError):
                check_inputs(x, weight, bias)  # raises the clear error if the inputs are at fault
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
        dense(mode)  # fails early, with the reason, if the mode is unavailable
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

def check_inputs(x: Tensor, weight: Tensor, bias: Tensor | None) -> None:
    """Raise a clear TypeError/ValueError for anything the op cannot compute on.

    The C++ stages repeat these checks (cpp/dense_common.h) for callers who reach the
    op through torch.ops directly.
    """
    for name, t in (("x", x), ("weight", weight), ("bias", bias)):
        if t is None and name == "bias":
            continue
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in DTYPES:
            raise TypeError(f"{name} has dtype {t.dtype}; Dense supports float32 and float64")
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


def register_dense_op(namespace: str) -> Callable[..., Tensor]:
    """Make ``torch.ops.<namespace>.forward`` traceable and vmap-able; returns the op.

    Every compiled stage defines the same two ops in C++ (schema in cpp/dense_common.h):
    ``forward(x, weight, bias?) -> out`` and
    ``backward(grad_out, x, weight, out, output_mask) -> (grad_x, grad_weight, grad_bias)``,
    and registers their autograd formula in C++ too (dense::implement_autograd, also in
    dense_common.h: no Python runs on the hot path). This adds, once for all stages, what
    only Python can register: the fake (shape-only) kernels torch.compile traces with, and
    the batching rules of torch.func.vmap.
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
        build_dir = ROOT / "build" / "jit" / name
        build_dir.mkdir(parents=True, exist_ok=True)
        built_libs = list(build_dir.glob("*.so"))
        newest = max((p.stat().st_mtime for p in built_libs), default=0.0)
        if any(s.stat().st_mtime > newest for s in _source_files(sources)):
            print(f"building the {name} extension in {build_dir.relative_to(ROOT)} "
                  "(about a minute the first time)...", file=sys.stderr, flush=True)
        with _build_guard(build_dir):
            _jit_build(name, sources, build_dir, extra_ldflags, jit_kwargs)
        kind = "jit"
    _build_kind[name] = kind
    return kind


class BuildError(RuntimeError):
    """A stage's C++/CUDA extension failed to compile or link; the message has the first errors."""


def _jit_build(name: str, sources: Sequence[Path], build_dir: Path, extra_ldflags: Sequence[str],
               jit_kwargs: dict) -> None:
    from torch.utils import cpp_extension

    try:
        cpp_extension.load(name=name, sources=[str(s) for s in sources], build_directory=str(build_dir),
                           is_python_module=False, extra_cflags=CXX_FLAGS,
                           extra_ldflags=LD_FLAGS + list(extra_ldflags), **jit_kwargs)
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


QUIET_WAIT_S = 2.0  # how long a process waits on the build lock before it says so


@contextlib.contextmanager
def _build_guard(build_dir: Path) -> Iterator[None]:
    """Hold an OS lock on the build folder while torch builds or loads the extension there.

    torch's own guard is the file ``<build_dir>/lock``, created at the start and deleted at
    the end; a build killed by SIGTERM/SIGKILL never deletes it, and every later load then
    waits for it forever. An flock, unlike that file, is released by the kernel when its
    holder dies, however it dies. So whoever holds our flock is the only process of ours
    building here, and a ``lock`` file it finds is stale: it is removed before torch looks.
    (Another build in progress makes us wait on the flock, which ends when that build does.
    Ranks that load a built extension at once hold it in turn for a moment each: the message
    comes only after QUIET_WAIT_S, so that they do not all announce a build that is not there.)
    """
    import fcntl

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
        if stale.exists():
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
