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

No thread's scheduling is changed, unless $DENSE_GLOO_IO_NICE asks for it: then the ranks this
launcher starts (and only they) give gloo's I/O threads that setting (parallel/common/threads.py).
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
from parallel.common import threads


class LaunchError(RuntimeError):
    """One or more ranks failed; the message names each and its error."""


def world() -> tuple[int, int]:
    """(rank, world size) of the default group, or (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def run_in_process_group(fn: Callable[..., Any], args: tuple, backend: str, timeout_s: float,
                         init_method: str = "env://", rank: int | None = None,
                         world_size: int | None = None) -> Any:
    """Join a process group, run fn(*args), then leave cleanly; returns fn's result."""
    kwargs: dict[str, Any] = {} if rank is None else {"rank": rank, "world_size": world_size}
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", rank if rank is not None else 0))
        torch.cuda.set_device(local % torch.cuda.device_count())
        # Named, NCCL binds this rank to its GPU at once instead of guessing it from the rank.
        kwargs["device_id"] = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group(backend, init_method=init_method, timeout=timedelta(seconds=timeout_s), **kwargs)
    try:
        if backend == "gloo":
            threads.lower_if_opted_in(expect=1)  # the world group's I/O thread; nothing by default
        result = fn(*args)
        # A rank that leaves while a peer still waits on its last message breaks that peer.
        dist.barrier()
        return result
    finally:
        dist.destroy_process_group()


def _worker(rank: int, world_size: int, folder: str, backend: str, timeout_s: float, num_threads: int,
            fn: Callable[..., Any], args: tuple) -> None:
    torch.set_num_threads(num_threads)
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
    try:
        threads.opt_in(threads.io_nice())  # a rank of ours: the experiment applies here if it was asked for
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
    per_rank = threads_per_rank or max(1, (os.cpu_count() or 1) // world_size)
    folder = tempfile.mkdtemp(prefix="dense-launch-")
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_worker, args=(r, world_size, folder, backend, timeout_s, per_rank, fn, args),
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
