"""Check each stage's forward and backward against nn.Linear + torch.sigmoid.

For every mode: torch.autograd.gradcheck in float64 (the stage's backward against finite
differences of its own forward), then the float32 output and gradients against the torch
reference. One line per check; the exit status is 0 only if every check passed.

Examples:
  python grad_check.py py
  python grad_check.py all                      # every mode that works here
  python grad_check.py cpp -b 64 -i 128 -o 32 --no-bias
  python grad_check.py cuda --device cuda
  python grad_check.py cuda --emulate --kernel 3   # stage 3's kernels on the CPU (cuda/emulated.py)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

import torch

import modes

# float32 results differ from the reference only by rounding in the reductions. A check
# passes when |actual − reference| ≤ ATOL·max(1, max|reference|) + RTOL·|reference|.
RTOL, ATOL = 1e-4, 1e-5


@dataclass
class Check:
    mode: str
    name: str
    passed: bool
    detail: str = ""

    def line(self) -> str:
        return f"{'PASS' if self.passed else 'FAIL'}  {self.mode:<4}  {self.name:<38} {self.detail}"


def compare(actual: torch.Tensor, ref: torch.Tensor) -> tuple[bool, str]:
    """The tolerance test above; returns (passed, a one-line description)."""
    scale = max(1.0, ref.abs().max().item()) if ref.numel() else 1.0
    err = (actual.double() - ref.double()).abs()
    allowed = ATOL * scale + RTOL * ref.double().abs()
    worst = err.max().item() if err.numel() else 0.0
    return bool((err <= allowed).all()), f"max |err| {worst:.2e} (rtol {RTOL:g}, atol {ATOL:g}·scale)"


def run_checks(mode: str, batch: int, in_f: int, out_f: int, device: str = "cpu",
               bias: bool = True, seed: int = 0, fn: modes.DenseFn | None = None) -> list[Check]:
    """Run gradcheck and the reference comparison for one mode (or ``fn``); one Check per line."""
    fn = fn or modes.dense(mode)
    gen = torch.Generator().manual_seed(seed)
    names = ("x", "weight", "bias")[: 3 if bias else 2]

    def make(dtype: torch.dtype) -> list[torch.Tensor]:
        shapes = [(batch, in_f), (out_f, in_f), (out_f,)][: len(names)]
        return [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_() for s in shapes]

    def call(*t: torch.Tensor) -> torch.Tensor:
        return fn(t[0], t[1], t[2] if bias else None)

    checks = []
    inputs64 = make(torch.float64)
    try:
        ok = torch.autograd.gradcheck(call, inputs64, eps=1e-6, atol=1e-5, rtol=1e-3)
        checks.append(Check(mode, f"gradcheck float64 ({', '.join(names)})", ok))
    except Exception as e:  # gradcheck raises with the mismatching Jacobian in the message
        checks.append(Check(mode, f"gradcheck float64 ({', '.join(names)})", False, str(e).splitlines()[0]))

    inputs = make(torch.float32)
    ref_inputs = [t.detach().clone().requires_grad_() for t in inputs]
    grad_out = torch.randn(batch, out_f, generator=gen).to(device)
    y = call(*inputs)
    y_ref = torch.sigmoid(torch.nn.functional.linear(*ref_inputs))
    ok, detail = compare(y, y_ref)
    checks.append(Check(mode, "forward float32 vs reference", ok, detail))
    y.backward(grad_out)
    y_ref.backward(grad_out)
    for name, t, r in zip(names, inputs, ref_inputs):
        ok, detail = compare(t.grad, r.grad)
        checks.append(Check(mode, f"grad {name} float32 vs reference", ok, detail))
    return checks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__[__doc__.index("Examples:"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("mode", choices=[*modes.MODES, "all"])
    parser.add_argument("-b", "--batch", type=int, default=8)
    parser.add_argument("-i", "--in-features", type=int, default=16)
    parser.add_argument("-o", "--out-features", type=int, default=12)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--no-bias", action="store_true")
    parser.add_argument("--emulate", action="store_true",
                        help="mode cuda only: run stage 3's kernels on the CPU through the execution-model emulation")
    parser.add_argument("--kernel", type=int, metavar="N", default=None,
                        help="with --emulate: GEMM version N only (0 = automatic; default: every version)")
    args = parser.parse_args(argv)
    if min(args.batch, args.in_features, args.out_features) < 1:
        parser.error("batch, in and out features must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda needs a CUDA build of torch and a GPU (this torch is {torch.__version__})")

    if args.emulate or args.kernel is not None:
        return emulated(parser, args)
    try:
        selected, skipped = modes.resolve(args.mode)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    for m, reason in skipped.items():
        print(f"SKIP  {m:<4}  {reason}")

    failed = 0
    for mode in selected:
        for check in run_checks(mode, args.batch, args.in_features, args.out_features,
                                args.device, bias=not args.no_bias):
            print(check.line(), flush=True)
            failed += not check.passed
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} "
          f"({', '.join(selected)}; B={args.batch}, in={args.in_features}, out={args.out_features}, "
          f"{args.device})")
    return 1 if failed else 0


def emulated(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """grad_check.py cuda --emulate: every (or one) GEMM version of stage 3, run on the CPU."""
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
        print(f"cannot emulate: {emu.unavailable_reason()}", file=sys.stderr)
        return 2
    failed = 0
    for v in versions:
        for check in run_checks(f"v{v}", args.batch, args.in_features, args.out_features,
                                bias=not args.no_bias, fn=emu.dense(v)):
            print(check.line(), flush=True)
            failed += not check.passed
    print(f"{'all checks passed' if not failed else f'{failed} check(s) FAILED'} (cuda kernels emulated on the "
          f"CPU, versions {', '.join(map(str, versions))}; B={args.batch}, in={args.in_features}, "
          f"out={args.out_features})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
