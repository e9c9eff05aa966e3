"""Where the microseconds of one small call go: the py and cpp stages against the reference.

At B=1, I=O=64 the arithmetic takes a few microseconds and everything else is overhead:
Python checks, the autograd machinery, the dispatcher. Each row times one layer of that stack
alone (benchmark.measure, the repository's one timing harness, all rows interleaved), so the
differences between rows say what each layer costs.

Examples:
  python cpp/overhead.py                              # print the table
  python cpp/overhead.py --rounds 10 -b 32            # another size
  python cpp/overhead.py --json /tmp/overhead.json    # also write the JSON record
(docs/results/cpp_overhead.json records the command that wrote it; docs/README.md lists them all.)
"""

from __future__ import annotations

import datetime
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import benchmark  # noqa: E402
import cli  # noqa: E402
import modes  # noqa: E402


def rows(batch: int, in_f: int, out_f: int, dtype: torch.dtype, modes_: list[str]) -> dict[str, tuple]:
    """Row name -> (callable, what it measures)."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen, dtype=dtype).requires_grad_()
               for s in ((batch, in_f), (out_f, in_f), (out_f,)))
    g = torch.randn(batch, out_f, generator=gen, dtype=dtype)
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    ts = (x, w, b)

    def step(fn):
        return lambda: torch.autograd.grad(fn(x, w, b), ts, g)

    def nograd(fn):
        def call():
            with torch.no_grad():
                return fn(xd, wd, bd)
        return call

    def reference(x, w, b):
        return torch.sigmoid(F.linear(x, w, b))

    out = {
        "reference: forward, no autograd": (nograd(reference), "F.linear + sigmoid under no_grad"),
        "reference: forward": (lambda: reference(x, w, b), "the same, recording the graph"),
        "reference: forward + backward": (step(reference), "forward, then torch.autograd.grad"),
    }
    for mode in modes_:
        fn = modes.dense(mode)
        if mode == "py":
            out["py: input checks"] = (lambda: modes.check_inputs(x, w, b), "modes.check_inputs, on py's path")
            out["py: forward, no autograd"] = (nograd(fn), "modes.dense('py') under no_grad: checks + "
                                                           "Function.apply + the torch ops")
        else:
            ops = getattr(torch.ops, f"dense_{mode}")
            y = ops.forward(xd, wd, bd)

            def kernel(ops=ops):
                with torch.inference_mode():  # no Autograd kernel at all
                    return ops.forward(xd, wd, bd)
            out[f"{mode}: forward op, no autograd"] = (kernel, "torch.ops call in inference_mode: dispatcher, "
                                                       "C++ checks, kernel")
            out[f"{mode}: backward op alone"] = (lambda ops=ops, y=y: ops.backward(g, xd, wd, y, [True, True, True]),
                                                 "torch.ops backward call: dispatcher, C++ checks, kernel")
        out[f"{mode}: forward"] = (lambda fn=fn: fn(x, w, b), f"modes.dense('{mode}'), recording the graph")
        out[f"{mode}: forward + backward"] = (step(fn), "forward, then torch.autograd.grad")
    return out


def measure(batch: int, in_f: int, out_f: int, dtype: torch.dtype, modes_: list[str], rounds: int) -> dict:
    table = rows(batch, in_f, out_f, dtype, modes_)
    stats = benchmark.measure({k: v[0] for k, v in table.items()}, rounds=rounds)
    ref = stats["reference: forward + backward"].median
    return {
        "device": benchmark.describe_device("cpu"),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "dtype": str(dtype).removeprefix("torch."),
        "shape": {"batch": batch, "in": in_f, "out": out_f},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "rounds": rounds,
        "command": "python cpp/overhead.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "rows": [{"name": k, "what": table[k][1], "median_us": s.median, "spread_us": s.spread,
                  "over_reference_step": s.median / ref} for k, s in stats.items()],
    }


def _commit() -> str | None:
    """The code measured: HEAD, marked "+changes" if tracked files differ from it."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (head + ("+changes" if dirty else "")) or None


def render(record: dict) -> str:
    """A Markdown table of one record (docs/render.py, marker kind `overhead`)."""
    out = ["| what is timed | µs per call (IQR) | / reference fwd+bwd | how |", "|---|---:|---:|---|"]
    for r in record["rows"]:
        out.append(f"| {r['name']} | {r['median_us']:.1f} ({r['spread_us']:.1f}) | "
                   f"{r['over_reference_step']:.2f} | {r['what']} |")
    s = record["shape"]
    out.append(f"\n{record['device']}, torch {record['torch']}, {record['threads']} threads, {record['dtype']}, "
               f"B={s['batch']} I={s['in']} O={s['out']}, {record['rounds']} rounds, {record['date']}: "
               f"`{record['command']}`" + (f" (code: {record['commit']})" if record.get("commit") else ""))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("-b", "--batch", type=int, default=1)
    parser.add_argument("-i", "--in-features", type=int, default=64)
    parser.add_argument("-o", "--out-features", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved samples per row")
    parser.add_argument("--json", metavar="PATH", help="also write the record as JSON to PATH")
    args = parser.parse_args(argv)
    if min(args.batch, args.in_features, args.out_features, args.rounds) < 1:
        parser.error("sizes and --rounds must be at least 1")
    json_path = cli.check_output(args.json, "--json")  # before minutes of work, not after
    reasons = modes.available()
    selected = [m for m in ("py", "cpp") if reasons[m] is None]
    for m in ("py", "cpp"):
        if reasons[m] is not None:
            print(f"skipping {m}: {reasons[m]}", file=sys.stderr)
    record = measure(args.batch, args.in_features, args.out_features, getattr(torch, args.dtype), selected,
                     args.rounds)
    return cli.publish(render(record), [(json_path, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
