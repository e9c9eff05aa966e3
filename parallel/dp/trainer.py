"""Data-parallel training of an MLP of Dense layers (chapter 6): the training loop.

Every rank holds the whole model. For each global batch, rank r takes its disjoint shard,
computes the loss as (sum over its samples) / (global batch size), and runs backward; the
GradReducer sums the gradients over the ranks while backward runs, so every rank steps its
optimiser with the gradient of the global-batch mean, exactly as one process would.

``train`` is that loop. What the other ways of training change, they change in a strategy
object: ``DataParallel`` below is plain data parallelism, and the other chapters subclass it,
overriding only what differs: ZeRO (parallel/collectives/zero.py) brings its own optimiser and
no gradient buckets; tensor parallelism (parallel/tp/training.py) builds sharded layers and
gathers them for checkpoints. The loop itself is the same for all three.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import modes
from parallel.common import data as data_mod
from parallel.common.checkpoint import CheckpointError, load_checkpoint, save_checkpoint  # noqa: F401 (re-exported)
from parallel.common.launch import world
from parallel.dp.reducer import GradReducer
from parallel.dp.ring import ring_all_reduce_host, ring_broadcast_from_rank0


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
# The loop
# ---------------------------------------------------------------------------

def train(config: Config) -> dict:
    """Run the training loop on this rank (inside a process group, or alone). Returns the
    history; rank 0 prints one line per epoch and writes the checkpoint."""
    how = strategy(config)
    torch.manual_seed(config.seed)  # the same initial weights on every rank (then rank 0's are broadcast)
    ds = load_data(config)
    model = how.build_model(ds)
    opt = how.make_optimizer(model)
    start_epoch, history = resume(config, how, model, opt, ds) if config.resume else (0, [])
    how.start(model)
    x, y, device = ds.train.x, ds.train.y, config.device
    try:
        for epoch in range(start_epoch, config.epochs):
            started, comm_before = time.perf_counter(), how.comm_s()
            batches = data_mod.epoch_batches(len(ds.train), config.batch_size, config.seed, epoch)
            # This rank's sum of losses stays on the device: .item() every step would make a GPU
            # wait for each step before the next is queued.
            loss_sum, samples = torch.zeros((), dtype=torch.float64, device=device), 0
            for step, batch in enumerate(batches):
                how.before_step(epoch, step)
                idx = data_mod.shard(batch, how.rank, how.size)  # this rank's part of the global batch
                loss = F.cross_entropy(model(x[idx].to(device)), y[idx].to(device), reduction="sum")
                (loss / len(batch)).backward()  # the global mean's gradient, once the ranks' are summed
                how.after_backward()            # every gradient summed over the ranks
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss_sum += loss.detach()
                samples += len(idx)
                show_progress(config, epoch, step, len(batches))
            record = end_of_epoch(config, how, model, ds, epoch, loss_sum, samples,
                                  time.perf_counter() - started, how.comm_s() - comm_before)
            history.append(record)
            if config.checkpoint:
                save(config, how, model, opt, ds, epoch, history)
    finally:
        how.close()
    if how.tracer:
        how.tracer.write(config, how.size)
    result = {"epochs": history, "final_accuracy": evaluate(model, ds.test, device, how)}
    if config.return_state:
        result["state"] = how.full_state(model, None)[0]
    return result


# ---------------------------------------------------------------------------
# Plain data parallelism, the strategy the others extend
# ---------------------------------------------------------------------------

class DataParallel:
    """The whole model on every rank; its gradients summed over ``group`` in buckets, during
    backward (GradReducer). ``rank`` and ``size`` are this rank's place among the ranks that
    split the batch."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.rank, self.size = world()
        self.group: torch.distributed.ProcessGroup | None = None  # None: all ranks
        self.reducer: GradReducer | None = None
        # gloo sends CPU tensors only: CUDA gradients then travel through host memory
        gloo = self.size > 1 and torch.distributed.get_backend() == "gloo"
        self.staging = "cpu" if config.device != "cpu" and gloo else None
        self.tracer = None  # with config.trace: parallel/dp/trace.py's Tracer

    def build_model(self, ds: data_mod.Dataset) -> nn.Module:
        return build_model(ds.features, tuple(self.config.hidden), ds.classes, self.config.mode, self.config.device)

    def make_optimizer(self, model: nn.Module):
        return torch.optim.Adam(model.parameters(), lr=self.config.lr)

    def start(self, model: nn.Module) -> None:
        """Before the first step: every rank takes rank 0's weights, and the buckets are set up."""
        self.broadcast(model)
        if self.size > 1:
            self.reducer = GradReducer(list(model.parameters()), bucket_bytes=self.config.bucket_kb * 1024,
                                       overlap=self.config.overlap, staging_device=self.staging, group=self.group)
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

    def close(self) -> None:
        if self.reducer:
            self.reducer.close()


def strategy(config: Config) -> DataParallel:
    """Plain data parallelism, unless the config asks for ZeRO or tensor parallelism."""
    if config.tp > 1:
        from parallel.tp.training import TensorParallel

        return TensorParallel(config)
    if config.zero and world()[1] > 1:
        from parallel.collectives.zero import ZeRO

        return ZeRO(config)
    return DataParallel(config)


# ---------------------------------------------------------------------------
# Around the loop: progress, evaluation, checkpoints
# ---------------------------------------------------------------------------

_last_print = [0.0]


def show_progress(config: Config, epoch: int, step: int, steps: int) -> None:
    """On a terminal, rank 0 rewrites one line with the batch it is at (five times a second)."""
    if config.progress and world()[0] == 0 and time.perf_counter() - _last_print[0] > 0.2:
        _last_print[0] = time.perf_counter()
        print(f"\r  epoch {epoch + 1}: batch {step + 1}/{steps}", end="", flush=True)


def evaluate(model: nn.Module, split: data_mod.Split, device: str, how: DataParallel) -> float:
    """Accuracy over the whole split: each rank counts on its shard, the ring adds the counts
    (over the data-parallel ranks: the ranks of a tensor-parallel group share a shard)."""
    idx = data_mod.shard(torch.arange(len(split)), how.rank, how.size)
    with torch.no_grad():
        pred = model(split.x[idx].to(device)).argmax(1).cpu() if len(idx) else torch.empty(0)
    counts = torch.tensor([(pred == split.y[idx]).sum().item(), len(idx)], dtype=torch.int64)
    if how.size > 1:
        ring_all_reduce_host(counts, how.group)
    return counts[0].item() / max(1, counts[1].item())


def end_of_epoch(config: Config, how: DataParallel, model: nn.Module, ds: data_mod.Dataset, epoch: int,
                 loss_sum: torch.Tensor, samples: int, elapsed: float, comm_s: float) -> dict:
    """The epoch's record (the loss over every rank's samples, the validation accuracy), printed
    by rank 0."""
    totals = torch.tensor([loss_sum.item(), samples], dtype=torch.float64)
    if how.size > 1:
        ring_all_reduce_host(totals, how.group)
    record = {"epoch": epoch + 1, "loss": totals[0].item() / max(1.0, totals[1].item()),
              "accuracy": evaluate(model, ds.val, config.device, how),
              "samples_per_s": len(ds.train) / elapsed, "comm_s": comm_s}
    if world()[0] == 0:
        print(("\r" if config.progress else "") +
              f"epoch {record['epoch']:>3}/{config.epochs}  loss {record['loss']:.4f}  "
              f"val accuracy {100 * record['accuracy']:5.1f}%  {record['samples_per_s']:8.0f} samples/s  "
              f"comm {record['comm_s']:.2f} s", flush=True)
    return record


def model_signature(config: Config, ds: data_mod.Dataset) -> dict:
    return {"mode": config.mode, "features": ds.features, "hidden": list(config.hidden), "classes": ds.classes}


def save(config: Config, how: DataParallel, model: nn.Module, opt, ds: data_mod.Dataset, epoch: int,
         history: list) -> None:
    """Rank 0 writes the unsharded state every rank helped gather; nobody runs ahead meanwhile."""
    model_state, optimizer_state = how.full_state(model, opt)
    if world()[0] == 0:
        save_checkpoint(config.checkpoint, model_state, optimizer_state, epoch + 1, history,
                        model_signature(config, ds), config)
    if world()[1] > 1:
        torch.distributed.barrier()


def resume(config: Config, how: DataParallel, model: nn.Module, opt, ds: data_mod.Dataset) -> tuple[int, list]:
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
