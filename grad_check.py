"""Check each stage's forward and backward against nn.Linear + torch.sigmoid.

In float32 (the default) and float64, for every mode: torch.autograd.gradcheck in float64 (the
stage's backward against finite differences of its own forward), then the output and gradients
against the torch reference in that type. In bfloat16 and float16 gradcheck does not apply (its
finite differences need float64's digits): the output and every gradient are compared with the
float64 truth, and judged against eager nn.Linear's own error on the same inputs (below). One
line per check; the exit status is 0 only if every check passed.

The tolerance in bfloat16 and float16. Let u be the type's unit roundoff (the largest relative
error of one rounding to nearest: bfloat16 2^-8, float16 2^-11, float32 2^-24) and v float32's.
A result r = Σ_k a_k·b_k (+ bias) of a reduction of length K, inputs in the type, accumulated in
float32 and rounded once to the type, obeys

    |r̂ − r| ≤ u·|r| + (1 + u)·γ_{K+1}·Σ_k |a_k·b_k|,    γ_n = n·v / (1 − n·v),

plus (2u + u²)·Σ_k |a_k·b_k| where the inputs themselves were rounded to the type (autocast).
The products are exact in float32: a bfloat16 significand has 8 bits and a float16 one 11, so a
product has at most 16 or 22, within float32's 24 (float16's products always fit float32's
exponent range; bfloat16's, whose range is float32's, unless they overflow or underflow it); only
the sums round. While K·v stays below u (K < 2^16 for bfloat16), that last rounding to the type
is the larger term: the reason the accumulator stays float32. A bfloat16 accumulator would give
γ_K with u itself: K·2^-8 reaches 1 at K = 256, and from there not one correct bit is promised. The sigmoid passes an
error δ of z on as at most σ'(z)·e^δ·δ (σ' ≤ 1/4), then rounds; dz = g·y(1 − y) is computed from
the rounded y; dx, dW and db are reductions of length O, B and B over dz, each bounded as above.
error_bound() adds these up element by element, with room for the ways stages differ (its
docstring lists them: an accumulator that truncates, as tensor cores do, x Wᵀ rounded before the
bias is added, elementwise steps rounded in the type); the tests check that nn.Linear and every
stage stay within it. The bound is a worst case. The output's error comes close to it (its last
rounding alone can cost nearly u·|y|); the gradients' stay well below, since the worst cases of
many terms would have to line up. So a stage is also judged against what nn.Linear achieves on
the same inputs. For the output and for each gradient, a check passes when

    max|stage − truth| ≤ 4·max|nn.Linear − truth| + 2u·max(size)

and the stage stays within error_bound wherever nn.Linear does (where nn.Linear does not, the
bound, not the stage, is wrong for those inputs). The truth is float64 arithmetic on the very
values the layer received. The size of an element is the size of what it is made of (|y| for
the output; for a gradient, the sum of the absolute values of its reduction's terms, as
magnitudes() computes it): rounding every term to the type can move an element by u times that,
which, where the terms cancel, is far more than u times the element. So the 2u term covers a
tensor that nn.Linear happens to get almost exactly right. Each line shows both errors, their
ratio and how much of the bound the stage uses. NaN and ±inf must fall where nn.Linear's do. On
a GPU the reference's cuBLAS is asked to accumulate in float32 (no reduced-precision
reductions), as the rule assumes.

--error-table measures, at one shape, each mode's and nn.Linear's errors against the float64
truth in float32, bfloat16 and float16 (the cuda mode through the CPU emulation of its kernels
where there is no GPU), and writes them as a record (--json) that chapter 1 shows
(grad_errors.py).

gradcheck's cost grows with the number of inputs times the number of outputs (it builds the
whole Jacobian, numerically and analytically): the script estimates it from the sizes, warns
above GRADCHECK_WARN_S seconds and refuses above GRADCHECK_MAX_S, suggesting smaller sizes or
--fast-gradcheck (torch's fast mode: the Jacobian times random vectors, not the whole matrix).

Examples:
  python grad_check.py py
  python grad_check.py all                      # every mode that works here
  python grad_check.py all --dtype bfloat16     # against the float64 truth, judged by nn.Linear's error
  python grad_check.py cpp -b 64 -i 128 -o 32 --no-bias
  python grad_check.py cpp -b 512 -i 256 -o 128 --fast-gradcheck
  python grad_check.py cuda --device cuda
  python grad_check.py cuda --emulate              # the CUDA kernels on the CPU, every version (seconds)
  python grad_check.py cuda --emulate --kernel 3 -b 33 -i 65 -o 17 --no-bias
  python grad_check.py cuda --emulate --dtype bfloat16 -b 37 -i 70 -o 33
  python grad_check.py all --error-table --json /tmp/errors.json

With --emulate the CUDA chapter's kernels run on the CPU (cuda/emulated.py), one version after
another (in bfloat16 and float16 the versions built for the type; the others are skipped, with
the reason). gradcheck makes 2·(B·I + O·I + O) forward calls and B·O backward calls per version, and
each call costs more as B·I·O grows: before each version the script times a call at the sizes
given and prints what the whole check will cost (it refuses one that would take over two minutes).
The tensor-core versions that compute float32 take no float64, so no gradcheck: split-TF32 (26,
34) is judged by the rule above in float32, plain TF32 (25) against a TF32 GEMM's error
(TF32Linear) with TF32's u = 2^-11. The TMA versions (32-35) copy rows of whole 16 bytes: where
B, I or O is not a multiple of 16 bytes' elements, they are checked at the next multiples, and say so.
"""

from __future__ import annotations

import cli  # first: a Ctrl-C during the imports below (torch takes seconds) is one line too

# isort: split
import argparse
import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.gradcheck import GradcheckError

import modes
from benchmark import check_stages, refusal

# float32 results differ from the reference only by rounding in the reductions. A check
# passes when |actual − reference| ≤ ATOL·max(1, max|reference|) + RTOL·|reference|.
RTOL, ATOL = 1e-4, 1e-5
RTOL64, ATOL64 = 1e-10, 1e-12  # the same in float64
# Seconds of estimated gradcheck time above which the script warns, and refuses.
GRADCHECK_WARN_S, GRADCHECK_MAX_S = 10.0, 120.0
EMULATE_HINT = "; without a GPU the kernels run on the CPU: python grad_check.py cuda --emulate"

# The unit roundoff of each type: half the gap between 1 and the next number, the largest relative
# error of one rounding to nearest.
UNIT_ROUNDOFF = {torch.float64: 2.0**-53, torch.float32: 2.0**-24, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
LOW_PRECISION = (torch.bfloat16, torch.float16)  # judged by the rule in the docstring, not by gradcheck
FACTOR = 4.0  # a stage's error may be up to FACTOR times nn.Linear's...
FLOOR = 2.0   # ... plus FLOOR·u times the largest size of what an element is made of (magnitudes)
TENSORS = ("output", "grad x", "grad weight", "grad bias")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The type every stage sums in: float64 for float64, float32 for every other."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class Check:
    mode: str
    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.mode:<6}  {self.name:<38} {self.detail}"


def compare(actual: torch.Tensor, ref: torch.Tensor, rtol: float = RTOL, atol: float = ATOL) -> tuple[bool, str]:
    """The tolerance test above; returns (passed, a one-line description)."""
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    err = (actual.double() - ref.double()).abs()
    allowed = atol * scale + rtol * ref.double().abs()
    worst = err.max().item() if err.numel() else 0.0
    return bool((err <= allowed).all()), f"max |err| {worst:.2e} (rtol {rtol:g}, atol {atol:g}·scale)"


# ---------------------------------------------------------------------------
# bfloat16 and float16: the float64 truth, the bound, and the rule
# ---------------------------------------------------------------------------

def reference(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    return torch.sigmoid(F.linear(x, weight, bias))


def tf32(t: Tensor) -> Tensor:
    """A float32 tensor rounded to TF32 as cvt.rna.tf32.f32 rounds it: its 13 low bits to nearest,
    ties away from zero (adding half of the dropped place to the magnitude's bits); NaN and ±inf
    kept. The result is a float32 holding a value with 10 bits of mantissa."""
    bits = t.contiguous().view(torch.int32)
    special = (bits & 0x7F800000) == 0x7F800000
    return torch.where(special, bits, (bits + 0x1000) & ~0x1FFF).view(torch.float32)


class TF32Linear(torch.autograd.Function):
    """nn.Linear + sigmoid as a float32 GEMM on TF32 tensor cores computes it (PyTorch's
    allow_tf32): each GEMM's operands rounded to TF32, products exact in float32 (11 × 11
    significant bits), sums in float32; dz and the bias gradient in float32. The reference a
    kernel that computes float32 in TF32 is judged against."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        y = torch.sigmoid(F.linear(tf32(x), tf32(weight), bias))
        ctx.save_for_backward(x, weight, y)
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, y = ctx.saved_tensors
        dz = grad * y * (1 - y)
        return tf32(dz) @ tf32(weight), tf32(dz).t() @ tf32(x), dz.sum(0) if ctx.has_bias else None


def forward_backward(fn: Callable[..., Tensor], inputs: Sequence[Tensor | None], grad_out: Tensor) -> list[Tensor]:
    """[output, the gradient of each input that is not None] of fn(x, weight, bias), on fresh leaves."""
    leaves = [None if t is None else t.detach().clone().requires_grad_() for t in inputs]
    y = fn(*leaves)
    y.backward(grad_out)
    return [y.detach()] + [t.grad for t in leaves if t is not None]


def truth(inputs: Sequence[Tensor | None], grad_out: Tensor) -> list[Tensor]:
    """forward_backward of the reference in float64, on the very values given (exact: every type
    here converts to float64 without rounding)."""
    return forward_backward(reference, [None if t is None else t.double() for t in inputs], grad_out.double())


def error_bound(x: Tensor, weight: Tensor, bias: Tensor | None, grad_out: Tensor, dtype: torch.dtype,
                rounded: bool = False) -> list[Tensor]:
    """Element by element, how far a stage's [output, grad x, grad weight, grad bias] computed in
    ``dtype`` may be from the float64 truth, for finite inputs: the bound of the module's
    docstring, carried through the sigmoid and the backward. ``rounded``: the values given are
    the truth's inputs, and the layer got them rounded to ``dtype`` (torch.autocast); grad_out is
    in ``dtype`` either way.

    It allows for the ways the stages and nn.Linear differ: an accumulator's step may be off by a
    whole ulp of the accumulator (2v: tensor cores truncate), x Wᵀ may be rounded to ``dtype``
    before the bias is added (and z rounded again), the sigmoid itself may be off by 2^-16 relative in
    bfloat16 and float16 (a GPU's fastest approximations are; 8 ulps of the accumulator in float32
    and float64), and dz = g·y(1 − y) may be rounded to ``dtype`` after each of its three
    operations (float16 on the CPU is)."""
    u = UNIT_ROUNDOFF[dtype]
    v = 2 * UNIT_ROUNDOFF[accumulator(dtype)]     # one step of the accumulator, truncating at worst
    tiny = torch.finfo(accumulator(dtype)).tiny    # a result below it may be flushed to zero
    eta = max(torch.finfo(dtype).tiny * u, tiny)   # ... and a rounding to dtype's subnormals
    sigmoid_rel = 2.0**-16 if dtype in LOW_PRECISION else 8 * v
    k_in, out_f = weight.shape[1], weight.shape[0]

    def gamma(n: int) -> float:
        return n * v / (1 - n * v)

    def to_dtype(value: Tensor, error: Tensor, times: int = 1) -> Tensor:
        """The error after rounding a result (true value ``value``, error so far ``error``) to dtype."""
        for _ in range(times):
            error = error + u * (value.abs() + error) + eta
        return error

    x2, w = x.double().reshape(-1, k_in), weight.double()
    g = grad_out.double().reshape(-1, out_f)
    b = bias.double() if bias is not None else torch.zeros(out_f, dtype=torch.float64)
    rows = x2.shape[0]
    inflate = (1 + u) ** 2 if rounded else 1.0  # |a'·b'| ≤ (1 + u)²·|a·b| for rounded inputs
    # forward: z = x Wᵀ + b, then y = sigmoid(z)
    product = x2 @ w.t()
    z, s = product + b, x2.abs() @ w.abs().t() + b.abs()
    ez = (gamma(k_in + 1) * inflate + (2 * u + u * u) * rounded) * s + (k_in + 1) * tiny
    ez = to_dtype(z, to_dtype(product, ez))  # the product rounded, then the sum with the bias
    y = torch.sigmoid(z)
    slope = torch.clamp(y * (1 - y) * torch.exp(ez), max=0.25)  # σ'(z + t) ≤ σ'(z)·e^|t|
    ey = to_dtype(y, slope * ez + sigmoid_rel * y + tiny)
    # backward: dz = g·y(1 − y) from the rounded y
    dz = g * y * (1 - y)
    edz = to_dtype(dz, g.abs() * ey * ((1 - 2 * y).abs() + ey) + v * (dz.abs() + tiny), times=3)
    adz = dz.abs() + edz

    def reduced(value: Tensor, carried: Tensor, magnitude: Tensor, length: int, operand_rounded: bool) -> Tensor:
        err = carried + gamma(length) * magnitude + length * tiny + u * magnitude * (rounded and operand_rounded)
        return to_dtype(value, err)

    w_abs, x_abs = w.abs(), x2.abs()
    dx = reduced(dz @ w, edz @ w_abs, adz @ w_abs, out_f, True).reshape(x.shape)
    dw = reduced(dz.t() @ x2, edz.t() @ x_abs, adz.t() @ x_abs, rows, True)
    db = reduced(dz.sum(0), edz.sum(0), adz.sum(0), rows, False)
    return [ey.reshape(*x.shape[:-1], out_f), dx, dw] + ([db] if bias is not None else [])


def magnitudes(x: Tensor, weight: Tensor, bias: Tensor | None, grad_out: Tensor) -> list[Tensor]:
    """The size of what each element of [output, grad x, grad weight, grad bias] is made of, in
    float64: |y|, then the sums of the absolute terms of each reduction, |dz|·|W|, |dz|ᵀ·|x| and
    Σ_rows |dz|. Rounding every term costs up to u times this, however much the terms cancel."""
    k_in, out_f = weight.shape[1], weight.shape[0]
    x2, w = x.detach().double().reshape(-1, k_in), weight.detach().double()
    z = x2 @ w.t() + (0 if bias is None else bias.detach().double())
    y = torch.sigmoid(z)
    dz = (grad_out.detach().double().reshape(-1, out_f) * y * (1 - y)).abs()
    sizes = [y.reshape(*x.shape[:-1], out_f), (dz @ w.abs()).reshape(x.shape), dz.t() @ x2.abs()]
    return sizes + ([dz.sum(0)] if bias is not None else [])


@dataclass
class Judged:
    """One tensor judged by the rule: its error, nn.Linear's, what the rule allows, and how much of
    error_bound each uses at its worst element (within it: at most 1)."""

    passed: bool
    error: float = math.nan
    linear_error: float = math.nan
    allowed: float = math.nan
    of_bound: float = math.nan
    linear_of_bound: float = math.nan
    problem: str = ""  # a reason the numbers do not cover: a type, a shape, NaN or ±inf misplaced
    reference: str = "nn.Linear"  # whose error the stage's is compared with

    @property
    def ratio(self) -> float:
        return self.error / self.linear_error if self.linear_error > 0 else (0.0 if self.error == 0 else math.inf)

    def detail(self) -> str:
        if self.problem:
            return self.problem
        bound = "" if math.isnan(self.of_bound) else f"; {self.of_bound:.2f} of the bound"
        if self.of_bound > 1:
            bound += f" ({self.reference}'s {self.linear_of_bound:.2f})"
        return (f"max |err| {self.error:.2e}, {self.reference}'s {self.linear_error:.2e}, ratio {self.ratio:.2f} "
                f"(allowed {self.allowed:.2e}: {FACTOR:g}× + {FLOOR:g}u·size){bound}")


def judge(actual: Tensor, linear: Tensor, exact: Tensor, dtype: torch.dtype, bound: Tensor | None = None,
          size: Tensor | None = None, unit: float | None = None) -> Judged:
    """The rule of the docstring for one tensor: ``actual`` (the stage's), ``linear`` (nn.Linear's
    on the same inputs, in the same type) against ``exact`` (the float64 truth). NaN and ±inf must
    be where nn.Linear has them; the errors are taken where nn.Linear and the truth are finite.
    With ``bound`` (error_bound's), the stage must also stay within it, unless nn.Linear does not
    (then the bound, not the stage, is wrong for these inputs). ``size`` (magnitudes') sets the
    floor of 2u; without it, |exact| does. ``unit``: u, where it is not dtype's (TF32's 2^-11)."""
    if actual.dtype != linear.dtype or actual.shape != linear.shape:
        return Judged(False, problem=f"{dtype_name(actual.dtype)} {tuple(actual.shape)}, "
                      f"nn.Linear gives {dtype_name(linear.dtype)} {tuple(linear.shape)}")
    a, lin, t = actual.detach().cpu().double(), linear.detach().cpu().double(), exact.detach().cpu().double()
    if not torch.equal(a.isnan(), lin.isnan()):
        return Judged(False, problem=f"NaN at {int((a.isnan() != lin.isnan()).sum())} places where nn.Linear differs")
    infinite = lin.isinf()
    if not torch.equal(a.isinf(), infinite) or not torch.equal(a[infinite], lin[infinite]):
        return Judged(False, problem="±inf where nn.Linear has none, or of the other sign")
    finite = lin.isfinite() & t.isfinite()
    if bound is not None:
        finite &= bound.isfinite()
    a, lin, t = a[finite], lin[finite], t[finite]
    if t.numel() == 0:
        return Judged(True, 0.0, 0.0, 0.0, 0.0, 0.0)
    error, linear_error = (a - t).abs(), (lin - t).abs()
    scale = t.abs() if size is None else size.detach().cpu().double()[finite]
    allowed = FACTOR * linear_error.max().item() + FLOOR * (unit or UNIT_ROUNDOFF[dtype]) * scale.max().item()
    of_bound = linear_of_bound = 0.0 if bound is not None else math.nan
    if bound is not None:
        e = bound.detach().cpu().double()[finite]
        of_bound, linear_of_bound = (error / e).max().item(), (linear_error / e).max().item()
    passed = error.max().item() <= allowed and (bound is None or of_bound <= 1 or linear_of_bound > 1)
    return Judged(passed, error.max().item(), linear_error.max().item(), allowed, of_bound, linear_of_bound)


def draw(batch: int, in_f: int, out_f: int, bias: bool, dtype: torch.dtype, seed: int = 0,
         device: str = "cpu") -> tuple[list[Tensor | None], Tensor]:
    """([x, weight, bias], grad_out) in ``dtype``: drawn in float64 at a working layer's scale
    (x ~ N(0, 1), weight and bias ~ N(0, 1/I), as benchmark.inputs), then rounded once."""
    gen = torch.Generator().manual_seed(seed)
    scale = in_f ** -0.5
    x = torch.randn(batch, in_f, generator=gen, dtype=torch.float64)
    w = torch.randn(out_f, in_f, generator=gen, dtype=torch.float64) * scale
    b = torch.randn(out_f, generator=gen, dtype=torch.float64) * scale
    g = torch.randn(batch, out_f, generator=gen, dtype=torch.float64)
    inputs = [x, w, b if bias else None]
    return [None if t is None else t.to(device=device, dtype=dtype) for t in inputs], g.to(device=device, dtype=dtype)


def low_precision_checks(mode: str, fn: modes.DenseFn, batch: int, in_f: int, out_f: int, device: str,
                         bias: bool, seed: int, dtype: torch.dtype, in_tf32: bool = False) -> Iterator[Check]:
    """The output and every gradient in ``dtype`` against the float64 truth, by the rule. With
    ``in_tf32`` (a float32 kernel on TF32 tensor cores), against TF32Linear's error and TF32's u,
    without the float32 bound."""
    name = "float32 in TF32" if in_tf32 else dtype_name(dtype)
    inputs, grad_out = draw(batch, in_f, out_f, bias, dtype, seed, device)
    try:
        got = forward_backward(fn, inputs, grad_out)
    except Exception as e:  # a stage that refuses the type, or fails in it: a line, not a traceback
        text = (str(e).strip().splitlines() or [""])[0][:300]
        yield Check(mode, f"forward and backward in {name}", False, f"{type(e).__name__}: {text}")
        return
    with float32_accumulation():
        linear = forward_backward(TF32Linear.apply if in_tf32 else reference, inputs, grad_out)
    cpu = [None if t is None else t.cpu() for t in inputs]
    sizes = magnitudes(*cpu, grad_out.cpu())
    bounds = [None] * len(sizes) if in_tf32 else error_bound(*cpu, grad_out.cpu(), dtype)
    for label, a, lin, t, e, m in zip(TENSORS[:3] + (TENSORS[3:] if bias else ()), got, linear,
                                      truth(inputs, grad_out), bounds, sizes):
        verdict = judge(a, lin, t, dtype, e, m, unit=2.0**-11 if in_tf32 else None)
        if in_tf32:
            verdict.reference = "TF32 nn.Linear"
        yield Check(mode, f"{label} {name} vs float64 truth", verdict.passed, verdict.detail())


@contextlib.contextmanager
def float32_accumulation() -> Iterator[None]:
    """cuBLAS's bfloat16 and float16 GEMMs may sum parts in the 16-bit type unless told not to;
    the rule assumes nn.Linear accumulates in float32, so it is told, here and only here."""
    matmul = torch.backends.cuda.matmul
    before = (matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction)
    matmul.allow_bf16_reduced_precision_reduction = matmul.allow_fp16_reduced_precision_reduction = False
    try:
        yield
    finally:
        matmul.allow_bf16_reduced_precision_reduction, matmul.allow_fp16_reduced_precision_reduction = before


# ---------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------

def gradcheck_cost(batch: int, in_f: int, out_f: int, bias: bool = True, fast: bool = False) -> tuple[float, int]:
    """(seconds, bytes) that gradcheck will roughly need at these sizes, in float64.

    Slow mode perturbs every input element (two forward calls each) and backpropagates every
    output element (one backward call each), and holds both Jacobians, inputs × outputs.
    The constants (100 µs a call, 0.1 µs a Jacobian entry, 1 GFLOP/s) are deliberately slow
    ones for a small CPU: the estimate is there to catch minutes, not to predict seconds.
    Fast mode makes a few calls per input tensor and holds no Jacobian.
    """
    n_in = batch * in_f + out_f * in_f + (out_f if bias else 0)
    n_out = batch * out_f
    flops = 2 * batch * in_f * out_f
    calls = 3 * 4 if fast else 2 * n_in + n_out
    seconds = calls * (1e-4 + flops / 1e9) + (0 if fast else n_in * n_out * 1e-7)
    nbytes = 8 * (4 * (n_in + n_out) if fast else 2 * n_in * n_out)
    return seconds, nbytes


def run_checks(mode: str, batch: int, in_f: int, out_f: int, device: str = "cpu",
               bias: bool = True, seed: int = 0, fast: bool = False,
               fn: modes.DenseFn | None = None, dtype: torch.dtype = torch.float32) -> list[Check]:
    """Run the checks of one mode (or ``fn``) in ``dtype``; one Check per line."""
    return list(iter_checks(mode, batch, in_f, out_f, device, bias, seed, fast, fn, dtype))


def iter_checks(mode: str, batch: int, in_f: int, out_f: int, device: str = "cpu",
                bias: bool = True, seed: int = 0, fast: bool = False,
                fn: modes.DenseFn | None = None, dtype: torch.dtype = torch.float32) -> Iterator[Check]:
    """run_checks, one Check at a time as each finishes (for printing progress)."""
    fn = fn or modes.dense(mode)
    if dtype in LOW_PRECISION:
        yield from low_precision_checks(mode, fn, batch, in_f, out_f, device, bias, seed, dtype)
        return
    gen = torch.Generator().manual_seed(seed)
    names = ("x", "weight", "bias")[: 3 if bias else 2]

    def make(dtype: torch.dtype) -> list[torch.Tensor]:
        shapes = [(batch, in_f), (out_f, in_f), (out_f,)][: len(names)]
        return [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_() for s in shapes]

    def call(*t: torch.Tensor) -> torch.Tensor:
        return fn(t[0], t[1], t[2] if bias else None)

    inputs64 = make(torch.float64)
    try:
        ok = torch.autograd.gradcheck(call, inputs64, eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=fast)
        yield Check(mode, f"gradcheck{' (fast)' if fast else ''} float64 ({', '.join(names)})", ok)
    except GradcheckError as e:  # raised with the mismatching Jacobian in the message
        yield Check(mode, f"gradcheck float64 ({', '.join(names)})", False, str(e).splitlines()[0])

    inputs = inputs64 if dtype == torch.float64 else make(dtype)
    tol = (RTOL64, ATOL64) if dtype == torch.float64 else (RTOL, ATOL)
    name = dtype_name(dtype)
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    inputs = [t.detach().clone().requires_grad_() for t in inputs]
    grad_out = torch.randn(batch, out_f, generator=gen, dtype=dtype).to(device)
    y = call(*inputs)
    y_ref = torch.sigmoid(torch.nn.functional.linear(*ref_inputs))
    ok, detail = compare(y, y_ref, *tol)
    yield Check(mode, f"forward {name} vs reference", ok, detail)
    y.backward(grad_out)
    y_ref.backward(grad_out)
    for label, t, r in zip(names, inputs, ref_inputs):
        ok, detail = compare(t.grad, r.grad, *tol)
        yield Check(mode, f"grad {label} {name} vs reference", ok, detail)


def takes(mode: str, dtype: torch.dtype) -> bool:
    return dtype in modes.MODE_DTYPES[mode]


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    size = cli.positive(int)
    parser.add_argument("mode", choices=[*modes.MODES, "all"])
    parser.add_argument("-b", "--batch", type=size, default=None, help="(default 8; --error-table: 32)")
    parser.add_argument("-i", "--in-features", type=size, default=None, help="(default 16; --error-table: 1024)")
    parser.add_argument("-o", "--out-features", type=size, default=None, help="(default 12; --error-table: 64)")
    parser.add_argument("--dtype", choices=[dtype_name(d) for d in modes.DTYPES], default="float32",
                        help="the type the stages compute in (default float32); bfloat16 and float16 are "
                             "judged against the float64 truth and nn.Linear's own error")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-bias", action="store_true")
    parser.add_argument("--fast-gradcheck", action="store_true",
                        help="torch's fast gradcheck (random projections of the Jacobian): for big sizes")
    parser.add_argument("--emulate", action="store_true",
                        help="mode cuda only: run the CUDA kernels on the CPU through the execution-model emulation "
                             "(no GPU, no nvcc)")
    parser.add_argument("--kernel", type=int, metavar="N", default=None,
                        help="with --emulate: GEMM version N only (0 = automatic; default: every version)")
    parser.add_argument("--error-table", action="store_true",
                        help="measure every mode's and nn.Linear's errors against the float64 truth in float32, "
                             "bfloat16 and float16 at one shape, and print the table")
    parser.add_argument("--json", metavar="PATH",
                        help="with --error-table: write the record there (the folder must exist)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda needs a CUDA build of torch and a GPU (this torch is {torch.__version__})")
    if args.json is not None and not args.error_table:
        parser.error("--json goes with --error-table")
    dtype = getattr(torch, args.dtype)
    if args.fast_gradcheck and dtype in LOW_PRECISION:
        parser.error(f"--fast-gradcheck: there is no gradcheck in {args.dtype} (the checks compare with the float64 "
                     "truth); drop it, or check in float32 or float64")
    if args.error_table:
        if args.emulate or args.kernel is not None or args.fast_gradcheck or args.dtype != "float32":
            parser.error("--error-table measures float32, bfloat16 and float16 itself: drop --dtype, --emulate, "
                         "--kernel and --fast-gradcheck")
        import grad_errors  # the error table loads this module first: imported here, not at the top

        return grad_errors.main(args)
    args.batch, args.in_features, args.out_features = args.batch or 8, args.in_features or 16, args.out_features or 12
    if args.emulate or args.kernel is not None:
        return emulated(parser, args, dtype)
    if args.mode != "all" and not takes(args.mode, dtype):
        raise cli.UserError(f"mode {args.mode!r} {refusal(args.mode, dtype)}")
    try:
        selected, skipped = modes.resolve(args.mode)
    except RuntimeError as e:
        raise cli.UserError(str(e) + (EMULATE_HINT if args.mode == "cuda" else "")) from None
    for m in modes.MODES:
        if m in selected + list(skipped) and not takes(m, dtype):
            print(f"SKIP  {m:<6}  {refusal(m, dtype)}")
        elif m in skipped:
            print(f"SKIP  {m:<6}  {skipped[m]}{EMULATE_HINT if m == 'cuda' else ''}")
    selected = [m for m in selected if takes(m, dtype)]
    gradcheck = dtype not in LOW_PRECISION

    # The cost of the work, from the sizes, before any of it starts.
    b, i, o = args.batch, args.in_features, args.out_features
    seconds, jacobians = gradcheck_cost(b, i, o, not args.no_bias, args.fast_gradcheck)
    seconds *= len(selected) if gradcheck else 0
    tensors = 4 * 8 * (b * i + o * i + o + b * o)  # inputs, their copies and gradients, in float64
    cli.check_memory(tensors, args.device, f"the inputs at B={b} I={i} O={o}")
    if seconds > GRADCHECK_MAX_S:
        raise cli.UserError(f"gradcheck at B={b} I={i} O={o} ({b * i + o * i + o:,} inputs, {b * o:,} outputs) "
                            f"would take about {seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 "
                            "-o 12 check the same code paths)"
                            + ("" if args.fast_gradcheck else " or --fast-gradcheck"))
    if gradcheck:
        cli.check_memory(tensors + jacobians, args.device, f"gradcheck's Jacobians at B={b} I={i} O={o}")
    if seconds > GRADCHECK_WARN_S:
        print(f"gradcheck at these sizes will take about {seconds:.0f} s (smaller sizes or --fast-gradcheck "
              "are quicker)", file=sys.stderr, flush=True)

    # Load (and build) each stage first: a compiler that fails gives a FAIL line with its message.
    loaded, load_failed = check_stages(selected)
    failed = len(load_failed)
    for mode, why in load_failed.items():
        print(Check(mode, "load the stage", False, why).line(), flush=True)
    for mode in loaded:
        if mode == "triton" and modes.stage(mode).INTERPRETED:
            # Triton's interpreter takes milliseconds a call, not the 100 µs gradcheck_cost assumes: time it.
            seconds = measured_cost(modes.dense(mode), b, i, o, not args.no_bias, args.fast_gradcheck, dtype)
            if seconds > GRADCHECK_MAX_S:
                raise cli.UserError(f"gradcheck at B={b} I={i} O={o} in Triton's interpreter would take about "
                                    f"{seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 -o 12 "
                                    "check the same code paths)" + ("" if args.fast_gradcheck else
                                                                    " or --fast-gradcheck"))
            if seconds > GRADCHECK_WARN_S:
                print(f"triton: the checks in the interpreter will take about {seconds:.0f} s", file=sys.stderr,
                      flush=True)
        for check in iter_checks(mode, b, i, o, args.device, bias=not args.no_bias, fast=args.fast_gradcheck,
                                 dtype=dtype):
            print(check.line(), flush=True)
            failed += not check.passed
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} "
          f"({', '.join(selected)}; B={args.batch}, in={args.in_features}, out={args.out_features}, "
          f"{args.dtype}, {args.device})")
    return 1 if failed else 0


def load_emulation():
    """cuda/emulated.py, under the name the tests load it by."""
    return cli.load_file("cuda/emulated.py")


def emulated(parser: argparse.ArgumentParser, args: argparse.Namespace, dtype: torch.dtype) -> int:
    """grad_check.py cuda --emulate: every (or one) GEMM version of the CUDA chapter, run on the CPU."""
    if not args.emulate or args.mode != "cuda" or args.device != "cpu":
        parser.error("--kernel goes with --emulate, and --emulate with mode cuda on the CPU (no --device cuda)")
    emu = load_emulation()
    name = dtype_name(dtype)
    if args.kernel is not None and args.kernel not in emu.versions():
        parser.error(f"--kernel must be one of {', '.join(map(str, emu.versions()))}")
    if args.kernel is not None and args.kernel not in emu.versions(dtype):
        parser.error(f"--kernel {args.kernel} does not take {name}; the versions that do: "
                     f"{', '.join(map(str, emu.versions(dtype)))}")
    if emu.unavailable_reason():
        raise cli.UserError(f"cannot emulate: {emu.unavailable_reason()}")
    b, i, o, bias = args.batch, args.in_features, args.out_features, not args.no_bias
    gradcheck = dtype not in LOW_PRECISION
    _, jacobians = gradcheck_cost(b, i, o, bias, args.fast_gradcheck)
    tensors = 4 * 8 * (b * i + o * i + o + b * o)
    cli.check_memory(tensors + (jacobians if gradcheck else 0), "cpu", f"gradcheck's Jacobians at B={b} I={i} O={o}")
    try:
        emu.library()  # the build (seconds, once), before anything is timed
    except RuntimeError as e:
        raise cli.UserError(str(e)) from None
    if args.kernel is not None:
        versions = [args.kernel]
    else:
        versions = list(emu.versions(dtype))
        for v in emu.versions():
            if v not in versions:
                built = [dtype_name(d) for d in emu.DTYPES if v in emu.versions(d)]
                print(f"SKIP  v{v:<5}  does not take {name}: built for {', '.join(built)}", flush=True)
    failed = 0
    for v in versions:
        fn = emu.dense(v)
        b, i, o = args.batch, args.in_features, args.out_features
        if (r := emu.row_multiple(v, dtype)) > 1 and (b % r or i % r or o % r):
            b, i, o = (-(-n // r) * r for n in (b, i, o))  # the next multiples, tiles still partial
            print(f"v{v}: takes its operands through TMA, whose rows are whole 16-byte multiples: checked at "
                  f"B={b} in={i} out={o}", flush=True)
        try:
            gradcheck = dtype not in LOW_PRECISION and v in emu.versions(torch.float64)
            seconds = measured_cost(fn, b, i, o, bias, args.fast_gradcheck, dtype, gradcheck)
            if seconds > GRADCHECK_MAX_S:
                raise cli.UserError(f"v{v}: gradcheck at B={b} I={i} O={o} on the emulated kernels would take about "
                                    f"{seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 -o 12 "
                                    "check the same code paths)" + ("" if args.fast_gradcheck else
                                                                    " or --fast-gradcheck"))
            print(f"v{v}: {emu.idea(v)}; about {seconds:.1f} s", flush=True)
            if dtype == torch.float32 and not gradcheck:  # tensor cores: the rule, not gradcheck
                checks = low_precision_checks(f"v{v}", fn, b, i, o, "cpu", bias, 0, dtype, v in emu.TF32_VERSIONS)
            else:
                checks = iter_checks(f"v{v}", b, i, o, bias=bias, fast=args.fast_gradcheck, fn=fn, dtype=dtype)
            for check in checks:
                print(check.line(), flush=True)
                failed += not check.passed
        except RuntimeError as e:  # a kernel that could not finish (the emulation said why on stderr)
            print(Check(f"v{v}", "run the emulated kernels", False, str(e)).line(), flush=True)
            failed += 1
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} (cuda kernels emulated on the "
          f"CPU, versions {', '.join(map(str, versions))}; B={args.batch}, in={args.in_features}, "
          f"out={args.out_features}, {name})")
    return 1 if failed else 0


def measured_cost(fn: modes.DenseFn, batch: int, in_f: int, out_f: int, bias: bool, fast: bool,
                  dtype: torch.dtype = torch.float32, gradcheck: bool = True) -> float:
    """Seconds the checks of a slow stage (an emulated version, Triton's interpreter) will take,
    from forward and backward calls timed at these sizes (in float64, as gradcheck calls them;
    in bfloat16 and float16, or without ``gradcheck``, one call each is all the checks make)."""
    low = dtype in LOW_PRECISION or not gradcheck
    timed_in = dtype if low else torch.float64
    x = torch.randn(batch, in_f, dtype=timed_in, requires_grad=True)
    w = torch.randn(out_f, in_f, dtype=timed_in, requires_grad=True)
    b = torch.randn(out_f, dtype=timed_in, requires_grad=True) if bias else None
    times = []
    for _ in range(3):  # the first pays for starting autograd's thread and mapping the fibers' stacks
        start = time.perf_counter()
        try:
            y = fn(x, w, b)
            middle = time.perf_counter()
            y.backward(torch.ones_like(y))
        except Exception:
            if not low:
                raise
            return 0.0  # a stage that refuses the type, or fails in it: the checks say so at once
        times.append((middle - start, time.perf_counter() - middle))
    forward, backward = min(t[0] for t in times[1:]), min(t[1] for t in times[1:])
    n_in, n_out = batch * in_f + out_f * in_f + (out_f if bias else 0), batch * out_f
    if low:
        return forward + backward
    calls = (12, 12) if fast else (2 * n_in, n_out)  # (forward, backward) calls; fast mode: a few per input
    jacobians = 0 if fast else n_in * n_out * 1e-7  # gradcheck_cost's price of a Jacobian entry
    return calls[0] * forward + calls[1] * backward + jacobians




if __name__ == "__main__":
    cli.run(main)

