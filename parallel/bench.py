"""Benchmarks of the distributed part, run on every rank by distributed.py --bench.

allreduce: our ring against dist.all_reduce on the same backend, 4 KiB to 64 MiB.
step:      one training step (forward, backward, gradient averaging, optimiser step) of our
           loop with and without overlap, against torch's DistributedDataParallel.

Both use benchmark.measure, interleaving the variants round by round. A sample is the
slowest rank's time for it (a collective is done when its last rank is). Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw · 2(n − 1)/n for an all-reduce.
"""

from __future__ import annotations

import datetime
import json
import statistics
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cli
from benchmark import Stats, describe_device, measure
from parallel import data as data_mod
from parallel.reducer import GradReducer, world
from parallel.ring import ring_all_reduce, ring_all_reduce_host
from parallel.trainer import Config, build_model

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _slowest_rank(samples: list[float]) -> list[float]:
    """Per sample, the largest time any rank measured (gathered with a ring sum)."""
    rank, n = world()
    table = torch.zeros(n, len(samples), dtype=torch.float64)
    table[rank] = torch.tensor(samples, dtype=torch.float64)
    return ring_all_reduce_host(table).max(0).values.tolist()


def _header(config: Config, kind: str) -> dict:
    return {"benchmark": kind, "device": describe_device(config.device), "torch": torch.__version__,
            "backend": dist.get_backend(), "world_size": world()[1], "threads_per_rank": torch.get_num_threads(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python distributed.py " + " ".join(sys.argv[1:])}


def _write(record: dict, path: Path | None, table: str) -> list[str]:
    """Rank 0: the file first (a reader that closes stdout early must not cost it), then the
    table, then any error writing the file. Returns those errors."""
    if world()[0] != 0:
        return []
    errors = cli.write_outputs([(path, lambda p: p.write_text(json.dumps(record, indent=2) + "\n"))])
    print(table, flush=True)
    for e in errors:
        print(f"distributed.py: {e}", file=sys.stderr, flush=True)
    return errors


def allreduce(config: Config, json_path: Path | None) -> dict:
    rank, n = world()
    device = config.device if dist.get_backend() == "nccl" else "cpu"
    results = []
    for nbytes in SIZES:
        t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: the sums stay finite
        fns = {"ring": lambda t=t: ring_all_reduce(t, check=False), "dist.all_reduce": lambda t=t: dist.all_reduce(t)}
        number = max(1, min(50, (1 << 20) // nbytes))  # same on every rank: they must make the same calls
        stats = measure(fns, device=device, rounds=20 if nbytes < (16 << 20) else 10, warmup=2, number=number)
        slowest = {variant: _slowest_rank(s.samples) for variant, s in stats.items()}
        for variant, samples in slowest.items():
            time_us = statistics.median(samples)
            algbw = nbytes / time_us / 1e3  # GB/s
            results.append({"bytes": nbytes, "variant": variant, "time_us": time_us, "spread_us": Stats(samples).spread,
                            "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                            # paired, round by round: dist.all_reduce's time over this variant's
                            "busbw_ratio_to_dist": statistics.median(
                                ref / mine for ref, mine in zip(slowest["dist.all_reduce"], samples))})
    record = {**_header(config, "allreduce"), "results": results}
    return {"output_errors": _write(record, json_path, allreduce_table(record))}


def step(config: Config, json_path: Path | None) -> dict:
    """Time a training step three ways on the same model, data and shard."""
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
                              overlap=(variant == "ring, overlap"))

        def run() -> None:
            (F.cross_entropy(model(x), y, reduction="sum") / len(batch)).backward()
            reducer.finish()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run, reducer

    variants = {name: make(name) for name in ("ddp", "ring, overlap", "ring, no overlap")}
    stats = measure({k: v[0] for k, v in variants.items()}, rounds=30, warmup=3, number=5)
    for _, reducer in variants.values():
        if reducer:
            reducer.close()
    slowest = {name: _slowest_rank(s.samples) for name, s in stats.items()}
    results = [{"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                # paired, round by round, like every ratio in these benchmarks
                "ratio_to_ddp": statistics.median(m / d for m, d in zip(samples, slowest["ddp"]))}
               for name, samples in slowest.items()]
    params = sum(p.numel() for p in build_model(ds.features, tuple(config.hidden), ds.classes, "py").parameters())
    record = {**_header(config, "step"), "mode": config.mode, "hidden": list(config.hidden),
              "global_batch": len(batch), "parameters": params, "bucket_kb": config.bucket_kb, "results": results}
    return {"output_errors": _write(record, json_path, step_table(record))}


def allreduce_table(record: dict) -> str:
    rows = ["| size | ring µs (IQR) | dist.all_reduce µs (IQR) | ring busbw GB/s | all_reduce busbw GB/s "
            "| ring / all_reduce busbw (paired) |", "|---:|---:|---:|---:|---:|---:|"]
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    for nbytes in sorted({r["bytes"] for r in record["results"]}):
        ring, ref = by[(nbytes, "ring")], by[(nbytes, "dist.all_reduce")]
        size = f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"
        rows.append(f"| {size} | {ring['time_us']:.0f} ({ring['spread_us']:.0f}) | {ref['time_us']:.0f} "
                    f"({ref['spread_us']:.0f}) | {ring['busbw_gbs']:.3f} | {ref['busbw_gbs']:.3f} "
                    f"| {ring['busbw_ratio_to_dist']:.2f} |")
    rows.append(f"\n{record['world_size']} ranks on {record['backend']}, {record['threads_per_rank']} thread(s) each, "
                f"{record['device']}, torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def step_table(record: dict) -> str:
    rows = ["| variant | step µs (IQR) | step / DDP's (paired) |", "|---|---:|---:|"]
    for r in record["results"]:
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | {r['ratio_to_ddp']:.3f} |")
    rows.append(f"\nMLP {record['hidden']} (mode {record['mode']}, {record['parameters']:,} parameters), global "
                f"batch {record['global_batch']}, {record['bucket_kb']} KiB buckets; {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


JOBS = {"allreduce": allreduce, "step": step}
RENDERERS = {"allreduce": allreduce_table, "step": step_table}
