"""Time the Triton stage on a GPU against cuBLAS + sigmoid and chapter 3's hand-written kernels.

One line per variant, float32 IEEE and TF32 apart (a TF32 GEMM rounds its inputs to 10-bit
mantissas: faster, and not the same numbers):
  reference          torch.sigmoid(F.linear(x, W, b)): cuBLAS, TF32 off
  triton             the stage, IEEE float32; its forward autotuned over tiles/kernels.py's FORWARD_CONFIGS
  cuda               chapter 3's kernels, automatic version (v8; v9 for small batches), where they build
  reference, TF32    cuBLAS with torch.backends.cuda.matmul.allow_tf32 = True
  triton, TF32       the stage under the same switch (tl.dot input_precision="tf32")
Times: the forward alone and fwd+bwd (forward then backward, as in training), with
benchmark.py's harness (events, L2 flushed before each call, rounds interleaved); ratios are
paired with the reference's fwd+bwd in the same round (docs/README.md: the statistics). The
autotuner's first call at a shape times every configuration; it happens before the timing.

Examples:
  python tiles/bench_gpu.py                                      # GPU: B = I = O = 4096
  python tiles/bench_gpu.py -b 32 -i 4096 -o 4096 --json /tmp/triton_gpu_b32.json
  python tiles/bench_gpu.py --smoke      # anywhere: every line once at a small shape, checked, not timed
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # the repository's modules, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (first: a Ctrl-C during the imports below is one line too)

# isort: split
from collections.abc import Callable  # noqa: E402

import torch  # noqa: E402

import benchmark  # noqa: E402
import modes  # noqa: E402
import record_info  # noqa: E402
import timing  # noqa: E402

SMOKE_SHAPE = (33, 65, 17)


def variants(dtype: torch.dtype) -> tuple[dict[str, tuple[Callable, bool]], dict[str, str]]:
    """{line: (function, TF32 allowed)} and {line left out: why}."""
    lines: dict[str, tuple[Callable, bool]] = {"reference": (benchmark.reference, False),
                                               "triton": (modes.dense("triton"), False)}
    skipped = {}
    reason = modes.available()["cuda"]
    if reason is None and torch.cuda.is_available():
        modes.stage("cuda").select_kernel(0)
        lines["cuda"] = (modes.dense("cuda"), False)
    else:
        skipped["cuda"] = reason or "runs on a GPU only"
    if dtype == torch.float32:
        lines["reference, TF32"] = (benchmark.reference, True)
        lines["triton, TF32"] = (modes.dense("triton"), True)
    return lines, skipped


def _with_tf32(fn: Callable, tf32: bool) -> Callable:
    def call(*args):
        # Set on every call, for every line alike: cuBLAS and the stage both read the switch then.
        torch.backends.cuda.matmul.allow_tf32 = tf32
        return fn(*args)
    return call


def smoke(dtype: torch.dtype) -> int:
    """Every line once at a small shape on whatever runs here, checked against the reference."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    lines, skipped = variants(dtype)
    (tensors, grad_out) = benchmark.inputs(*SMOKE_SHAPE, device, dtype, 0)
    ref_y = benchmark.reference(*tensors)
    ref_grads = torch.autograd.grad(ref_y, tensors, grad_out)
    failed = 0
    for name, (fn, tf32) in lines.items():
        y = _with_tf32(fn, tf32)(*tensors)
        grads = torch.autograd.grad(y, tensors, grad_out)
        tol = {"rtol": 1e-2, "atol": 1e-2} if tf32 else {"rtol": 1e-4, "atol": 1e-5}
        ok = all(torch.allclose(a, b, **tol) for a, b in zip((y, *grads), (ref_y, *ref_grads)))
        failed += not ok
        print(f"{'PASS' if ok else 'FAIL'}  {name}: forward and backward against the reference")
    torch.backends.cuda.matmul.allow_tf32 = False
    for name, why in skipped.items():
        print(f"SKIP  {name}: {why}")
    print(f"smoke run on {device} at B={SMOKE_SHAPE[0]} I={SMOKE_SHAPE[1]} O={SMOKE_SHAPE[2]}: nothing was timed")
    return 1 if failed else 0


def run(batch: int, in_f: int, out_f: int, dtype: torch.dtype, rounds: int, device: str = "cuda") -> dict:
    lines, skipped = variants(dtype)
    tensors, grad_out = benchmark.inputs(batch, in_f, out_f, device, dtype, 0)
    timed = {}
    for name, (fn, tf32) in list(lines.items()):
        call = _with_tf32(fn, tf32)
        try:
            call(*tensors)  # the autotuner times its configurations here, outside the timing
        except RuntimeError as e:  # a line whose launch fails is recorded; the others are still timed
            skipped[name] = "failed: " + ((str(e).strip().splitlines() or [type(e).__name__])[0])[:300]
            del lines[name]
            print(f"FAIL  {name}: {skipped[name]} (not timed)", file=sys.stderr, flush=True)
            continue
        timed[f"{name}/forward"] = lambda call=call: call(*tensors)
        timed[f"{name}/fwd+bwd"] = lambda call=call: torch.autograd.grad(call(*tensors), tensors, grad_out)
    if "reference" not in lines:
        raise cli.UserError(f"the reference itself failed: {skipped['reference']}")
    stats = timing.measure(timed, device=device, rounds=rounds)
    torch.backends.cuda.matmul.allow_tf32 = False
    flops = 2 * batch * in_f * out_f
    ref = stats["reference/fwd+bwd"].samples
    tuned = modes.stage("triton").forward_tuned
    results = []
    for name, (_, tf32) in lines.items():
        fwd, both = stats[f"{name}/forward"], stats[f"{name}/fwd+bwd"]
        paired = timing.paired_ratio(both.samples, ref)
        results.append({"line": name, "tf32": tf32, "forward_us": fwd.median, "forward_spread_us": fwd.spread,
                        "fwd_bwd_us": both.median, "fwd_bwd_spread_us": both.spread,
                        "forward_tflops": flops / fwd.median / 1e6, "fwd_bwd_tflops": 3 * flops / both.median / 1e6,
                        "ratio_to_reference": paired["ratio"], "ratio_ci": paired["ci"], "verdict": paired["verdict"]})
    best = getattr(tuned, "best_config", None)
    return {**record_info.record_header(device, dtype), "triton": _triton_version(),
            "shape": {"batch": batch, "in": in_f,
            "out": out_f}, "rounds": len(ref), "skipped": skipped, "autotuned": str(best) if best else None,
            "results": results}


def _triton_version() -> str:
    import triton

    return triton.__version__


def table(record: dict) -> str:
    rows = ["| line | TF32 | forward µs (IQR) | forward TFLOP/s | fwd+bwd µs (IQR) | fwd+bwd / reference (95% CI) "
            "| verdict |", "|---|---|---:|---:|---:|---:|---|"]
    for r in record["results"]:
        ci = r["ratio_ci"]
        ratio = f"{r['ratio_to_reference']:.3f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")
        verdict = "(the reference)" if r["line"] == "reference" else r["verdict"]
        rows.append(f"| {r['line']} | {'yes' if r['tf32'] else 'no'} | {r['forward_us']:.1f} "
                    f"({r['forward_spread_us']:.1f}) | {r['forward_tflops']:.1f} | {r['fwd_bwd_us']:.1f} "
                    f"({r['fwd_bwd_spread_us']:.1f}) | {ratio} | {verdict} |")
    s = record["shape"]
    skipped = "".join(f" Not timed: {k} ({v})." for k, v in record.get("skipped", {}).items())
    rows.append("\n" + record_info.footer(record, f"B={s['batch']} I={s['in']} O={s['out']}",
                                        f"{record['rounds']} rounds", f"autotuned forward: {record['autotuned']}",
                                        tools=[f"Triton {record['triton']}"], sep=f".{skipped} "))
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    size = cli.positive(int)
    parser.add_argument("-b", "--batch", type=size, default=4096)
    parser.add_argument("-i", "--in-features", type=size, default=4096)
    parser.add_argument("-o", "--out-features", type=size, default=4096)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rounds", type=size, default=20, help="interleaved samples per line (default 20)")
    parser.add_argument("--json", metavar="PATH", help="write the record as JSON (the folder must exist)")
    parser.add_argument("--smoke", action="store_true",
                        help="run every line once at a small shape, check it, time nothing (works without a GPU)")
    args = parser.parse_args(argv)
    dtype = getattr(torch, args.dtype)
    reason = modes.available()["triton"]
    if reason is not None:
        raise cli.UserError(f"mode 'triton' is not available here: {reason}")
    if args.smoke:
        return smoke(dtype)
    if not torch.cuda.is_available():
        raise cli.UserError(f"timing needs a GPU (this torch is {torch.__version__}); Triton's interpreter is no "
                            "speed measurement. --smoke runs every line once, untimed")
    if modes.stage("triton").INTERPRETED:
        raise cli.UserError("TRITON_INTERPRET=1 is set: the stage runs in Triton's interpreter, which is no speed "
                            "measurement; unset it to time the compiled kernels")
    json_path = cli.check_output(args.json, "--json")
    b, i, o = args.batch, args.in_features, args.out_features
    cli.check_memory(benchmark.estimate_bytes(b, i, o, 5, dtype), "cuda", f"B={b} I={i} O={o}")
    print(f"timing at B={b} I={i} O={o} (the autotuner's first call times its configurations)...",
          file=sys.stderr, flush=True)
    record = run(b, i, o, dtype, args.rounds)
    return cli.publish(table(record), [(json_path, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
