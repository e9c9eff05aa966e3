"""Benchmarks of the distributed part, run on every rank by distributed.py --bench.

allreduce: our all_reduce (auto, and each algorithm it chooses from) against dist.all_reduce on
           the same backend, 4 KiB to 64 MiB (from 1 MiB on gloo also the segmented ring with its
           loop in C++, where a compiler is at hand).
cpu:       where a call's CPU time goes (our main thread, gloo's I/O and worker threads), summed
           over the ranks, for the ring, two-shot, the segmented ring (also with its loop in C++,
           where a compiler is at hand) and dist.all_reduce, 1-16 MiB.
burst:     the ring and two-shot against dist.all_reduce, 1, 2 or 8 calls in a row after a
           barrier: from a common start (the cost model's assumption) and back to back.
step:      one training step (forward, backward, gradient averaging, optimiser step) of our
           loop with and without overlap, against torch's DistributedDataParallel.

They use benchmark.measure, interleaving the variants round by round, in a new order each
round (order="shuffle"): rotating the order made the variant that always followed
dist.all_reduce pay for it (parallel/collectives.md). A sample is the
slowest rank's time for it (a collective is done when its last rank is). allreduce, burst and
zero start every sample with a barrier, as nccl-tests does: without one, a rank's clock started
when it finished the previous sample, and the slowest rank's time also counted how far the
ranks had drifted apart by then (parallel/collectives.md). Bandwidths follow
nccl-tests: algbw = bytes / time, busbw = algbw · 2(n − 1)/n for an all-reduce.
"""

from __future__ import annotations

import datetime
import hashlib
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F

import cli
from benchmark import Stats, describe_device, measure, median_ci
from parallel import collectives, ring
from parallel import data as data_mod
from parallel.collectives import ALGORITHMS, all_reduce, choose
from parallel.costmodel import PREDICT, link_for, size_label, warm_up
from parallel.launch import POLICIES, THREAD_KINDS, io_nice, io_thread_nices, thread_cpu_s
from parallel.reducer import GradReducer, world
from parallel.ring import _peers, ring_all_reduce, ring_all_reduce_host
from parallel.tp_report import bytes_table
from parallel.trainer import Config, build_model

SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def _every_rank(mine: torch.Tensor) -> torch.Tensor:
    """Every rank's ``mine`` (the same shape on all), stacked in rank order: each rank fills its
    own row of zeros and a ring sum gathers them. Every rank must call it."""
    rank, n = world()
    table = torch.zeros(n, *mine.shape, dtype=mine.dtype)
    table[rank] = mine
    return ring_all_reduce_host(table)


def _slowest_rank(samples: list[float]) -> list[float]:
    """Per sample, the largest time any rank measured."""
    return _every_rank(torch.tensor(samples, dtype=torch.float64)).max(0).values.tolist()


def _one_clock() -> bool:
    """Whether every rank reads the same monotonic clock (one machine, one boot), so that their
    time.perf_counter() readings can be compared. Every rank must call it (it gathers)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        boot = int(hashlib.sha256(Path("/proc/sys/kernel/random/boot_id").read_bytes()).hexdigest()[:15], 16)
    except OSError:  # unreadable here: say "no" by a value no other rank has, but still take part
        boot = -1 - world()[0]
    return len(set(_every_rank(torch.tensor(boot, dtype=torch.int64)).tolist())) == 1


def _arrivals(calls: list[tuple[float, float]]) -> dict[str, list[float]] | None:
    """Each rank's mean µs, over its all-reduces, spent waiting for the last rank to reach the
    call, and spent in it after that: the two parts of its time inside the call. ``calls`` are
    this rank's (start, end) readings of time.perf_counter(); every rank made the same calls in
    the same order. None where the ranks' clocks cannot be compared."""
    if not _one_clock():
        return None
    table = _every_rank(torch.tensor(calls, dtype=torch.float64).view(len(calls), 2))
    starts, ends = table[:, :, 0], table[:, :, 1]
    last = starts.max(0).values  # when the last rank arrived at each call
    return {"allreduce_in_step_waiting_us_by_rank": ((last - starts).mean(1) * 1e6).tolist(),
            "allreduce_in_step_after_last_arrival_us_by_rank": ((ends - last).mean(1) * 1e6).tolist()}


def _io_thread_nices() -> dict[str, int]:
    """How many of gloo's I/O threads, over all ranks, have each setting now (niceness, or
    "idle" / "batch" for SCHED_IDLE / SCHED_BATCH): the setting (``io_nice()``) as it took
    effect. A thread that ``lower_io_priority`` missed shows here."""
    policies = list(POLICIES)  # after the nicenesses: SCHED_IDLE, SCHED_BATCH
    counts = torch.zeros(40 + len(policies), dtype=torch.int64)  # niceness -20 … 19, then the policies
    for nice in io_thread_nices():
        counts[40 + policies.index(nice) if nice in POLICIES else nice + 20] += 1
    ring_all_reduce_host(counts)  # every rank calls _header, so every rank takes part
    return {(policies[i - 40] if i >= 40 else str(i - 20)): int(c) for i, c in enumerate(counts.tolist()) if c}


def _header(config: Config, kind: str) -> dict:
    """The fields every record starts with. Every rank must call it (it gathers from all)."""
    return {"benchmark": kind, "device": describe_device(config.device), "torch": torch.__version__,
            "backend": dist.get_backend(), "world_size": world()[1], "threads_per_rank": torch.get_num_threads(),
            **({"gloo_io_nice": io_nice(), "gloo_io_thread_nices": _io_thread_nices()}
               if dist.get_backend() == "gloo" else {}),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python distributed.py " + " ".join(sys.argv[1:])}


def _write(record: dict, path: Path | None, table: str) -> list[str]:
    """Rank 0: the file first (a reader that closes stdout early must not cost it), then the
    table, then any error writing the file. Returns those errors."""
    if world()[0] != 0:
        return []
    errors = cli.write_outputs([(path, cli.json_writer(record))])
    print(table, flush=True)
    for e in errors:
        print(f"distributed.py: {e}", file=sys.stderr, flush=True)
    return errors


def _calls_per_sample(nbytes: int) -> int:
    """Calls a sample of the allreduce benchmark averages: about 1 MiB's worth, at most 50
    (4 KiB to 256 KiB), and at least 4 up to 4 MiB and 2 above. With one call per sample from
    1 MiB, each round's ratio was one call over one other, and in a 2-rank run at 16 MiB `auto`
    and the ring, the same call, came out at 0.86 and 1.00 of gloo's (the benchmark at commit
    16c1853; that run was not committed)."""
    return max(4 if nbytes <= 4 << 20 else 2, min(50, (1 << 20) // nbytes))


def _rounds(nbytes: int) -> int:
    """Rounds of the allreduce benchmark at one size. Now and then a message here takes
    milliseconds instead of a fraction of one, so the paired ratio is heavy-tailed. With 40
    rounds at every size below 16 MiB and 12 above (and one call per sample from 1 MiB), the
    ratio's 95% intervals from 256 KiB were 0.2 to 0.6 wide (the 2-rank run at commit 63a1e37):
    at 256 KiB, auto and the one-shot it calls landed on either side of the 0.90 goal, 0.88 and
    1.04. So more rounds there, fewer at the slowest sizes."""
    if nbytes < 256 << 10:
        return 40
    return 100 if nbytes < 16 << 20 else 40 if nbytes < 64 << 20 else 20


# A variant as it was -> (the present variant, a fresh buffer per call, a wait per send,
# one message per piece, posts through dist.isend / dist.irecv and a shared scratch)
BEFORE = {"ring, a fresh buffer per call (before)": ("ring", True, False, False, False),
          "ring, a fresh buffer and a wait per send (before)": ("ring", True, True, False, False),
          "two_shot, a wait per send (before)": ("two_shot", False, True, False, False),
          "ring, one message per piece (before)": ("ring", False, False, True, False),
          "two_shot, one message per block (before)": ("two_shot", False, False, True, False),
          "segmented_ring, through dist.isend/irecv and a shared scratch (before)":
              ("segmented_ring", False, False, False, True)}


def _as_before(t: torch.Tensor) -> dict:
    """The ring and two-shot as they were before three changes, to measure each: a fresh
    receive buffer on every call (the ring only: two-shot already kept one), a wait for every
    send before going on (ring.LATE_SENDS off), and each piece or block sent as one message
    however large (ring.MESSAGE_BYTES 0); and the segmented ring as first written, posting
    through dist.isend / dist.irecv with its scratch in the shared buffer
    (collectives.SEGMENTED_DIRECT off)."""
    calls = {"ring": lambda: ring_all_reduce(t, check=False),
             "two_shot": lambda: all_reduce(t, algorithm="two_shot", check=False),
             "segmented_ring": lambda: all_reduce(t, algorithm="segmented_ring", check=False)}

    def before(fn: Callable[[], object], fresh_buffer: bool, wait_every_send: bool,
               one_message: bool, indirect: bool) -> Callable[[], None]:
        def run() -> None:
            kept, message_bytes = ring._local.__dict__.get("buffers"), ring.MESSAGE_BYTES
            if fresh_buffer:
                ring._local.buffers = {}
            ring.LATE_SENDS = not wait_every_send
            ring.MESSAGE_BYTES = 0 if one_message else message_bytes
            collectives.SEGMENTED_DIRECT = not indirect
            try:
                fn()
            finally:
                ring.LATE_SENDS, ring.MESSAGE_BYTES, collectives.SEGMENTED_DIRECT = True, message_bytes, True
                if fresh_buffer and kept is not None:  # the next variant finds the buffer it left
                    ring._local.buffers = kept
        return run
    return {name: before(calls[now], *flags) for name, (now, *flags) in BEFORE.items()}


def _segmented_at(t: torch.Tensor, segment_bytes: int, cpp: bool = False) -> None:
    """The segmented ring, its loop in Python or in C++, with segments of at most
    ``segment_bytes`` (collectives.SEGMENT_BYTES for this call only)."""
    from parallel import cpp_loop

    kept = collectives.SEGMENT_BYTES
    collectives.SEGMENT_BYTES = segment_bytes
    try:
        if cpp:
            cpp_loop.segmented_ring(t, check=False)
        else:
            all_reduce(t, algorithm="segmented_ring", check=False)
    finally:
        collectives.SEGMENT_BYTES = kept


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


CPP_LOOP = "segmented ring, loop in C++"  # parallel/cpp_loop.py: the same messages without the interpreter


def _cpp_loop_everywhere() -> str | None:
    """None where every rank can run the C++ loop (distributed.py built it before the ranks
    started), else why not. Every rank must call it: they must all run the same variants."""
    from parallel import cpp_loop

    reason = cpp_loop.unavailable()
    agreed = _every_rank(torch.tensor(0 if reason is None else 1, dtype=torch.int64))
    if reason is None and not agreed.any():
        return None
    return reason or f"ranks {[r for r, bad in enumerate(agreed.tolist()) if bad]} cannot build C++ extensions"


def allreduce(config: Config, json_path: Path | None) -> dict:
    from parallel import cpp_loop

    rank, n = world()
    device = config.device if dist.get_backend() == "nccl" else "cpu"
    warm_up(*_peers(None)[2:])  # a fresh gloo pair is slow for its first messages
    without_cpp = "it runs on gloo only" if dist.get_backend() != "gloo" else _cpp_loop_everywhere()
    if without_cpp is None:
        cpp_loop.build()  # in every rank, before any call: auto's segmented ring runs in C++ from here
    results = []
    for nbytes in SIZES:
        t = torch.zeros(nbytes // 4, dtype=torch.float32, device=device)  # zeros: the sums stay finite
        fns = {name: (lambda t=t, a=name: all_reduce(t, algorithm=a, check=False))
               for name in ALGORITHMS}
        fns["dist.all_reduce"] = lambda t=t: dist.all_reduce(t)
        if nbytes >= 4 << 20:  # the ring's piece size (4 MiB) against a smaller and a larger one
            for piece in (1, 16):
                fns[f"ring, {piece} MiB pieces"] = lambda t=t, b=piece << 20: ring_all_reduce(t, check=False,
                                                                                             segment_bytes=b)
            fns.update(_as_before(t))
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
        number = _calls_per_sample(nbytes)  # same on every rank: they must make the same calls
        stats = measure(fns, device=device, rounds=_rounds(nbytes), warmup=2, number=number, order="shuffle",
                        sync=dist.barrier)
        slowest = {variant: _slowest_rank(s.samples) for variant, s in stats.items()}
        for variant, samples in slowest.items():
            row = _against_dist(samples, slowest["dist.all_reduce"])
            algbw = nbytes / row["time_us"] / 1e3  # GB/s
            if variant in BEFORE:  # paired with the present code, round by round
                before_over_now = [b / m for b, m in zip(samples, slowest[BEFORE[variant][0]])]
                row["time_over_now"] = statistics.median(before_over_now)
                row["time_over_now_ci"] = list(median_ci(before_over_now) or ()) or None
            if variant == CPP_LOOP:  # paired with the Python loop it repeats
                over_python = [c / p for c, p in zip(samples, slowest["segmented_ring"])]
                row["time_over_python_loop"] = statistics.median(over_python)
                row["time_over_python_loop_ci"] = list(median_ci(over_python) or ()) or None
            results.append({"bytes": nbytes, "variant": variant, **row,
                            "algbw_gbs": algbw, "busbw_gbs": algbw * 2 * (n - 1) / n,
                            **({"algorithm": choose(nbytes // 4, 4, n)} if variant == "auto" else {})})
    record = {**_header(config, "allreduce"), "segment_bytes": collectives.SEGMENT_BYTES,
              "without_cpp_loop": without_cpp, "auto_cpp_loop": collectives._loop_in_cpp(), "results": results}
    return {"output_errors": _write(record, json_path, allreduce_table(record))}


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
    from parallel import cpp_loop

    warm_up(*_peers(None)[2:])
    without_cpp = _cpp_loop_everywhere()
    shuffler = random.Random(0)  # the same order on every rank: they must make the same calls
    results = []
    for nbytes in CPU_SIZES:
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
        every = {v: _every_rank(torch.tensor(m, dtype=torch.float64) * (1e6 / calls)) for v, m in mine.items()}
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
    record = {**_header(config, "cpu"), "cores": os.cpu_count(), "rounds": CPU_ROUNDS,
              "thread_kinds": list(THREAD_KINDS), "without_cpp_loop": without_cpp, "results": results}
    return {"output_errors": _write(record, json_path, cpu_table(record))}


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
    """Rounds of the burst benchmark at one size: with 30 at 1 and 4 MiB (2 ranks), the paired
    ratios' 95% intervals were 0.3 to 0.5 wide (the first runs of the segmented ring here, not
    committed); a round there costs tens of milliseconds, so 100."""
    return 100 if nbytes <= 4 << 20 else 30 if nbytes < 64 << 20 else 12


def burst(config: Config, json_path: Path | None) -> dict:
    """Our algorithms against dist.all_reduce, k = 1, 2 or 8 calls in a row after a barrier:
    the first call starts with all ranks together, as the cost model assumes; the later ones
    start as each rank finishes the one before. The segmented ring runs twice, its loop in
    Python and in C++ (where distributed.py built it): does a loop that starts its next call
    sooner gain or lose when calls follow each other?"""
    from parallel import cpp_loop

    n = world()[1]
    warm_up(*_peers(None)[2:])
    without_cpp = _cpp_loop_everywhere()
    variants = [v for v in BURST_VARIANTS if v != CPP_LOOP or without_cpp is None]
    results = []
    for nbytes in BURST_SIZES:
        t = torch.zeros(nbytes // 4)  # zeros: the sums stay finite
        calls = {name: (lambda t=t, a=name: all_reduce(t, algorithm=a, check=False))
                 for name in ("ring", "two_shot", "segmented_ring")}
        calls[CPP_LOOP] = lambda t=t: cpp_loop.segmented_ring(t, check=False)
        calls["dist.all_reduce"] = lambda t=t: dist.all_reduce(t)
        fns = {f"{name} x{k}": (lambda fn=calls[name], k=k: [fn() for _ in range(k)])
               for name in variants for k in BURSTS}
        stats = measure(fns, rounds=_burst_rounds(nbytes), warmup=1, number=1, order="shuffle", sync=dist.barrier)
        for k in BURSTS:
            per_call = {v: [s / k for s in _slowest_rank(stats[f"{v} x{k}"].samples)] for v in variants}
            for v, samples in per_call.items():
                results.append({"bytes": nbytes, "calls_in_a_row": k, "variant": v,
                                **_against_dist(samples, per_call["dist.all_reduce"]),
                                # the median hides a tail that the mean over k calls takes in
                                "mean_us": statistics.mean(samples),
                                "p90_us": statistics.quantiles(samples, n=10, method="inclusive")[-1],
                                **({"predicted_us": PREDICT[v](n, nbytes, link_for(n)) * 1e6} if v in PREDICT else {})})
    record = {**_header(config, "burst"), "without_cpp_loop": without_cpp, "results": results}
    return {"output_errors": _write(record, json_path, burst_table(record))}


def burst_table(record: dict) -> str:
    """Per size and burst length: each variant's time per call, then each one's busbw over
    all_reduce's. The columns are the variants the record holds (an older record: ring and
    two-shot only)."""
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
    if all("mean_us" in r for r in record["results"]):  # records from before them have no tails
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
                              overlap=(variant == "all_reduce, overlap"))

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
    slowest = {name: _slowest_rank(s.samples) for name, s in stats.items()}
    results = [{"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                # paired, round by round, like every ratio in these benchmarks
                "ratio_to_ddp": statistics.median(m / d for m, d in zip(samples, slowest["ddp"]))}
               for name, samples in slowest.items()]
    params = sum(p.numel() for p in build_model(ds.features, tuple(config.hidden), ds.classes, "py").parameters())
    record = {**_header(config, "step"), "mode": config.mode, "hidden": list(config.hidden),
              "global_batch": len(batch), "parameters": params, "bucket_kb": config.bucket_kb, "results": results}
    return {"output_errors": _write(record, json_path, step_table(record))}


def zero(config: Config, json_path: str | None) -> None:
    """A training step with Adam: computation alone, plain data parallelism (our all-reduce after
    backward), and ZeRO stage 1; and the optimiser state each rank holds."""
    from parallel.zero import ZeroAdam

    rank, n = world()
    ds = data_mod.synthetic(config.seed)
    per_rank = config.batch_size  # weak scaling: every rank computes the same amount at every n
    idx = torch.arange(rank * per_rank, (rank + 1) * per_rank) % len(ds.train)
    x, y = ds.train.x[idx], ds.train.y[idx]
    warm_up(*_peers(None)[2:])

    def make(variant: str):
        torch.manual_seed(config.seed)
        model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode)
        params = list(model.parameters())
        opt = ZeroAdam(params, lr=1e-4) if variant == "zero" else torch.optim.Adam(params, lr=1e-4)
        reducer = GradReducer(params, bucket_bytes=config.bucket_kb * 1024, overlap=False) if variant == "dp" else None

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
    slowest = {name: _slowest_rank(s.samples) for name, s in stats.items()}
    state = {name: (v[1].state_bytes() if name == "zero" else
                    sum(t.numel() * t.element_size() for st in v[1].state.values() for t in st.values()))
             for name, v in variants.items()}
    state["adam step alone"] = state["compute only"]
    # Each rank's mean time inside the gradient all-reduce of a dp step: the collective itself,
    # plus the wait for ranks that reached it later (costmodel's predict compares it with the model).
    in_step = _every_rank(torch.tensor(variants["dp"][2].comm_s / steps[0] * 1e6, dtype=torch.float64)).tolist()
    split = _arrivals(variants["dp"][2].calls) or {}
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
    record = {**_header(config, "zero"), "mode": config.mode, "hidden": list(config.hidden),
              "batch_per_rank": per_rank, "parameters": params, "bucket_kb": config.bucket_kb, "results": results}
    _write(record, json_path, zero_table(record))


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


ONE_MESSAGE = "one message: irecv, then isend, + wait (after: ring._exchange on gloo)"


def overhead(config: Config, json_path: str | None) -> None:
    """Where the microseconds of a small all-reduce go: whole calls against one bare message,
    and the Python-side pieces of a call timed alone (no message)."""
    from parallel.ring import _exchange, _wait, ring_all_reduce

    rank, n = world()
    nbytes = 4096
    _, _, right, left = _peers(None)
    warm_up(right, left)
    t, recv = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4)
    calls = {  # variant -> (callable, messages each rank sends per call)
        "one message: batch_isend_irecv + wait (before)": (lambda: _wait(dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, t, right), dist.P2POp(dist.irecv, recv, left)])), 1),
        ONE_MESSAGE: (lambda: _wait(_exchange(t, recv, right, left, None)), 1),
        "ring_all_reduce, check=False (before)": (lambda: ring_all_reduce(t, check=False), 2 * (n - 1)),
        "all_reduce doubling (after)": (lambda: all_reduce(t, algorithm="doubling", check=False),
                                        (n.bit_length() - 1) + 2 * (n != 1 << (n.bit_length() - 1))),
        "all_reduce one-shot (after)": (lambda: all_reduce(t, algorithm="one_shot", check=False), n - 1),
        "all_reduce auto (after)": (lambda: all_reduce(t, check=False), None),
        "dist.all_reduce": (lambda: dist.all_reduce(t), None),
    }
    stats = measure({k: v[0] for k, v in calls.items()}, rounds=30, warmup=3, number=50, order="shuffle")
    slowest = {k: statistics.median(_slowest_rank(s.samples)) for k, s in stats.items()}
    one = slowest[ONE_MESSAGE]
    local = measure({  # the per-call work that needs no message, each piece alone
        "dist.get_rank + get_world_size + get_backend (ring, per call)":
            lambda: (dist.get_rank(), dist.get_world_size(), dist.get_backend()),
        "tensor_split into chunks and pieces + max (ring, per call)":
            lambda: [torch.tensor_split(c, 1) for c in torch.tensor_split(t, n)],
        "torch.empty receive buffer (ring, per call until it kept one)": lambda: torch.empty(nbytes // 4 // n),
        "add_ of one received piece": lambda: t[: nbytes // 4 // n].add_(recv[: nbytes // 4 // n]),
        "cached plan + buffer lookup + choice (all_reduce, per call)":
            lambda: (collectives._plan(None), collectives._buffer(nbytes // 4, t),
                     collectives.choose(nbytes // 4, 4, n)),
    }, rounds=10, warmup=2)
    results = [{"variant": k, "time_us": v, "messages": calls[k][1],
                "beyond_its_messages_us": (v - calls[k][1] * one) if calls[k][1] else None}
               for k, v in slowest.items()]
    results += [{"variant": k, "time_us": s.median, "local": True} for k, s in local.items()]
    record = {**_header(config, "overhead"), "bytes": nbytes, "results": results}
    _write(record, json_path, overhead_table(record))


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
    default = record.get("segment_bytes", 2 << 20)  # records from before it was written: 2 MiB
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


def allreduce_table(record: dict) -> str:
    intervals = any(r.get("ratio_ci") for r in record["results"])
    how = "95% CI" if intervals else "IQR"
    rows = ["| size | auto picks | auto µs (IQR) | dist.all_reduce µs (IQR) | auto busbw GB/s | all_reduce busbw GB/s "
            f"| auto / all_reduce busbw (paired, {how}) | ring / all_reduce | segmented ring / all_reduce |",
            "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    for nbytes in sorted({r["bytes"] for r in record["results"]}):
        auto, ref, ring = by[(nbytes, "auto")], by[(nbytes, "dist.all_reduce")], by[(nbytes, "ring")]
        segmented = by.get((nbytes, "segmented_ring"))  # records from before it have none
        picks = auto["algorithm"].replace("_", "-") + (" (C++)" if record.get("auto_cpp_loop")
                                                        and auto["algorithm"] == "segmented_ring" else "")
        rows.append(f"| {size_label(nbytes)} | {picks} "
                    f"| {auto['time_us']:.0f} ({auto['spread_us']:.0f}) "
                    f"| {ref['time_us']:.0f} ({ref['spread_us']:.0f}) "
                    f"| {auto['busbw_gbs']:.3f} | {ref['busbw_gbs']:.3f} "
                    f"| {_ratio_text(auto)} | {ring['busbw_ratio_to_dist']:.2f} "
                    f"| {'—' if segmented is None else format(segmented['busbw_ratio_to_dist'], '.2f')} |")

    autos = [r for r in record["results"] if r["variant"] == "auto"]
    met = ", ".join(size_label(r["bytes"]) for r in autos if r["busbw_ratio_to_dist"] >= 0.90) or "no size"
    missed = [r for r in autos if r["busbw_ratio_to_dist"] < 0.90]
    line = (f"\nGoal, auto's busbw at least 0.90 of all_reduce's (median paired ratio): met at {met}; "
            f"missed at {', '.join(size_label(r['bytes']) for r in missed) or 'no size'}")
    if intervals:
        below = [size_label(r["bytes"]) for r in missed if r.get("ratio_ci") and r["ratio_ci"][1] < 0.90]
        line += f"; significantly below 0.90 (interval under it) at {', '.join(below) or 'no size'}"
    rows.append(line + ".")
    pieces = sorted({r["bytes"] for r in record["results"] if r["variant"] == "ring, 1 MiB pieces"})
    if pieces:
        rows.append(f"\n| size | ring, 1 MiB pieces / all_reduce ({how}) | ring, 4 MiB pieces (default) / all_reduce "
                    "| ring, 16 MiB pieces / all_reduce |\n|---:|---:|---:|---:|")
        for nbytes in pieces:
            cells = [by[(nbytes, v)] for v in ("ring, 1 MiB pieces", "ring", "ring, 16 MiB pieces")]
            rows.append(f"| {size_label(nbytes)} | " + " | ".join(_ratio_text(c) for c in cells) + " |")
    rows += _segment_rows(record, how)
    rows += _cpp_loop_rows(record, how)
    befores = [r for r in record["results"] if r["variant"] in BEFORE]
    if befores:
        rows.append(f"\n| size | as before | its busbw / all_reduce's ({how}) | present code's "
                    "| its time / the present code's (paired, 95% CI) |\n|---:|---|---:|---:|---:|")
        for r in befores:
            now = by[(r["bytes"], BEFORE[r["variant"]][0])]
            ci = r.get("time_over_now_ci") or [math.nan, math.nan]
            rows.append(f"| {size_label(r['bytes'])} | {r['variant'].removesuffix(' (before)')} | {_ratio_text(r)} "
                        f"| {_ratio_text(now)} | {r['time_over_now']:.2f} ({ci[0]:.2f}–{ci[1]:.2f}) |")
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


# ---------------------------------------------------------------------------
# tp: one tensor-parallel MLP step, collectives overlapped with the GEMMs or not, against torch's
# ---------------------------------------------------------------------------

TP_VARIANTS = ("unoverlapped", "overlapped", "dtensor")
TP_SPLIT_STEPS = 10  # steps recorded (outside the timed ones) to split a step into comm and compute
_KINDS = ("compute", "comm")


def _tp_models(d: int, h: int, mode: str, seed: int) -> dict:
    """The same weights three ways: our sequence-parallel pair without and with overlap, and
    nn.Linear + sigmoid parallelised by torch (ColwiseParallel takes the batch-sharded input
    and all-gathers it, RowwiseParallel reduce-scatters its output along the batch)."""
    from torch import nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    from modes import Dense
    from parallel.tp import ColumnParallelDense, RowParallelDense

    models = {}
    for name in ("unoverlapped", "overlapped"):
        torch.manual_seed(seed)
        pair = nn.Sequential(
            ColumnParallelDense(d, h, mode=mode, sequence_parallel=True, overlap=name == "overlapped"),
            RowParallelDense(h, d, mode=mode, sequence_parallel=True, overlap=name == "overlapped"))
        for layer in pair:
            layer.check = False  # shapes agreed by construction (and checked once below)
        models[name] = pair
    torch.manual_seed(seed)
    full = [Dense(d, h, mode=mode), Dense(h, d, mode=mode)]
    linears = [nn.Linear(d, h), nn.Linear(h, d)]
    with torch.no_grad():
        for lin, dense in zip(linears, full):
            lin.weight.copy_(dense.weight)
            lin.bias.copy_(dense.bias)
    torch_pair = nn.Sequential(linears[0], nn.Sigmoid(), linears[1], nn.Sigmoid())
    mesh = init_device_mesh("cpu", (world()[1],))
    models["dtensor"] = parallelize_module(torch_pair, mesh, {"0": ColwiseParallel(input_layouts=Shard(0)),
                                                              "2": RowwiseParallel(output_layouts=Shard(0))})
    return models


def _events_table(events: list[tuple[str, float, float]]) -> list[list[float]]:
    """A rank's timeline as rows (rank, kind, start s, end s), gathered from every rank."""
    n = world()[1]
    m = int(_every_rank(torch.tensor(float(len(events)), dtype=torch.float64)).max().item())
    mine = torch.zeros(m, 3, dtype=torch.float64)
    for i, (kind, t0, t1) in enumerate(events):
        mine[i] = torch.tensor([_KINDS.index(kind) + 1, t0, t1], dtype=torch.float64)
    rows = _every_rank(mine)
    return [[r, _KINDS[int(k) - 1], t0, t1] for r in range(n) for k, t0, t1 in rows[r].tolist() if k]


def tp(config: Config, json_path: str | None) -> None:
    """Time the same sequence-parallel MLP pair step three ways (see TP_VARIANTS)."""
    from parallel.tp import Timeline

    if len(config.hidden) != 2:
        raise ValueError(f"--bench tp takes --hidden D,H (the pair D -> H -> D), got {list(config.hidden)}")
    rank, n = world()
    d, h = config.hidden
    if h % n or config.batch_size % n or config.batch_size < n:
        raise ValueError(f"--bench tp needs H ({h}) and --batch-size ({config.batch_size}) divisible by the "
                         f"world size {n}, as torch's tensor parallelism shards them evenly")
    g = torch.Generator().manual_seed(config.seed + rank)
    rows = config.batch_size // n
    x = torch.randn(rows, d, generator=g).requires_grad_()  # an inner layer: its input needs a gradient
    grad = torch.randn(rows, d, generator=g)
    models = _tp_models(d, h, config.mode, config.seed)

    def stepper(model):
        def run() -> None:
            model(x).backward(grad)
            for t in [x, *model.parameters()]:
                _settle(t.grad)  # torch's collectives may still be in flight: a step ends when they are done
                t.grad = None
        return run

    # The three compute the same thing: check once, with the shapes agreed (check=True).
    outs = {}
    for name, model in models.items():
        for layer in model if name != "dtensor" else ():
            layer.check = True
        outs[name] = model(x).detach()
        for layer in model if name != "dtensor" else ():
            layer.check = False
    for name in TP_VARIANTS[1:]:
        if not torch.allclose(outs[name], outs["unoverlapped"], rtol=1e-4, atol=1e-5):
            raise RuntimeError(f"--bench tp: variant {name} computes another result than unoverlapped")

    fns = {name: stepper(models[name]) for name in TP_VARIANTS}
    stats = measure(fns, rounds=20, warmup=2, number=3, order="shuffle")
    slowest = {name: _slowest_rank(s.samples) for name, s in stats.items()}

    # Where a step's time goes: our variants record every GEMM/elementwise call and every wait on
    # a collective; the medians over a few steps, the slowest rank's. torch's step is not
    # instrumented: its communication is timed alone (the same four collectives, gloo's), and its
    # computation is the same step's GEMMs on one rank with no communication.
    splits: dict[str, dict[str, float]] = {}
    timelines = {}
    for name in ("unoverlapped", "overlapped"):
        per_step: dict[str, list[float]] = {k: [] for k in (*_KINDS, "wall")}
        for i in range(TP_SPLIT_STEPS):
            dist.barrier()
            Timeline.start()
            start = time.perf_counter()
            fns[name]()
            per_step["wall"].append((time.perf_counter() - start) * 1e6)
            events = Timeline.stop()
            for k in _KINDS:
                per_step[k].append(sum(t1 - t0 for kind, t0, t1 in events if kind == k) * 1e6)
            if i == TP_SPLIT_STEPS - 1:
                timelines[name] = _events_table(events)
        # the slowest rank's medians; the share is per recorded step, of that step's own time
        share = [c / w for c, w in zip(per_step["comm"], per_step["wall"])]
        splits[name] = {"comm_us": max(_slowest_rank([statistics.median(per_step["comm"])])),
                        "compute_us": max(_slowest_rank([statistics.median(per_step["compute"])])),
                        "recorded_step_us": max(_slowest_rank([statistics.median(per_step["wall"])])),
                        "comm_share": max(_slowest_rank([statistics.median(share)]))}
    splits["dtensor"] = _torch_split(d, h, rows, n, config.seed)
    results = []
    for name, samples in slowest.items():
        ratios = [m / u for m, u in zip(samples, slowest["unoverlapped"])]
        results.append({"variant": name, "step_us": statistics.median(samples), "spread_us": Stats(samples).spread,
                        "ratio_to_unoverlapped": statistics.median(ratios), "ratio_spread": Stats(ratios).spread,
                        **splits[name]})
    by = {r["variant"]: r for r in results}
    elem = 4
    record = {**_header(config, "tp"), "mode": config.mode, "d": d, "h": h, "global_batch": rows * n,
              "bytes_per_collective": rows * n * d * elem,
              "comm_share_unoverlapped": by["unoverlapped"]["comm_share"],
              "overlapped_over_unoverlapped": by["overlapped"]["ratio_to_unoverlapped"],
              "overlapped_over_dtensor": statistics.median(
                  o / t for o, t in zip(slowest["overlapped"], slowest["dtensor"])),
              "results": results, "timeline": timelines,
              # the goals, judged on this run's paired medians
              "goals": {"comm_share_at_least_0.30": by["unoverlapped"]["comm_share"] >= 0.30,
                        "overlapped_at_most_0.85_of_unoverlapped": by["overlapped"]["ratio_to_unoverlapped"] <= 0.85,
                        "overlapped_no_slower_than_dtensor": statistics.median(
                            o / t for o, t in zip(slowest["overlapped"], slowest["dtensor"])) <= 1.0},
              "how": "comm_us/compute_us: ours, time inside collectives or blocked on a transfer, and in GEMMs and "
                     f"elementwise kernels, per step, medians of {TP_SPLIT_STEPS} recorded steps (recorded_step_us "
                     "is their own median time; comm_share the median of comm/step); dtensor, gloo's "
                     "all_gather_into_tensor + reduce_scatter_tensor "
                     "of the same tensors timed alone, and the same step's nn.Linear GEMMs on one rank alone"}
    _write(record, json_path, tp_table(record))


def _settle(t: torch.Tensor | None) -> None:
    """Wait for a tensor that torch's functional collectives may still be computing."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor
    from torch.distributed.tensor import DTensor

    local = t.to_local() if isinstance(t, DTensor) else t
    if isinstance(local, AsyncCollectiveTensor):
        local.wait()


def _torch_split(d: int, h: int, rows: int, n: int, seed: int) -> dict[str, float]:
    """torch's step, taken apart: the four collectives alone (gloo), the local compute alone."""
    import warnings

    from torch import nn

    full_x, part = torch.zeros(rows * n, d), torch.zeros(rows, d)

    def comm() -> None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            for _ in range(2):  # forward: gather x, scatter y; backward: gather dy, scatter dx
                dist.all_gather_into_tensor(full_x, part)
                dist.reduce_scatter_tensor(part, full_x)
    torch.manual_seed(seed)
    local = nn.Sequential(nn.Linear(d, h // n), nn.Sigmoid(), nn.Linear(h // n, d), nn.Sigmoid())
    xin = torch.randn(rows * n, d, requires_grad=True)
    gout = torch.randn(rows * n, d)

    def compute() -> None:
        local(xin).backward(gout)
        local.zero_grad(set_to_none=True)
        xin.grad = None
    stats = measure({"comm": comm}, rounds=10, warmup=1, number=3)
    comm_us = statistics.median(_slowest_rank(stats["comm"].samples))
    compute_us = statistics.median(measure({"compute": compute}, rounds=10, warmup=1, number=3)["compute"].samples)
    return {"comm_us": comm_us, "compute_us": max(_slowest_rank([compute_us]))}


def tp_table(record: dict) -> str:
    rows = ["| variant | step µs (IQR) | step / unoverlapped (paired; IQR) | communication µs | computation µs |",
            "|---|---:|---:|---:|---:|"]
    for r in record["results"]:
        spread = f" ({r['ratio_spread']:.3f})" if "ratio_spread" in r else ""  # older records lack it
        rows.append(f"| {r['variant']} | {r['step_us']:.0f} ({r['spread_us']:.0f}) | "
                    f"{r['ratio_to_unoverlapped']:.3f}{spread} | {r['comm_us']:.0f} | {r['compute_us']:.0f} |")
    rows.append(f"\nMLP pair {record['d']} → {record['h']} → {record['d']} (mode {record['mode']}), global batch "
                f"{record['global_batch']} split along the batch; communication "
                f"{100 * record['comm_share_unoverlapped']:.0f}% of the unoverlapped step; overlapped / dtensor "
                f"(paired) {record['overlapped_over_dtensor']:.3f}. Goals: "
                + "; ".join(f"{k.replace('_', ' ')}: {'met' if v else 'missed'}" for k, v in record["goals"].items())
                + f". {record['world_size']} ranks on "
                f"{record['backend']}, {record['threads_per_rank']} thread(s) each, {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


JOBS = {"allreduce": allreduce, "cpu": cpu, "burst": burst, "step": step, "overhead": overhead, "zero": zero, "tp": tp}
RENDERERS = {"allreduce": allreduce_table, "cpploop": cpp_loop_table, "cpu": cpu_table, "burst": burst_table,
             "step": step_table, "overhead": overhead_table, "zero": zero_table, "tp": tp_table, "tpbytes": bytes_table}
