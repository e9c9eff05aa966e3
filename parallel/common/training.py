"""The training loop of the parallel chapters, and the one interface through which it knows how
the work is split between ranks.

For each global batch, rank r takes its disjoint shard, computes the loss as (sum over its
samples) / (global batch size), and runs backward; once the gradients are summed over the ranks
that split the batch, every rank steps its optimiser with the gradient of the global-batch
mean, exactly as one process would.

What differs between plain data parallelism (chapter 7, parallel/dp/trainer.py), ZeRO
(chapter 7 continued, parallel/collectives/zero.py) and tensor parallelism (chapter 8,
parallel/tp/training.py) lives in a ``Strategy``: which model a rank builds, which optimiser,
how the gradients are summed, what a checkpoint gathers. ``train(config, how)`` is the same
loop for all of them; distributed.py picks the strategy its flags ask for.

Precision (``Config.dtype``, ``Config.grad_dtype``): with dtype "bfloat16" the forward and the
loss run under ``torch.autocast`` to bfloat16, and so does evaluation; the parameters, their
gradients and the optimiser's state stay float32 (autocast casts a float32 parameter on its
way into an op, and the cast's backward hands a float32 gradient back). grad_dtype is what the
gradients travel as between the ranks: each strategy's business.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

import modes
from parallel.common import data as data_mod
from parallel.common.checkpoint import load_checkpoint, save_checkpoint
from parallel.common.launch import world


@dataclass
class Config:
    mode: str = "py"
    world_size: int = 2
    backend: str = "gloo"
    device: str = "cpu"
    epochs: int = 5
    batch_size: int = 128          # global: split across the ranks
    lr: float = 2e-3
    hidden: tuple[int, ...] = (128, 128)
    seed: int = 0
    data: str = "synthetic"
    data_dir: str | None = None
    checkpoint: str | None = None
    resume: bool = False
    timeout: float = 120.0
    overlap: bool = True
    bucket_kb: int = 25600          # DDP's default cap, 25 MiB
    zero: bool = False              # ZeRO stage 1: Adam's state sharded over the ranks (parallel/collectives/zero.py)
    progress: bool = False
    return_state: bool = False     # tests compare the final weights
    train_limit: int | None = None  # use only the first N training samples (quick runs, tests)
    tp: int = 1                    # tensor-parallel size: world = dp × tp (parallel/tp/training.py)
    trace: str | None = None       # write when each gradient bucket was ready and reduced (parallel/dp/trace.py)
    dtype: str = "float32"         # what the forward computes in: "bfloat16" runs it under torch.autocast
    grad_dtype: str = "float32"    # what the gradients are summed over the ranks in (a key of DTYPES)


# The precisions Config names. Parameters and the optimiser's state are float32 whatever they
# say: bfloat16 is what the forward computes in and what gradients travel as, never what is kept.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def autocast(config: Config) -> contextlib.AbstractContextManager:
    """The forward's precision: torch.autocast to ``config.dtype`` on the config's device, or
    nothing for float32."""
    if config.dtype == "float32":
        return contextlib.nullcontext()
    return torch.autocast(torch.device(config.device).type, dtype=DTYPES[config.dtype])


def build_model(features: int, hidden: tuple[int, ...], classes: int, mode: str,
                device: str = "cpu") -> nn.Sequential:
    """Dense layers (sigmoid included) of the chosen mode, then a linear classifier head."""
    layers: list[nn.Module] = []
    for width in hidden:
        layers.append(modes.Dense(features, width, mode=mode, device=device))
        features = width
    layers.append(nn.Linear(features, classes, device=device))
    return nn.Sequential(*layers)


def load_data(config: Config) -> data_mod.Dataset:
    if config.data == "synthetic":
        ds = data_mod.synthetic(config.seed)
    elif config.data == "mnist":
        if not config.data_dir:
            raise data_mod.DataError("--data mnist needs --data-dir, the folder with MNIST's IDX files")
        ds = data_mod.mnist(config.data_dir, config.seed)
    else:
        raise ValueError(f"unknown data set {config.data!r}; choose synthetic or mnist")
    if config.train_limit is not None:
        ds.train = data_mod.Split(ds.train.x[: config.train_limit], ds.train.y[: config.train_limit])
    return ds


# ---------------------------------------------------------------------------
# What the loop asks of a strategy
# ---------------------------------------------------------------------------

@runtime_checkable
class Strategy(Protocol):
    """How the ranks share the work. ``rank`` and ``size`` are this rank's place among the ranks
    that split the batch (in tensor parallelism, the data-parallel ones). Every rank calls every
    hook, in the same order."""

    # region hooks
    rank: int
    size: int

    def build_model(self, ds: data_mod.Dataset) -> nn.Module:
        """This rank's model (whole, or its shard of each layer)."""

    def make_optimizer(self, model: nn.Module):
        """The optimiser the loop steps (torch.optim.Adam, or one that shards its state)."""

    def start(self, model: nn.Module) -> None:
        """Before the first step: the same weights on every rank, and whatever reduces gradients."""

    def before_step(self, epoch: int, step: int) -> None:
        """At the start of each step."""

    def after_backward(self) -> None:
        """After backward, before the optimiser's step: the gradients summed where they must be."""

    def sum_over_ranks(self, values: Tensor) -> Tensor:
        """Sum a small CPU tensor (counts, losses) over the ranks that split the batch, in place."""

    def comm_s(self) -> float:
        """Seconds spent communicating so far."""

    def full_state(self, model: nn.Module, opt) -> tuple[dict, dict | None]:
        """The unsharded model's state_dict (on the CPU) and torch.optim.Adam's (None without
        ``opt``), as one process would hold them: what a checkpoint holds."""

    def load_full_state(self, model: nn.Module, opt, state: dict) -> None:
        """Load a checkpoint's unsharded state; this rank keeps its part."""

    def finish(self) -> None:
        """After the last epoch, when training succeeded."""

    def close(self) -> None:
        """Always, last: stop threads, remove hooks."""
    # endregion


# ---------------------------------------------------------------------------
# The loop
# ---------------------------------------------------------------------------

def train(config: Config, how: Strategy) -> dict:
    """Run the training loop on this rank (inside a process group, or alone), the work split as
    ``how`` says. Returns the history; rank 0 prints one line per epoch and writes the
    checkpoint."""
    torch.manual_seed(config.seed)  # the same initial weights on every rank (then rank 0's are broadcast)
    ds = load_data(config)
    model = how.build_model(ds)
    opt = how.make_optimizer(model)
    start_epoch, history = resume(config, how, model, opt, ds) if config.resume else (0, [])
    how.start(model)
    x, y, device = ds.train.x, ds.train.y, config.device
    try:
        # region loop
        for epoch in range(start_epoch, config.epochs):
            started, comm_before = time.perf_counter(), how.comm_s()
            batches = data_mod.epoch_batches(len(ds.train), config.batch_size, config.seed, epoch)
            # This rank's sum of losses stays on the device: .item() every step would make a GPU
            # wait for each step before the next is queued.
            loss_sum, samples = torch.zeros((), dtype=torch.float64, device=device), 0
            for step, batch in enumerate(batches):
                how.before_step(epoch, step)
                idx = data_mod.shard(batch, how.rank, how.size)  # this rank's part of the global batch
                with autocast(config):  # bfloat16 or not; cross_entropy autocasts to float32 either way
                    loss = F.cross_entropy(model(x[idx].to(device)), y[idx].to(device), reduction="sum")
                (loss / len(batch)).backward()  # the global mean's gradient, once the ranks' are summed
                how.after_backward()            # every gradient summed over the ranks
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss_sum += loss.detach()
                samples += len(idx)
                show_progress(config, epoch, step, len(batches))
        # endregion
            record = end_of_epoch(config, how, model, ds, epoch, loss_sum, samples,
                                  time.perf_counter() - started, how.comm_s() - comm_before)
            history.append(record)
            if config.checkpoint:
                save(config, how, model, opt, ds, epoch, history)
        how.finish()
        result = {"epochs": history, "final_accuracy": evaluate(model, ds.test, device, how, config)}
        if config.return_state:
            result["state"] = how.full_state(model, None)[0]
    finally:
        how.close()  # last, whatever happened: a hook after it could need what it stopped
    return result


# ---------------------------------------------------------------------------
# Around the loop: progress, evaluation, checkpoints
# ---------------------------------------------------------------------------

_last_print = [0.0]


def show_progress(config: Config, epoch: int, step: int, steps: int) -> None:
    """On a terminal, rank 0 rewrites one line with the batch it is at (five times a second)."""
    if config.progress and world()[0] == 0 and time.perf_counter() - _last_print[0] > 0.2:
        _last_print[0] = time.perf_counter()
        print(f"\r  epoch {epoch + 1}: batch {step + 1}/{steps}", end="", flush=True)


def evaluate(model: nn.Module, split: data_mod.Split, device: str, how: Strategy, config: Config) -> float:
    """Accuracy over the whole split: each rank counts on its shard, and the counts are summed
    over the ranks that split the batch (the ranks of a tensor-parallel group share a shard).
    The model runs in the precision it trained in (``config``'s autocast): the accuracy is
    that of the model as it computes."""
    idx = data_mod.shard(torch.arange(len(split)), how.rank, how.size)
    with torch.no_grad(), autocast(config):
        pred = model(split.x[idx].to(device)).argmax(1).cpu() if len(idx) else torch.empty(0)
    counts = torch.tensor([(pred == split.y[idx]).sum().item(), len(idx)], dtype=torch.int64)
    how.sum_over_ranks(counts)
    return counts[0].item() / max(1, counts[1].item())


def end_of_epoch(config: Config, how: Strategy, model: nn.Module, ds: data_mod.Dataset, epoch: int,
                 loss_sum: torch.Tensor, samples: int, elapsed: float, comm_s: float) -> dict:
    """The epoch's record (the loss over every rank's samples, the validation accuracy), printed
    by rank 0."""
    totals = torch.tensor([loss_sum.item(), samples], dtype=torch.float64)
    how.sum_over_ranks(totals)
    record = {"epoch": epoch + 1, "loss": totals[0].item() / max(1.0, totals[1].item()),
              "accuracy": evaluate(model, ds.val, config.device, how, config),
              "samples_per_s": len(ds.train) / elapsed, "comm_s": comm_s}
    if world()[0] == 0:
        print(("\r" if config.progress else "") +
              f"epoch {record['epoch']:>3}/{config.epochs}  loss {record['loss']:.4f}  "
              f"val accuracy {100 * record['accuracy']:5.1f}%  {record['samples_per_s']:8.0f} samples/s  "
              f"comm {record['comm_s']:.2f} s", flush=True)
    return record


def model_signature(config: Config, ds: data_mod.Dataset) -> dict:
    return {"mode": config.mode, "features": ds.features, "hidden": list(config.hidden), "classes": ds.classes}


def save(config: Config, how: Strategy, model: nn.Module, opt, ds: data_mod.Dataset, epoch: int,
         history: list) -> None:
    """Rank 0 writes the unsharded state every rank helped gather; nobody runs ahead meanwhile."""
    model_state, optimizer_state = how.full_state(model, opt)
    if world()[0] == 0:
        save_checkpoint(config.checkpoint, model_state, optimizer_state, epoch + 1, history,
                        model_signature(config, ds), config)
    if world()[1] > 1:
        torch.distributed.barrier()


def resume(config: Config, how: Strategy, model: nn.Module, opt, ds: data_mod.Dataset) -> tuple[int, list]:
    """Load --checkpoint into this rank's model and optimiser; returns (epochs done, history)."""
    state = load_checkpoint(config.checkpoint, model_signature(config, ds), config)
    how.load_full_state(model, opt, state)
    torch.set_rng_state(state["rng"])
    if world()[0] == 0:
        print(f"resuming from {config.checkpoint} after epoch {state['epoch']}", flush=True)
    return state["epoch"], state["history"]


def check_resume(config: Config, ds: data_mod.Dataset | None = None) -> None:
    """For the launcher's process, before any rank starts: would --resume be accepted?"""
    ds = ds if ds is not None else load_data(config)
    load_checkpoint(config.checkpoint, model_signature(config, ds), config)
