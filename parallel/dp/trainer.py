"""Plain data parallelism (chapter 7): the strategy the training loop of
parallel/common/training.py runs by default, and the one the later chapters extend.

Every rank holds the whole model and takes its shard of each global batch. Before the first
step every rank takes rank 0's weights (``ring_broadcast_from_rank0``); during backward the
GradReducer (reducer.py) sums the gradients over the ranks, bucket by bucket (in
``config.grad_dtype``), so that when backward ends every rank holds the global batch's
gradient. ZeRO (parallel/collectives/zero.py) and tensor parallelism (parallel/tp/training.py)
subclass ``DataParallel``, overriding only what differs.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor, nn

from parallel.common import data as data_mod
from parallel.common import training
from parallel.common.launch import world
from parallel.common.training import Config
from parallel.dp.reducer import AllReduce, GradReducer
from parallel.dp.ring import ring_all_reduce, ring_all_reduce_host, ring_broadcast_from_rank0

# The chapter's strategy and the loop run with it (Config, which lives in
# parallel/common/training.py, is importable from here too).
__all__ = ["Config", "DataParallel", "train"]


class DataParallel:
    """The whole model on every rank; its gradients summed over ``group`` in buckets, during
    backward (GradReducer), by ``all_reduce``: this chapter's ring unless the caller passes
    another (distributed.py passes parallel.collectives.algorithms.all_reduce, which picks
    the algorithm by size). ``rank`` and ``size`` are this rank's place among the ranks that
    split the batch. A ``training.Strategy``."""

    def __init__(self, config: Config, all_reduce: AllReduce = ring_all_reduce) -> None:
        self.config = config
        self.all_reduce = all_reduce
        self.rank, self.size = world()
        self.group: torch.distributed.ProcessGroup | None = None  # None: all ranks
        self.reducer: GradReducer | None = None
        # gloo sends CPU tensors only: CUDA gradients then travel through host memory
        gloo = self.size > 1 and torch.distributed.get_backend() == "gloo"
        self.staging = "cpu" if config.device != "cpu" and gloo else None
        self.tracer = None  # with config.trace: parallel/dp/trace.py's Tracer

    def build_model(self, ds: data_mod.Dataset) -> nn.Module:
        c = self.config
        return training.build_model(ds.features, tuple(c.hidden), ds.classes, c.mode, c.device)

    def make_optimizer(self, model: nn.Module):
        return torch.optim.Adam(model.parameters(), lr=self.config.lr)

    def start(self, model: nn.Module) -> None:
        """Before the first step: every rank takes rank 0's weights, and the buckets are set up."""
        self.broadcast(model)
        if self.size > 1:
            self.reducer = GradReducer(list(model.parameters()), bucket_bytes=self.config.bucket_kb * 1024,
                                       overlap=self.config.overlap, staging_device=self.staging, group=self.group,
                                       all_reduce=self.all_reduce,
                                       grad_dtype=training.DTYPES[self.config.grad_dtype])
        if self.config.trace and self.reducer is not None:
            from parallel.dp.trace import Tracer

            self.tracer = Tracer(self.reducer)
            model.register_forward_hook(self.tracer.forward_ended)

    def broadcast(self, model: nn.Module) -> None:
        if self.size == 1:
            return
        for p in model.parameters():
            if self.staging:
                p.data.copy_(ring_broadcast_from_rank0(p.detach().cpu(), self.group))
            else:
                ring_broadcast_from_rank0(p.data, self.group)

    def before_step(self, epoch: int, step: int) -> None:
        """Only a traced run does anything here: it notes when the step started."""
        if self.tracer:
            self.tracer.step_started(epoch, step)

    def after_backward(self) -> None:
        if self.reducer is None:
            return
        backward_end = time.perf_counter()
        self.reducer.finish()  # wait for the last bucket (and start any not yet started)
        if self.tracer:
            self.tracer.step_ended(backward_end)

    def sum_over_ranks(self, values: Tensor) -> Tensor:
        """The ring's sum of a small CPU tensor over ``group`` (through the GPU on NCCL)."""
        return ring_all_reduce_host(values, self.group) if self.size > 1 else values

    def comm_s(self) -> float:
        """Seconds spent in communication so far (the gradient buckets' all-reduces)."""
        return self.reducer.comm_s if self.reducer else 0.0

    def full_state(self, model: nn.Module, opt) -> tuple[dict, dict | None]:
        """The unsharded model's state_dict (on the CPU) and torch.optim.Adam's (None without
        ``opt``). Every rank must call it: other strategies gather here."""
        state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
        return state, (opt.state_dict() if opt is not None else None)

    def load_full_state(self, model: nn.Module, opt, state: dict) -> None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    def finish(self) -> None:
        """A traced run writes its trace (every rank takes part)."""
        if self.tracer:
            self.tracer.write(self.config, self.size)

    def close(self) -> None:
        if self.reducer:
            self.reducer.close()


def train(config: Config) -> dict:
    """The training loop with plain data parallelism, the gradient buckets reduced by the ring.
    (distributed.py's ``train`` runs the strategy its flags ask for.)"""
    if config.zero or config.tp > 1:
        raise ValueError("parallel.dp.trainer.train is plain data parallelism: with zero or tp > 1 train "
                         "through distributed.train, which picks ZeRO or tensor parallelism")
    return training.train(config, DataParallel(config))


