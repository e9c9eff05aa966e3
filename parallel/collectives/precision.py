"""Chapter 7 (continued)'s bf16 benchmark, run on every rank by distributed.py --bench bf16:
float32 against bfloat16 in three places. The all-reduce's bus bandwidth at the same number of
elements (bfloat16 moves half the bytes); a training step (bfloat16 autocast, with the gradients
reduced in float32 or in bfloat16); and the test accuracy after training, over several seeds,
against the goal that bfloat16 autocast with a float32 reduction stays within GOAL_POINTS of
float32's. ``bf16`` measures and writes the record; ``bf16_table`` renders it."""

from __future__ import annotations

import contextlib
import dataclasses
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.collectives.algorithms import all_reduce, choose
from parallel.collectives.costmodel import size_label
from parallel.common import data as data_mod
from parallel.common import training
from parallel.common.harness import calls_per_sample, every_rank, header, progress, slowest_rank, warm_up, write_record
from parallel.common.launch import world
from parallel.common.p2p import peers
from parallel.common.training import DTYPES, Config, build_model
from parallel.dp.reducer import GradReducer
from timing import CI_LEVEL, Stats, measure, paired_ratio

PRECISION_NUMELS = [1 << 18, 1 << 20, 1 << 22, 1 << 24]  # elements: 1 to 64 MiB in float32, half in bfloat16
PRECISION_ROUNDS = 40
# Each training variant's (--dtype, --grad-dtype), float32 first: the others are compared with it.
PRECISIONS = {"float32": ("float32", "float32"),
              "bfloat16, float32 reduction": ("bfloat16", "float32"),
              "bfloat16, bfloat16 reduction": ("bfloat16", "bfloat16")}
# Trainings per variant, seeds --seed, --seed + 1, ...: a seed fixes the synthetic data, the
# initial weights and the data order, so the variants are compared seed by seed, and the
# spread between seeds says how large a difference chance alone makes.
PRECISION_SEEDS = 3
GOAL_POINTS = 1.0  # bfloat16 autocast, float32 reduction: within this many points of float32's test accuracy


def _precision_allreduce(n: int) -> list[dict]:
    """all_reduce (auto) of the same number of elements in float32 and in bfloat16, interleaved;
    beside each, one addition of as many elements in that dtype (a CPU adds a bfloat16 element in
    about the time of a float32 one: the bytes halve, the additions do not)."""
    rows = []
    for numel in PRECISION_NUMELS:
        tensors = {name: torch.zeros(numel, dtype=DTYPES[name]) for name in ("float32", "bfloat16")}  # sums stay 0
        fns = {name: (lambda t=t: all_reduce(t, check=False)) for name, t in tensors.items()}
        others = {name: torch.zeros_like(t) for name, t in tensors.items()}
        fns.update({f"add {name}": (lambda t=t, o=others[name]: t.add_(o)) for name, t in tensors.items()})
        stats = measure(fns, rounds=PRECISION_ROUNDS, warmup=2, number=calls_per_sample(numel * 4),
                        order="shuffle", sync=dist.barrier)
        slowest = {name: slowest_rank(s.samples) for name, s in stats.items()}
        for name, samples in slowest.items():
            if name.startswith("add "):
                continue
            size = tensors[name].element_size()
            time_us = statistics.median(samples)
            algbw = numel * size / time_us / 1e3  # GB/s
            row = {"numel": numel, "dtype": name, "bytes": numel * size, "time_us": time_us,
                   "spread_us": Stats(samples).spread, "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                   "algorithm": choose(numel, size, n, dist.get_backend()),
                   "add_us": statistics.median(slowest[f"add {name}"])}
            if name != "float32":
                paired = paired_ratio(samples, slowest["float32"])  # round by round
                row.update(time_over_float32=paired["ratio"], ci=paired["ci"], verdict=paired["verdict"])
            rows.append(row)
        progress(f"bf16: all-reduce of {numel:,} elements done")
    return rows


def _precision_step(config: Config, ds: data_mod.Dataset, n: int) -> list[dict]:
    """One training step (forward, backward with the buckets reduced as training reduces them,
    Adam) in each precision, on the same model, data and shard, interleaved."""
    rank = world()[0]
    per_rank = config.batch_size // n
    idx = torch.arange(rank * per_rank, (rank + 1) * per_rank) % len(ds.train)
    x, y = ds.train.x[idx], ds.train.y[idx]

    def make(name: str):
        dtype, grad_dtype = PRECISIONS[name]
        precision = dataclasses.replace(config, dtype=dtype)
        torch.manual_seed(config.seed)
        model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        reducer = GradReducer(list(model.parameters()), bucket_bytes=config.bucket_kb * 1024, overlap=config.overlap,
                              all_reduce=all_reduce, grad_dtype=DTYPES[grad_dtype])
        steps = [0]

        def run() -> None:
            with training.autocast(precision):
                loss = F.cross_entropy(model(x), y, reduction="sum")
            (loss / (per_rank * n)).backward()
            reducer.finish()
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps[0] += 1
        return run, reducer, steps

    variants = {name: make(name) for name in PRECISIONS}
    stats = measure({k: v[0] for k, v in variants.items()}, rounds=30, warmup=3, number=3, order="shuffle",
                    sync=dist.barrier)
    slowest = {name: slowest_rank(s.samples) for name, s in stats.items()}
    rows = []
    for name, samples in slowest.items():
        _, reducer, steps = variants[name]
        paired = paired_ratio(samples, slowest["float32"])
        in_reduce = every_rank(torch.tensor(reducer.comm_s / steps[0] * 1e6, dtype=torch.float64)).max().item()
        reducer.close()
        rows.append({"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                     "ratio_to_float32": paired["ratio"], "ratio_ci": paired["ci"], "verdict": paired["verdict"],
                     "allreduce_in_step_us": in_reduce})
    progress("bf16: step done")
    return rows


def _precision_accuracy(config: Config) -> list[dict]:
    """Train with each precision and seed (plain data parallelism, the buckets reduced by
    ``all_reduce`` as distributed.py trains); the test accuracy at the end of each."""
    from parallel.dp.trainer import DataParallel

    rows = []
    for seed in range(config.seed, config.seed + PRECISION_SEEDS):
        for name, (dtype, grad_dtype) in PRECISIONS.items():
            run = dataclasses.replace(config, dtype=dtype, grad_dtype=grad_dtype, seed=seed, progress=False,
                                      checkpoint=None, resume=False, trace=None)
            with contextlib.redirect_stdout(sys.stderr):  # the epochs' lines are progress; stdout carries the table
                result = training.train(run, DataParallel(run, all_reduce))
            epochs = result["epochs"]
            rows.append({"variant": name, "seed": seed, "test_accuracy": result["final_accuracy"],
                         "final_loss": epochs[-1]["loss"],
                         "samples_per_s": statistics.median(e["samples_per_s"] for e in epochs),
                         "comm_s_per_epoch": statistics.median(e["comm_s"] for e in epochs)})
            progress(f"bf16: {name}, seed {seed}: test accuracy {100 * result['final_accuracy']:.1f}%")
    return rows


def bf16(config: Config, json_path: Path | None) -> dict:
    """float32 against bfloat16 on gloo: the all-reduce, a step, and the accuracy after training."""
    n = world()[1]
    warm_up(*peers(None)[2:])  # a fresh gloo pair is slow for its first messages
    ds = training.load_data(config)
    record = {**header("bf16", config.device), "ci_level": CI_LEVEL, "mode": config.mode,
              "hidden": list(config.hidden), "data": config.data, "epochs": config.epochs,
              "global_batch": config.batch_size, "lr": config.lr, "bucket_kb": config.bucket_kb,
              "parameters": sum(p.numel() for p in build_model(ds.features, tuple(config.hidden), ds.classes,
                                                                "py").parameters()),
              "goal_points": GOAL_POINTS,
              "allreduce": _precision_allreduce(n), "step": _precision_step(config, ds, n),
              "accuracy": _precision_accuracy(config)}
    return {"output_errors": write_record(record, json_path, bf16_table(record))}


def _accuracy_summary(record: dict) -> dict[str, dict]:
    """Per variant: its test accuracies by seed, their mean, and the mean difference from float32's
    on the same seeds, in points."""
    by = {}
    for r in record["accuracy"]:
        by.setdefault(r["variant"], {})[r["seed"]] = r
    ref = by["float32"]
    out = {}
    for name, runs in by.items():
        accs = [100 * runs[s]["test_accuracy"] for s in sorted(runs)]
        diffs = [100 * (runs[s]["test_accuracy"] - ref[s]["test_accuracy"]) for s in sorted(runs)]
        out[name] = {"by_seed": accs, "mean": statistics.mean(accs), "difference": statistics.mean(diffs),
                     "differences": diffs, "final_loss": statistics.mean(runs[s]["final_loss"] for s in runs)}
    return out


def bf16_table(record: dict) -> str:
    """The all-reduce, the step and the accuracy tables of a bf16 record, and the goal's verdict."""
    level = f"{100 * record.get('ci_level', CI_LEVEL):.0f}%"
    rows = ["| elements | float32: auto picks, µs (IQR), busbw GB/s | bfloat16: auto picks, µs (IQR), busbw GB/s "
            f"| bfloat16 time / float32 (paired, {level} CI) | one add_ of the elements, µs: float32, bfloat16 |",
            "|---:|---|---|---:|---:|"]
    by = {(r["numel"], r["dtype"]): r for r in record["allreduce"]}
    for numel in sorted({r["numel"] for r in record["allreduce"]}):
        f, b = by[(numel, "float32")], by[(numel, "bfloat16")]
        ci = b.get("ci")
        cells = [f"{r['algorithm'].replace('_', '-')}, {r['time_us']:.0f} ({r['spread_us']:.0f}), "
                 f"{r['busbw_gbs']:.2f}" for r in (f, b)]
        adds = " / ".join("—" if "add_us" not in r else f"{r['add_us']:.0f}" for r in (f, b))
        rows.append(f"| {numel:,} ({size_label(f['bytes'])} / {size_label(b['bytes'])}) | {cells[0]} | {cells[1]} "
                    f"| {b['time_over_float32']:.2f}" + (f" ({ci[0]:.2f}–{ci[1]:.2f})" if ci else "") +
                    f" | {adds} |")
    rows += ["", f"| variant | step µs (IQR) | step / float32's (paired, {level} CI) | verdict "
             "| all-reduce µs per step |", "|---|---:|---:|---|---:|"]
    for r in record["step"]:
        ci = r.get("ratio_ci") if r["variant"] != "float32" else None
        ratio = f"{r['ratio_to_float32']:.3f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")
        verdict = "(the reference)" if r["variant"] == "float32" else r["verdict"]
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | {ratio} | {verdict} "
                    f"| {r['allreduce_in_step_us']:.0f} |")
    summary = _accuracy_summary(record)
    seeds = sorted({r["seed"] for r in record["accuracy"]})
    rows += ["", f"| variant | test accuracy, seeds {', '.join(map(str, seeds))} | mean "
             "| difference from float32 (points, mean over seeds) | final training loss (mean) |",
             "|---|---|---:|---:|---:|"]
    for name, s in summary.items():
        diff = "—" if name == "float32" else f"{s['difference']:+.2f}"
        rows.append(f"| {name} | {' / '.join(f'{a:.1f}%' for a in s['by_seed'])} | {s['mean']:.2f}% | {diff} "
                    f"| {s['final_loss']:.4f} |")
    goal, points = summary["bfloat16, float32 reduction"], record["goal_points"]
    verdict = "met" if goal["difference"] >= -points else "missed"
    rows.append(f"\nGoal, bfloat16 autocast with float32 reduction within {points:g} point of float32's test "
                f"accuracy (mean over seeds): {verdict} ({goal['difference']:+.2f} points).")
    rows.append(f"\nMLP {record['hidden']} (mode {record['mode']}, {record['parameters']:,} parameters), "
                f"{record['data']} data, global batch {record['global_batch']}, {record['epochs']} "
                f"epoch{'s' if record['epochs'] != 1 else ''} of Adam "
                f"(lr {record['lr']:g}), {record['bucket_kb']} KiB buckets; {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)
