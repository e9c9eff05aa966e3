"""ZeRO stage 1: Adam whose state is sharded over the ranks (Rajbhandari et al., 2020).

Plain data parallelism keeps a full copy of Adam's two moments on every rank: 8 bytes per
float32 parameter, n times over. Here the parameters are seen as one flat vector, padded to
a multiple of n and cut into n equal shards; rank r keeps Adam's state for shard r only:

  1. reduce-scatter the flat gradient: rank r receives the sum of shard r (ring, n − 1 steps);
  2. rank r runs Adam on shard r of the parameters, with its shard of the moments;
  3. all-gather the updated shards: every rank has every parameter again (n − 1 steps).

Steps 1 and 3 move exactly the bytes of one ring all-reduce, so the communication is the
same as plain data parallelism; the optimiser's memory and work fall as 1/n. Adam is
elementwise, so each element gets the update it would get unsharded.

``grad_dtype=torch.bfloat16`` reduce-scatters the gradient as bfloat16 (half the bytes of
step 1). The shard of the parameters, its gradient and Adam's moments stay in the parameters'
dtype, and step 3 gathers the updated parameters in it: gathering them in bfloat16 would round
the master weights themselves, every step.

``state_dict()`` gathers the shards into torch.optim.Adam's own format (one entry per
parameter) and ``load_state_dict()`` takes that format and keeps its shard: checkpoints are
full and interchangeable with unsharded runs. Both are collective: every rank calls them.

torch's own ZeRO stage 1 is ``torch.distributed.optim.ZeroRedundancyOptimizer``
(``torch_zero`` below builds one; a test trains the same model with both and compares the
weights). It shards differently: it hands out whole parameters, each to one rank (greedily,
to balance their sizes), expects the gradients already averaged (by DDP's all-reduce), steps
the parameters it owns, and then broadcasts each updated parameter from its owner. ZeroAdam cuts
one flat vector into equal shards, reduce-scatters the gradients itself, and all-gathers the
updated shards: the ring's bytes, and shards that balance to one element whatever the
parameters' sizes. Past stage 1, the parameters and gradients are sharded too (stages 2 and 3,
or FSDP); torch's FSDP2 does it with ``torch.distributed.fsdp.fully_shard``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn

from parallel.common.training import DTYPES
from parallel.dp.ring import ring_all_gather, ring_reduce_scatter
from parallel.dp.trainer import DataParallel


class ZeroAdam:
    """torch.optim.Adam over ``params``, its state sharded over the ranks of ``group``; the
    gradients reduce-scattered in ``grad_dtype`` (default: the parameters' dtype)."""

    def __init__(self, params, lr: float = 1e-3, group: dist.ProcessGroup | None = None,
                 grad_dtype: torch.dtype | None = None, **adam_kwargs) -> None:
        self.params: list[nn.Parameter] = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("ZeroAdam needs at least one parameter that requires grad")
        dtypes = {p.dtype for p in self.params}
        if len(dtypes) != 1 or {p.device for p in self.params} != {self.params[0].device}:
            raise ValueError(f"ZeroAdam needs parameters of one dtype on one device, got {sorted(map(str, dtypes))}")
        self.group, self.adam_kwargs = group, {"lr": lr, **adam_kwargs}
        self.rank, self.size = dist.get_rank(group), dist.get_world_size(group)
        self.numel = sum(p.numel() for p in self.params)
        self.shard_numel = -(-self.numel // self.size)  # padded: every shard the same size
        ref = self.params[0]
        padded = self.shard_numel * self.size
        self.flat_grad = torch.zeros(padded, dtype=grad_dtype or ref.dtype, device=ref.device)
        # The all-gather's source, in the parameters' dtype: the gradient's buffer where the dtypes
        # match (the gradient is no longer needed by then), a buffer of its own where they do not.
        self.flat_params = (self.flat_grad if self.flat_grad.dtype == ref.dtype else
                            torch.zeros(padded, dtype=ref.dtype, device=ref.device))
        self.lo = self.rank * self.shard_numel
        self.shard = nn.Parameter(torch.zeros(self.shard_numel, dtype=ref.dtype, device=ref.device))
        self.opt = torch.optim.Adam([self.shard], **self.adam_kwargs)
        self.param_groups = self.opt.param_groups  # lr schedulers and the trainer read these
        self.comm_s = 0.0

    def _views(self, flat: torch.Tensor):
        """(parameter, its part of ``flat``) for every parameter, in order."""
        offset = 0
        for p in self.params:
            yield p, flat[offset: offset + p.numel()].view_as(p)
            offset += p.numel()

    @torch.no_grad()
    def step(self) -> None:
        for p, part in self._views(self.flat_grad):  # cast to the buffer's dtype; no gradient: zeros
            part.copy_(p.grad) if p.grad is not None else part.zero_()
        start = time.perf_counter()
        grad = ring_reduce_scatter(self.flat_grad, "sum", self.group, check=False)
        self.comm_s += time.perf_counter() - start
        # The shard's values are the parameters' (they may have been loaded or broadcast since).
        full = self.flat_params
        for p, part in self._views(full):
            part.copy_(p)
        full[self.numel:].zero_()
        self.shard.copy_(full[self.lo: self.lo + self.shard_numel])
        self.shard.grad = grad.to(self.shard.dtype)  # the master shard is updated in its own dtype
        self.opt.step()
        start = time.perf_counter()
        gathered = ring_all_gather(self.shard.detach(), self.group, check=False)
        self.comm_s += time.perf_counter() - start
        for p, part in self._views(gathered):
            p.copy_(part)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def state_bytes(self) -> int:
        """Bytes of optimiser state this rank holds (Adam's moments and step counter)."""
        return sum(v.numel() * v.element_size() for s in self.opt.state.values() for v in s.values()
                   if isinstance(v, torch.Tensor))

    # -- checkpoints in torch.optim.Adam's own format -------------------------------------

    def _unsharded(self) -> torch.optim.Adam:
        """A plain Adam over the real parameters, carrying the same hyperparameters."""
        full = torch.optim.Adam(self.params, **self.adam_kwargs)
        for key, value in self.opt.param_groups[0].items():
            if key != "params":
                full.param_groups[0][key] = value
        return full

    @torch.no_grad()
    def state_dict(self) -> dict:
        """The full state, as torch.optim.Adam over the same parameters would save it (collective)."""
        full = self._unsharded()
        state = self.opt.state.get(self.shard)
        if state:
            moments = {k: ring_all_gather(state[k], self.group, check=False) for k in ("exp_avg", "exp_avg_sq")}
            parts = {k: [part for _, part in self._views(flat)] for k, flat in moments.items()}
            for i, p in enumerate(self.params):
                full.state[p] = {"step": state["step"].clone(), **{k: v[i].clone() for k, v in parts.items()}}
        return full.state_dict()

    @torch.no_grad()
    def load_state_dict(self, state_dict: dict) -> None:
        """Load a full Adam state (ours or a plain Adam's); this rank keeps its shard."""
        full = self._unsharded()
        full.load_state_dict(state_dict)  # checks the parameter groups' sizes, casts to our dtype
        for key, value in full.param_groups[0].items():
            if key != "params":
                self.opt.param_groups[0][key] = value
        self.opt.state.clear()
        states = [full.state.get(p) for p in self.params]
        if not any(states):
            return
        if not all(states):
            raise ValueError("the checkpoint holds Adam state for some parameters only")
        shard = {}
        for k in ("exp_avg", "exp_avg_sq"):
            flat = torch.zeros_like(self.flat_params)
            for (_, part), s in zip(self._views(flat), states):
                part.copy_(s[k])
            shard[k] = flat[self.lo: self.lo + self.shard_numel].clone()
        steps = {float(s["step"]) for s in states}
        if len(steps) != 1:
            raise ValueError(f"the checkpoint's parameters were stepped different numbers of times: {sorted(steps)}")
        self.opt.state[self.shard] = {"step": states[0]["step"].clone(), **shard}


def torch_zero(params, lr: float = 1e-3, group: dist.ProcessGroup | None = None, **adam_kwargs):
    """The library's twin of ZeroAdam: torch.optim.Adam's state sharded by whole parameters
    (ZeroRedundancyOptimizer). Its step expects gradients already averaged over the ranks."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.Adam, process_group=group, lr=lr,
                                   **adam_kwargs)


# ---------------------------------------------------------------------------
# In the training loop (python distributed.py --zero)
# ---------------------------------------------------------------------------

class ZeRO(DataParallel):
    """The training loop's strategy (parallel/common/training.py) with ZeroAdam: chapter 7's
    DataParallel, except that the optimiser reduce-scatters the gradients itself in its step,
    so there are no all-reduce buckets during backward."""

    def __init__(self, config) -> None:
        super().__init__(config)
        if self.staging:
            raise ValueError("--zero reduce-scatters on the parameters' device: CUDA parameters need nccl "
                             "(one GPU per rank), not gloo")

    def make_optimizer(self, model: nn.Module) -> ZeroAdam:
        self.opt = ZeroAdam(model.parameters(), lr=self.config.lr, group=self.group,
                            grad_dtype=DTYPES[self.config.grad_dtype])
        return self.opt

    def start(self, model: nn.Module) -> None:
        self.broadcast(model)  # the same weights everywhere; no buckets

    def comm_s(self) -> float:
        return self.opt.comm_s
    # Checkpoints need nothing more: ZeroAdam.state_dict() gathers the shards into torch.optim.Adam's
    # format (every rank takes part), and its load_state_dict keeps this rank's shard.
