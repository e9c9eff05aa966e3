"""Data-parallel training of an MLP of Dense layers, gradients averaged by our ring.

Every rank holds the whole model. For each global batch, rank r takes its disjoint shard,
computes the loss as (sum over its samples) / (global batch size), and runs backward; the
GradReducer sums the gradients over ranks while backward runs, so every rank steps its
optimiser with the gradient of the global-batch mean, exactly as one process would.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import modes
from parallel import data as data_mod
from parallel import tp as tp_mod
from parallel.reducer import GradReducer, world
from parallel.ring import ring_all_reduce_host, ring_broadcast_from_rank0


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
    zero: bool = False              # ZeRO stage 1: Adam's state sharded over the ranks (parallel/zero.py)
    progress: bool = False
    return_state: bool = False     # tests compare the final weights
    train_limit: int | None = None  # use only the first N training samples (quick runs, tests)
    tp: int = 1                    # tensor-parallel size: world = dp × tp (parallel/tp.py)


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed by this run."""


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


def _model_signature(config: Config, ds: data_mod.Dataset) -> dict:
    return {"mode": config.mode, "features": ds.features, "hidden": list(config.hidden), "classes": ds.classes}


def save_checkpoint(path: str, model: nn.Module, optimizer_state: dict, epoch: int, history: list,
                    signature: dict, config: Config, model_state: dict | None = None) -> None:
    """Rank 0 only. Written to a temporary file and renamed, so a crash never leaves half a file,
    and a failed write leaves no temporary file behind. ``optimizer_state`` is torch.optim.Adam's
    state_dict (ZeroAdam gathers its shards into it; a tensor-parallel run gathers the unsharded
    one); ``model_state`` replaces the local state_dict (the unsharded one of a tensor-parallel run)."""
    state = {"format": 1, "signature": signature, "epoch": epoch, "history": history,
             "model": model_state if model_state is not None else model.state_dict(), "optimizer": optimizer_state,
             "data_order": {"seed": config.seed, "batch_size": config.batch_size, "data": config.data,
                            "next_epoch": epoch},
             "rng": torch.get_rng_state()}
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    except BaseException as e:
        Path(tmp).unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise CheckpointError(f"cannot write the checkpoint {path}: {e.strerror or e}") from None
        raise


# What a resumed run must share with the checkpoint, or it would train on other data.
DATA_ORDER_FLAGS = {"seed": "--seed", "batch_size": "--batch-size", "data": "--data"}


def _cause(e: Exception) -> str:
    """One line for why torch.load failed. Its weights-only loader wraps the cause (such as
    "Unsupported operand 103" for a file that is not a checkpoint) in a paragraph of advice."""
    text = str(e)
    found = re.search(r"WeightsUnpickler error:\s*(\S.*)", text)
    line = found.group(1) if found else (text.strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {line.strip()[:200]}"


def load_checkpoint(path: str, signature: dict, config: Config | None = None) -> dict:
    """Read a checkpoint for --resume; raise CheckpointError unless this run (its model and,
    given ``config``, its data order) continues exactly what the checkpoint was written by."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"--resume: no checkpoint at {path}") from None
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable checkpoint ({_cause(e)})") from e
    if not isinstance(state, dict) or state.get("format") != 1:
        raise CheckpointError(f"{path} is not a checkpoint written by this trainer")
    if state["signature"] != signature:
        raise CheckpointError(f"{path} was written for a different model: {state['signature']}; "
                              f"this run builds {signature}")
    if config is not None:
        saved = state.get("data_order", {})
        for key, flag in DATA_ORDER_FLAGS.items():
            if key in saved and saved[key] != getattr(config, key):
                raise CheckpointError(f"{path} was written with {flag} {saved[key]} but this run has {flag} "
                                      f"{getattr(config, key)}: resuming would train on a different data order; "
                                      f"use {flag} {saved[key]} or start without --resume")
    return state


def check_resume(config: Config, ds: data_mod.Dataset | None = None) -> None:
    """For the launcher's process, before any rank starts: would --resume be accepted?"""
    ds = ds if ds is not None else load_data(config)
    load_checkpoint(config.checkpoint, _model_signature(config, ds), config)



def _evaluate(model: nn.Module, split: data_mod.Split, device: str, rank: int, world_size: int,
              group: torch.distributed.ProcessGroup | None = None) -> float:
    """Accuracy over the whole split: each rank counts on its shard, the ring adds the counts
    (over ``group``, the data-parallel ranks; the ranks of a tensor-parallel group share a shard)."""
    idx = data_mod.shard(torch.arange(len(split)), rank, world_size)
    with torch.no_grad():
        pred = model(split.x[idx].to(device)).argmax(1).cpu() if len(idx) else torch.empty(0)
    counts = torch.tensor([(pred == split.y[idx]).sum().item(), len(idx)], dtype=torch.int64)
    if world_size > 1:
        ring_all_reduce_host(counts, group)
    return counts[0].item() / max(1, counts[1].item())


def train(config: Config) -> dict:
    """Run the training loop on this rank (inside a process group, or alone). Returns the
    history; rank 0 prints one line per epoch and writes the checkpoint."""
    rank, world_size = world()
    # Tensor parallelism: the ranks of a tp group share a data shard and split the layers; the
    # data-parallel ranks (dp_rank of dp) split the batch. tp = 1 is plain data parallelism.
    layout = tp_mod.make_layout(config.tp) if world_size > 1 or config.tp > 1 else tp_mod.Layout(1, 1, 0, 0, None, None)
    dp_rank, dp_size, dp_group = layout.dp_rank, layout.dp, layout.dp_group
    torch.manual_seed(config.seed)
    ds = load_data(config)
    device = config.device
    if layout.tp > 1:
        model = tp_mod.build_tp_model(ds.features, tuple(config.hidden), ds.classes, config.mode,
                                      layout.tp_group, device)
    else:
        model = build_model(ds.features, tuple(config.hidden), ds.classes, config.mode, device)
    if config.zero and world_size > 1:  # distributed.py refuses --zero with --tp > 1
        from parallel.zero import ZeroAdam

        opt = ZeroAdam(model.parameters(), lr=config.lr)
    else:
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
    signature = _model_signature(config, ds)
    staging = "cpu" if (device != "cpu" and world_size > 1 and torch.distributed.get_backend() == "gloo") else None
    if staging and config.zero:
        raise ValueError("--zero reduce-scatters on the parameters' device: CUDA parameters need nccl "
                         "(one GPU per rank), not gloo")

    history: list[dict] = []
    start_epoch = 0
    if config.resume:
        state = load_checkpoint(config.checkpoint, signature, config)
        if layout.tp > 1:  # checkpoints hold the unsharded state: keep this rank's shards
            tp_mod.load_full_state_dict(model, state["model"], layout.tp_group)
            tp_mod.load_full_optimizer_state(model, opt, state["optimizer"], layout.tp_group)
        else:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        start_epoch, history = state["epoch"], state["history"]
        if rank == 0:
            print(f"resuming from {config.checkpoint} after epoch {start_epoch}", flush=True)
    if dp_size > 1:  # every rank starts from its data-parallel rank 0's weights
        for p in model.parameters():
            if staging:
                host = p.detach().cpu()
                p.data.copy_(ring_broadcast_from_rank0(host, dp_group))
            else:
                ring_broadcast_from_rank0(p.data, dp_group)
    # With ZeRO the optimiser reduce-scatters the gradients itself: no all-reduce buckets.
    reducer = None
    if dp_size > 1 and not config.zero:
        reducer = GradReducer(list(model.parameters()), bucket_bytes=config.bucket_kb * 1024,
                              overlap=config.overlap, staging_device=staging, group=dp_group)
    comm = reducer or (opt if config.zero and world_size > 1 else None)  # what counts communication time

    train_x, train_y = ds.train.x, ds.train.y
    try:
        for epoch in range(start_epoch, config.epochs):
            # communication: the gradient buckets' (or ZeRO's) and, with --tp, the sharded layers' own
            started, comm_before = time.perf_counter(), (comm.comm_s if comm else 0.0) + tp_mod.Timeline.comm_s
            batches = data_mod.epoch_batches(len(ds.train), config.batch_size, config.seed, epoch)
            # This rank's sum of losses stays on the device: .item() every step would make a GPU
            # wait for each step before the next is queued.
            loss_total, samples = torch.zeros((), dtype=torch.float64, device=device), 0
            last_print = 0.0
            for i, batch in enumerate(batches):
                idx = data_mod.shard(batch, dp_rank, dp_size)
                logits = model(train_x[idx].to(device))
                loss = F.cross_entropy(logits, train_y[idx].to(device), reduction="sum")
                (loss / len(batch)).backward()
                if reducer:
                    reducer.finish()
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss_total += loss.detach()
                samples += len(idx)
                if config.progress and rank == 0 and time.perf_counter() - last_print > 0.2:
                    last_print = time.perf_counter()
                    print(f"\r  epoch {epoch + 1}: batch {i + 1}/{len(batches)}", end="", flush=True)
            elapsed = time.perf_counter() - started
            loss_sum = torch.tensor([loss_total.item(), samples], dtype=torch.float64)
            if dp_size > 1:
                ring_all_reduce_host(loss_sum, dp_group)
            record = {"epoch": epoch + 1, "loss": loss_sum[0].item() / max(1.0, loss_sum[1].item()),
                      "accuracy": _evaluate(model, ds.val, device, dp_rank, dp_size, dp_group),
                      "samples_per_s": len(ds.train) / elapsed,
                      "comm_s": (comm.comm_s if comm else 0.0) + tp_mod.Timeline.comm_s - comm_before}
            history.append(record)
            # Every rank takes part in gathering a full state: ZeroAdam's shards, or a
            # tensor-parallel run's unsharded model and optimiser state.
            model_state, optimizer_state = None, None
            if config.checkpoint and layout.tp > 1:
                model_state = tp_mod.full_state_dict(model, layout.tp_group)
                optimizer_state = tp_mod.full_optimizer_state(model, opt, layout.tp_group)
            elif config.checkpoint:
                optimizer_state = opt.state_dict()
            if rank == 0:
                print(("\r" if config.progress else "") +
                      f"epoch {record['epoch']:>3}/{config.epochs}  loss {record['loss']:.4f}  "
                      f"val accuracy {100 * record['accuracy']:5.1f}%  {record['samples_per_s']:8.0f} samples/s  "
                      f"comm {record['comm_s']:.2f} s", flush=True)
                if config.checkpoint:
                    save_checkpoint(config.checkpoint, model, optimizer_state, epoch + 1, history, signature, config,
                                    model_state)
            if config.checkpoint and world_size > 1:
                torch.distributed.barrier()  # nobody runs ahead of a checkpoint being written
    finally:
        if reducer:
            reducer.close()

    result = {"epochs": history, "final_accuracy": _evaluate(model, ds.test, device, dp_rank, dp_size, dp_group)}
    if config.return_state:
        result["state"] = (tp_mod.full_state_dict(model, layout.tp_group) if layout.tp > 1 else
                           {k: v.detach().cpu().clone() for k, v in model.state_dict().items()})
    return result


def report(config: Config, result: dict, backend: str) -> dict:
    """The JSON record of a run (written by rank 0)."""
    return {
        "device": config.device, "torch": torch.__version__, "backend": backend,
        "world_size": config.world_size,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python distributed.py " + " ".join(sys.argv[1:]),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in dataclasses.asdict(config).items()
                   if k not in ("return_state", "progress", "train_limit")},
        "epochs": result["epochs"], "final_accuracy": result["final_accuracy"],
    }


def table(record: dict) -> str:
    """A Markdown table of a run's JSON record (docs/render.py puts it into the READMEs)."""
    rows = ["| epoch | training loss | validation accuracy | samples/s | communication s |",
            "|---:|---:|---:|---:|---:|"]
    for e in record["epochs"]:
        rows.append(f"| {e['epoch']} | {e['loss']:.4f} | {100 * e['accuracy']:.1f}% | {e['samples_per_s']:.0f} "
                    f"| {e['comm_s']:.2f} |")
    c = record["config"]
    ranks = f"{record['world_size']} ranks" + (f" (tp {c['tp']})" if c.get("tp", 1) > 1 else "")
    rows.append(f"\nTest accuracy {100 * record['final_accuracy']:.1f}%. {c['data']} data, mode {c['mode']}, hidden "
                f"{c['hidden']}, global batch {c['batch_size']}, {ranks} on {record['backend']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def plot(record: dict, path: str) -> None:
    from benchmark import pyplot

    plt = pyplot()
    epochs = [e["epoch"] for e in record["epochs"]]
    fig, (a, b) = plt.subplots(1, 2, figsize=(8, 3.2))
    a.plot(epochs, [e["loss"] for e in record["epochs"]], marker="o")
    a.set_xlabel("epoch")
    a.set_ylabel("training loss")
    b.plot(epochs, [100 * e["accuracy"] for e in record["epochs"]], marker="o", color="tab:green")
    b.set_xlabel("epoch")
    b.set_ylabel("validation accuracy (%)")
    c = record["config"]
    fig.suptitle(f"{c['data']}, mode {c['mode']}, {record['world_size']} ranks on {record['backend']}; "
                 f"test accuracy {100 * record['final_accuracy']:.1f}%", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
