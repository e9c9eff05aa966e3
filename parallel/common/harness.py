"""What every distributed benchmark does around its measurement, written once.

Run on every rank by ``distributed.py --bench`` (the benchmarks themselves live with their
chapters: parallel/dp/bench.py, parallel/collectives/bench.py, parallel/tp/bench.py). A
collective is done when its last rank is, so a sample is the slowest rank's time for it
(``slowest_rank``); the ranks' readings are gathered round our own ring (``every_rank``). A
record starts with the same fields everywhere (``header``: the machine, torch, the backend,
the ranks, and the setting of gloo's I/O threads it ran under), and rank 0 writes it
(``write_record``).
"""

from __future__ import annotations

import datetime
import hashlib
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import cli
from parallel.common import threads
from parallel.common.launch import world
from parallel.common.p2p import agree, exchange, stack_rows, wait
from record_info import describe_device


def every_rank(mine: torch.Tensor) -> torch.Tensor:
    """Every rank's ``mine`` (a CPU tensor, the same shape on all), stacked in rank order, on
    the CPU: gathered round the ring (p2p.stack_rows; on NCCL through the current GPU, since
    NCCL sends CUDA tensors only). Every rank must call it."""
    if dist.get_backend() == "nccl":
        mine = mine.to(torch.device("cuda", torch.cuda.current_device()))
    agree("all_reduce", mine, "sum", None)  # ranks that disagree on the size raise, not crash gloo
    return stack_rows(mine, purpose="data").cpu()


def slowest_rank(samples: list[float]) -> list[float]:
    """Per sample, the largest time any rank measured."""
    return every_rank(torch.tensor(samples, dtype=torch.float64)).max(0).values.tolist()


def one_clock() -> bool:
    """Whether every rank reads the same monotonic clock (one machine, one boot), so that their
    time.perf_counter() readings can be compared. Every rank must call it (it gathers)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        boot = int(hashlib.sha256(Path("/proc/sys/kernel/random/boot_id").read_bytes()).hexdigest()[:15], 16)
    except OSError:  # unreadable here: say "no" by a value no other rank has, but still take part
        boot = -1 - world()[0]
    return len(set(every_rank(torch.tensor(boot, dtype=torch.int64)).tolist())) == 1


def arrivals(calls: list[tuple[float, float]]) -> dict[str, list[float]] | None:
    """Each rank's mean µs, over its all-reduces, spent waiting for the last rank to reach the
    call, and spent in it after that: the two parts of its time inside the call. ``calls`` are
    this rank's (start, end) readings of time.perf_counter(); every rank made the same calls in
    the same order. None where the ranks' clocks cannot be compared."""
    if not one_clock():
        return None
    table = every_rank(torch.tensor(calls, dtype=torch.float64).view(len(calls), 2))
    starts, ends = table[:, :, 0], table[:, :, 1]
    last = starts.max(0).values  # when the last rank arrived at each call
    return {"allreduce_in_step_waiting_us_by_rank": ((last - starts).mean(1) * 1e6).tolist(),
            "allreduce_in_step_after_last_arrival_us_by_rank": ((ends - last).mean(1) * 1e6).tolist()}


def _io_thread_nices() -> dict[str, int]:
    """How many of gloo's I/O threads, over all ranks, have each setting now (niceness, or
    "idle" / "batch" for SCHED_IDLE / SCHED_BATCH): what the threads really had."""
    policies = list(threads.POLICIES)  # after the nicenesses: SCHED_IDLE, SCHED_BATCH
    counts = torch.zeros(40 + len(policies), dtype=torch.int64)  # niceness -20 … 19, then the policies
    for nice in threads.io_thread_nices():
        counts[40 + policies.index(nice) if nice in threads.POLICIES else nice + 20] += 1
    counts = every_rank(counts).sum(0)  # every rank calls header, so every rank takes part
    return {(policies[i - 40] if i >= 40 else str(i - 20)): int(c) for i, c in enumerate(counts.tolist()) if c}


def header(kind: str, device: str) -> dict:
    """The fields every record starts with. Every rank must call it (it gathers from all).
    ``gloo_io_nice`` is the setting of gloo's I/O threads the run was asked to apply (None: left
    alone, the default); ``gloo_io_thread_nices`` counts what the threads had."""
    return {"benchmark": kind, "device": describe_device(device), "torch": torch.__version__,
            "backend": dist.get_backend(), "world_size": world()[1], "threads_per_rank": torch.get_num_threads(),
            **({"gloo_io_nice": threads.active_setting(), "gloo_io_thread_nices": _io_thread_nices()}
               if dist.get_backend() == "gloo" else {}),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python distributed.py " + " ".join(sys.argv[1:])}


def write_record(record: dict, path: Path | None, table: str) -> list[str]:
    """Rank 0: the file first (a reader that closes stdout early must not cost it), then the
    table, then any error writing the file. Returns those errors."""
    if world()[0] != 0:
        return []
    errors = cli.write_outputs([(path, cli.json_writer(record))])
    print(table, flush=True)
    for e in errors:
        print(f"distributed.py: {e}", file=sys.stderr, flush=True)
    return errors


def progress(message: str) -> None:
    """Rank 0 says how far a long benchmark has got, on stderr (stdout carries the table)."""
    if world()[0] == 0:
        print(message, file=sys.stderr, flush=True)


def warm_up(right: int, left: int, group=None, seconds: float = 0.5) -> None:
    """Exchange small messages for a while first: the first few hundred on a fresh gloo pair are
    several times slower (measured here: the first size timed took 5× the next one)."""
    a, b = torch.zeros(1024), torch.zeros(1024)
    end = torch.tensor([time.perf_counter() + seconds], dtype=torch.float64)
    dist.broadcast(end, 0, group)  # every rank stops after the same number of exchanges
    go = torch.ones(1)
    while go.item():
        wait(exchange(a, b, right, left, group))
        go.fill_(float(time.perf_counter() < end.item()))
        dist.broadcast(go, 0, group)


def calls_per_sample(nbytes: int) -> int:
    """Calls a sample of an all-reduce benchmark averages, by the message's bytes: about 1 MiB's
    worth, at most 50 (4 KiB to 256 KiB), and at least 4 up to 4 MiB and 2 above. With one call per sample, a
    round's ratio is one call over one other, and a single slow message decides it: two
    variants that make the same call can then land far apart."""
    return max(4 if nbytes <= 4 << 20 else 2, min(50, (1 << 20) // nbytes))
