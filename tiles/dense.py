"""Chapter 6: the Dense layer as Triton kernels (tiles/kernels.py), as the ops dense_triton::forward/backward.

Where a GPU is present the kernels are compiled for it and take CUDA tensors; where none is,
Triton's interpreter runs them on CPU tensors (NumPy underneath: right answers, no speed).

Check it:  python grad_check.py triton
"""

from __future__ import annotations

import contextlib
import math
import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor
from torch.autograd import forward_ad
from torch.library import wrap_triton

import cli
import modes

HERE = Path(__file__).resolve().parent

# ---------------------------------------------------------------------------
# Compiled or interpreted: decided once, before the kernels exist
# ---------------------------------------------------------------------------

# @triton.jit reads TRITON_INTERPRET when it decorates a kernel, so it is set before kernels.py
# runs. Without a GPU the interpreter is the only way; with one, TRITON_INTERPRET=1 asks for it.
INTERPRETED = not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
os.environ["TRITON_INTERPRET"] = "1" if INTERPRETED else "0"
DEVICE = "cpu" if INTERPRETED else "cuda"


_kernels = cli.load_file("tiles/kernels.py")  # by path: tiles/ is no package (modes.py says why)
forward_kernel, grad_x_kernel, grad_w_kernel = _kernels.forward_kernel, _kernels.grad_x_kernel, _kernels.grad_w_kernel

import triton  # noqa: E402  (after the kernels, which must see TRITON_INTERPRET first)

if INTERPRETED:
    import numpy as np
    import triton.language as tl
    from triton.runtime.jit import JITFunction

    # Triton decorates its own language functions when it is first imported: imported earlier
    # without TRITON_INTERPRET=1 (torch.compile imports it), they stay compiled-only, and every
    # interpreted kernel fails inside them. modes.py sets the variable as it loads; say it here.
    if isinstance(tl.zeros, JITFunction):
        raise RuntimeError("Triton was imported before TRITON_INTERPRET=1 was set (torch.compile imports it), so "
                           "its interpreter cannot run in this process: import modes first, or start Python "
                           "with TRITON_INTERPRET=1")

    # Triton 3.6's interpreter makes a loop bound an int with int() of a 1-element array, which
    # NumPy 2.4 refuses (Triton 3.7 and later take the element first): say so before any kernel.
    if tuple(int(p) for p in triton.__version__.split(".")[:2]) < (3, 7) and \
            np.lib.NumpyVersion(np.__version__) >= "2.4.0":
        raise RuntimeError(f"Triton {triton.__version__}'s interpreter needs numpy < 2.4 (this is {np.__version__}): "
                           f'pip install "numpy<2.4", or a newer Triton')

    @contextlib.contextmanager
    def _quiet():
        # NumPy warns where IEEE arithmetic makes inf or NaN, as it must for such inputs (e^-z
        # for a large negative z, inf · 0): torch.sigmoid does not warn, and neither does the
        # stage. Triton 3.6's int() of a 1-element array is deprecated in NumPy 2.x: not ours.
        with np.errstate(over="ignore", invalid="ignore"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "Conversion of an array with ndim > 0", DeprecationWarning)
            yield
else:
    _quiet = contextlib.nullcontext

# ---------------------------------------------------------------------------
# Tiles, precision, devices
# ---------------------------------------------------------------------------

TILES = ("BLOCK_M", "BLOCK_N", "BLOCK_K")


def _config(launch: dict) -> triton.Config:
    return triton.Config({k: launch[k] for k in TILES}, num_warps=launch.get("num_warps", 4),
                         num_stages=launch.get("num_stages", 2))


# On a GPU the forward is autotuned: the first call at a new (M, N, K) times every configuration
# and keeps the fastest. The backward's kernels keep one: the order of their sums depends on the
# tile, and the bias gradient must be the same bit for bit in every process, not only from run
# to run within one.
FORWARD = [_kernels.INTERPRETER_CONFIG] if INTERPRETED else _kernels.FORWARD_CONFIGS
BACKWARD = _kernels.INTERPRETER_CONFIG if INTERPRETED else _kernels.BACKWARD_CONFIG
forward_tuned = triton.autotune([_config(c) for c in FORWARD], key=["M", "N", "K", "HAS_BIAS", "PRECISION"])(
    forward_kernel)


def precision(dtype: torch.dtype) -> str:
    """tl.dot's input_precision: IEEE float32 unless torch allows TF32 for cuBLAS too.

    One switch decides both (torch.backends.cuda.matmul.allow_tf32, off by default), so a
    comparison with cuBLAS is like with like whichever way it is set. The interpreter
    multiplies in NumPy, in full precision, whatever this says."""
    tf32 = dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32 and not INTERPRETED
    return "tf32" if tf32 else "ieee"


def _check_device(x: Tensor) -> None:
    if x.device.type == DEVICE:
        return
    if INTERPRETED:
        raise ValueError(f"dense_triton runs Triton's interpreter in this process, on CPU tensors; x is on "
                         f"{x.device} (on a GPU machine, start Python without TRITON_INTERPRET=1 to compile)")
    raise ValueError(f"dense_triton compiles its kernels for the GPU in this process; x is on {x.device}: move "
                     "it to cuda, or start Python with TRITON_INTERPRET=1 to run Triton's interpreter on CPU tensors")


def _device_guard(device: torch.device) -> contextlib.AbstractContextManager:
    """Make ``device`` the current CUDA device for the launches (and back after them): Triton
    launches a kernel on the current device, not on its tensors' (the C++ stages take a CUDAGuard
    for the same reason). The interpreter's CPU tensors need none."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


def _rows(x: Tensor) -> int:
    # The product of the leading dimensions (x.reshape(-1, K) cannot say it when K = 0).
    return math.prod(x.shape[:-1])


# ---------------------------------------------------------------------------
# The two ops
# ---------------------------------------------------------------------------

# On a GPU the ops are triton_ops: torch.compile traces into their bodies and sees the kernel
# launches. The interpreter's kernels are Python functions run on NumPy arrays, which no graph
# can hold (wrap_triton hands them back unwrapped), so there the same bodies are plain custom
# ops, kept whole as one call in a compiled graph.
_define = torch.library.custom_op if INTERPRETED else torch.library.triton_op


@_define("dense_triton::forward", mutates_args=())
def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    modes.check_inputs(x, weight, bias, "triton")
    _check_device(x)
    m, k, n = _rows(x), x.shape[-1], weight.shape[0]
    out = x.new_empty((*x.shape[:-1], n))  # allocated in its final shape: the result is no view
    if out.numel() == 0:
        return out
    x2, y2 = x.reshape(m, k), out.view(m, n)  # 2-d views (x copied only if its strides cannot fold)

    def grid(meta):  # one program per BLOCK_M × BLOCK_N tile of y, whichever tile the autotuner picks
        return triton.cdiv(m, meta["BLOCK_M"]), triton.cdiv(n, meta["BLOCK_N"])

    with _device_guard(x.device), _quiet():
        wrap_triton(forward_tuned)[grid](
            x2, weight, weight if bias is None else bias, y2, m, n, k,  # no bias: any pointer, never read
            x2.stride(0), x2.stride(1), weight.stride(0), weight.stride(1), 0 if bias is None else bias.stride(0),
            y2.stride(0), y2.stride(1),
            HAS_BIAS=bias is not None, PRECISION=precision(x.dtype), INTERPRETED=INTERPRETED)
    return out


@_define("dense_triton::backward", mutates_args=())
def backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor,
             output_mask: Sequence[bool]) -> tuple[Tensor, Tensor, Tensor]:
    _check_device(x)
    m, k, n = _rows(x), x.shape[-1], weight.shape[0]
    # Gradients nobody asked for come back empty (the schema returns Tensor, as the C++ stages').
    gx = x.new_empty(x.shape if output_mask[0] else (0,))
    gw = weight.new_empty(weight.shape if output_mask[1] else (0,))
    gb = weight.new_empty((n,) if output_mask[2] else (0,))
    g2, y2, x2 = grad_out.reshape(m, n), out.reshape(m, n), x.reshape(m, k)
    gy_strides = (g2.stride(0), g2.stride(1), y2.stride(0), y2.stride(1))
    tiles = {key: BACKWARD[key] for key in TILES}
    launch = {key: BACKWARD[key] for key in ("num_warps", "num_stages") if key in BACKWARD}
    prec = precision(x.dtype)
    with _device_guard(x.device), _quiet():
        if output_mask[0] and gx.numel():
            dx2 = gx.view(m, k)
            grid = (triton.cdiv(m, tiles["BLOCK_M"]), triton.cdiv(k, tiles["BLOCK_K"]))
            wrap_triton(grad_x_kernel)[grid](
                g2, y2, weight, dx2, m, n, k, *gy_strides, weight.stride(0), weight.stride(1),
                dx2.stride(0), dx2.stride(1), PRECISION=prec, INTERPRETED=INTERPRETED, **tiles, **launch)
        want_w, want_b = output_mask[1] and gw.numel() > 0, output_mask[2] and n > 0
        if want_w or want_b:
            # One program per BLOCK_N × BLOCK_K tile of dW; without dW, one per block of columns.
            grid = (triton.cdiv(n, tiles["BLOCK_N"]), triton.cdiv(k, tiles["BLOCK_K"]) if want_w else 1)
            dw = gw if want_w else weight  # stand-in pointers for what is not computed, never written
            wrap_triton(grad_w_kernel)[grid](
                g2, y2, x2, dw, gb if want_b else weight, m, n, k, *gy_strides, x2.stride(0), x2.stride(1),
                dw.stride(0), dw.stride(1), DW=want_w, DB=want_b, PRECISION=prec, INTERPRETED=INTERPRETED,
                **tiles, **launch)
    return gx, gw, gb


# ---------------------------------------------------------------------------
# Autograd: one formula, two doors
# ---------------------------------------------------------------------------

def _setup_context(ctx, inputs, output) -> None:
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, output)  # sigmoid'(z) = y (1 − y): y is all the backward needs of z
    if forward_ad._current_level >= 0:  # forward-mode AD (jvp) needs them too, and only there
        ctx.save_for_forward(x, weight, output)
    ctx.has_bias = bias is not None


def _backward(ctx, grad: Tensor):
    x, weight, y = ctx.saved_tensors
    mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
    if torch.is_grad_enabled():
        # create_graph=True (torch.func.grad always asks for it): these gradients will be
        # differentiated in turn, and the kernels have no derivative. torch's ops have one.
        m, n = _rows(x), weight.shape[0]
        dz = torch.ops.aten.sigmoid_backward(grad, y)
        dz2 = dz.reshape(m, n)
        return (dz @ weight if mask[0] else None, dz2.t() @ x.reshape(m, x.shape[-1]) if mask[1] else None,
                dz2.sum(0) if mask[2] else None)
    gx, gw, gb = torch.ops.dense_triton.backward(grad, x, weight, y, mask)
    return gx if mask[0] else None, gw if mask[1] else None, gb if mask[2] else None


forward.register_autograd(_backward, setup_context=_setup_context)
_op = modes.register_dense_op("dense_triton")  # fake kernels and vmap rules, shared with the C++ stages


class _Dense(torch.autograd.Function):
    """The same op and formula as an autograd.Function: the door that torch.func's transforms and
    forward-mode AD take. (An op's registered formula has no jvp, and torch.func refuses it.)"""

    generate_vmap_rule = True  # forward, backward and jvp are ops with vmap rules

    @staticmethod
    def forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        return _op(x, weight, bias)

    setup_context = staticmethod(_setup_context)
    backward = staticmethod(_backward)

    @staticmethod
    def jvp(ctx, dx: Tensor | None, dw: Tensor | None, db: Tensor | None) -> Tensor:
        x, weight, y = ctx.saved_tensors
        return _tangent(x, weight, y, dx, dw, db)


def _tangent(x: Tensor, weight: Tensor, y: Tensor, dx: Tensor | None, dw: Tensor | None,
             db: Tensor | None) -> Tensor:
    """The forward-mode formula: with tangents dx, dW, db, dz = dx Wᵀ + x dWᵀ + db and
    dy = y (1 − y) · dz (torch's differentiable ops, so that it can be differentiated again)."""
    dz = torch.zeros_like(y)
    if dx is not None:
        dz = dz + torch.nn.functional.linear(dx, weight)
    if dw is not None:
        dz = dz + torch.nn.functional.linear(x, dw)
    if db is not None:
        dz = dz + db
    return dz * y * (1 - y)


def _has_tangent(*inputs: Tensor | None) -> bool:
    """Whether forward-mode AD (torch.autograd.forward_ad, or torch.func.jvp, which opens the
    same level) gives an input a tangent. Inside the Function's forward none has one: autograd
    runs it with forward grad off, so the op called there takes the reverse-mode kernel."""
    return forward_ad._current_level >= 0 and any(
        t is not None and forward_ad.unpack_dual(t).tangent is not None for t in inputs)


# Forward-mode AD (torch.func.jvp, jacfwd, hessian) cannot be compiled into a graph: the op's
# registered formula is reverse-mode only, and Dynamo traces the Function's forward without its
# jvp (zero tangents; torch 2.13). So torch.compile leaves the call out of its graph and runs it
# eagerly; the op called directly, which Dynamo cannot leave out, refuses.
NO_FORWARD_MODE_GRAPH = ("dense_triton under forward-mode AD (torch.func.jvp, jacfwd, hessian) runs eagerly: a "
                         "graph cannot hold its forward-mode formula; compile without fullgraph=True, or call it "
                         "outside torch.compile")
NO_FORWARD_MODE_GRAPH_OP = ("torch.ops.dense_triton.forward under forward-mode AD (torch.func.jvp, jacfwd, "
                            "hessian) cannot be compiled: a graph cannot hold its forward-mode formula; call "
                            "tiles/dense.py's dense (modes.dense('triton')), which torch.compile runs eagerly, or "
                            "call the op outside torch.compile")


@torch.compiler.disable(reason=NO_FORWARD_MODE_GRAPH)
def _forward_mode_eagerly(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return _Dense.apply(x, weight, bias)


def dense(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """sigmoid(x Wᵀ + b) by the kernels. The op itself (eager, and what torch.compile traces)
    unless a torch.func transform or forward-mode AD is active: those take the Function, which
    torch.compile leaves out of its graph under forward-mode AD (NO_FORWARD_MODE_GRAPH)."""
    forward_mode = forward_ad._current_level >= 0
    if torch.compiler.is_compiling():
        return _forward_mode_eagerly(x, weight, bias) if forward_mode else _op(x, weight, bias)
    if not (forward_mode or torch._C._are_functorch_transforms_active()):
        return _op(x, weight, bias)
    return _Dense.apply(x, weight, bias)


# ---------------------------------------------------------------------------
# The op called directly under forward-mode AD
# ---------------------------------------------------------------------------

# The Autograd kernel torch.library makes from the registered formula (register_autograd) records
# a graph only for inputs that require grad, which a tensor with a tangent need not: it would
# drop the tangents (torch.func.jvp: zeros; torch.autograd.forward_ad: none). So the op gets a
# kernel of its own: with a tangent, the primal by the kernels and the formula's tangent attached
# to it (the C++ stages' Autograd kernel does the same); otherwise torch.library's kernel, made
# by the function custom_op uses (torch.library has no public way to wrap it).
_reverse_mode = torch._library.autograd.make_autograd_impl(_op, forward)


def _autograd_kernel(keyset, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    if not _has_tangent(x, weight, bias):
        return _reverse_mode(keyset, x, weight, bias)
    if torch.compiler.is_compiling():
        raise RuntimeError(NO_FORWARD_MODE_GRAPH_OP)
    (x, dx), (weight, dw), (bias, db) = (forward_ad.unpack_dual(t) if t is not None else (None, None)
                                         for t in (x, weight, bias))
    y = _op(x, weight, bias)
    return forward_ad.make_dual(y, _tangent(x, weight, y, dx, dw, db))


_library = torch.library.Library("dense_triton", "FRAGMENT")  # the registration lives as long as this object
with warnings.catch_warnings():  # replacing custom_op's kernel is the point: the dispatcher's warning says so
    warnings.filterwarnings("ignore", "Warning only once for all operators", UserWarning)
    _library.impl("forward", _autograd_kernel, "Autograd", with_keyset=True)
