"""Gradient buckets all-reduced while backward is still running (what DDP does).

Parameters are grouped, in reverse order of registration (the order backward produces their
gradients), into buckets of about ``bucket_bytes``. A hook on each parameter
(``register_post_accumulate_grad_hook``) notes when its gradient is ready; when a bucket is
complete it is handed to a communication thread, which flattens it, all-reduces it (with the
``all_reduce`` it was given: the ring by default) and writes the result back, while autograd
goes on with the earlier layers. ``finish()`` waits for the last bucket before the optimiser step.

Buckets always start in index order on every rank: an all-reduce is a sequence of point-to-point
messages, and two ranks that reduced buckets in different orders would pair the wrong ones.

``grad_dtype`` is what the buckets travel as: the flattening copy casts each float32 gradient
to it (bfloat16: half the bytes, one rounding), the ring sums in it, and the copy back into
``.grad`` restores the parameters' dtype. The loss already carries the 1/(global batch) scale,
so the sum needs no division after it, in bfloat16 or otherwise.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

from parallel.dp.ring import ring_all_reduce

# all_reduce(tensor, group=..., check=...): sums ``tensor`` over the group's ranks, in place
AllReduce = Callable[..., Tensor]


class GradReducer:
    """Sum the gradients of ``params`` over all ranks, bucket by bucket.

    The loss on each rank must already carry the global scale (the training loop,
    parallel/common/training.py, divides the local sum by the global batch size), so a plain
    sum gives the global-batch gradient whatever the shard sizes. ``staging_device="cpu"``
    reduces CUDA gradients through host memory, for gloo (which sends CPU tensors only).
    ``all_reduce(buffer, group=..., check=...)`` sums a bucket in place: the ring, or any
    all-reduce with its signature (the second part of this chapter picks one by size).
    ``grad_dtype`` (default: the parameters' own) is the dtype the buckets are reduced in.
    """

    def __init__(self, params: list[nn.Parameter], bucket_bytes: int = 1 << 20, overlap: bool = True,
                 staging_device: str | torch.device | None = None, group: dist.ProcessGroup | None = None,
                 all_reduce: AllReduce = ring_all_reduce, grad_dtype: torch.dtype | None = None) -> None:
        params = [p for p in params if p.requires_grad]
        self.group = group  # the ranks that average these gradients (a data-parallel group)
        self.all_reduce = all_reduce
        self.overlap = overlap
        # region buckets
        self.buckets: list[list[nn.Parameter]] = []
        size = bucket_bytes  # start a new bucket at the first parameter
        for p in reversed(params):
            nbytes = p.numel() * p.element_size()
            if size + nbytes > bucket_bytes and (not self.buckets or self.buckets[-1]):
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.where = {p: i for i, bucket in enumerate(self.buckets) for p in bucket}
        # endregion
        # The same buckets whatever grad_dtype is (sized by the gradients' bytes, as DDP sizes its
        # own), so that a run reduced in bfloat16 differs from a float32 one in the bytes alone.
        self.buffers = [torch.zeros(sum(p.numel() for p in b), dtype=grad_dtype or b[0].dtype,
                                    device=staging_device or b[0].device) for b in self.buckets]
        # One reduction with size checks, before training: ranks with different models stop
        # here with a clear error instead of exchanging garbage later.
        for buf in self.buffers:
            all_reduce(buf, group=group, check=True)
        self.comm_s = 0.0
        # Set to a list to record each all-reduce's start and end (time.perf_counter(), the
        # machine-wide monotonic clock on Linux): the zero benchmark compares ranks' arrivals.
        self.calls: list[tuple[float, float]] | None = None
        # Set to a dict to record, per bucket index, when its last gradient was ready and when
        # its all-reduce started and ended (parallel/dp/trace.py draws them).
        self.trace: dict[int, dict[str, float]] | None = None
        self._error: BaseException | None = None
        self._jobs: queue.Queue[int | None] = queue.Queue()
        self._done = threading.Semaphore(0)
        self._threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._serve, name="allreduce", daemon=True)
        self._thread.start()
        self._hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in params]
        self._reset()

    # region ready
    def _reset(self) -> None:
        self._pending = [len(b) for b in self.buckets]
        self._next = 0  # the next bucket to start, in index order

    def _ready(self, p: nn.Parameter) -> None:
        i = self.where[p]
        self._pending[i] -= 1
        if self.trace is not None and self._pending[i] == 0:
            self.trace.setdefault(i, {})["ready"] = time.perf_counter()
        if self.overlap:
            self._start_ready()

    def _start_ready(self, everything: bool = False) -> None:
        while self._next < len(self.buckets) and (everything or self._pending[self._next] == 0):
            self._jobs.put(self._next)
            self._next += 1
    # endregion

    def _serve(self) -> None:
        # OpenMP's thread count is per thread: a new thread would use every core, fighting
        # the other ranks for them. Give it the training thread's setting.
        torch.set_num_threads(self._threads)
        if self.buffers and self.buffers[0].is_cuda:  # the current device is per thread too
            torch.cuda.set_device(self.buffers[0].device)
        while (i := self._jobs.get()) is not None:
            try:
                if self._error is None:
                    self._reduce(i)
            except BaseException as e:  # re-raised on the training thread by finish()
                self._error = e
            finally:
                self._done.release()

    def _reduce(self, i: int) -> None:
        buf, offset = self.buffers[i], 0
        for p in self.buckets[i]:  # flatten (and cast to the buffer's dtype); no gradient: zeros
            part = buf[offset: offset + p.numel()]
            part.copy_(p.grad.view(-1)) if p.grad is not None else part.zero_()
            offset += p.numel()
        start = time.perf_counter()
        self.all_reduce(buf, group=self.group, check=False)
        end = time.perf_counter()
        self.comm_s += end - start
        if self.calls is not None:
            self.calls.append((start, end))
        if self.trace is not None:
            self.trace.setdefault(i, {}).update(start=start, end=end)
        offset = 0
        for p in self.buckets[i]:
            grad = buf[offset: offset + p.numel()].view_as(p)
            if p.grad is None:
                p.grad = grad.to(p.device, p.dtype, copy=True)
            else:
                p.grad.copy_(grad)
            offset += p.numel()

    def finish(self) -> None:
        """Wait until every bucket of this step is reduced (starting any not yet started)."""
        self._start_ready(everything=True)
        for _ in self.buckets:
            self._done.acquire()
        self._reset()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        for h in self._hooks:
            h.remove()
        self._jobs.put(None)
        self._thread.join(timeout=5)
