"""Time each stage's forward and backward against the torch reference, honestly.

The reference is nn.Linear + torch.sigmoid in eager mode (``--compile`` adds the same
under torch.compile). All variants are timed in one run, interleaved round by round, so
drift (clocks, other processes) hits them alike. The forward runs with autograd recording,
as in training; the backward is timed alone, replayed on a retained graph.
CPU: torch.utils.benchmark.Timer. CUDA: events around each call, after warm-up and with the
L2 cache flushed before every timed call. Reported: median and spread (interquartile range)
in µs, GFLOP/s (2·B·I·O forward, 4·B·I·O backward), and each variant's fwd+bwd time over
the reference's (the median over rounds of the ratio within a round).

Examples:
  python benchmark.py -m all
  python benchmark.py -m cpp -b 1024 -i 1024 -o 1024 --json docs/results/cpu_1024.json
  python benchmark.py -m all --compile --plot docs/results/cpu_1024.png
  python benchmark.py -m py --dtype float64 --rounds 5
  python benchmark.py -m cuda --device cuda -b 4096 -i 4096 -o 4096 --kernel 3
  python benchmark.py -m ptx --device cuda --ptx compiler      # the compiler's PTX, to measure the edits
  python benchmark.py -m all --device cuda -b 4096 -i 4096 -o 4096 --roofline
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

import modes

# ---------------------------------------------------------------------------
# The timing harness (used by every benchmark in this repository)
# ---------------------------------------------------------------------------

@dataclass
class Stats:
    """Per-call times of one variant, in microseconds."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def spread(self) -> float:
        """Interquartile range: robust to the odd slow sample that a mean would chase."""
        if len(self.samples) < 2:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        return q[2] - q[0]


def describe_device(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return "cpu: " + line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu: " + (platform.processor() or platform.machine())


def measure(fns: dict[str, Callable[[], object]], device: str = "cpu", rounds: int = 20,
            warmup: int = 3, min_sample_s: float = 0.01, number: int | None = None) -> dict[str, Stats]:
    """Time every callable ``rounds`` times, interleaved; returns per-call Stats in µs.

    Each round runs every callable once in an order that rotates from round to round, so
    no variant always runs first (cold) or right after a heavy one. On the CPU a sample
    averages enough calls to last ``min_sample_s``, or exactly ``number`` calls: ranks that
    time a collective together must all make the same calls.
    """
    names = list(fns)
    for _ in range(warmup):
        for name in names:
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        # Writing twice the L2's size evicts whatever the previous call left in it.
        flush = torch.empty(max(2 * props.L2_cache_size, 1 << 20), dtype=torch.uint8, device=device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                flush.zero_()
                start.record()
                fns[name]()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) * 1e3)
    else:
        from torch.utils.benchmark import Timer

        timers, calls = {}, {}
        for name in names:
            # Timer runs on one thread unless told otherwise: give it the threads torch has.
            timers[name] = Timer(stmt="fn()", globals={"fn": fns[name]}, num_threads=torch.get_num_threads())
            if number is None:  # enough calls per sample that timer resolution does not matter
                once = timers[name].timeit(1).median
                calls[name] = max(1, int(min_sample_s / max(once, 1e-9)))
            else:
                calls[name] = number
        for r in range(rounds):
            for name in names[r % len(names):] + names[: r % len(names)]:
                samples[name].append(timers[name].timeit(calls[name]).median * 1e6)
    return {name: Stats(s) for name, s in samples.items()}


# ---------------------------------------------------------------------------
# The Dense benchmark
# ---------------------------------------------------------------------------

def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.sigmoid(F.linear(x, weight, bias))


def run(variants: Sequence[str], batch: int, in_f: int, out_f: int, device: str = "cpu",
        dtype: torch.dtype = torch.float32, rounds: int = 20, seed: int = 0) -> dict:
    """Benchmark the given variants ("reference", "compile" or a mode); returns the JSON record."""
    gen = torch.Generator().manual_seed(seed)
    tensors = [torch.randn(s, generator=gen, dtype=dtype).to(device).requires_grad_()
               for s in ((batch, in_f), (out_f, in_f), (out_f,))]
    grad_out = torch.randn(batch, out_f, generator=gen, dtype=dtype).to(device)
    funcs = {"reference": reference, "compile": torch.compile(reference) if "compile" in variants else None}
    funcs.update({m: modes.dense(m) for m in variants if m in modes.MODES})

    timed: dict[str, Callable[[], object]] = {}
    for name in variants:
        fn = funcs[name]
        out = fn(*tensors)  # the graph that the backward replays (retain_graph)
        timed[f"{name}/forward"] = lambda fn=fn: fn(*tensors)
        timed[f"{name}/backward"] = lambda out=out: torch.autograd.grad(out, tensors, grad_out,
                                                                         retain_graph=True)
    stats = measure(timed, device=device, rounds=rounds)

    flops = 2 * batch * in_f * out_f
    results = []
    for name in variants:
        fwd, bwd = stats[f"{name}/forward"], stats[f"{name}/backward"]
        results.append({
            "mode": name,
            "forward_us": fwd.median, "backward_us": bwd.median,
            "forward_spread_us": fwd.spread, "backward_spread_us": bwd.spread,
            "forward_gflops": flops / fwd.median / 1e3, "backward_gflops": 2 * flops / bwd.median / 1e3,
        })
    # Paired: each round's fwd+bwd time over the reference's in the same round, then the median.
    # Drift that slows a whole round (another process, clocks) cancels out of every ratio.
    ref = [f + b for f, b in zip(stats["reference/forward"].samples, stats["reference/backward"].samples)]
    for r in results:
        mine = [f + b for f, b in zip(stats[f"{r['mode']}/forward"].samples, stats[f"{r['mode']}/backward"].samples)]
        r["ratio_to_reference"] = statistics.median(m / q for m, q in zip(mine, ref))
    return {
        "device": describe_device(device),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "shape": {"batch": batch, "in": in_f, "out": out_f},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": rounds,
        "command": "python benchmark.py " + " ".join(sys.argv[1:]),
        "results": results,
    }


# Peak rates from NVIDIA's datasheets (SXM parts): FP32 and FP64 without tensor cores, HBM GB/s.
PEAKS = {"H200": {"float32": 67.0, "float64": 34.0, "gbs": 4800.0},
         "H100": {"float32": 67.0, "float64": 34.0, "gbs": 3350.0}}


def roofline(stages: Sequence[str], batch: int, in_f: int, out_f: int, device: str, dtype: torch.dtype,
             rounds: int, peak_tflops: float | None = None, peak_gbs: float | None = None) -> list[dict]:
    """Each kernel of the compiled stages, timed alone through its op, against the device's peak.

    The forward op is the fused GEMM (compute-bound: TFLOP/s); the backward op with only the bias
    gradient asked for runs just the elementwise kernel (memory-bound: GB/s, 3 tensors of B×O
    moved). torch's own kernels for the same work are measured alongside.
    """
    name = describe_device(device)
    known = next((v for k, v in PEAKS.items() if k in name), None) if device.startswith("cuda") else None
    dname = str(dtype).removeprefix("torch.")
    peak_tflops = peak_tflops or (known[dname] if known else None)
    peak_gbs = peak_gbs or (known["gbs"] if known else None)
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen, dtype=dtype).to(device) for s in ((batch, in_f), (out_f, in_f), (out_f,)))
    g = torch.randn(batch, out_f, generator=gen, dtype=dtype).to(device)
    y = torch.sigmoid(F.linear(x, w, b))
    flops, nbytes = 2 * batch * in_f * out_f, (3 * batch * out_f + out_f) * x.element_size()
    kernels = {"reference: addmm + sigmoid": (lambda: torch.sigmoid(F.linear(x, w, b)), "flops"),
               "reference: sigmoid_backward + sum": (lambda: torch.ops.aten.sigmoid_backward(g, y).sum(0), "bytes")}
    for m in stages:
        modes.dense(m)  # loads and registers the stage
        ops = getattr(torch.ops, f"dense_{m}")
        kernels[f"{m}: fused GEMM + bias + sigmoid"] = (lambda ops=ops: ops.forward(x, w, b), "flops")
        kernels[f"{m}: sigmoid-grad + bias sum"] = (
            lambda ops=ops: ops.backward(g, x, w, y, [False, False, True]), "bytes")
    with torch.no_grad():
        stats = measure({k: v[0] for k, v in kernels.items()}, device=device, rounds=rounds)
    rows = []
    for k, (_, kind) in kernels.items():
        t = stats[k].median
        rate = flops / t / 1e6 if kind == "flops" else nbytes / t / 1e3  # TFLOP/s or GB/s
        peak = peak_tflops if kind == "flops" else peak_gbs
        rows.append({"kernel": k, "time_us": t, "unit": "TFLOP/s" if kind == "flops" else "GB/s",
                     "achieved": rate, "peak": peak, "fraction_of_peak": rate / peak if peak else None})
    return rows


def roofline_table(record: dict) -> str:
    rows = ["| kernel | µs | achieved | peak | share of peak |", "|---|---:|---:|---:|---:|"]
    for r in record["roofline"]:
        peak = f"{r['peak']:g} {r['unit']}" if r["peak"] else "unknown"
        share = f"{100 * r['fraction_of_peak']:.1f}%" if r["fraction_of_peak"] is not None else "–"
        rows.append(f"| {r['kernel']} | {r['time_us']:.1f} | {r['achieved']:.2f} {r['unit']} | {peak} | {share} |")
    s = record["shape"]
    rows.append(f"\n{record['device']}, torch {record['torch']}, {record['dtype']}, B={s['batch']} I={s['in']} "
                f"O={s['out']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def table(record: dict) -> str:
    """A Markdown table of one benchmark record (docs/render.py puts these into the READMEs)."""
    rows = ["| variant | forward µs (IQR) | backward µs (IQR) | fwd GFLOP/s | bwd GFLOP/s | fwd+bwd / reference |",
            "|---|---:|---:|---:|---:|---:|"]
    for r in record["results"]:
        rows.append(f"| {r['mode']} | {r['forward_us']:.1f} ({r['forward_spread_us']:.1f}) "
                    f"| {r['backward_us']:.1f} ({r['backward_spread_us']:.1f}) "
                    f"| {r['forward_gflops']:.1f} | {r['backward_gflops']:.1f} | {r['ratio_to_reference']:.3f} |")
    s = record["shape"]
    rows.append(f"\n{record['device']}, torch {record['torch']}, {record['threads']} threads, "
                f"{record['dtype']}, B={s['batch']} I={s['in']} O={s['out']}, {record['rounds']} rounds, "
                f"{record['date']}: `{record['command']}`")
    return "\n".join(rows)


def pyplot():
    """matplotlib.pyplot without a display; matplotlib is an optional extra."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("--plot needs matplotlib: pip install matplotlib") from None
    return plt


def plot(record: dict, path: str) -> None:
    plt = pyplot()
    names = [r["mode"] for r in record["results"]]
    fig, ax = plt.subplots(figsize=(1.6 * len(names) + 2, 3.5))
    xs = range(len(names))
    ax.bar([i - 0.2 for i in xs], [r["forward_us"] for r in record["results"]], 0.4,
           yerr=[r["forward_spread_us"] / 2 for r in record["results"]], label="forward")
    ax.bar([i + 0.2 for i in xs], [r["backward_us"] for r in record["results"]], 0.4,
           yerr=[r["backward_spread_us"] / 2 for r in record["results"]], label="backward")
    ax.set_xticks(list(xs), names)
    ax.set_ylabel("median µs per call (lower is better)")
    s = record["shape"]
    ax.set_title(f"Dense {s['batch']}×{s['in']}→{s['out']} {record['dtype']}, {record['device']}", fontsize=9)
    top = max(max(r["forward_us"], r["backward_us"]) for r in record["results"])
    ax.set_ylim(0, 1.25 * top)  # room for the legend above the bars
    ax.legend(ncols=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__[__doc__.index("Examples:"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-m", "--mode", choices=[*modes.MODES, "all"], default="all")
    parser.add_argument("-b", "--batch", type=int, default=1024)
    parser.add_argument("-i", "--in-features", type=int, default=1024)
    parser.add_argument("-o", "--out-features", type=int, default=1024)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--compile", action="store_true", help="also time torch.compile of the reference")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved samples per variant")
    parser.add_argument("--kernel", type=int, choices=range(10), metavar="N",
                        help="GEMM version of the cuda and ptx modes (0 automatic, 1-9; see cuda/README.md)")
    parser.add_argument("--roofline", action="store_true",
                        help="also time each compiled stage's kernels alone, against the device's peak")
    parser.add_argument("--peak-tflops", type=float, help="peak TFLOP/s for --roofline (known for H100/H200)")
    parser.add_argument("--peak-gbs", type=float, help="peak memory GB/s for --roofline (known for H100/H200)")
    parser.add_argument("--ptx", choices=["edited", "compiler"], default="edited",
                        help="ptx mode: the hand-edited PTX, or the compiler's own (bash ptx/regen.sh)")
    parser.add_argument("--json", metavar="PATH", help="write the results as one JSON object")
    parser.add_argument("--plot", metavar="PATH", help="draw a bar chart PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    if min(args.batch, args.in_features, args.out_features, args.rounds) < 1:
        parser.error("sizes and --rounds must be at least 1")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error(f"--device cuda needs a CUDA build of torch and a GPU (this torch is {torch.__version__})")

    try:
        selected, skipped = modes.resolve(args.mode)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 2
    for m, reason in skipped.items():
        print(f"skipping {m}: {reason}", file=sys.stderr)

    gpu_stages = [m for m in selected if m in ("cuda", "ptx")]
    if (args.kernel is not None or args.ptx != "edited") and not gpu_stages:
        parser.error("--kernel and --ptx apply to the cuda and ptx modes, and neither is selected or available")
    for m in gpu_stages:
        if args.kernel is not None:
            modes.stage(m).select_kernel(args.kernel)
    if "ptx" in gpu_stages and args.ptx == "compiler":
        modes.stage("ptx").load_ptx(modes.stage("ptx").GENERATED)
    # A float32 benchmark means float32 GEMMs: TF32 would make the reference 8x faster and less exact.
    torch.backends.cuda.matmul.allow_tf32 = False

    variants = ["reference"] + (["compile"] if args.compile else []) + selected
    record = run(variants, args.batch, args.in_features, args.out_features, args.device,
                 getattr(torch, args.dtype), args.rounds)
    record.update(kernel=args.kernel if args.kernel is not None else 0, ptx=args.ptx, tf32=False)
    if args.roofline:
        stages = [m for m in selected if m != "py"]  # py has no kernels of its own
        record["roofline"] = roofline(stages, args.batch, args.in_features, args.out_features, args.device,
                                      getattr(torch, args.dtype), args.rounds, args.peak_tflops, args.peak_gbs)
    # Files first: a reader that closes stdout early (| head) must not cost the results.
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    if args.plot:
        plot(record, args.plot)
    print(table(record))
    if args.roofline:
        print("\n" + roofline_table(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
