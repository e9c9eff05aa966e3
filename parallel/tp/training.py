"""Tensor parallelism in the training loop: the dp × tp process groups, and checkpoints that hold
the unsharded state.

``make_layout(tp)`` cuts the world into tensor-parallel groups of neighbouring ranks and
data-parallel groups across them. ``full_state_dict`` / ``full_optimizer_state`` gather the
shards into what the unsharded model and its optimiser would hold, and the ``load_*`` functions
keep this rank's shard of it: a checkpoint written with one --tp resumes with another, or in
plain data parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from parallel.common import threads
from parallel.dp.reducer import AllReduce
from parallel.dp.ring import ring_all_reduce
from parallel.dp.trainer import DataParallel
from parallel.tp.layers import Timeline, TPError, build_tp_model, group_all_gather, group_info, own_part, size_of

# ---------------------------------------------------------------------------
# Full (unsharded) state: what checkpoints hold
# ---------------------------------------------------------------------------

def tp_dims(model: nn.Module) -> dict[str, int | None]:
    """Parameter name -> the dimension its shards are split along (None: whole everywhere)."""
    dims: dict[str, int | None] = {}
    for prefix, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            key = f"{prefix}.{name}" if prefix else name
            dims[key] = getattr(module, "tp_dims", {}).get(name)
    return dims


def _gather_dim(t: Tensor, dim: int, group) -> Tensor:
    return group_all_gather(t.movedim(dim, 0).contiguous(), group).movedim(0, dim).contiguous()


def full_state_dict(model: nn.Module, group) -> dict[str, Tensor]:
    """The unsharded state_dict (on the CPU), gathered from every rank of ``group`` (every
    rank must call it). It loads into parallel.common.training.build_model's model."""
    dims = tp_dims(model)
    out = {}
    for key, value in model.state_dict().items():
        dim = dims.get(key)
        value = value.detach()
        out[key] = (value if dim is None or size_of(group) == 1 else _gather_dim(value, dim, group)).cpu().clone()
    return out


def load_full_state_dict(model: nn.Module, state: dict[str, Tensor], group) -> None:
    """Load an unsharded state_dict, keeping this rank's shard of each split parameter."""
    dims, own = tp_dims(model), model.state_dict()
    sharded = {}
    for key, value in state.items():
        dim = dims.get(key)
        part = value if dim is None else own_part(value, dim, group)
        if key in own and part.shape != own[key].shape:
            raise TPError(f"{key}: the checkpoint's {tuple(value.shape)} does not split into this rank's "
                          f"{tuple(own[key].shape)}")
        sharded[key] = part
    model.load_state_dict(sharded)


def _optimizer_dims(model: nn.Module) -> list[int | None]:
    dims = tp_dims(model)
    return [dims[name] for name, _ in model.named_parameters()]


def full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, group) -> dict:
    """The optimiser's state_dict with every per-parameter tensor (Adam's moments) unsharded,
    as the same optimiser on the unsharded model would hold it. Parameters are numbered in
    model.parameters() order, which is the unsharded model's order too."""
    state = opt.state_dict()
    dims, params = _optimizer_dims(model), list(model.parameters())
    full = {}
    for i, entry in state["state"].items():
        full[i] = {k: (_gather_dim(v, dims[i], group).cpu() if isinstance(v, Tensor) and dims[i] is not None
                       and v.shape == params[i].shape and size_of(group) > 1 else v)
                   for k, v in entry.items()}
    return {"state": full, "param_groups": state["param_groups"]}


def load_full_optimizer_state(model: nn.Module, opt: torch.optim.Optimizer, state: dict, group) -> None:
    dims, params = _optimizer_dims(model), list(model.parameters())
    own = {}
    for i, entry in state["state"].items():
        i = int(i)
        own[i] = {k: (own_part(v, dims[i], group) if isinstance(v, Tensor) and dims[i] is not None
                      and v.dim() == params[i].dim() and v.dim() > 0 else v) for k, v in entry.items()}
    opt.load_state_dict({"state": own, "param_groups": state["param_groups"]})


# ---------------------------------------------------------------------------
# Two dimensions: data-parallel groups of tensor-parallel groups
# ---------------------------------------------------------------------------

@dataclass
class Layout:
    """Where this rank stands in a world of dp × tp ranks. Global rank = dp_rank · tp + tp_rank:
    the ranks of a tensor-parallel group are neighbours (on a real cluster, one machine's GPUs,
    because tensor parallelism communicates inside every layer). ``tp_group`` runs the sharded
    layers; ``dp_group`` (the ranks with the same tp_rank) averages their gradients. With tp = 1
    both are None: no group is made, and the world is the one data-parallel group."""

    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: dist.ProcessGroup | None
    dp_group: dist.ProcessGroup | None
    mesh: DeviceMesh | None = None


def make_layout(tp: int) -> Layout:
    """Create the groups (every rank must call this, in the same order).

    torch's DeviceMesh does the bookkeeping: ranks 0 … n − 1 laid out as a dp × tp grid, row
    by row, and a process group along each dimension (a row of the grid is a tensor-parallel
    group, a column a data-parallel one). By hand it would be two loops of dist.new_group, in
    which every rank must create every group, its own or not, in the same order."""
    rank, world = group_info(None)
    if tp < 1 or world % tp:
        raise TPError(f"--tp {tp} must divide the world size {world}")
    dp = world // tp
    if tp == 1:
        return Layout(1, dp, 0, rank, None, None)
    gloo = dist.get_backend() == "gloo"
    io_before = len(threads.io_threads()) if gloo else 0
    device = "cuda" if dist.get_backend() == "nccl" else "cpu"
    mesh = init_device_mesh(device, (dp, tp), mesh_dim_names=("dp", "tp"))
    if gloo:  # each new gloo group of two ranks or more has an I/O thread (parallel/common/threads.py's
        threads.lower_if_opted_in(expect=io_before + 1 + (dp > 1))  # opt-in experiment; nothing by default)
    return Layout(tp, dp, mesh.get_local_rank("tp"), mesh.get_local_rank("dp"), mesh.get_group("tp"),
                  mesh.get_group("dp"), mesh)


# ---------------------------------------------------------------------------
# In the training loop (python distributed.py --tp N)
# ---------------------------------------------------------------------------

class TensorParallel(DataParallel):
    """The training loop's strategy (parallel/common/training.py) over a dp × tp layout:
    chapter 7's DataParallel, except that the ranks of a tensor-parallel group share a data
    shard and split the hidden layers (build_tp_model); the data-parallel ranks (dp_rank of dp)
    split the batch and sum their gradients over ``dp_group``. Checkpoints hold the unsharded
    state."""

    def __init__(self, config, all_reduce: AllReduce = ring_all_reduce) -> None:
        super().__init__(config, all_reduce)
        self.layout = make_layout(config.tp)
        self.rank, self.size, self.group = self.layout.dp_rank, self.layout.dp, self.layout.dp_group

    def build_model(self, ds) -> nn.Module:
        c = self.config
        return build_tp_model(ds.features, tuple(c.hidden), ds.classes, c.mode, self.layout.tp_group, c.device)

    def comm_s(self) -> float:
        return super().comm_s() + Timeline.comm_s  # and the sharded layers' own collectives

    def full_state(self, model: nn.Module, opt) -> tuple[dict, dict | None]:
        group = self.layout.tp_group
        return full_state_dict(model, group), (full_optimizer_state(model, opt, group) if opt is not None else None)

    def load_full_state(self, model: nn.Module, opt, state: dict) -> None:
        load_full_state_dict(model, state["model"], self.layout.tp_group)
        load_full_optimizer_state(model, opt, state["optimizer"], self.layout.tp_group)
