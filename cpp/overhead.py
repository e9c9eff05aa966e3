"""Where the microseconds of one small call go: the py and cpp stages against the reference.

At B=1, I=O=64 the arithmetic takes a few microseconds and everything else is overhead:
Python checks, the autograd machinery, the dispatcher. Each row times one layer of that stack
alone (timing.measure, the repository's one timing harness, all rows interleaved), so the
differences between rows say what each layer costs.

For the py stage it times `Function.apply` itself beside the C++ apply underneath it, and the
inspect binding that apply runs first, alone: what a Function's Python entry costs a small call,
beside the reference's forward.

It also times the cpp stage's own kernels with their autograd formula registered from Python
(torch.library.register_autograd, on an op of a scratch namespace made here) beside the same
kernels with the formula in C++ (dense::DenseFunction, what the stage uses): chapter 2's lesson.

Examples:
  python cpp/overhead.py                              # print the table
  python cpp/overhead.py --rounds 10 -b 32            # another size
  python cpp/overhead.py --json /tmp/overhead.json    # also write the JSON record
(docs/README.md lists the command that wrote docs/results/cpp_overhead.json.)
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

import cli  # noqa: E402
import modes  # noqa: E402
import record_info  # noqa: E402
import timing  # noqa: E402

APPLY = "py: Function.apply"
UNDER = "py: the C++ apply under it"
BINDING = "py: inspect binding alone"
UNDER_WHAT = "recording the graph: Function.apply without its Python part"
SCRATCH = "dense_cpp_pyautograd"  # the namespace of the op with a Python autograd formula
PY_AUTOGRAD = "cpp, Python autograd"
_scratch_lib: torch.library.Library | None = None  # kept alive: dropping it removes the op


def python_autograd_op() -> Callable[..., Tensor]:
    """The cpp stage's forward and backward kernels behind a scratch op whose autograd formula is
    Python, registered with torch.library.register_autograd: every call with autograd then runs
    a Python setup_context (and a Python backward), where dense::DenseFunction runs C++.

    The scratch op's kernel is a Python function that calls torch.ops.dense_cpp.forward (a
    Python-defined op cannot have a C++ kernel without a build of its own); the row
    "forward op, no autograd" of this variant shows what that frame costs alone."""
    global _scratch_lib
    ops = torch.ops.dense_cpp
    if _scratch_lib is None:
        lib = torch.library.Library(SCRATCH, "DEF")
        lib.define("forward(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
        # Called below the Autograd key, so the C++ op runs its CPU kernel and no autograd of its own.
        lib.impl("forward", lambda x, weight, bias: ops.forward(x, weight, bias), "CPU")

        def setup_context(ctx, inputs, output) -> None:
            x, weight, bias = inputs
            ctx.save_for_backward(x, weight, output)
            ctx.has_bias = bias is not None

        def backward(ctx, grad_out: Tensor):
            x, weight, out = ctx.saved_tensors
            need_x, need_w, need_b = ctx.needs_input_grad
            gx, gw, gb = ops.backward(grad_out, x, weight, out, [need_x, need_w, need_b and ctx.has_bias])
            return (gx if need_x else None, gw if need_w else None, gb if need_b and ctx.has_bias else None)

        torch.library.register_autograd(f"{SCRATCH}::forward", backward, setup_context=setup_context, lib=lib)
        _scratch_lib = lib
    return getattr(torch.ops, SCRATCH).forward.default


def apply_rows(x: Tensor, w: Tensor, b: Tensor) -> dict[str, tuple]:
    """The py stage's Function.apply, the C++ apply under it, and the inspect binding apply runs
    first, alone."""
    py = modes.stage("py")
    forward = py.DenseFunction.forward
    # What torch.autograd.Function.apply calls once its Python part is done (torch 2.13): a
    # private entry, timed here only to measure that part, never called by the stage.
    under = super(torch.autograd.Function, py.DenseFunction).apply

    def binding():
        # What torch.autograd.Function.apply runs first (torch 2.13's bind_default_args).
        bound = inspect.signature(forward).bind(x, w, b)
        bound.apply_defaults()
        return bound.args, bound.kwargs

    return {
        APPLY: (lambda: py.DenseFunction.apply(x, w, b), "recording the graph; binds with inspect first"),
        UNDER: (lambda: under(x, w, b), UNDER_WHAT),
        BINDING: (binding, "inspect.signature(forward).bind(x, w, b)"),
    }


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

    def inference(fn):
        def call():
            with torch.inference_mode():  # no Autograd kernel runs at all
                return fn(xd, wd, bd)
        return call

    def reference(x, w, b):
        return torch.sigmoid(F.linear(x, w, b))

    out = {
        "reference: forward, no autograd": (nograd(reference), "F.linear + sigmoid, under no_grad"),
        "reference: forward": (lambda: reference(x, w, b), "recording the graph"),
        "reference: forward + backward": (step(reference), "then torch.autograd.grad"),
    }
    for mode in modes_:
        fn = modes.dense(mode)
        if mode == "py":
            out["py: input checks"] = (lambda: modes.check_inputs(x, w, b), "modes.check_inputs")
            out["py: forward, no autograd"] = (nograd(fn), "under no_grad: checks, apply, torch ops")
            out.update(apply_rows(x, w, b))
        else:
            ops = getattr(torch.ops, f"dense_{mode}")
            y = ops.forward(xd, wd, bd)
            out[f"{mode}: forward op, no autograd"] = (inference(ops.forward), "in inference_mode: dispatcher, "
                                                       "C++ checks, kernel")
            out[f"{mode}: backward op alone"] = (lambda ops=ops, y=y: ops.backward(g, xd, wd, y, [True, True, True]),
                                                 "dispatcher, C++ checks, kernel")
        out[f"{mode}: forward"] = (lambda fn=fn: fn(x, w, b), "recording the graph")
        out[f"{mode}: forward + backward"] = (step(fn), "then torch.autograd.grad")
        if mode == "cpp":
            scratch = python_autograd_op()
            out[f"{PY_AUTOGRAD}: forward op, no autograd"] = (
                inference(scratch), "in inference_mode: a Python kernel calls the C++ op")
            out[f"{PY_AUTOGRAD}: forward"] = (lambda fn=scratch: fn(x, w, b), "a Python setup_context")
            out[f"{PY_AUTOGRAD}: forward + backward"] = (step(scratch), "a Python backward calls the backward op")
    return out


def measure(batch: int, in_f: int, out_f: int, dtype: torch.dtype, modes_: list[str], rounds: int) -> dict:
    table = rows(batch, in_f, out_f, dtype, modes_)
    stats = timing.measure({k: v[0] for k, v in table.items()}, rounds=rounds)
    ref = stats["reference: forward + backward"].median
    return {
        **record_info.record_header("cpu", dtype),
        "benchmark": "cpp_overhead",
        "shape": {"batch": batch, "in": in_f, "out": out_f},
        "rounds": rounds,
        "rows": [{"name": k, "what": table[k][1], "median_us": s.median, "spread_us": s.spread,
                  "over_reference_step": s.median / ref} for k, s in stats.items()],
    }


def render(record: dict) -> str:
    """A Markdown table of one record (docs/render.py, marker kind `cpp_overhead`)."""
    out = ["| what is timed | µs per call (IQR) | / reference fwd+bwd | how |", "|---|---:|---:|---|"]
    for r in record["rows"]:
        what = UNDER_WHAT if r["name"] == UNDER else r["what"]  # the same call; says what it is, not who calls it
        out.append(f"| {r['name']} | {r['median_us']:.1f} ({r['spread_us']:.1f}) | "
                   f"{r['over_reference_step']:.2f} | {what} |")
    by_name = {r["name"]: r["median_us"] for r in record["rows"]}
    if f"{PY_AUTOGRAD}: forward + backward" in by_name and "cpp: forward + backward" in by_name:
        fwd, step = (by_name[f"{PY_AUTOGRAD}: {k}"] - by_name[f"cpp: {k}"] for k in ("forward", "forward + backward"))
        out.append(f"\nThe same kernels with the autograd formula in Python: {fwd:+.1f} µs a forward, "
                   f"{step:+.1f} µs a forward + backward (medians' differences).")
    if {APPLY, UNDER, BINDING, "reference: forward"} <= by_name.keys():
        out.append(f"\n`Function.apply` over the C++ apply under it: {by_name[APPLY] - by_name[UNDER]:+.1f} µs a call "
                   f"(the inspect binding alone: {by_name[BINDING]:.1f} µs); the reference's whole forward: "
                   f"{by_name['reference: forward']:.1f} µs (medians).")
    s = record["shape"]
    out.append("\n" + record_info.footer(record, f"B={s['batch']} I={s['in']} O={s['out']}",
                                       f"{record['rounds']} rounds"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("-b", "--batch", type=int, default=1)
    parser.add_argument("-i", "--in-features", type=int, default=64)
    parser.add_argument("-o", "--out-features", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--rounds", type=int, default=20, help="interleaved samples per row")
    parser.add_argument("--malloc", choices=timing.MALLOC_CHOICES, default="retain",
                        help="as benchmark.py's --malloc (default retain: freed memory stays in the process)")
    parser.add_argument("--json", metavar="PATH", help="also write the record as JSON to PATH")
    args = parser.parse_args(argv)
    if min(args.batch, args.in_features, args.out_features, args.rounds) < 1:
        parser.error("sizes and --rounds must be at least 1")
    json_path = cli.check_output(args.json, "--json")  # before minutes of work, not after
    timing.set_malloc(args.malloc)
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
