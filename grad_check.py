"""Check each stage's forward and backward against nn.Linear + torch.sigmoid.

For every mode: torch.autograd.gradcheck in float64 (the stage's backward against finite
differences of its own forward), then the float32 output and gradients against the torch
reference. One line per check; the exit status is 0 only if every check passed.

gradcheck's cost grows with the number of inputs times the number of outputs (it builds the
whole Jacobian, numerically and analytically): the script estimates it from the sizes, warns
above GRADCHECK_WARN_S seconds and refuses above GRADCHECK_MAX_S, suggesting smaller sizes or
--fast-gradcheck (torch's fast mode: the Jacobian times random vectors, not the whole matrix).

Examples:
  python grad_check.py py
  python grad_check.py all                      # every mode that works here
  python grad_check.py cpp -b 64 -i 128 -o 32 --no-bias
  python grad_check.py cpp -b 512 -i 256 -o 128 --fast-gradcheck
  python grad_check.py cuda --device cuda
  python grad_check.py cuda --emulate              # the CUDA kernels on the CPU, every version (seconds)
  python grad_check.py cuda --emulate --kernel 3 -b 33 -i 65 -o 17 --no-bias

With --emulate the CUDA chapter's kernels run on the CPU (cuda/emulated.py), one version after
another. gradcheck makes 2·(B·I + O·I + O) forward calls and B·O backward calls per version, and
each call costs more as B·I·O grows: before each version the script times a call at the sizes
given and prints what the whole check will cost (it refuses one that would take over two minutes).
"""

from __future__ import annotations

import cli  # first: a Ctrl-C during the imports below (torch takes seconds) is one line too

# isort: split
import argparse
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch.autograd.gradcheck import GradcheckError

import modes
from benchmark import check_stages

# float32 results differ from the reference only by rounding in the reductions. A check
# passes when |actual − reference| ≤ ATOL·max(1, max|reference|) + RTOL·|reference|.
RTOL, ATOL = 1e-4, 1e-5
# Seconds of estimated gradcheck time above which the script warns, and refuses.
GRADCHECK_WARN_S, GRADCHECK_MAX_S = 10.0, 120.0
EMULATE_HINT = "; without a GPU the kernels run on the CPU: python grad_check.py cuda --emulate"


@dataclass
class Check:
    mode: str
    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.mode:<6}  {self.name:<38} {self.detail}"


def compare(actual: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    """The tolerance test above; returns (passed, a one-line description)."""
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    err = (actual.double() - ref.double()).abs()
    allowed = ATOL * scale + RTOL * ref.double().abs()
    worst = err.max().item() if err.numel() else 0.0
    return bool((err <= allowed).all()), f"max |err| {worst:.2e} (rtol {RTOL:g}, atol {ATOL:g}·scale)"


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
               fn: modes.DenseFn | None = None) -> list[Check]:
    """Run gradcheck and the reference comparison for one mode (or ``fn``); one Check per line."""
    return list(iter_checks(mode, batch, in_f, out_f, device, bias, seed, fast, fn))


def iter_checks(mode: str, batch: int, in_f: int, out_f: int, device: str = "cpu",
                bias: bool = True, seed: int = 0, fast: bool = False,
                fn: modes.DenseFn | None = None) -> Iterator[Check]:
    """run_checks, one Check at a time as each finishes (for printing progress)."""
    fn = fn or modes.dense(mode)
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

    inputs = make(torch.float32)
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    grad_out = torch.randn(batch, out_f, generator=gen).to(device)
    y = call(*inputs)
    y_ref = torch.sigmoid(torch.nn.functional.linear(*ref_inputs))
    ok, detail = compare(y, y_ref)
    yield Check(mode, "forward float32 vs reference", ok, detail)
    y.backward(grad_out)
    y_ref.backward(grad_out)
    for name, t, r in zip(names, inputs, ref_inputs):
        ok, detail = compare(t.grad, r.grad)
        yield Check(mode, f"grad {name} float32 vs reference", ok, detail)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    size = cli.positive(int)
    parser.add_argument("mode", choices=[*modes.MODES, "all"])
    parser.add_argument("-b", "--batch", type=size, default=8)
    parser.add_argument("-i", "--in-features", type=size, default=16)
    parser.add_argument("-o", "--out-features", type=size, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-bias", action="store_true")
    parser.add_argument("--fast-gradcheck", action="store_true",
                        help="torch's fast gradcheck (random projections of the Jacobian): for big sizes")
    parser.add_argument("--emulate", action="store_true",
                        help="mode cuda only: run the CUDA kernels on the CPU through the execution-model emulation "
                             "(no GPU, no nvcc)")
    parser.add_argument("--kernel", type=int, metavar="N", default=None,
                        help="with --emulate: GEMM version N only (0 = automatic; default: every version)")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda needs a CUDA build of torch and a GPU (this torch is {torch.__version__})")

    if args.emulate or args.kernel is not None:
        return emulated(parser, args)
    try:
        selected, skipped = modes.resolve(args.mode)
    except RuntimeError as e:
        raise cli.UserError(str(e) + (EMULATE_HINT if args.mode == "cuda" else "")) from None
    for m, reason in skipped.items():
        print(f"SKIP  {m:<6}  {reason}{EMULATE_HINT if m == 'cuda' else ''}")

    # The cost of the work, from the sizes, before any of it starts.
    b, i, o = args.batch, args.in_features, args.out_features
    seconds, jacobians = gradcheck_cost(b, i, o, not args.no_bias, args.fast_gradcheck)
    seconds *= len(selected)
    tensors = 4 * 8 * (b * i + o * i + o + b * o)  # inputs, their copies and gradients, in float64
    cli.check_memory(tensors, args.device, f"the inputs at B={b} I={i} O={o}")
    if seconds > GRADCHECK_MAX_S:
        raise cli.UserError(f"gradcheck at B={b} I={i} O={o} ({b * i + o * i + o:,} inputs, {b * o:,} outputs) "
                            f"would take about {seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 "
                            "-o 12 check the same code paths)"
                            + ("" if args.fast_gradcheck else " or --fast-gradcheck"))
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
            seconds = measured_cost(modes.dense(mode), b, i, o, not args.no_bias, args.fast_gradcheck)
            if seconds > GRADCHECK_MAX_S:
                raise cli.UserError(f"gradcheck at B={b} I={i} O={o} in Triton's interpreter would take about "
                                    f"{seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 -o 12 "
                                    "check the same code paths)" + ("" if args.fast_gradcheck else
                                                                    " or --fast-gradcheck"))
            if seconds > GRADCHECK_WARN_S:
                print(f"triton: gradcheck in the interpreter will take about {seconds:.0f} s", file=sys.stderr,
                      flush=True)
        for check in run_checks(mode, b, i, o, args.device, bias=not args.no_bias, fast=args.fast_gradcheck):
            print(check.line(), flush=True)
            failed += not check.passed
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} "
          f"({', '.join(selected)}; B={args.batch}, in={args.in_features}, out={args.out_features}, "
          f"{args.device})")
    return 1 if failed else 0


def emulated(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """grad_check.py cuda --emulate: every (or one) GEMM version of the CUDA chapter, run on the CPU."""
    import importlib.util

    if not args.emulate or args.mode != "cuda" or args.device != "cpu":
        parser.error("--kernel goes with --emulate, and --emulate with mode cuda on the CPU (no --device cuda)")
    spec = importlib.util.spec_from_file_location("dense_cuda_emulated", modes.ROOT / "cuda" / "emulated.py")
    emu = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(emu)
    versions = [args.kernel] if args.kernel is not None else list(emu.versions())
    if any(v not in emu.versions() for v in versions):
        parser.error(f"--kernel must be one of {', '.join(map(str, emu.versions()))}")
    if emu.unavailable_reason():
        raise cli.UserError(f"cannot emulate: {emu.unavailable_reason()}")
    b, i, o, bias = args.batch, args.in_features, args.out_features, not args.no_bias
    _, jacobians = gradcheck_cost(b, i, o, bias, args.fast_gradcheck)
    tensors = 4 * 8 * (b * i + o * i + o + b * o)
    cli.check_memory(tensors + jacobians, "cpu", f"gradcheck's Jacobians at B={b} I={i} O={o}")
    try:
        emu.library()  # the build (seconds, once), before anything is timed
    except RuntimeError as e:
        raise cli.UserError(str(e)) from None
    failed = 0
    for v in versions:
        fn = emu.dense(v)
        try:
            seconds = measured_cost(fn, b, i, o, bias, args.fast_gradcheck)
            if seconds > GRADCHECK_MAX_S:
                raise cli.UserError(f"v{v}: gradcheck at B={b} I={i} O={o} on the emulated kernels would take about "
                                    f"{seconds / 60:,.0f} min: use smaller sizes (the defaults -b 8 -i 16 -o 12 "
                                    "check the same code paths)" + ("" if args.fast_gradcheck else
                                                                    " or --fast-gradcheck"))
            print(f"v{v}: {emu.idea(v)}; about {seconds:.1f} s", flush=True)
            for check in iter_checks(f"v{v}", b, i, o, bias=bias, fast=args.fast_gradcheck, fn=fn):
                print(check.line(), flush=True)
                failed += not check.passed
        except RuntimeError as e:  # a kernel that could not finish (the emulation said why on stderr)
            print(Check(f"v{v}", "run the emulated kernels", False, str(e)).line(), flush=True)
            failed += 1
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} (cuda kernels emulated on the "
          f"CPU, versions {', '.join(map(str, versions))}; B={b}, in={i}, out={o})")
    return 1 if failed else 0


def measured_cost(fn: modes.DenseFn, batch: int, in_f: int, out_f: int, bias: bool, fast: bool) -> float:
    """Seconds the checks of a slow stage (an emulated version, Triton's interpreter) will take,
    from forward and backward calls timed at these sizes (in float64, as gradcheck calls them)."""
    x = torch.randn(batch, in_f, dtype=torch.float64, requires_grad=True)
    w = torch.randn(out_f, in_f, dtype=torch.float64, requires_grad=True)
    b = torch.randn(out_f, dtype=torch.float64, requires_grad=True) if bias else None
    times = []
    for _ in range(3):  # the first pays for starting autograd's thread and mapping the fibers' stacks
        start = time.perf_counter()
        y = fn(x, w, b)
        middle = time.perf_counter()
        y.backward(torch.ones_like(y))
        times.append((middle - start, time.perf_counter() - middle))
    forward, backward = min(t[0] for t in times[1:]), min(t[1] for t in times[1:])
    n_in, n_out = batch * in_f + out_f * in_f + (out_f if bias else 0), batch * out_f
    calls = (12, 12) if fast else (2 * n_in, n_out)  # (forward, backward) calls; fast mode: a few per input
    jacobians = 0 if fast else n_in * n_out * 1e-7  # gradcheck_cost's price of a Jacobian entry
    return calls[0] * forward + calls[1] * backward + jacobians


if __name__ == "__main__":
    cli.run(main)
