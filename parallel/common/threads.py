"""The threads of a rank: where its CPU time goes, and (only when asked) gloo's I/O threads at a
lower priority.

By default nothing here changes any thread: the scheduling of gloo's threads is gloo's and the
operating system's business. The readers (``thread_cpu_s``, ``io_threads``, ``io_thread_nices``)
only look, in /proc.

The opt-in setting is the lock-holder-preemption experiment of chapter 7, continued
(parallel/collectives/README.md). With more busy threads than cores, gloo's I/O thread, woken
by a message, can preempt the rank's main thread while that thread holds the connection's lock,
then spin on the lock until a scheduler tick lets the holder run. A lower priority for the I/O
thread makes that preemption rarer. Whether it helps depends on the machine, its kernel and its
load, so it is an experiment a reader runs, never a default:

    DENSE_GLOO_IO_NICE=batch python distributed.py --bench allreduce --world-size 4

takes effect only in the ranks that parallel.common.launch starts itself (``opt_in``), on the
groups it and this project's tensor-parallel layout create. Under torchrun, or in a process group
the user created, nothing is changed. The values: "batch" (Linux's SCHED_BATCH policy: a woken
thread is disfavoured against the running one but keeps its share of a core, sched(7)), "idle"
(SCHED_IDLE: the thread runs only when nothing else wants the core, which starves it behind
other jobs), or a niceness 1 to 19; 0 or unset leaves the threads alone. Lowering a priority
needs no privilege; raising it back may, so a comparison starts every setting in fresh ranks
(python -m parallel.collectives.ionice does).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

IO_NICE_VAR = "DENSE_GLOO_IO_NICE"
IDLE = "idle"  # the SCHED_IDLE policy: below any niceness
BATCH = "batch"  # the SCHED_BATCH policy: niceness 0's share of a core, disfavoured on waking
POLICIES = {IDLE: "SCHED_IDLE", BATCH: "SCHED_BATCH"}  # the settings that are a policy, not a niceness
IO_THREAD_NAME = "gloo_tcp_loop"  # the name gloo's TCP transport gives its event-loop thread
# ProcessGroupGloo's worker threads: where its own collectives (dist.all_reduce) run and post
WORKER_THREAD_NAME = "pt_gloo_runloop"
THREAD_KINDS = ("main", "gloo I/O", "gloo worker", "other")

IoSetting = int | str  # a niceness 0..19, IDLE or BATCH


def parse_io_setting(text: str, name: str = IO_NICE_VAR) -> IoSetting:
    """A setting for gloo's I/O threads from text: "idle", "batch" or a niceness from 0 (leave
    them alone) to 19. ValueError, naming ``name``, for anything else."""
    text = text.strip()
    if text in POLICIES:
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"{name} must be {BATCH!r} (Linux's SCHED_BATCH policy), {IDLE!r} (SCHED_IDLE) or an "
                         f"integer from 0 (leave gloo's I/O threads alone, as when it is unset) to 19, got {text!r}")
    return value


def io_nice() -> IoSetting | None:
    """The setting asked for in $DENSE_GLOO_IO_NICE (parse_io_setting), or None where it is unset."""
    text = os.environ.get(IO_NICE_VAR)
    return None if text is None else parse_io_setting(text)


# The setting this process applies to the gloo groups it makes: None (leave them alone) unless
# parallel.common.launch started this rank and the setting was asked for.
_opted_in: IoSetting | None = None


def opt_in(setting: IoSetting | None) -> None:
    """Called by the launcher in a rank it started: apply ``setting`` to the groups it makes."""
    global _opted_in
    _opted_in = None if setting in (None, 0) else setting


def active_setting() -> IoSetting | None:
    """What this process applies to its gloo I/O threads: None when it leaves them alone."""
    return _opted_in


def lower_if_opted_in(expect: int) -> int:
    """After this project's own code created gloo groups: give their I/O threads the opted-in
    setting (nothing, by default). ``expect``: how many I/O threads this process has by now."""
    return 0 if _opted_in is None else lower_io_priority(_opted_in, expect)


def _policy(setting: IoSetting) -> int:
    """os.SCHED_IDLE or os.SCHED_BATCH for IDLE or BATCH."""
    return getattr(os, POLICIES[setting])


def _io_setting(tid: int) -> IoSetting:
    """What a thread has now: IDLE or BATCH if its policy is SCHED_IDLE or SCHED_BATCH, else
    its niceness."""
    policy = os.sched_getscheduler(tid)
    for setting in POLICIES:
        if policy == _policy(setting):
            return setting
    return os.getpriority(os.PRIO_PROCESS, tid)


def lower_io_priority(nice: IoSetting, expect: int = 0, wait_s: float = 5.0) -> int:
    """Give this process's gloo I/O threads the setting ``nice``: the SCHED_BATCH or SCHED_IDLE
    policy for BATCH or IDLE, else that niceness (0: change nothing). Returns how many threads
    it changed.

    ``expect``: how many I/O threads this process has at least by now. Gloo's I/O thread names
    itself from inside, a moment after it starts: on a busy machine a search right after the
    group was created can miss a thread that is not named yet, and that thread would keep its
    priority. So this first waits, up to ``wait_s``, until that many carry the name.
    """
    if nice == 0 or not sys.platform.startswith("linux"):
        return 0
    deadline = time.monotonic() + wait_s
    while len(io_threads()) < expect and time.monotonic() < deadline:
        time.sleep(0.001)
    changed = 0
    for tid in io_threads():
        try:
            if _io_setting(tid) == nice:
                continue
            if nice in POLICIES:
                os.sched_setscheduler(tid, _policy(nice), os.sched_param(0))
            else:
                os.setpriority(os.PRIO_PROCESS, tid, nice)
            changed += 1
        except OSError:  # the thread ended meanwhile; nothing to lower
            continue
    return changed


def io_threads() -> list[int]:
    """The thread ids of this process's gloo I/O threads (none off Linux: no /proc to read)."""
    if not sys.platform.startswith("linux"):
        return []
    tids = []
    for tid in os.listdir("/proc/self/task"):
        try:
            if Path(f"/proc/self/task/{tid}/comm").read_text().strip() == IO_THREAD_NAME:
                tids.append(int(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return tids


def io_thread_nices() -> list[IoSetting]:
    """The setting each of this process's gloo I/O threads has now: IDLE, BATCH, or its
    niceness. What the benchmark and fit records report."""
    nices = []
    for tid in io_threads():
        try:
            nices.append(_io_setting(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return nices


def thread_cpu_s() -> dict[str, float]:
    """CPU seconds this process's threads have used so far, summed by kind (THREAD_KINDS): the
    main thread (ours post every message and add there), gloo's I/O threads (they read and
    write the sockets), gloo's worker threads (dist.all_reduce runs there) and any other. From
    /proc/self/task/*/schedstat (nanoseconds); a thread that ends between two readings takes
    its time with it. Empty off Linux."""
    if not sys.platform.startswith("linux"):
        return {}
    kinds = {IO_THREAD_NAME: "gloo I/O", WORKER_THREAD_NAME: "gloo worker"}
    totals = dict.fromkeys(THREAD_KINDS, 0.0)
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            ns = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except OSError:  # the thread ended meanwhile
            continue
        kind = "main" if int(tid) == os.getpid() else kinds.get(name, "other")
        totals[kind] += ns * 1e-9
    return totals
