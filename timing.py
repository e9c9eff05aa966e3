"""How every benchmark in this repository times and compares: ``measure`` (callables interleaved
round by round, CUDA events with the L2 flushed on a GPU, enough calls per sample on the CPU),
``Stats`` (a variant's per-call µs: median, interquartile range), ``median_ci`` (a
distribution-free interval of a median), ``paired_ratio`` and ``replicated_ratio`` (the
per-round ratio of two variants, within one process or pooled over replicates),
``ci_narrow_enough`` (when to stop adding rounds), and the process's conditions a timing depends
on: ``pin_threads`` and ``set_malloc`` (whose choice every record states, MALLOC)."""

from __future__ import annotations

import ctypes
import math
import os
import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

CI_LEVEL = 0.95


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


def median_ci(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float] | None:
    """A distribution-free confidence interval for the median of ``values``.

    The number of values below the true median is Binomial(n, 1/2) whatever the distribution,
    so [v_(k), v_(n+1-k)] (sorted, 1-based) covers the median with probability at least
    1 - 2·P(Bin(n, 1/2) < k). Returns the narrowest such interval with at least ``level``
    coverage, or None when there are too few values (fewer than 6 for 95%).
    """
    v, n = sorted(values), len(values)
    alpha, cdf, k = 1 - level, 0.0, 0
    # Largest k with P(Bin(n, 1/2) <= k - 1) <= alpha / 2.
    while k < n:
        nxt = cdf + math.comb(n, k) / 2**n
        if nxt > alpha / 2:
            break
        cdf, k = nxt, k + 1
    if k == 0:
        return None
    return v[k - 1], v[n - k]


def paired_ratio(mine: Sequence[float], ref: Sequence[float]) -> dict:
    """The median of the per-round ratios mine[r] / ref[r], its confidence interval and a verdict."""
    ratios = [m / q for m, q in zip(mine, ref)]
    ci = median_ci(ratios)
    return {"ratio": statistics.median(ratios), "ci": list(ci) if ci else None, "verdict": _verdict(ci)}


def _verdict(ci: Sequence[float] | None) -> str:
    if ci is None:
        return "too few rounds for an interval"
    if ci[0] <= 1.0 <= ci[1]:
        return "no significant difference"
    return "faster" if ci[1] < 1.0 else "slower"


def replicated_ratio(mine: Sequence[Sequence[float]], ref: Sequence[Sequence[float]],
                     resamples: int = 2000, seed: int = 0) -> dict:
    """The paired ratio over several replicates of one measurement (fresh tensors each).

    Rounds of one replicate share whatever state its process and tensors are in, and at small
    sizes that state moves the ratio by more than one replicate's interval (the sweep's table
    shows each replicate's ratio: see docs/results/cpu_sweep.json). So the interval must come
    from the replicates, not only the
    rounds: a two-level bootstrap resamples the replicates, then the rounds within each, and
    takes the median of the pooled ratios; the interval is the central 95% of ``resamples``
    such medians. The ratio itself is the median of all rounds' ratios. One replicate:
    paired_ratio's distribution-free interval.
    """
    per_rep = [[m / q for m, q in zip(ms, qs)] for ms, qs in zip(mine, ref)]
    if len(per_rep) == 1:
        return {**paired_ratio(mine[0], ref[0]), "replicate_ratios": [statistics.median(per_rep[0])]}
    rng = random.Random(seed)
    medians = []
    for _ in range(resamples):
        pooled = [v for rep in rng.choices(per_rep, k=len(per_rep)) for v in rng.choices(rep, k=len(rep))]
        medians.append(statistics.median(pooled))
    medians.sort()
    tail = (1 - CI_LEVEL) / 2
    ci = [medians[int(tail * resamples)], medians[int((1 - tail) * resamples) - 1]]
    return {"ratio": statistics.median([v for rep in per_rep for v in rep]), "ci": ci, "verdict": _verdict(ci),
            "replicate_ratios": [statistics.median(rep) for rep in per_rep]}



def pin_threads(threads: int | None) -> list[int] | None:
    """Fix torch's thread count and, where the OS allows, the CPUs this process runs on
    (the first ``threads`` of those it may use), so that a run does not migrate between cores.
    Call before the first tensor operation. Returns the CPUs pinned, or None."""
    if threads is not None:
        torch.set_num_threads(threads)
    n = torch.get_num_threads()
    if not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))[:n]
    os.sched_setaffinity(0, cpus)
    return cpus


# What glibc's malloc does with a freed block decides whether the next allocation of that size
# costs nothing or a page fault per 4 KiB page. By default it hands large blocks back to the
# OS: always above 32 MiB, and below that depending on thresholds that move as the program
# runs, so the cost depends on what the process allocated before (docs/README.md; compare a
# sweep with --malloc default against one without).
# "retain" keeps freed memory in the process, as PyTorch's CUDA caching allocator, jemalloc
# and tcmalloc do: every variant then pays for its work, not for the allocator's history.
MALLOC_CHOICES = ("retain", "default")
MALLOC = "default"  # what set_malloc() last did in this process: every record says it


def set_malloc(policy: str) -> str:
    """Apply ``policy`` ("retain" or "default") to this process's malloc; returns what was done,
    for the record. Needs glibc for "retain"; elsewhere it says the allocator was left alone.
    Call before the big allocations: blocks already mapped stay mapped."""
    global MALLOC
    MALLOC = "default" if policy == "default" else _mallopt_retain()
    return MALLOC


def _mallopt_retain() -> str:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return "default (no glibc mallopt here)"
    m_trim_threshold, m_mmap_max = -1, -4  # from glibc's <malloc.h>
    # No block is ever mmap'ed (so none is unmapped on free), and the heap is never trimmed.
    if mallopt(m_mmap_max, 0) != 1 or mallopt(m_trim_threshold, ctypes.c_int(2**31 - 1)) != 1:
        return "default (mallopt refused)"
    return "retain (glibc mallopt: M_MMAP_MAX=0, M_TRIM_THRESHOLD=2^31-1)"


def measure(fns: dict[str, Callable[[], object]], device: str = "cpu", rounds: int = 20,
            warmup: int = 3, min_sample_s: float = 0.01, number: int | None = None,
            enough: Callable[[dict[str, list[float]]], bool] | None = None,
            max_rounds: int | None = None, budget_s: float | None = None,
            min_rounds: int | None = None, order: str = "rotate",
            sync: Callable[[], object] | None = None) -> dict[str, Stats]:
    """Time every callable ``rounds`` times, interleaved; returns per-call Stats in µs.

    Each round runs every callable once, in an order that rotates from round to round, so
    that no variant always runs first (cold). Rotation keeps the cyclic order, though: each
    variant always follows the same neighbour. ``order="shuffle"`` draws a new order each
    round instead, from a generator seeded alike in every process (ranks that time
    collectives together make the same calls): the distributed benchmarks use it, because
    a call straight after a collective can inherit its after-effects (gloo's threads still
    finishing), and under rotation the same variant would always pay for them. On the CPU a
    sample averages enough calls to last ``min_sample_s``, or exactly ``number`` calls: ranks that
    time a collective together must all make the same calls, so they give ``number`` and
    no ``enough``, ``budget_s`` or ``min_rounds`` (each rank would judge those by its own
    clock). Warm-up runs each callable ``warmup`` times, fewer for one that takes over a
    second, unless ``number`` is given. With ``enough``, rounds go on
    after ``rounds`` until ``enough(samples)`` is true, ``max_rounds`` are done or
    ``budget_s`` seconds have passed since the timing started. With ``min_rounds`` too, slow
    callables get fewer than ``rounds`` rounds (as many as the budget holds, judged from the
    warm-up), but never fewer than ``min_rounds``. ``sync``, if given, runs before every sample,
    untimed: the distributed benchmarks pass ``dist.barrier`` so that every rank starts a sample
    together, as nccl-tests does (a barrier, then the timed calls).
    """
    names = list(fns)
    if order not in ("rotate", "shuffle"):
        raise ValueError(f"order must be 'rotate' or 'shuffle', got {order!r}")
    shuffler = random.Random(0)

    def round_order(r: int) -> list[str]:
        if order == "shuffle":
            return shuffler.sample(names, len(names))
        return names[r % len(names):] + names[: r % len(names)]

    last_call: dict[str, float] = {}  # the last warm-up call's time: how many calls make a sample
    for name in names:
        spent = time.perf_counter()
        for _ in range(warmup):
            t0 = time.perf_counter()
            fns[name]()
            last_call[name] = time.perf_counter() - t0
            # Cut a slow callable's warm-up short, but never when the calls are collectives
            # (``number`` given): each rank would judge its own clock, and ranks that warm up
            # a different number of times send mismatched messages (gloo aborts the process).
            if number is None and time.perf_counter() - spent > 1.0:
                break
    if min_rounds is not None and budget_s is not None and last_call:
        round_s = sum(last_call.values())
        rounds = max(min_rounds, min(rounds, int(budget_s / max(round_s, 1e-9))))
    samples: dict[str, list[float]] = {name: [] for name in names}
    started = time.perf_counter()

    def go_on(r: int) -> bool:
        if r < rounds:
            return True
        if enough is None or enough(samples):
            return False
        if max_rounds is not None and r >= max_rounds:
            return False
        return budget_s is None or time.perf_counter() - started < budget_s

    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        # Writing twice the L2's size evicts whatever the previous call left in it.
        flush = torch.empty(max(2 * props.L2_cache_size, 1 << 20), dtype=torch.uint8, device=device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        r = 0
        while go_on(r):
            for name in round_order(r):
                flush.zero_()
                if sync is not None:
                    sync()
                start.record()
                fns[name]()
                end.record()
                end.synchronize()
                samples[name].append(start.elapsed_time(end) * 1e3)
            r += 1
    else:
        from torch.utils.benchmark import Timer

        timers, calls = {}, {}
        for name in names:
            # Timer runs on one thread unless told otherwise: give it the threads torch has.
            timers[name] = Timer(stmt="fn()", globals={"fn": fns[name]}, num_threads=torch.get_num_threads())
            if number is None:  # enough calls per sample that timer resolution does not matter
                once = last_call.get(name) or timers[name].timeit(1).median
                if once < min_sample_s:  # a fast call: time it once more through the Timer, warm
                    once = timers[name].timeit(1).median
                calls[name] = max(1, int(min_sample_s / max(once, 1e-9)))
            else:
                calls[name] = number

        def sample(name: str) -> float:
            if sync is None:
                return timers[name].timeit(calls[name]).median * 1e6
            # Timer.timeit runs two untimed calls before the timed ones, by which time the ranks
            # have drifted apart again: time the calls here, straight after the barrier.
            sync()
            t0 = time.perf_counter()
            for _ in range(calls[name]):
                fns[name]()
            return (time.perf_counter() - t0) / calls[name] * 1e6

        started = time.perf_counter()
        r = 0
        while go_on(r):
            for name in round_order(r):
                samples[name].append(sample(name))
            r += 1
    return {name: Stats(s) for name, s in samples.items()}


def ci_narrow_enough(pairs: list[tuple[str, str]], target: float) -> Callable[[dict[str, list[float]]], bool]:
    """For measure(enough=...): every paired ratio's interval within ±target of its median."""

    def check(samples: dict[str, list[float]]) -> bool:
        for mine, ref in pairs:
            ratios = [m / q for m, q in zip(samples[mine], samples[ref])]
            ci = median_ci(ratios)
            if ci is None or (ci[1] - ci[0]) / 2 > target * statistics.median(ratios):
                return False
        return True

    return check

