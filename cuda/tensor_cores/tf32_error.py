"""Split-TF32's error on the CPU: the float32 versions on tensor cores against float32's rule.

For each reduction length K (the layer's in features) the script draws one layer as
grad_check.draw does (x ~ N(0, 1), W and b ~ N(0, 1/K), grad_out ~ N(0, 1)), then measures
against the float64 truth on the very values drawn:

- the forward GEMM x·Wᵀ alone, the error that grows with K, computed by torch in float32 on this
  CPU (whose sums run in vector lanes and blocks), by chapter 3's v8 (float32 on the CUDA cores,
  emulated: one serial sum per output, as a SIMT GEMM's thread keeps), by a TF32 GEMM (grad_check.tf32 operands, the
  forward of grad_check.TF32Linear), by split-TF32's three products summed exactly in float64
  (split_gemm: the split's own error, without an accumulator's), and by the tensor-core versions
  v25 (TF32 on mma.sync), v26 (split-TF32 on mma.sync) and v34 (split-TF32 on wgmma), run by the
  CPU emulation;
- the whole layer, forward and backward (its output and three gradients: the backward's GEMMs
  reduce over the batch and the out features), exactly as `grad_check.py cuda --emulate` judges it.

Each result is judged by grad_check's rule against torch float32's error on the same inputs:
max|err| ≤ 4·max|err of float32| + 2u·max(size), u = 2^-24, the size of an element being the sum
of the absolute values of its reduction's terms (grad_check.magnitudes; |x|·|W|ᵀ for the GEMM);
the layer's tensors must also stay within grad_check.error_bound where float32 does. Plain TF32
(v25, and the TF32 GEMM itself) is also judged against a TF32 GEMM's error with u = 2^-11.

What the emulator models, and what it does not: its mma and wgmma add a k-step's products (each
exact) to the accumulator by one of two models (cuda/emulate/tc_accumulate.h): the exact sum
rounded once to float32, or the published model of the H100's tensor cores (the products aligned
to the largest exponent with 2 extra bits and cut toward zero, the block's sum cut to float32),
which no GPU has confirmed yet. Each tensor-core version is run under both, and each tensor keeps
the larger of the two errors (the record says which model gave it). So these figures are the
algorithm's error under either reading, not a GPU's: cuda/bench_gpu.py's tf32 part measures the
GPU's against cuBLAS itself.

Cost: the emulated kernels run one GPU thread per fiber on one core, each tensor-core version
twice (one run per accumulation model). At the defaults (B = 128, O = 256, K = 64, 256, 1024 and
4096) about two minutes on this project's machines, growing with
⌈B/128⌉·⌈O/128⌉·ΣK; sizes over 16 times the defaults' work are refused. B, K and O must be
multiples of 4: v34 copies rows of whole 16 bytes (TMA).

Examples:
  python cuda/tensor_cores/tf32_error.py -i 64 256 -b 32 -o 32     # seconds: prints the table
  python cuda/tensor_cores/tf32_error.py --json /tmp/tf32_error.json
(The committed record: python cuda/tensor_cores/tf32_error.py --json docs/results/tf32_error_cpu.json)
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # cli.py and grad_check.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402  (first: a Ctrl-C while torch imports is one line too)

# isort: split
import ctypes  # noqa: E402
import math  # noqa: E402
from collections.abc import Iterator  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import Tensor  # noqa: E402

import grad_check  # noqa: E402
import record_info  # noqa: E402

VERSIONS = (25, 26, 34)
SPLIT_VERSIONS = (26, 34)
# Chapter 3's v8 on the CUDA cores, GEMM only: each thread sums its outputs' K products one after
# another in float32, as a SIMT GEMM's thread does, where torch on the CPU sums in vector lanes
# and blocks (a smaller error): the baseline a GPU's float32 GEMM is closer to.
SERIAL_VERSION = 8
DEFAULT_K = (64, 256, 1024, 4096)
DEFAULT_BATCH, DEFAULT_OUT = 128, 256
TF32_UNIT = 2.0**-11  # TF32's unit roundoff: 10 bits of mantissa
GEMM = "forward GEMM"
TENSORS = (GEMM, *grad_check.TENSORS)  # the GEMM, then the layer's output and gradients
# Every variant, by the name the record uses, and what it is.
LABELS = {
    "float32": "float32 (torch, CPU)",
    "v8": "v8: float32, CUDA cores",
    "tf32": "TF32 GEMM (TF32Linear)",
    "split": "split-TF32, float64 sums",
    "v25": "v25: TF32, mma.sync",
    "v26": "v26: split-TF32, mma.sync",
    "v34": "v34: split-TF32, wgmma",
}
TF32_VARIANTS = ("tf32", *(f"v{v}" for v in (25,)))  # also judged by TF32's rule
MAX_WORK = 16 * DEFAULT_BATCH * DEFAULT_OUT * sum(DEFAULT_K)  # in ⌈B/128⌉·⌈O/128⌉·128²·ΣK
TC_VARIANTS = tuple(f"v{v}" for v in VERSIONS)  # the tensor-core versions: run under each accumulation model
# cuda/emulate/tc_accumulate.h's models, in emu::Accumulation's order.
ACCUMULATIONS = ("exact", "h100")
MODEL = ("the emulator's mma and wgmma add a k-step's products to the accumulator in the kernels' order, by two "
         "models: in double, then round once to float32; or as the published H100 model has it, not GPU-confirmed "
         "(the products aligned to the largest exponent with 2 extra bits and cut toward zero, the block's sum cut to "
         "float32: they truncate where the first rounds); each tensor-core result is the worse of the two (its "
         "\"accumulation\" says which): this is the algorithm's error, not a GPU's (cuda/bench_gpu.py's tf32 part "
         "measures that)")


def emulation():
    """cuda/emulated.py, built and loaded (the name grad_check loads it by)."""
    emu = grad_check.load_emulation()
    if emu.unavailable_reason():
        raise cli.UserError(f"cannot emulate: {emu.unavailable_reason()}")
    try:
        emu.library()  # the build (seconds, once)
    except RuntimeError as e:
        raise cli.UserError(str(e).splitlines()[0]) from None
    return emu


@contextmanager
def accumulation(emu, model: str) -> Iterator[None]:
    """The emulator's mma and wgmma sum by `model` (one of ACCUMULATIONS) inside the block."""
    lib = emu.library()
    lib.emu_set_accumulation.argtypes, lib.emu_set_accumulation.restype = [ctypes.c_int], ctypes.c_int
    previous = lib.emu_set_accumulation(ACCUMULATIONS.index(model))
    try:
        yield
    finally:
        lib.emu_set_accumulation(previous)


def split_gemm(x: Tensor, w: Tensor, drop: str | None = None) -> Tensor:
    """x·wᵀ by split-TF32 with exact sums: each operand a TF32 big part tf32(a) and a TF32 small
    part tf32(a − big), the products small·big, big·small and big·big (small·small dropped)
    summed in float64 and rounded once to float32. ``drop`` ("small·big", "big·small" or
    "big·big") leaves one more product out: a broken split, which the rule must reject."""
    parts = {}
    for name, t in (("x", x), ("w", w)):
        big = grad_check.tf32(t)
        parts[name] = (big.double(), grad_check.tf32(t - big).double())
    (bx, sx), (bw, sw) = parts["x"], parts["w"]
    terms = {"small·big": (sx, bw), "big·small": (bx, sw), "big·big": (bx, bw)}
    if drop is not None and drop not in terms:
        raise ValueError(f"drop must be one of {', '.join(terms)}, not {drop!r}")
    total = sum(a @ b.t() for name, (a, b) in terms.items() if name != drop)
    return total.float()


def _judged(k: int, tensor: str, got: dict[str, Tensor], exact: Tensor, size: Tensor,
            bound: Tensor | None) -> list[dict]:
    """One result per variant for one tensor: its error, and the rule's verdict against float32's
    (and, for plain TF32, against the TF32 GEMM's with TF32's u)."""
    out = []
    for name, t in got.items():
        f32 = grad_check.judge(t, got["float32"], exact, torch.float32, bound, size)
        if f32.problem:
            raise RuntimeError(f"{name}, {tensor} at K={k}: {f32.problem}")
        entry = {"in": k, "tensor": tensor, "variant": name, "error": f32.error, "float32_error": f32.linear_error,
                 "ratio": f32.ratio, "allowed": f32.allowed, "passed": f32.passed}
        if bound is not None:
            entry["of_bound"] = f32.of_bound
        if name in TF32_VARIANTS:
            t32 = grad_check.judge(t, got["tf32"], exact, torch.float32, None, size, unit=TF32_UNIT)
            entry["tf32_rule"] = {"tf32_error": t32.linear_error, "ratio": t32.ratio, "allowed": t32.allowed,
                                  "passed": t32.passed}
        if name == "v34" and "v26" in got and torch.equal(t, got["v26"]):
            entry["same_bits_as"] = "v26"
        out.append(entry)
    return out


def _worse(by_model: dict[str, list[dict]]) -> list[dict]:
    """One tensor's entries: each tensor-core variant's from the accumulation model that gave it the
    larger error (the first model on a tie), with that model and both errors; the other variants'
    as the first model's pass has them (they do not use the tensor cores)."""
    first = by_model[ACCUMULATIONS[0]]
    out = []
    for entry in first:
        if entry["variant"] not in TC_VARIANTS:
            out.append(entry)
            continue
        each = {m: next(e for e in entries if e["variant"] == entry["variant"]) for m, entries in by_model.items()}
        model = max(each, key=lambda m: each[m]["error"])
        chosen = {**each[model], "accumulation": model,
                  "error_by_accumulation": {m: e["error"] for m, e in each.items()}}
        if not all(e.get("same_bits_as") == "v26" for e in each.values()):
            chosen.pop("same_bits_as", None)
        out.append(chosen)
    return out


def measure_gemm(emu, x: Tensor, w: Tensor, versions: tuple[int, ...] = VERSIONS) -> list[dict]:
    """The forward GEMM x·Wᵀ's entries at K = x's columns: every variant judged by float32's rule,
    each tensor-core version the worse of its runs under the accumulation models."""
    batch, k = x.shape
    out_f = w.shape[0]
    exact = x.double() @ w.double().t()
    size = x.double().abs() @ w.double().abs().t()
    base = {"float32": F.linear(x, w), "tf32": F.linear(grad_check.tf32(x), grad_check.tf32(w)),
            "split": split_gemm(x, w)}
    c = torch.empty(batch, out_f)
    emu.gemm(SERIAL_VERSION, "nt", x, w, c, None, batch, out_f, k, emu.KPLAIN)
    base[f"v{SERIAL_VERSION}"] = c
    by_model = {}
    for model in ACCUMULATIONS:
        got = dict(base)
        with accumulation(emu, model):
            for v in versions:
                c = torch.empty(batch, out_f)
                emu.gemm(v, "nt", x, w, c, None, batch, out_f, k, emu.KPLAIN)
                got[f"v{v}"] = c
        by_model[model] = _judged(k, GEMM, got, exact, size, None)
    return _worse(by_model)


def measure(batch: int, out_f: int, ks: tuple[int, ...], seed: int = 0, versions: tuple[int, ...] = VERSIONS,
            progress: Callable[[str], None] = lambda line: None) -> list[dict]:
    """Every variant's error, tensor by tensor, at each K (the records' "results")."""
    emu = emulation()
    results = []
    for k in ks:
        inputs, grad_out = grad_check.draw(batch, k, out_f, True, torch.float32, seed)
        x, w, _ = inputs
        progress(f"K={k}: the forward GEMM")
        results += measure_gemm(emu, x, w, versions)
        progress(f"K={k}: the layer, forward and backward")
        truth = grad_check.truth(inputs, grad_out)
        sizes = grad_check.magnitudes(*inputs, grad_out)
        bounds = grad_check.error_bound(*inputs, grad_out, torch.float32)
        base = {"float32": grad_check.forward_backward(grad_check.reference, inputs, grad_out),
                "tf32": grad_check.forward_backward(grad_check.TF32Linear.apply, inputs, grad_out)}
        layers = {}
        for model in ACCUMULATIONS:
            layers[model] = dict(base)
            with accumulation(emu, model):
                for v in versions:
                    progress(f"K={k}: v{v}, {model} accumulation")
                    layers[model][f"v{v}"] = grad_check.forward_backward(emu.dense(v), inputs, grad_out)
        for i, tensor in enumerate(grad_check.TENSORS):
            results += _worse({model: _judged(k, tensor, {name: got[i] for name, got in mine.items()}, truth[i],
                                              sizes[i], bounds[i]) for model, mine in layers.items()})
    return results


def record(batch: int, out_f: int, ks: tuple[int, ...], seed: int = 0,
           progress: Callable[[str], None] = lambda line: None) -> dict:
    """The record the script writes (docs/render.py shows it with ``table``)."""
    results = measure(batch, out_f, ks, seed, progress=progress)
    header = {k: v for k, v in record_info.record_header("cpu", torch.float32).items()
              if k not in ("dtype", "malloc", "threads", "affinity")}  # rounding, not timing
    emu = grad_check.load_emulation()
    return {
        "benchmark": "tf32_error", **header,
        "shape": {"batch": batch, "out": out_f, "in": list(ks)}, "seed": seed,
        "inputs": "grad_check.draw: x ~ N(0, 1); weight, bias ~ N(0, 1/I); grad_out ~ N(0, 1): drawn in float64, "
                  "rounded once to float32",
        "truth": "float64 arithmetic on the values each variant received",
        "error": "largest |result - truth| over a tensor's elements",
        "rule": {"factor": grad_check.FACTOR, "floor_unit_roundoffs": grad_check.FLOOR,
                 "float32_unit_roundoff": grad_check.UNIT_ROUNDOFF[torch.float32], "tf32_unit_roundoff": TF32_UNIT},
        "variants": {**{k: v for k, v in LABELS.items() if not k.startswith("v")},
                     **{f"v{v}": emu.idea(v) for v in (SERIAL_VERSION, *VERSIONS)}},
        "model": MODEL,
        "results": results,
    }


def times(ratio: float) -> str:
    """A ratio as the tables write it: 1.05×, 36×, 1,510×."""
    return f"{ratio:.2f}×" if ratio < 10 else f"{ratio:,.0f}×"


def _results(rec: dict, tensor: str, variant: str) -> list[dict]:
    return [r for r in rec["results"] if r["tensor"] == tensor and r["variant"] == variant]


def table(rec: dict) -> str:
    """The Markdown tables of a record: the forward GEMM's error at each K, each variant's ratio to
    float32's and whether float32's rule accepts it; then the layer's verdicts (docs/render.py,
    marker kind ``tf32_error``)."""
    ks = rec["shape"]["in"]
    variants = [v for v in LABELS if any(r["variant"] == v for r in rec["results"])]
    rows = ["| K | " + " | ".join(LABELS[v] for v in variants) + " |", "|---:|" + "---:|" * len(variants)]
    for k in ks:
        cells = []
        for v in variants:
            (r,) = [r for r in _results(rec, GEMM, v) if r["in"] == k]
            cells.append(f"{r['error']:.1e}" if v == "float32" else
                         f"{r['error']:.1e} ({times(r['ratio'])}{'' if r['passed'] else ', fails'})")
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    layer = [f"| the layer, by float32's rule | {' | '.join(f'K={k}' for k in ks)} |", "|---|" + "---|" * len(ks)]
    for v in [v for v in variants[1:] if any(r["variant"] == v and r["tensor"] != GEMM for r in rec["results"])]:
        cells = []
        for k in ks:
            mine = [r for r in rec["results"] if r["variant"] == v and r["in"] == k and r["tensor"] != GEMM]
            worst = max(r["ratio"] for r in mine)
            failed = [r["tensor"] for r in mine if not r["passed"]]
            which = "" if len(failed) == len(mine) else ": " + ", ".join(failed)
            cells.append(f"passes (≤ {times(worst)})" if not failed else f"fails{which} (≤ {times(worst)})")
        layer.append(f"| {LABELS[v]} | " + " | ".join(cells) + " |")
    notes = [f"The forward GEMM x·Wᵀ: its largest error against the float64 truth, ×: over float32's on the same "
             f"inputs; float32's rule allows {rec['rule']['factor']:g}× plus {rec['rule']['floor_unit_roundoffs']:g}u "
             "of the largest size, u = 2^-24. The layer: its output, grad x, grad weight and grad bias, each judged "
             "so (and within grad_check.error_bound where float32 is); the largest ratio of the four."]
    tf32 = [r for r in rec["results"] if "tf32_rule" in r and r["variant"] != "tf32"]
    for v in dict.fromkeys(r["variant"] for r in tf32):
        mine = [r for r in tf32 if r["variant"] == v]
        verdict = "passes it everywhere" if all(r["tf32_rule"]["passed"] for r in mine) else "fails it"
        worst = max(r["tf32_rule"]["ratio"] for r in mine)
        notes.append(f"Against a TF32 GEMM's error (TF32Linear, u = 2^-11), {v} {verdict} "
                     f"(at most {times(worst)} its error).")
    v34 = [r for r in rec["results"] if r["variant"] == "v34"]
    if v34 and all(r.get("same_bits_as") == "v26" for r in v34):
        notes.append("v34 gives v26's bits in every tensor: the same split, the same order of products.")
    notes.append(f"The CPU emulation: {rec['model']}.")
    s = rec["shape"]
    footer = record_info.footer(rec, f"B={s['batch']} O={s['out']}", f"seed {rec['seed']}")
    return "\n".join(rows) + "\n\n" + "\n".join(layer) + "\n\n" + " ".join(notes) + "\n\n" + footer


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    size = cli.positive(int)
    parser.add_argument("-b", "--batch", type=size, default=DEFAULT_BATCH, help="B, the GEMM's M (default 128)")
    parser.add_argument("-o", "--out-features", type=size, default=DEFAULT_OUT, help="O, the GEMM's N (default 256)")
    parser.add_argument("-i", "--in-features", type=size, nargs="+", default=list(DEFAULT_K), metavar="K",
                        help="the reductions' lengths, K (default: 64 256 1024 4096)")
    parser.add_argument("--seed", type=cli.positive(int, allow_zero=True), default=0)
    parser.add_argument("--json", metavar="PATH", help="write the record here")
    args = parser.parse_args(argv)
    ks = tuple(sorted(set(args.in_features)))
    odd = [f"{name} {n}" for name, n in (("-b", args.batch), ("-o", args.out_features), *(("-i", k) for k in ks))
           if n % 4]
    if odd:
        raise cli.UserError(f"{', '.join(odd)}: not a multiple of 4 (v34 copies rows of whole 16 bytes by TMA)")
    work = math.ceil(args.batch / 128) * math.ceil(args.out_features / 128) * 128 * 128 * sum(ks)
    if work > MAX_WORK:
        raise cli.UserError(f"B={args.batch} O={args.out_features} K={'+'.join(map(str, ks))} is about "
                            f"{work / MAX_WORK * 16:.0f} times the defaults' work on the emulated kernels (minutes "
                            "each): keep it within 16 times")
    json_path = cli.check_output(args.json, "--json")
    cli.check_memory(8 * 8 * (args.batch + args.out_features) * max(ks) * 4, "cpu", "these sizes")
    rec = record(args.batch, args.out_features, ks, args.seed,
                 progress=lambda line: print(f"measuring {line}...", file=sys.stderr, flush=True))
    return cli.publish(table(rec), [(json_path, cli.json_writer(rec))])


if __name__ == "__main__":
    cli.run(main)
