"""The one process launcher: start local ranks, watch them, and never leave one behind.

    results = launch(fn, world_size=2, args=(config,))

starts ``world_size`` processes (spawn), puts each in a process group (a FileStore in a
temporary folder, so there is no port to race for), runs ``fn(*args)`` on each, and returns
what each rank returned. If a rank fails, the others get the process-group timeout to fail
by themselves (a dead peer is usually noticed within a second), then are killed; the error
names every rank that failed and why. Under torchrun, ``run_in_process_group`` does the same
for the one rank this process is. A local rank ends with ``os._exit`` as soon as its result is
on disk: it skips the interpreter's teardown, where gloo's threads could abort it (``_leave``),
so atexit handlers registered in a rank do not run.

Each rank also lowers the priority of gloo's I/O threads (``lower_io_priority``): on a machine
with fewer cores than busy threads, an I/O thread woken by a message could preempt the rank's
main thread while that thread held the connection's lock, then spin on the lock until a
scheduler tick (every 4 ms here) let the holder run. By default they get Linux's SCHED_BATCH
policy: a woken batch thread is disfavoured against the running one (sched(7)), yet keeps a
normal thread's share of a core when other jobs keep the cores busy. $DENSE_GLOO_IO_NICE=idle gives them
SCHED_IDLE (the default before SCHED_BATCH: as fast on an otherwise idle machine, but with two
other busy processes on 2 cores it made calls 19 to 56 times slower), a number that niceness
(19 was the first default), and 0 leaves them alone. parallel/collectives.md, "Where the
milliseconds went" and "Under load", shows the trace and the before and after.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cli


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names each and its error."""


IO_NICE_VAR = "DENSE_GLOO_IO_NICE"
IDLE = "idle"  # the SCHED_IDLE policy: below any niceness
BATCH = "batch"  # the SCHED_BATCH policy: niceness 0's share of a core, disfavoured on waking
POLICIES = {IDLE: "SCHED_IDLE", BATCH: "SCHED_BATCH"}  # the settings that are a policy, not a niceness
IO_NICE_DEFAULT = BATCH
IO_THREAD_NAME = "gloo_tcp_loop"  # the name gloo's TCP transport gives its event-loop thread

IoSetting = int | str  # a niceness 0..19, IDLE or BATCH


def parse_io_setting(text: str, name: str = IO_NICE_VAR) -> IoSetting:
    """A setting for gloo's I/O threads from text: "idle" (the SCHED_IDLE policy), "batch"
    (SCHED_BATCH) or a niceness from 0 (leave them alone) to 19. ValueError, naming ``name``,
    for anything else."""
    text = text.strip()
    if text in POLICIES:
        return text
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 19:
        raise ValueError(f"{name} must be {BATCH!r} (Linux's SCHED_BATCH policy, the default), {IDLE!r} "
                         f"(SCHED_IDLE) or an integer from 0 (leave gloo's I/O threads alone) to 19, "
                         f"got {text!r}")
    return value


def io_nice() -> IoSetting:
    """The setting for gloo's I/O threads: $DENSE_GLOO_IO_NICE, else "batch" (parse_io_setting)."""
    return parse_io_setting(os.environ.get(IO_NICE_VAR, IO_NICE_DEFAULT))


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


def lower_io_priority(nice: IoSetting | None = None, expect: int = 0, wait_s: float = 5.0) -> int:
    """Give this process's gloo I/O threads the setting ``nice`` (default: ``io_nice()``):
    the SCHED_BATCH or SCHED_IDLE policy for BATCH or IDLE, else that niceness. Returns how
    many threads it changed.
    ``expect``: how many I/O threads this process has at least by now. Gloo's I/O thread names
    itself from inside, a moment after it starts: on a busy machine, a search right after
    ``init_process_group`` or ``new_group`` can miss a thread that is not named yet (seen here:
    6 of 200 new groups with two other processes spinning), and that thread would keep its
    priority. So this first waits, up to ``wait_s``, until that many carry the name.

    Why (parallel/collectives.md, "Where the milliseconds went"): a rank's main thread posts
    its sends and receives under the lock of the gloo connection (the pair), and gloo's I/O
    thread only tries that lock: when it finds data ready and the lock taken, it goes back to
    epoll_wait, which returns at once, and so spins. Traced here, in the slow calls both cores
    ran an I/O thread for milliseconds (until a scheduler tick) while the main threads waited.
    At niceness 19 a woken I/O thread takes the core from a main thread less often; under
    SCHED_IDLE never (a waking idle thread does not preempt a normal one), and the calls' slow
    tail went with it. SCHED_IDLE also runs the thread only when nothing else wants the core,
    which starves it behind other jobs. SCHED_BATCH disfavours the thread on waking ("a small
    scheduling penalty with respect to wakeup behavior", sched(7)) but keeps its fair share; it
    measured close to SCHED_IDLE on a quiet machine (parallel/collectives.md, "Under load").
    Lowering one's own threads' priority needs no privilege; raising a niceness back, or
    leaving SCHED_IDLE, may not be allowed, so a process that wants to compare must start with
    the variable at 0. Every new gloo process group starts its own I/O thread: call this again
    after creating one.
    """
    nice = io_nice() if nice is None else nice
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


# ProcessGroupGloo's worker threads: where its own collectives (dist.all_reduce) run and post
WORKER_THREAD_NAME = "pt_gloo_runloop"
THREAD_KINDS = ("main", "gloo I/O", "gloo worker", "other")


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


def io_thread_nices() -> list[IoSetting]:
    """The setting each of this process's gloo I/O threads has now (``lower_io_priority`` as it
    took effect): IDLE, BATCH, or its niceness. What the benchmark and fit records report."""
    nices = []
    for tid in io_threads():
        try:
            nices.append(_io_setting(tid))
        except OSError:  # the thread ended meanwhile
            continue
    return nices


def run_in_process_group(fn: Callable[..., Any], args: tuple, backend: str, timeout_s: float,
                         init_method: str = "env://", rank: int | None = None,
                         world_size: int | None = None) -> Any:
    """Join a process group, run fn(*args), then leave cleanly; returns fn's result."""
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank if rank is not None else 0))
        torch.cuda.set_device(local % torch.cuda.device_count())
    kwargs = {} if rank is None else {"rank": rank, "world_size": world_size}
    dist.init_process_group(backend, init_method=init_method, timeout=timedelta(seconds=timeout_s), **kwargs)
    try:
        if backend == "gloo":
            lower_io_priority(expect=1)  # the world group's
        result = fn(*args)
        # A rank that leaves while a peer still waits on its last message breaks that peer.
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, folder: str, backend: str, timeout_s: float, threads: int,
            fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        result = run_in_process_group(fn, args, backend, timeout_s, f"file://{folder}/store", rank, world_size)
        Path(folder, f"result_{rank}.pkl").write_bytes(pickle.dumps(result))
    except BaseException as e:  # report it to the launcher, then exit non-zero
        last = traceback.extract_tb(e.__traceback__)[-1:] if e.__traceback__ else []
        where = f" (at {Path(last[0].filename).name}:{last[0].lineno})" if last else ""
        Path(folder, f"error_{rank}.txt").write_text(f"{type(e).__name__}: {e}{where}".strip())
        _leave(1)
    _leave(0)


def _leave(code: int) -> NoReturn:
    """End a rank without the interpreter's teardown, once its result or error is on disk.

    A process group that outlives ``destroy_process_group`` (torch's DistributedDataParallel
    keeps its group referenced from C++) keeps gloo's worker threads running. If one of them
    frees a finished request that holds a tensor while the interpreter shuts down, it takes the
    GIL, Python ends the thread, and C++ aborts the process: "terminate called without an
    active exception", SIGABRT (a core dump here showed that stack in ``pt_gloo_runloop``). There
    is nothing left to tear down that matters, so a rank skips it: atexit handlers do not run.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed or replaced by the caller's code
            pass
    os._exit(code)


def _describe(rank: int, code: int | None, folder: str) -> str:
    error = Path(folder, f"error_{rank}.txt")
    if error.exists():
        return f"rank {rank}: {error.read_text().splitlines()[0]}"
    if code is not None and code < 0:
        return f"rank {rank}: killed by {signal.Signals(-code).name}"
    return f"rank {rank}: exited with status {code}"


# A local rank is a fresh interpreter that imports torch: about 220 MiB resident here (Python
# 3.11, torch 2.13 CPU, after joining its group) before it does any work, and a first import in
# a fresh environment peaked at 360 MiB in CI. A floor, to refuse counts that cannot start.
RANK_MEMORY_BYTES = 256 << 20


def check_ranks_fit(world_size: int) -> None:
    """Refuse, in one line, more local ranks than this machine's memory can start (a thousand
    would need about 250 GiB, and swapping to a halt is no error message)."""
    cli.check_memory(world_size * RANK_MEMORY_BYTES, what=f"{world_size} local ranks",
                     advice="use fewer ranks (--world-size)")


def launch(fn: Callable[..., Any], world_size: int, args: tuple = (), *, backend: str = "gloo",
           timeout_s: float = 120.0, threads_per_rank: int | None = None,
           deadline_s: float | None = None) -> list[Any]:
    """Run fn(*args) on ``world_size`` local ranks; return their results, index = rank.

    ``timeout_s`` is the process-group timeout: how long a rank waits for a silent peer.
    ``deadline_s`` bounds the whole run. Raises LaunchError if any rank fails or the
    deadline passes; no process outlives this call.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    check_ranks_fit(world_size)
    threads = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    folder = tempfile.mkdtemp(prefix="dense-launch-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world_size, folder, backend, timeout_s, threads, fn, args),
                         name=f"rank{r}") for r in range(world_size)]
    try:
        for p in procs:
            p.start()
        start, first_failure = time.monotonic(), None
        while any(p.is_alive() for p in procs):
            time.sleep(0.05)
            now = time.monotonic()
            if first_failure is None and any(p.exitcode not in (None, 0) for p in procs):
                first_failure = now
            # After a failure the others get the process-group timeout to notice it themselves.
            if first_failure is not None and now - first_failure > timeout_s + 5:
                break
            if deadline_s is not None and now - start > deadline_s:
                break
        hung = [r for r, p in enumerate(procs) if p.is_alive()]
        _stop(procs)
        failures = [_describe(r, p.exitcode, folder) for r, p in enumerate(procs)
                    if p.exitcode != 0 and r not in hung]
        failures += [f"rank {r}: still running after the {'failure of another rank' if failures else 'deadline'}"
                     ", killed" for r in hung]
        if failures:
            raise LaunchError(f"{len(failures)} of {world_size} ranks failed:\n  " + "\n  ".join(failures))
        return [pickle.loads(Path(folder, f"result_{r}.pkl").read_bytes()) for r in range(world_size)]
    finally:
        _stop(procs)
        shutil.rmtree(folder, ignore_errors=True)


def _stop(procs: list) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=5)
        if p.is_alive():
            p.kill()
            p.join()
