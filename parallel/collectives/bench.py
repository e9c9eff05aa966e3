"""Chapter 7 (continued)'s benchmarks, run on every rank by distributed.py --bench.

allreduce: our all_reduce (auto, and each algorithm it chooses from) against dist.all_reduce on
           the same backend, 4 KiB to 64 MiB (from 1 MiB on gloo also the segmented ring with its
           loop in C++, where a compiler is at hand).
cpu:       where a call's CPU time goes (our main thread, gloo's I/O and worker threads), summed
           over the ranks, for the ring, two-shot, the segmented ring (also with its loop in C++,
           where a compiler is at hand) and dist.all_reduce, 1-16 MiB.
burst:     the ring and two-shot against dist.all_reduce, 1, 2 or 8 calls in a row after a
           barrier: from a common start (the cost model's assumption) and back to back.
overhead:  where the microseconds of a 4 KiB all-reduce go.
zero:      a training step with Adam: plain data parallelism against ZeRO stage 1.
bf16:      float32 against bfloat16: the all-reduce's bus bandwidth at the same number of
           elements, a training step, and the test accuracy after training (float32; bfloat16
           autocast with float32 gradient reduction; bfloat16 autocast with bfloat16 reduction):
           parallel/collectives/precision.py.

They use timing.measure, interleaving the variants round by round, in a new order each
round (order="shuffle"): in a fixed rotation, the variant that always follows dist.all_reduce
would pay for what gloo leaves behind. A sample is the slowest rank's time for it (a
collective is done when its last rank is: parallel/common/harness.py). allreduce, burst and
zero start every sample with a barrier, as nccl-tests does: without one, a rank's clock starts
when it finished the previous sample, and the slowest rank's time also counts how far the
ranks have drifted apart by then. Bandwidths follow nccl-tests: algbw = bytes / time,
busbw = algbw · 2(n − 1)/n for an all-reduce.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

from parallel.collectives import algorithms
from parallel.collectives.algorithms import ALGORITHMS, all_reduce, choose
from parallel.collectives.costmodel import PREDICT, link_for, size_label
from parallel.collectives.precision import bf16, bf16_table
from parallel.common import data as data_mod
from parallel.common import p2p
from parallel.common.harness import (
    arrivals,
    calls_per_sample,
    every_rank,
    header,
    progress,
    slowest_rank,
    warm_up,
    write_record,
)
from parallel.common.launch import world
from parallel.common.p2p import peers
from parallel.common.threads import THREAD_KINDS, thread_cpu_s
from parallel.common.training import Config, build_model
from parallel.dp import ring
from parallel.dp.reducer import GradReducer
from parallel.dp.ring import ring_all_reduce
from timing import Stats, measure, median_ci

GOAL = 0.90  # auto's busbw at least this share of dist.all_reduce's, at every size
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]





def _rounds(nbytes: int) -> int:
    """Rounds of the allreduce benchmark at one size. Now and then a message here takes
    milliseconds instead of a fraction of one, so the paired ratio is heavy-tailed, and its 95%
    interval needs many rounds to be narrower than the differences it judges (with 40 rounds
    from 256 KiB on, intervals 0.2 to 0.6 wide straddled the 0.90 goal). So 100 rounds in the
    middle sizes, fewer at the slowest."""
    if nbytes < 256 << 10:
        return 40
    return 100 if nbytes < 16 << 20 else 40 if nbytes < 64 << 20 else 20


# Each choice the algorithms make, timed against its alternative in the same run:
# alternative -> (the variant it alters, a fresh buffer per call, a wait per send, one message
# per piece, posts through dist.isend / dist.irecv and a shared scratch)
ALTERNATIVES = {"ring, a fresh buffer per call": ("ring", True, False, False, False),
                "ring, a fresh buffer and a wait per send": ("ring", True, True, False, False),
                "two_shot, a wait per send": ("two_shot", False, True, False, False),
                "ring, one message per piece": ("ring", False, False, True, False),
                "two_shot, one message per block": ("two_shot", False, False, True, False),
                "segmented_ring, through dist.isend/irecv and a shared scratch":
                    ("segmented_ring", False, False, False, True)}


def _alternative(name: str) -> str | None:
    """The ALTERNATIVES key a record's variant names (records may suffix it " (before)")."""
    name = name.removesuffix(" (before)")
    return name if name in ALTERNATIVES else None


def _alternatives(t: torch.Tensor) -> dict:
    """The ring, two-shot and the segmented ring with one of their choices undone, to measure
    what each is worth: a fresh receive buffer on every call (the ring only: two-shot keeps one
    either way), a wait for every send before going on (ring.LATE_SENDS off), each piece or
    block sent as one message however large (p2p.MESSAGE_BYTES 0), and the segmented ring
    posting through dist.isend / dist.irecv with its scratch in the shared buffer
    (algorithms.SEGMENTED_DIRECT off). Each switch is undone again after its call."""
    calls = {"ring": lambda: ring_all_reduce(t, check=False),
             "two_shot": lambda: all_reduce(t, algorithm="two_shot", check=False),
             "segmented_ring": lambda: all_reduce(t, algorithm="segmented_ring", check=False)}

    def altered(fn: Callable[[], object], fresh_buffer: bool, wait_every_send: bool,
                one_message: bool, indirect: bool) -> Callable[[], None]:
        def run() -> None:
            message_bytes = p2p.MESSAGE_BYTES
            ring.LATE_SENDS = not wait_every_send
            p2p.MESSAGE_BYTES = 0 if one_message else message_bytes
            algorithms.SEGMENTED_DIRECT = not indirect
            try:
                with p2p.fresh_scratch() if fresh_buffer else contextlib.nullcontext():
                    fn()
            finally:
                ring.LATE_SENDS, p2p.MESSAGE_BYTES, algorithms.SEGMENTED_DIRECT = True, message_bytes, True
        return run
    return {name: altered(calls[default], *flags) for name, (default, *flags) in ALTERNATIVES.items()}


def _segmented_at(t: torch.Tensor, segment_bytes: int, cpp: bool = False) -> None:
    """The segmented ring, its loop in Python or in C++, with segments of at most
    ``segment_bytes`` (algorithms.SEGMENT_BYTES for this call only)."""
    from parallel.collectives import cpp_loop

    kept = algorithms.SEGMENT_BYTES
    algorithms.SEGMENT_BYTES = segment_bytes
    try:
        if cpp:
            cpp_loop.segmented_ring(t, check=False)
        else:
            all_reduce(t, algorithm="segmented_ring", check=False)
    finally:
        algorithms.SEGMENT_BYTES = kept


def segment_variant(segment_bytes: int, cpp: bool = False) -> str:
    """The allreduce benchmark's name for a segmented ring with segments other than the default."""
    return f"{CPP_LOOP if cpp else 'segmented ring'}, {size_label(segment_bytes)} segments"


OTHER_SEGMENTS = {False: (2 << 20, 8 << 20), True: (2 << 20,)}  # beside SEGMENT_BYTES, by loop (C++?)
RECORDED_SEGMENTS = (1 << 20, 2 << 20, 8 << 20)  # every size a record holds beside its default, old ones too


def _against_dist(samples: list[float], ref: list[float]) -> dict:
    """A variant's median time and its ratio to dist.all_reduce's, paired round by round
    (gloo's time over ours: the busbw ratio), with the ratio's 95% interval."""
    ratios = [r / mine for r, mine in zip(ref, samples)]
    return {"time_us": statistics.median(samples), "spread_us": Stats(samples).spread,
            "busbw_ratio_to_dist": statistics.median(ratios), "ratio_spread": Stats(ratios).spread,
            "ratio_ci": list(median_ci(ratios) or ()) or None}


CPP_LOOP = "segmented ring, loop in C++"  # cpp_loop.py: the same messages without the interpreter


def _cpp_loop_everywhere() -> str | None:
    """None where every rank can run the C++ loop (distributed.py built it before the ranks
    started), else why not. Every rank must call it: they must all run the same variants."""
    from parallel.collectives import cpp_loop

    reason = cpp_loop.unavailable()
    agreed = every_rank(torch.tensor(0 if reason is None else 1, dtype=torch.int64))
    if reason is None and not agreed.any():
        return None
    return reason or f"ranks {[r for r, bad in enumerate(agreed.tolist()) if bad]} cannot build C++ extensions"


def allreduce(config: Config, json_path: Path | None) -> dict:
    record = allreduce_record(config.device, SIZES)
    return {"output_errors": write_record(record, json_path, allreduce_table(record))}


def allreduce_record(device: str, sizes: list[int]) -> dict:
    """The allreduce benchmark at ``sizes`` on every rank: the record (every rank gets it)."""
    from parallel.collectives import cpp_loop

    n = world()[1]
    device = device if dist.get_backend() == "nccl" else "cpu"
    warm_up(*peers(None)[2:])  # a fresh gloo pair is slow for its first messages
    without_cpp = "it runs on gloo only" if dist.get_backend() != "gloo" else _cpp_loop_everywhere()
    if without_cpp is None:
        cpp_loop.build()  # in every rank, before any call: auto's segmented ring runs in C++ from here
    results, started = [], time.perf_counter()
    progress(f"allreduce: {len(sizes)} sizes, {size_label(sizes[0])} to {size_label(sizes[-1])}; "
             "the larger take longer (minutes in all)")
    for i, nbytes in enumerate(sizes):
        results += _rows_at(nbytes, n, device, without_cpp)
        progress(f"allreduce: {size_label(nbytes)} done ({i + 1}/{len(sizes)}, {time.perf_counter() - started:.0f} s)")
    return {**header("allreduce", device), "segment_bytes": algorithms.SEGMENT_BYTES,
            "without_cpp_loop": without_cpp, "auto_cpp_loop": algorithms.loop_in_cpp(), "results": results}


def _rows_at(nbytes: int, n: int, device: str, without_cpp: str | None) -> list[dict]:
    """Every variant at one size, interleaved round by round: one row each (see allreduce)."""
    from parallel.collectives import cpp_loop

    t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: the sums stay finite
    fns = {name: (lambda t=t, a=name: all_reduce(t, algorithm=a, check=False)) for name in ALGORITHMS}
    fns["dist.all_reduce"] = lambda t=t: dist.all_reduce(t)
    if nbytes >= 4 << 20:  # the ring's piece size (4 MiB) against a smaller and a larger one
        for piece in (1, 16):
            fns[f"ring, {piece} MiB pieces"] = lambda t=t, b=piece << 20: ring_all_reduce(t, check=False,
                                                                                         segment_bytes=b)
        fns.update(_alternatives(t))
    # the segmented ring's largest segment against others; below 16 MiB the chunks are too
    # short for the size to change the cut much
    if nbytes >= 16 << 20:
        for cpp, others in OTHER_SEGMENTS.items():
            if cpp and without_cpp is not None:
                continue
            for b in others:
                fns[segment_variant(b, cpp)] = lambda t=t, b=b, c=cpp: _segmented_at(t, b, c)
    if nbytes >= 1 << 20 and without_cpp is None:  # where auto picks among the large-message algorithms
        fns[CPP_LOOP] = lambda t=t: cpp_loop.segmented_ring(t, check=False)
    number = calls_per_sample(nbytes)  # same on every rank: they must make the same calls
    stats = measure(fns, device=device, rounds=_rounds(nbytes), warmup=2, number=number, order="shuffle",
                    sync=dist.barrier)
    slowest = {variant: slowest_rank(s.samples) for variant, s in stats.items()}
    rows = []
    for variant, samples in slowest.items():
        row = _against_dist(samples, slowest["dist.all_reduce"])
        algbw = nbytes / row["time_us"] / 1e3  # GB/s
        if variant in ALTERNATIVES:  # paired with the variant it alters, round by round
            over_default = [a / d for a, d in zip(samples, slowest[ALTERNATIVES[variant][0]])]
            row["time_over_default"] = statistics.median(over_default)
            row["time_over_default_ci"] = list(median_ci(over_default) or ()) or None
        if variant == CPP_LOOP:  # paired with the Python loop it repeats
            over_python = [c / p for c, p in zip(samples, slowest["segmented_ring"])]
            row["time_over_python_loop"] = statistics.median(over_python)
            row["time_over_python_loop_ci"] = list(median_ci(over_python) or ()) or None
        rows.append({"bytes": nbytes, "variant": variant, **row,
                     "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                     **({"algorithm": choose(nbytes // 4, 4, n, dist.get_backend())} if variant == "auto" else {})})
    return rows


CPU_SIZES = [1 << 20, 4 << 20, 16 << 20]
CPU_VARIANTS = ("ring", "two_shot", "segmented_ring", "dist.all_reduce")
CPU_ROUNDS = 30


def cpu(config: Config, json_path: Path | None) -> dict:
    """Where a call's CPU time goes: per call, the CPU time of every thread kind (main, gloo's
    I/O threads, gloo's worker threads; launch.thread_cpu_s), summed over the ranks, next to
    the slowest rank's wall time. With more ranks than cores the ranks take turns, and the
    wall time follows the CPU time they need together. A sample is ``calls`` calls in a row
    after a barrier; the variants take turns in a new order each round, and a variant's CPU
    time is paired with gloo's in the same round."""
    from parallel.collectives import cpp_loop

    warm_up(*peers(None)[2:])
    without_cpp = _cpp_loop_everywhere()
    shuffler = random.Random(0)  # the same order on every rank: they must make the same calls
    results, started = [], time.perf_counter()
    for i, nbytes in enumerate(CPU_SIZES):
        t = torch.zeros(nbytes // 4)
        fns = {v: (lambda t=t: dist.all_reduce(t)) if v == "dist.all_reduce"
               else (lambda t=t, a=v: all_reduce(t, algorithm=a, check=False)) for v in CPU_VARIANTS}
        if without_cpp is None:
            fns[CPP_LOOP] = lambda t=t: cpp_loop.segmented_ring(t, check=False)
        calls = max(4, (16 << 20) // nbytes)
        for fn in fns.values():
            fn(), fn()
        mine: dict[str, list[list[float]]] = {v: [] for v in fns}  # per round: wall µs, then CPU µs by kind
        for _ in range(CPU_ROUNDS):
            for v in shuffler.sample(list(fns), len(fns)):
                dist.barrier()
                before, start = thread_cpu_s(), time.perf_counter()
                for _ in range(calls):
                    fns[v]()
                wall = time.perf_counter() - start
                after = thread_cpu_s()
                mine[v].append([wall] + [after.get(k, 0.0) - before.get(k, 0.0) for k in THREAD_KINDS])
        every = {v: every_rank(torch.tensor(m, dtype=torch.float64) * (1e6 / calls)) for v, m in mine.items()}
        totals = {v: e[:, :, 1:].sum((0, 2)).tolist() for v, e in every.items()}  # all ranks, all kinds
        for v, e in every.items():
            wall = e[:, :, 0].max(0).values.tolist()  # the slowest rank
            by_thread = {k: e[:, :, 1 + i].sum(0).tolist() for i, k in enumerate(THREAD_KINDS)}  # all ranks
            ratios = [a / b for a, b in zip(totals[v], totals["dist.all_reduce"])]
            results.append({"bytes": nbytes, "variant": v, "calls_per_sample": calls,
                            "time_us": statistics.median(wall), "cpu_us": statistics.median(totals[v]),
                            "cpu_us_by_thread": {k: statistics.median(x) for k, x in by_thread.items()},
                            "cores_busy": statistics.median(c / w for c, w in zip(totals[v], wall)),
                            "cpu_over_dist": statistics.median(ratios),
                            "cpu_over_dist_ci": list(median_ci(ratios) or ()) or None,
                            "rounds_time_us": wall, "rounds_cpu_us": totals[v], "rounds_cpu_us_by_thread": by_thread})
            if v == CPP_LOOP:  # paired with the Python loop it repeats, round by round
                ratios = [a / b for a, b in zip(totals[v], totals["segmented_ring"])]
                results[-1].update(cpu_over_python_loop=statistics.median(ratios),
                                   cpu_over_python_loop_ci=list(median_ci(ratios) or ()) or None)
        progress(f"cpu: {size_label(nbytes)} done ({i + 1}/{len(CPU_SIZES)}, {time.perf_counter() - started:.0f} s)")
    record = {**header("cpu", config.device), "cores": os.cpu_count(), "rounds": CPU_ROUNDS,
              "thread_kinds": list(THREAD_KINDS), "without_cpp_loop": without_cpp, "results": results}
    return {"output_errors": write_record(record, json_path, cpu_table(record))}


def cpu_table(record: dict) -> str:
    kinds = [k for k in record["thread_kinds"] if any(r["cpu_us_by_thread"][k] >= 1 for r in record["results"])]
    rows = ["| size | variant | µs per call | CPU µs per call, all ranks | " + " | ".join(kinds)
            + " | CPU / gloo's (paired, 95% CI) | cores busy |",
            "|---:|---|---:|---:|" + "---:|" * len(kinds) + "---:|---:|"]
    for r in record["results"]:
        ci = r.get("cpu_over_dist_ci") or [math.nan, math.nan]
        rows.append(f"| {size_label(r['bytes'])} | {r['variant']} | {r['time_us']:.0f} | {r['cpu_us']:.0f} | "
                    + " | ".join(f"{r['cpu_us_by_thread'][k]:.0f}" for k in kinds)
                    + f" | {r['cpu_over_dist']:.2f} ({ci[0]:.2f}–{ci[1]:.2f}) | {r['cores_busy']:.2f} |")
    loops = [(r["bytes"], r["cpu_over_python_loop"], r["cpu_over_python_loop_ci"] or [math.nan, math.nan])
             for r in record["results"] if "cpu_over_python_loop" in r]
    if loops:
        rows.append("\nThe segmented ring's CPU time with its loop in C++ over the Python loop's (paired, 95% CI): "
                    + ", ".join(f"{size_label(b)} {x:.2f} ({lo:.2f}–{hi:.2f})" for b, x, (lo, hi) in loops) + ".")
    elif record.get("without_cpp_loop"):
        rows.append(f"\nWithout the C++ loop: {record['without_cpp_loop']}.")
    rows.append(f"\nPer call: the slowest rank's wall time and the CPU time of each kind of thread, summed over the "
                f"ranks (from /proc/self/task/*/schedstat), medians over {record['rounds']} rounds; cores busy: "
                f"all ranks' CPU time over the wall time. {record['world_size']} ranks on {record['backend']} on "
                f"{record['cores']} cores, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


BURSTS = (1, 2, 8)
BURST_SIZES = [1 << 20, 4 << 20, 16 << 20, 64 << 20]
BURST_VARIANTS = ("ring", "two_shot", "segmented_ring", CPP_LOOP, "dist.all_reduce")  # the reference last
BURST_LABELS = {"ring": "ring", "two_shot": "two-shot", "segmented_ring": "segmented ring", CPP_LOOP: "C++ loop",
                "dist.all_reduce": "all_reduce"}


def _burst_rounds(nbytes: int) -> int:
    """Rounds of the burst benchmark at one size: with 30 at 1 and 4 MiB (2 ranks) the paired
    ratios' 95% intervals are 0.3 to 0.5 wide; a round there costs tens of milliseconds, so 100."""
    return 100 if nbytes <= 4 << 20 else 30 if nbytes < 64 << 20 else 12


def burst(config: Config, json_path: Path | None) -> dict:
    """Our algorithms against dist.all_reduce, k = 1, 2 or 8 calls in a row after a barrier:
    the first call starts with all ranks together, as the cost model assumes; the later ones
    start as each rank finishes the one before. The segmented ring runs twice, its loop in
    Python and in C++ (where distributed.py built it): does a loop that starts its next call
    sooner gain or lose when calls follow each other?"""
    from parallel.collectives import cpp_loop

    n = world()[1]
    warm_up(*peers(None)[2:])
    without_cpp = _cpp_loop_everywhere()
    variants = [v for v in BURST_VARIANTS if v != CPP_LOOP or without_cpp is None]
    results, started = [], time.perf_counter()
    for i, nbytes in enumerate(BURST_SIZES):
        t = torch.zeros(nbytes // 4)  # zeros: the sums stay finite
        calls = {name: (lambda t=t, a=name: all_reduce(t, algorithm=a, check=False))
                 for name in ("ring", "two_shot", "segmented_ring")}
        calls[CPP_LOOP] = lambda t=t: cpp_loop.segmented_ring(t, check=False)
        calls["dist.all_reduce"] = lambda t=t: dist.all_reduce(t)
        fns = {f"{name} x{k}": (lambda fn=calls[name], k=k: [fn() for _ in range(k)])
               for name in variants for k in BURSTS}
        stats = measure(fns, rounds=_burst_rounds(nbytes), warmup=1, number=1, order="shuffle", sync=dist.barrier)
        for k in BURSTS:
            per_call = {v: [s / k for s in slowest_rank(stats[f"{v} x{k}"].samples)] for v in variants}
            for v, samples in per_call.items():
                results.append({"bytes": nbytes, "calls_in_a_row": k, "variant": v,
                                **_against_dist(samples, per_call["dist.all_reduce"]),
                                # the median hides a tail that the mean over k calls takes in
                                "mean_us": statistics.mean(samples),
                                "p90_us": statistics.quantiles(samples, n=10, method="inclusive")[-1],
                                **({"predicted_us": PREDICT[v](n, nbytes, link_for(n)) * 1e6} if v in PREDICT else {})})
        progress(f"burst: {size_label(nbytes)} done ({i + 1}/{len(BURST_SIZES)}, "
                 f"{time.perf_counter() - started:.0f} s)")
    record = {**header("burst", config.device), "without_cpp_loop": without_cpp, "results": results}
    return {"output_errors": write_record(record, json_path, burst_table(record))}


def burst_table(record: dict) -> str:
    """Per size and burst length: each variant's time per call, then each one's busbw over
    all_reduce's. The columns are the variants the record holds."""
    held = {r["variant"] for r in record["results"]}
    variants = [v for v in BURST_VARIANTS if v in held]
    ours = variants[:-1]
    rows = ["| size | calls in a row | " + " | ".join(f"{BURST_LABELS[v]} µs per call" for v in variants) + " | "
            + " | ".join(f"{BURST_LABELS[v]} / all_reduce" + (" busbw (paired, 95% CI)" if i == 0 else "")
                         for i, v in enumerate(ours)) + " |",
            "|---:|---:|" + "---:|" * (len(variants) + len(ours))]
    by = {(r["bytes"], r["calls_in_a_row"], r["variant"]): r for r in record["results"]}
    first = min(r["calls_in_a_row"] for r in record["results"])  # one call at a time
    model = []
    for nbytes in sorted({r["bytes"] for r in record["results"]}):
        for k in sorted({r["calls_in_a_row"] for r in record["results"]}):
            cells = [by[(nbytes, k, v)] for v in variants]
            rows.append(f"| {size_label(nbytes)} | {k} | " + " | ".join(f"{c['time_us']:.0f}" for c in cells)
                        + " | " + " | ".join(_ratio_text(c) for c in cells[:-1]) + " |")
        predicted = [f"{BURST_LABELS[v]} {by[(nbytes, first, v)]['predicted_us']:.0f}" for v in ours
                     if "predicted_us" in by[(nbytes, first, v)]]
        model.append(f"{size_label(nbytes)}: {', '.join(predicted)}")
    if all("mean_us" in r for r in record["results"]):  # a record without them has no tails
        rows += [f"\nOne call at a time ({first} in a row), the slowest rank's time over the rounds, median / mean / "
                 f"90th percentile in µs:\n",
                 "| size | " + " | ".join(BURST_LABELS[v] for v in variants) + " |",
                 "|---:|" + "---:|" * len(variants)]
        for nbytes in sorted({r["bytes"] for r in record["results"]}):
            cells = [by[(nbytes, first, v)] for v in variants]
            text = [f"{c['time_us']:.0f} / {c['mean_us']:.0f} / {c['p90_us']:.0f}" for c in cells]
            rows.append(f"| {size_label(nbytes)} | " + " | ".join(text) + " |")
    why = record.get("without_cpp_loop")
    rows.append(f"\nThe cost model's time of one call: {'; '.join(model)} µs. Per call: the slowest rank's time "
                f"of k calls from a barrier, over k; median over rounds. "
                + (f"Without the C++ loop: {why}. " if why else "")
                + f"{record['world_size']} ranks on {record['backend']}, "
                f"{record['threads_per_rank']} thread(s) each, {record['device']}, torch {record['torch']}, "
                f"{record['date']}: `{record['command']}`")
    return "\n".join(rows)


def zero(config: Config, json_path: str | None) -> None:
    """A training step with Adam: computation alone, plain data parallelism (our all-reduce after
    backward), and ZeRO stage 1; and the optimiser state each rank holds."""
    from parallel.collectives.zero import ZeroAdam

    rank, n = world()
    ds = data_mod.synthetic(config.seed)
    per_rank = config.batch_size  # weak scaling: every rank computes the same amount at every n
    idx = torch.arange(rank * per_rank, (rank + 1) * per_rank) % len(ds.train)
    x, y = ds.train.x[idx], ds.train.y[idx]
    warm_up(*peers(None)[2:])

    def make(variant: str):
        torch.manual_seed(config.seed)
        model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode)
        params = list(model.parameters())
        opt = ZeroAdam(params, lr=1e-4) if variant == "zero" else torch.optim.Adam(params, lr=1e-4)
        reducer = (GradReducer(params, bucket_bytes=config.bucket_kb * 1024, overlap=False, all_reduce=all_reduce)
                   if variant == "dp" else None)

        def run() -> None:
            (F.cross_entropy(model(x), y, reduction="sum") / (per_rank * n)).backward()
            if reducer:
                reducer.finish()
                steps[0] += 1
            opt.step()
            opt.zero_grad(set_to_none=True)
        return run, opt, reducer

    steps = [0]  # dp steps run, warm-up included: reducer.comm_s sums their all-reduces
    variants = {name: make(name) for name in ("compute only", "dp", "zero")}
    variants["dp"][2].calls = []  # each all-reduce's start and end, to split waiting from the call
    fns = {k: v[0] for k, v in variants.items()}
    adam_model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode)
    adam = torch.optim.Adam(adam_model.parameters(), lr=1e-4)
    for p in adam_model.parameters():
        p.grad = torch.full_like(p, 1e-3)
    fns["adam step alone"] = adam.step  # the part of "compute only" that ZeRO divides by n
    # A barrier starts every sample, as in the allreduce benchmark: costmodel's predict compares
    # these steps with the model, which assumes the ranks start a step together.
    stats = measure(fns, rounds=20, warmup=3, number=3, order="shuffle", sync=dist.barrier)
    slowest = {name: slowest_rank(s.samples) for name, s in stats.items()}
    state = {name: (v[1].state_bytes() if name == "zero" else
                    sum(t.numel() * t.element_size() for st in v[1].state.values() for t in st.values()))
             for name, v in variants.items()}
    state["adam step alone"] = state["compute only"]
    # Each rank's mean time inside the gradient all-reduce of a dp step: the collective itself,
    # plus the wait for ranks that reached it later (costmodel's predict compares it with the model).
    in_step = every_rank(torch.tensor(variants["dp"][2].comm_s / steps[0] * 1e6, dtype=torch.float64)).tolist()
    split = arrivals(variants["dp"][2].calls) or {}
    for _, _, reducer in variants.values():
        if reducer:
            reducer.close()
    params = sum(p.numel() for p in build_model(ds.features, tuple(config.hidden), ds.classes, "py").parameters())
    results = []
    for name, samples in slowest.items():
        ratios = [m / d for m, d in zip(samples, slowest["dp"])]  # paired, round by round
        results.append({"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                        "ratio_to_dp": statistics.median(ratios), "ratio_spread": Stats(ratios).spread,
                        "optimizer_state_bytes": state[name],
                        **({"allreduce_in_step_us_by_rank": in_step, **split} if name == "dp" else {})})
    record = {**header("zero", config.device), "mode": config.mode, "hidden": list(config.hidden),
              "batch_per_rank": per_rank, "parameters": params, "bucket_kb": config.bucket_kb, "results": results}
    write_record(record, json_path, zero_table(record))


def zero_table(record: dict) -> str:
    rows = ["| variant | step µs (IQR) | step / plain DP's (paired, IQR) | Adam state per rank |",
            "|---|---:|---:|---:|"]
    for r in record["results"]:
        spread = f" ({r['ratio_spread']:.2f})" if "ratio_spread" in r else ""
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | {r['ratio_to_dp']:.3f}{spread} "
                    f"| {r['optimizer_state_bytes'] / 1e6:.2f} MB |")
    rows.append(f"\nMLP {record['hidden']} (mode {record['mode']}, {record['parameters']:,} parameters), "
                f"{record['batch_per_rank']} samples per rank, Adam; {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)



ONE_MESSAGE = "one message: irecv, then isend, + wait (p2p.exchange on gloo)"


def overhead(config: Config, json_path: str | None) -> None:
    """Where the microseconds of a small all-reduce go: whole calls against one bare message,
    and the Python-side pieces of a call timed alone (no message)."""
    from parallel.common.p2p import exchange, wait

    rank, n = world()
    nbytes = 4096
    _, _, right, left = peers(None)
    warm_up(right, left)
    t, recv = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
    calls = {  # variant -> (callable, messages each rank sends per call)
        "one message: batch_isend_irecv + wait": (lambda: wait(dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, right), dist.P2POp(dist.irecv, recv, left)])), 1),
        ONE_MESSAGE: (lambda: wait(exchange(t, recv, right, left, None)), 1),
        "ring_all_reduce, check=False": (lambda: ring_all_reduce(t, check=False), 2 * (n - 1)),
        "all_reduce doubling": (lambda: all_reduce(t, algorithm="doubling", check=False),
                                (n.bit_length() - 1) + 2 * (n != 1 << (n.bit_length() - 1))),
        "all_reduce one-shot": (lambda: all_reduce(t, algorithm="one_shot", check=False), n - 1),
        "all_reduce auto": (lambda: all_reduce(t, check=False), None),
        "dist.all_reduce": (lambda: dist.all_reduce(t), None),
    }
    stats = measure({k: v[0] for k, v in calls.items()}, rounds=30, warmup=3, number=50, order="shuffle")
    slowest = {k: statistics.median(slowest_rank(s.samples)) for k, s in stats.items()}
    one = slowest[ONE_MESSAGE]
    local = measure({  # the per-call work that needs no message, each piece alone
        "dist.get_rank + get_world_size + get_backend (ring, per call)":
            lambda: (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
        "tensor_split into chunks and pieces + max (ring, per call)":
            lambda: [torch.tensor_split(c, 1) for c in torch.tensor_split(t, n)],
        "torch.empty receive buffer (what a call that kept none would add)":
            lambda: torch.empty(nbytes // 4 // n),
        "add_ of one received piece": lambda: t[: nbytes // 4 // n].add_(recv[: nbytes // 4 // n]),
        "cached plan + buffer lookup + choice (all_reduce, per call)":
            lambda: (algorithms.group_plan(None), p2p.scratch(nbytes // 4, t),
                     algorithms.choose(nbytes // 4, 4, n)),
    }, rounds=10, warmup=2)
    results = [{"variant": k, "time_us": v, "messages": calls[k][1],
                "beyond_its_messages_us": (v - calls[k][1] * one) if calls[k][1] else None}
               for k, v in slowest.items()]
    results += [{"variant": k, "time_us": s.median, "local": True} for k, s in local.items()]
    record = {**header("overhead", config.device), "bytes": nbytes, "results": results}
    write_record(record, json_path, overhead_table(record))


def overhead_table(record: dict) -> str:
    rows = ["| what | µs per call | messages per rank | µs beyond its messages |", "|---|---:|---:|---:|"]
    for r in record["results"]:
        extra = "" if r.get("beyond_its_messages_us") is None else f"{r['beyond_its_messages_us']:.0f}"
        msgs = "" if r.get("messages") is None else str(r["messages"])
        rows.append(f"| {r['variant']} | {r['time_us']:.{1 if r.get('local') else 0}f} | {msgs} | {extra} |")
    rows.append(f"\n{record['bytes'] >> 10} KiB float32, slowest rank's median (whole calls) or this rank's median "
                f"(pieces alone); {record['world_size']} ranks on {record['backend']}, {record['threads_per_rank']} "
                f"thread(s) each, {record['device']}, torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def _ratio_text(r: dict) -> str:
    """A paired ratio with its 95% interval, or with its IQR in records written before intervals."""
    if r.get("ratio_ci"):
        return f"{r['busbw_ratio_to_dist']:.2f} ({r['ratio_ci'][0]:.2f}–{r['ratio_ci'][1]:.2f})"
    return f"{r['busbw_ratio_to_dist']:.2f} ({r['ratio_spread']:.2f})"


def _cpp_loop_rows(record: dict, how: str) -> list[str]:
    """The segmented ring with its loop in C++ against gloo's and against the Python loop."""
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    loops = [r for r in record["results"] if r["variant"] == CPP_LOOP]
    if not loops:
        return []
    rows = [f"\n| size | segmented ring, loop in C++ / all_reduce ({how}) | Python loop / all_reduce "
            "| C++ loop's time / Python loop's (paired, 95% CI) |\n|---:|---:|---:|---:|"]
    for r in loops:
        ci = r.get("time_over_python_loop_ci") or [math.nan, math.nan]
        python = by[(r["bytes"], "segmented_ring")]
        rows.append(f"| {size_label(r['bytes'])} | {_ratio_text(r)} | {_ratio_text(python)} "
                    f"| {r['time_over_python_loop']:.2f} ({ci[0]:.2f}–{ci[1]:.2f}) |")
    return rows


def cpp_loop_table(record: dict) -> str:
    """An allreduce record's C++-loop table alone, with the run's line (the chapter shows the
    rest of the record elsewhere)."""
    rows = _cpp_loop_rows(record, "95% CI")
    if not rows:
        raise ValueError("this allreduce record has no C++ loop (it was run without one)")
    rows.append(f"\nbusbw over gloo's all_reduce's, paired round by round. {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows).lstrip("\n")


def _segment_rows(record: dict, how: str) -> list[str]:
    """The segmented ring's segment sizes side by side, per loop: busbw over all_reduce's."""
    default = record.get("segment_bytes", 2 << 20)  # a record without it ran with 2 MiB
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    named = {(nbytes, cpp): {b: by[(nbytes, segment_variant(b, cpp))]
                             for b in RECORDED_SEGMENTS if (nbytes, segment_variant(b, cpp)) in by}
             for nbytes in sorted({r["bytes"] for r in record["results"]}) for cpp in (False, True)}
    named = {k: v for k, v in named.items() if v}
    if not named:
        return []
    sizes = sorted({default} | {b for v in named.values() for b in v})
    heads = [f"{size_label(b)} segments{' (default)' if b == default else ''}" for b in sizes]
    rows = [f"\n| size | loop | busbw / all_reduce's ({how}), {heads[0]} | " + " | ".join(heads[1:])
            + f" |\n|---:|---|{'---:|' * len(sizes)}"]
    for (nbytes, cpp), cells in named.items():
        cells[default] = by[(nbytes, CPP_LOOP if cpp else "segmented_ring")]
        rows.append(f"| {size_label(nbytes)} | {'C++' if cpp else 'Python'} | "
                    + " | ".join(_ratio_text(cells[b]) if b in cells else "—" for b in sizes) + " |")
    return rows


def _goal_rows(record: dict, how: str) -> list[str]:
    """auto against gloo's all_reduce at every size, then the goal's verdict per size."""
    intervals = how == "95% CI"
    rows = ["| size | auto picks | auto µs (IQR) | dist.all_reduce µs (IQR) | auto busbw GB/s | all_reduce busbw GB/s "
            f"| auto / all_reduce busbw (paired, {how}) | ring / all_reduce | segmented ring / all_reduce |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    for nbytes in sorted({r["bytes"] for r in record["results"]}):
        auto, ref, ring = by[(nbytes, "auto")], by[(nbytes, "dist.all_reduce")], by[(nbytes, "ring")]
        segmented = by.get((nbytes, "segmented_ring"))  # a record may hold none
        picks = auto["algorithm"].replace("_", "-") + (" (C++)" if record.get("auto_cpp_loop")
                                                        and auto["algorithm"] == "segmented_ring" else "")
        rows.append(f"| {size_label(nbytes)} | {picks} "
                    f"| {auto['time_us']:.0f} ({auto['spread_us']:.0f}) "
                    f"| {ref['time_us']:.0f} ({ref['spread_us']:.0f}) "
                    f"| {auto['busbw_gbs']:.3f} | {ref['busbw_gbs']:.3f} "
                    f"| {_ratio_text(auto)} | {ring['busbw_ratio_to_dist']:.2f} "
                    f"| {'—' if segmented is None else format(segmented['busbw_ratio_to_dist'], '.2f')} |")

    autos = [r for r in record["results"] if r["variant"] == "auto"]
    met = ", ".join(size_label(r["bytes"]) for r in autos if r["busbw_ratio_to_dist"] >= GOAL) or "no size"
    missed = [r for r in autos if r["busbw_ratio_to_dist"] < GOAL]
    line = (f"\nGoal, auto's busbw at least {GOAL:.2f} of all_reduce's (median paired ratio): met at {met}; "
            f"missed at {', '.join(size_label(r['bytes']) for r in missed) or 'no size'}")
    if intervals:
        below = [size_label(r["bytes"]) for r in missed if r.get("ratio_ci") and r["ratio_ci"][1] < GOAL]
        line += f"; significantly below {GOAL:.2f} (interval under it) at {', '.join(below) or 'no size'}"
    rows.append(line + ".")
    return rows


def _run_line(record: dict) -> str:
    return (f"\n{record['world_size']} ranks on {record['backend']}, {record['threads_per_rank']} thread(s) each, "
            f"{record['device']}, torch {record['torch']}, {record['date']}: `{record['command']}`")


def goal_table(record: dict) -> str:
    """An allreduce record's first table and the goal's verdict, and the setting of gloo's I/O
    threads the run was taken under (the chapter's marker "goal"; "allreduce" shows every table)."""
    how = "95% CI" if any(r.get("ratio_ci") for r in record["results"]) else "IQR"
    rows = _goal_rows(record, how)
    threads = ""
    if "gloo_io_nice" in record:  # records older than the field say nothing
        setting = record["gloo_io_nice"]
        threads = ("gloo's I/O threads left alone (the default). " if setting is None else
                   f"gloo's I/O threads under $DENSE_GLOO_IO_NICE={setting}. ")
    rows.append(f"\n{threads}{_run_line(record).lstrip()}")
    return "\n".join(rows)


def allreduce_table(record: dict) -> str:
    intervals = any(r.get("ratio_ci") for r in record["results"])
    how = "95% CI" if intervals else "IQR"
    rows = _goal_rows(record, how)
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    pieces = sorted({r["bytes"] for r in record["results"] if r["variant"] == "ring, 1 MiB pieces"})
    if pieces:
        rows.append(f"\n| size | ring, 1 MiB pieces / all_reduce ({how}) | ring, 4 MiB pieces (default) / all_reduce "
                    "| ring, 16 MiB pieces / all_reduce |\n|---:|---:|---:|---:|")
        for nbytes in pieces:
            cells = [by[(nbytes, v)] for v in ("ring, 1 MiB pieces", "ring", "ring, 16 MiB pieces")]
            rows.append(f"| {size_label(nbytes)} | " + " | ".join(_ratio_text(c) for c in cells) + " |")
    rows += _segment_rows(record, how)
    rows += _cpp_loop_rows(record, how)
    altered = [r for r in record["results"] if _alternative(r["variant"])]
    if altered:
        rows.append(f"\n| size | alternative | its busbw / all_reduce's ({how}) | the default's "
                    "| its time / the default's (paired, 95% CI) |\n|---:|---|---:|---:|---:|")
        for r in altered:
            name = _alternative(r["variant"])
            default = by[(r["bytes"], ALTERNATIVES[name][0])]
            ratio = r.get("time_over_default", r.get("time_over_now"))
            ci = r.get("time_over_default_ci", r.get("time_over_now_ci")) or [math.nan, math.nan]
            rows.append(f"| {size_label(r['bytes'])} | {name} | {_ratio_text(r)} "
                        f"| {_ratio_text(default)} | {ratio:.2f} ({ci[0]:.2f}–{ci[1]:.2f}) |")
    rows.append(_run_line(record))
    return "\n".join(rows)


JOBS = {"allreduce": allreduce, "cpu": cpu, "burst": burst, "overhead": overhead, "zero": zero, "bf16": bf16}
RENDERERS = {"allreduce": allreduce_table, "goal": goal_table, "cpploop": cpp_loop_table, "cpu": cpu_table,
             "burst": burst_table, "overhead": overhead_table, "zero": zero_table, "bf16": bf16_table}

