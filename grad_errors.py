"""grad_check.py --error-table: at one shape, each mode's and nn.Linear's errors against the
float64 truth in float32, bfloat16 and float16 (the cuda mode through the CPU emulation of its
kernels where there is no GPU), as a record (``error_record``) and the table chapter 1 shows
(``error_table``, docs/render.py's "errors"). The rule the errors are judged by, and the bound,
are grad_check.py's."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

import torch

import cli
import grad_check
import modes
import record_info
from benchmark import check_stages, refusal

TABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
TABLE_SHAPE = (32, 1024, 64)  # --error-table's default B, I, O: a reduction long enough to count

def table_variants(device: str) -> tuple[dict[str, modes.DenseFn], dict[str, str]]:
    """({variant: fn}, {mode: why it is not measured}): nn.Linear, then every mode that runs here;
    on the CPU, the cuda mode through the emulation of its kernels (version 0, as the mode runs)."""
    selected, skipped = modes.resolve("all")
    loaded, failed = check_stages(selected)
    variants: dict[str, modes.DenseFn] = {"nn.Linear": grad_check.reference, **{m: modes.dense(m) for m in loaded}}
    missing = {**skipped, **failed}
    if device == "cpu" and "cuda" in missing:
        emu = grad_check.load_emulation()
        reason = emu.unavailable_reason()
        if reason is None:
            try:
                emu.library()
                variants["cuda (emulated)"] = emu.dense(0)
                del missing["cuda"]
            except RuntimeError as e:
                missing["cuda"] = f"the emulation: {str(e).splitlines()[0]}"
    return variants, missing


def measure_errors(variants: dict[str, modes.DenseFn], batch: int, in_f: int, out_f: int, device: str = "cpu",
                   seed: int = 0, dtypes: Sequence[torch.dtype] = TABLE_DTYPES,
                   progress: Callable[[str], None] = lambda line: None) -> tuple[list[dict], dict]:
    """(one result per variant and type, {type: the bound's and the truth's largest values}).

    The inputs are drawn once, in float64, and rounded to each type; the truth is float64
    arithmetic on the rounded values. A result holds, per tensor, the largest error (``errors``),
    the error over the bound at its worst element (``of_bound``: at most 1 within it) and, in
    bfloat16 and float16, the rule's verdict; or ``error``: why the variant did not run."""
    results, scales = [], {}
    for dtype in dtypes:
        name = grad_check.dtype_name(dtype)
        inputs, grad_out = grad_check.draw(batch, in_f, out_f, True, dtype, seed, device)
        exact = grad_check.truth(inputs, grad_out)
        bound = grad_check.error_bound(*[t.cpu() for t in inputs], grad_out.cpu(), dtype)
        sizes = grad_check.magnitudes(*[t.cpu() for t in inputs], grad_out.cpu())
        with grad_check.float32_accumulation():
            linear = grad_check.forward_backward(grad_check.reference, inputs, grad_out)
        scales[name] = {"truth_max": dict(zip(grad_check.TENSORS, (t.abs().max().item() for t in exact))),
                        "bound_max": dict(zip(grad_check.TENSORS, (e.max().item() for e in bound))),
                        "unit_roundoff": grad_check.UNIT_ROUNDOFF[dtype]}
        for variant, fn in variants.items():
            progress(f"{variant} in {name}")
            is_mode = variant in modes.MODES or variant.startswith("cuda")
            if is_mode and not grad_check.takes(variant.split()[0], dtype):
                results.append({"variant": variant, "dtype": name, "error": refusal(variant.split()[0], dtype)})
                continue
            try:
                with grad_check.float32_accumulation():
                    got = linear if variant == "nn.Linear" else grad_check.forward_backward(fn, inputs, grad_out)
            except Exception as e:  # a stage that fails in this type is a cell of the table, not the end of it
                text = (str(e).strip().splitlines() or [""])[0][:300]
                results.append({"variant": variant, "dtype": name, "error": f"{type(e).__name__}: {text}"})
                continue
            entry: dict = {"variant": variant, "dtype": name, "errors": {}, "of_bound": {}, "ratio_to_linear": {}}
            for label, a, lin, t, e, m in zip(grad_check.TENSORS, got, linear, exact, bound, sizes):
                verdict = grad_check.judge(a, lin, t, dtype, e, m)
                entry["errors"][label] = verdict.error
                entry["of_bound"][label] = verdict.of_bound
                entry["ratio_to_linear"][label] = verdict.ratio
                if dtype in grad_check.LOW_PRECISION:  # the rule judges these two types
                    entry.setdefault("passed", {})[label] = verdict.passed
            results.append(entry)
    return results, scales


def error_record(batch: int, in_f: int, out_f: int, device: str = "cpu", seed: int = 0,
                 progress: Callable[[str], None] = lambda line: None) -> dict:
    """The record --error-table writes (docs/render.py shows it with error_table)."""
    variants, missing = table_variants(device)
    results, scales = measure_errors(variants, batch, in_f, out_f, device, seed, progress=progress)
    header = {k: v for k, v in record_info.record_header(device, torch.float32).items()
              if k not in ("dtype", "malloc", "threads", "affinity")}  # rounding, not timing: those do not matter
    return {
        "benchmark": "errors", **header,
        "shape": {"batch": batch, "in": in_f, "out": out_f}, "seed": seed,
        "dtypes": [grad_check.dtype_name(d) for d in TABLE_DTYPES],
        "inputs": "x ~ N(0, 1); weight, bias ~ N(0, 1/I); grad_out ~ N(0, 1): drawn in float64, rounded once to "
                  "each type",
        "truth": "float64 arithmetic on the values each variant received",
        "error": "largest |result - truth| over a tensor's elements",
        "rule": {"factor": grad_check.FACTOR, "floor_unit_roundoffs": grad_check.FLOOR},
        "scales": scales, "results": results, "not_measured": missing,
    }


def error_table(record: dict) -> str:
    """The Markdown table of an --error-table record (docs/render.py, marker kind ``errors``)."""
    dtypes = record["dtypes"]
    low = [d for d in dtypes if d in ("bfloat16", "float16")]
    rows = ["| variant | " + " | ".join(f"{d}: output | gradients" for d in dtypes)
            + f" | × nn.Linear's error ({', '.join(low)}) |",
            "|---|" + "---:|---:|" * len(dtypes) + "---:|"]

    def relative(values: dict, dtype: str) -> tuple[str, str]:
        truth_max = record["scales"][dtype]["truth_max"]
        rel = {k: v / truth_max[k] if truth_max[k] else 0.0 for k, v in values.items()}
        return f"{rel['output']:.1e}", f"{max(v for k, v in rel.items() if k != 'output'):.1e}"

    failures = []
    for variant in dict.fromkeys(r["variant"] for r in record["results"]):
        cells, ratios = [], []
        for d in dtypes:
            r = next((r for r in record["results"] if r["variant"] == variant and r["dtype"] == d), None)
            if r is None or "error" in r:
                cells += ["–", "–"]
                if r is not None:
                    failures.append(f"{variant} in {d}: {r['error']}")
                continue
            cells += relative(r["errors"], d)
            if d in low:
                worst = max(r["ratio_to_linear"].values())
                ratios.append(f"{worst:.2f}" + ("" if all(r["passed"].values()) else " (fails the rule)"))
            elif d != dtypes[0]:
                ratios.append("–")
        rows.append(f"| {variant} | {' | '.join(cells)} | {', '.join(ratios) or '–'} |")
    bound = [c for d in dtypes for c in relative(record["scales"][d]["bound_max"], d)]
    rows.append(f"| the bound (`grad_check.error_bound`) | {' | '.join(bound)} | |")
    rows.append("| u, the unit roundoff | " + " | ".join(f"{record['scales'][d]['unit_roundoff']:.1e} | "
                                                        for d in dtypes) + " | |")
    s = record["shape"]
    notes = [f"Each cell: the largest error of a tensor's elements against the float64 truth, over the "
             f"largest |truth|; gradients: the worst of x, weight and bias. × nn.Linear's error: the largest "
             f"ratio over the four tensors; the rule allows {record['rule']['factor']:g}× plus "
             f"{record['rule']['floor_unit_roundoffs']:g}u of the largest size (`grad_check.magnitudes`)."]
    notes += [f"Not measured: {m} ({why})." for m, why in record.get("not_measured", {}).items()]
    notes += [f"{f}." for f in failures]
    footer = record_info.footer(record, f"B={s['batch']} I={s['in']} O={s['out']}", f"seed {record['seed']}")
    return "\n".join(rows) + "\n\n" + " ".join(notes) + "\n\n" + footer


def main(args: argparse.Namespace) -> int:
    """grad_check.py all --error-table [--json PATH]."""
    if args.mode != "all":
        raise cli.UserError("--error-table measures every mode: give the mode as all")
    if args.no_bias:
        raise cli.UserError("--error-table measures a layer with a bias: drop --no-bias")
    json_path = cli.check_output(args.json, "--json")
    b, i, o = args.batch or TABLE_SHAPE[0], args.in_features or TABLE_SHAPE[1], args.out_features or TABLE_SHAPE[2]
    cli.check_memory(8 * 8 * (b * i + o * i + o + b * o), args.device, f"the inputs at B={b} I={i} O={o}")
    record = error_record(b, i, o, args.device,
                          progress=lambda line: print(f"measuring {line}...", file=sys.stderr, flush=True))
    return cli.publish(error_table(record), [(json_path, cli.json_writer(record))])
