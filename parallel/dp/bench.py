"""Chapter 7's benchmark, run on every rank by ``distributed.py --bench step``: one training step
(forward, backward, gradient averaging, optimiser step) of our loop with and without overlap,
against torch's DistributedDataParallel, on the same model, data and shard. Interleaved round
by round, in a new order each round (timing.measure, order="shuffle"); a sample is the
slowest rank's time; the ratio to DDP is paired round by round, with a distribution-free interval
and a verdict (timing.paired_ratio; docs/README.md says how).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from parallel.common import data as data_mod
from parallel.common.harness import header, slowest_rank, write_record
from parallel.common.launch import world
from parallel.common.training import Config, build_model
from parallel.dp.reducer import AllReduce, GradReducer
from parallel.dp.ring import ring_all_reduce
from timing import CI_LEVEL, Stats, measure, paired_ratio


def step(config: Config, json_path: Path | None, all_reduce: AllReduce = ring_all_reduce) -> dict:
    """Time a training step three ways on the same model, data and shard; our loop's buckets
    reduced by ``all_reduce`` (distributed.py passes the one training uses)."""
    from torch.nn.parallel import DistributedDataParallel

    rank, n = world()
    ds = data_mod.synthetic(config.seed)
    batch = torch.arange(config.batch_size - config.batch_size % n)  # equal shards: DDP averages
    idx = data_mod.shard(batch, rank, n)
    x, y = ds.train.x[idx].to(config.device), ds.train.y[idx].to(config.device)

    def make(variant: str):
        torch.manual_seed(config.seed)
        model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode, config.device)
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        if variant == "ddp":
            ddp = DistributedDataParallel(model, bucket_cap_mb=config.bucket_kb / 1024)

            def run() -> None:
                F.cross_entropy(ddp(x), y).backward()  # DDP averages the local means
                opt.step()
                opt.zero_grad(set_to_none=True)
            return run, None
        reducer = GradReducer(list(model.parameters()), bucket_bytes=config.bucket_kb * 1024,
                              overlap=(variant == "all_reduce, overlap"), all_reduce=all_reduce)

        def run() -> None:
            (F.cross_entropy(model(x), y, reduction="sum") / len(batch)).backward()
            reducer.finish()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run, reducer

    variants = {name: make(name) for name in ("ddp", "all_reduce, overlap", "all_reduce, no overlap")}
    stats = measure({k: v[0] for k, v in variants.items()}, rounds=30, warmup=3, number=5, order="shuffle")
    for _, reducer in variants.values():
        if reducer:
            reducer.close()
    slowest = {name: slowest_rank(s.samples) for name, s in stats.items()}
    results = []
    for name, samples in slowest.items():
        paired = paired_ratio(samples, slowest["ddp"])  # round by round, like every ratio in these benchmarks
        results.append({"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                        "ratio_to_ddp": paired["ratio"], "ratio_ci": paired["ci"], "verdict": paired["verdict"]})
    params = sum(p.numel() for p in build_model(ds.features, tuple(config.hidden), ds.classes, "py").parameters())
    record = {**header("step", config.device), "ci_level": CI_LEVEL, "mode": config.mode, "hidden": list(config.hidden),
              "global_batch": len(batch), "parameters": params, "bucket_kb": config.bucket_kb, "results": results}
    return {"output_errors": write_record(record, json_path, step_table(record))}


def step_table(record: dict) -> str:
    """What a record lacks (an interval, a verdict) shows as "–"."""
    level = f"{100 * record.get('ci_level', CI_LEVEL):.0f}%"
    rows = [f"| variant | step µs (IQR) | step / DDP's (paired, {level} CI) | verdict |", "|---|---:|---:|---|"]
    for r in record["results"]:
        ci = r.get("ratio_ci") if r["variant"] != "ddp" else None
        ratio = f"{r['ratio_to_ddp']:.3f}" + (f" ({ci[0]:.3f}–{ci[1]:.3f})" if ci else "")
        verdict = "(the reference)" if r["variant"] == "ddp" else r.get("verdict", "–")
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | {ratio} | {verdict} |")
    rows.append(f"\nMLP {record['hidden']} (mode {record['mode']}, {record['parameters']:,} parameters), global "
                f"batch {record['global_batch']}, {record['bucket_kb']} KiB buckets; {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


JOBS = {"step": step}
RENDERERS = {"step": step_table}
