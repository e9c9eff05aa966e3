"""Tensor parallelism on our ring (chapter 8): split one layer's weights between ranks.

    col = ColumnParallelDense(1024, 4096, mode="cpp", group=tp_group)   # W's rows (outputs) split
    row = RowParallelDense(4096, 1024, mode="cpp", group=tp_group)      # W's columns (inputs) split
    y = row(col(x))                       # Megatron's pair: one all-reduce forward, one backward

Every rank of ``group`` holds 1/n of each weight. Shards follow ``torch.tensor_split``: a
width that n does not divide gives the first ``width % n`` ranks one feature more; a width
smaller than n is an error that names both. A layer is initialised as the unsharded
``modes.Dense`` would be (the same random draws, then this rank's slice), and
``full_state_dict`` gathers the shards back into the unsharded ``state_dict``.

With ``sequence_parallel=True`` the activations between pairs are split along the batch
instead of replicated: the column layer all-gathers its input and the row layer
reduce-scatters its output, and with ``overlap=True`` each of those collectives runs as ring
steps with a GEMM on the chunk in hand while the next chunk travels (collective matmul),
forward and backward.

Every collective is the ring of parallel/dp/ring.py on ``group`` (its steps, where they are
interleaved with GEMMs, through parallel/common/p2p.py); without a process group (or
with a group of one) the layers compute the unsharded result alone.
"""

from __future__ import annotations

import time
import types
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor, nn

import modes
from parallel.common.p2p import agree, exchange, peers, wait
from parallel.dp.ring import ring_all_gather, ring_all_reduce, ring_reduce_scatter


class TPError(ValueError):
    """A tensor-parallel layout that cannot work (a width smaller than the tp size, ...)."""


def group_info(group: dist.ProcessGroup | None) -> tuple[int, int]:
    """(rank, size) in ``group``; (0, 1) without a process group."""
    if not (dist.is_available() and dist.is_initialized()):
        return 0, 1
    return dist.get_rank(group), dist.get_world_size(group)


def shard_sizes(width: int, parts: int, what: str = "width") -> list[int]:
    """The widths of ``parts`` shards of ``width`` (``torch.tensor_split``'s, uneven allowed)."""
    if parts < 1:
        raise TPError(f"the tensor-parallel size must be at least 1, got {parts}")
    if width < parts:
        raise TPError(f"{what} {width} cannot be split between {parts} tensor-parallel ranks: "
                      f"every rank needs at least one feature (use --tp <= {width})")
    return [width // parts + (1 if r < width % parts else 0) for r in range(parts)]


# One rank (or no process group): every collective is the identity, and nothing is sent.
def group_all_reduce(t: Tensor, group, check: bool = True) -> Tensor:
    return t if size_of(group) == 1 else ring_all_reduce(t, group=group, check=check)


def group_all_gather(t: Tensor, group, check: bool = True) -> Tensor:
    return t.clone() if size_of(group) == 1 else ring_all_gather(t, group, check=check)


def group_reduce_scatter(t: Tensor, group, check: bool = True) -> Tensor:
    return t.clone() if size_of(group) == 1 else ring_reduce_scatter(t, group=group, check=check)


# ---------------------------------------------------------------------------
# A timeline of what each rank does (the overlap figure and the benchmark's split of a step)
# ---------------------------------------------------------------------------

class Timeline:
    """Records (kind, start, end) intervals: "compute" for a GEMM or elementwise kernel,
    "comm" for time spent inside a collective or blocked on a transfer. Off by default."""

    events: list[tuple[str, float, float]] | None = None
    comm_s = 0.0  # always kept: seconds this process spent in tensor-parallel communication

    @classmethod
    def start(cls) -> None:
        cls.events = []

    @classmethod
    def stop(cls) -> list[tuple[str, float, float]]:
        events, cls.events = cls.events or [], None
        return events


def _timed(kind: str, fn: Callable[[], Tensor | None]) -> Tensor | None:
    if Timeline.events is None and kind != "comm":
        return fn()
    start = time.perf_counter()
    out = fn()
    end = time.perf_counter()
    if kind == "comm":
        Timeline.comm_s += end - start
    if Timeline.events is not None:
        Timeline.events.append((kind, start, end))
    return out


def _wait_timed(requests: list) -> None:
    _timed("comm", lambda: wait(requests))


# ---------------------------------------------------------------------------
# The autograd pieces: each collective with its adjoint as the backward
# ---------------------------------------------------------------------------

def _gather_last(x: Tensor, group: dist.ProcessGroup | None, check: bool = True) -> Tensor:
    """All-gather along the last dimension (shards may differ in width)."""
    gathered = group_all_gather(x.movedim(-1, 0), group, check)
    return gathered.movedim(0, -1).contiguous()


def own_part(x: Tensor, dim: int, group: dist.ProcessGroup | None) -> Tensor:
    rank, size = group_info(group)
    return torch.tensor_split(x, size, dim=dim)[rank].contiguous()


class CopyToTP(torch.autograd.Function):
    """Identity forward, all-reduce backward (Megatron's f): in front of column-parallel
    layers, whose input every rank holds whole; each rank's gradient is a partial sum."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _timed("comm", lambda: group_all_reduce(grad.contiguous().clone(), ctx.group)), None


class ReduceFromTP(torch.autograd.Function):
    """All-reduce forward, identity backward (Megatron's g): sums partial results."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        return _timed("comm", lambda: group_all_reduce(x.contiguous().clone(), group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return grad, None


class GatherFeatures(torch.autograd.Function):
    """All-gather along the feature (last) dimension forward; backward keeps this rank's part."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _timed("comm", lambda: _gather_last(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return own_part(grad, -1, ctx.group), None


class ScatterFeatures(torch.autograd.Function):
    """Keep this rank's part of the feature dimension forward; all-gather it backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return own_part(x, -1, group)

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _timed("comm", lambda: _gather_last(grad, ctx.group)), None


class GatherBatch(torch.autograd.Function):
    """Sequence parallelism's all-gather along the batch (dimension 0) forward; its adjoint,
    the reduce-scatter, backward. The parts must be ``torch.tensor_split``'s of the batch."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group, ctx.shape = group, x.shape
        return _timed("comm", lambda: group_all_gather(x, group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        part = _timed("comm", lambda: group_reduce_scatter(grad.contiguous(), ctx.group))
        if part.shape != ctx.shape:
            raise TPError(f"GatherBatch: this rank's part had shape {tuple(ctx.shape)} but the batch splits as "
                          f"{tuple(part.shape)}; sequence-parallel parts must be torch.tensor_split's")
        return part, None


class ReduceScatterBatch(torch.autograd.Function):
    """Sequence parallelism's reduce-scatter along the batch forward; all-gather backward."""

    @staticmethod
    def forward(ctx, x: Tensor, group: dist.ProcessGroup | None) -> Tensor:
        ctx.group = group
        return _timed("comm", lambda: group_reduce_scatter(x.contiguous(), group))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return _timed("comm", lambda: group_all_gather(grad.contiguous(), ctx.group)), None


# ---------------------------------------------------------------------------
# The stages' own kernels
# ---------------------------------------------------------------------------

StageBackward = Callable[[Tensor, Tensor, Tensor, Tensor, list], tuple]


def stage_backward(mode: str) -> StageBackward:
    """The stage's own backward: (grad_out, x, weight, out, mask) -> (grad_x, grad_w, grad_b),
    with dz = grad_out · out (1 − out) fused into the GEMMs as the stage does it; None for a
    gradient the mask does not ask for. The compiled stages export it as an op; the py stage
    has it as DenseFunction.backward, called here with the few fields it reads from ctx."""
    module = modes.stage(mode)
    if hasattr(module, "DenseFunction"):
        def py_backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor, mask: list) -> tuple:
            ctx = types.SimpleNamespace(saved_tensors=(x, weight, out), needs_input_grad=tuple(mask),
                                        has_bias=mask[2])
            return module.DenseFunction.backward(ctx, grad_out)
        return py_backward
    op = getattr(torch.ops, f"dense_{mode}").backward

    def compiled_backward(grad_out: Tensor, x: Tensor, weight: Tensor, out: Tensor, mask: list) -> tuple:
        return tuple(g if m else None for g, m in zip(op(grad_out, x, weight, out, list(mask)), mask))
    return compiled_backward


class _RowParallel(torch.autograd.Function):
    """y = sigmoid(Σ_ranks x_r W_rᵀ + b): a partial GEMM per rank, a ring all-reduce of the
    partial sums, then bias and sigmoid in place on the sum. Backward is exactly the stage's
    own backward kernel on this rank's (x_r, W_r) with the full output y: dz needs only y."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, group, mode: str, check: bool) -> Tensor:
        modes.check_inputs(x, weight, bias)
        x2 = x.reshape(-1, weight.shape[1])
        z = _timed("compute", lambda: x2 @ weight.t())
        _timed("comm", lambda: group_all_reduce(z, group, check))
        y = _timed("compute", lambda: (z if bias is None else z.add_(bias)).sigmoid_())
        ctx.save_for_backward(x, weight, y)
        ctx.mode, ctx.has_bias = mode, bias is not None
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):
        x, weight, y = ctx.saved_tensors
        mask = [ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        gx, gw, gb = _timed("compute", lambda: stage_backward(ctx.mode)(
            grad.contiguous().view(-1, weight.shape[0]), x.reshape(-1, weight.shape[1]), weight,
            y.view(-1, weight.shape[0]), mask))
        return (gx.view(x.shape) if gx is not None else None), gw, gb, None, None, None


# ---------------------------------------------------------------------------
# Collective matmul: the sequence-parallel pair, with and without overlap
# ---------------------------------------------------------------------------

def _batch_parts(x: Tensor, group, check: bool) -> list[int]:
    """Every rank's batch size, in rank order. Checked, the ranks agree on the rest of the
    shape and the dtype first, as ring_all_gather does (and raise its RingError); unchecked,
    every rank's is taken to be this rank's."""
    size = size_of(group)
    if not check or size == 1:
        return [x.shape[0]] * size
    return [row[6] for row in agree("all_gather", x, "sum", group)]


def _split_sizes(n: int, parts: int) -> list[int]:
    """The sizes of torch.tensor_split(range(n), parts)."""
    return [n // parts + (1 if r < n % parts else 0) for r in range(parts)]


# region collective-matmul
def _gather_matmul(x: Tensor, parts: list[int], group, compute: Callable[[int, Tensor], None]) -> Tensor:
    """All-gather ``x`` (this rank's rows) round the ring; ``compute(c, rows)`` runs on chunk c
    as soon as it is here, while the next chunk travels. Returns the gathered tensor."""
    rank, size, right, left = peers(group) if size_of(group) > 1 else (0, 1, 0, 0)
    full = torch.empty(sum(parts), *x.shape[1:], dtype=x.dtype, device=x.device)
    chunks = list(torch.split(full, parts))
    chunks[rank].copy_(x)
    for step in range(size):
        c = (rank - step) % size  # in hand
        requests = (exchange(chunks[c], chunks[(c - 1) % size], right, left, group)
                    if step < size - 1 else [])
        _timed("compute", lambda c=c: compute(c, chunks[c]))
        _wait_timed(requests)
    return full


def _matmul_reduce_scatter(parts: list[int], group, partial: Callable[[int], Tensor]) -> Tensor:
    """Reduce-scatter partial products round the ring: ``partial(c)`` computes this rank's
    contribution to chunk c. The partial for the chunk that arrives next is computed while the
    current one travels. Returns this rank's finished chunk (the sum over ranks)."""
    rank, size, right, left = peers(group) if size_of(group) > 1 else (0, 1, 0, 0)
    if size == 1:
        return _timed("compute", lambda: partial(0))
    send = _timed("compute", lambda: partial((rank - 1) % size))
    for step in range(size - 1):
        c = (rank - step - 2) % size  # the chunk arriving in this step
        recv = send.new_empty(parts[c], *send.shape[1:])
        requests = exchange(send, recv, right, left, group)
        own = _timed("compute", lambda c=c: partial(c))
        _wait_timed(requests)
        send = _timed("compute", lambda own=own, recv=recv: own.add_(recv))
    return send
# endregion


def size_of(group) -> int:
    return group_info(group)[1]


class _ColumnSP(torch.autograd.Function):
    """Sequence-parallel column layer: x is this rank's rows of the batch; the output is
    sigmoid(X W_rᵀ + b_r) for the whole batch X (all ranks' rows) and this rank's features."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, mode: str, overlap: bool, check: bool):
        modes.check_inputs(x, weight, bias)
        fn = modes.dense(mode)
        parts = _batch_parts(x, group, check)
        if overlap:
            outs: list[Tensor | None] = [None] * len(parts)

            def compute(c: int, rows: Tensor) -> None:
                outs[c] = fn(rows, weight, bias)  # the stage's fused op, on the chunk in hand
            full_x = _gather_matmul(x, parts, group, compute)
            y = torch.cat(outs)
        else:
            full_x = _timed("comm", lambda: group_all_gather(x, group, check))
            y = _timed("compute", lambda: fn(full_x, weight, bias))
        ctx.save_for_backward(full_x, weight, y)
        ctx.group, ctx.mode, ctx.overlap, ctx.check, ctx.parts = group, mode, overlap, check, parts
        ctx.has_bias = bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        full_x, weight, y = ctx.saved_tensors
        grad = grad.contiguous()
        back = stage_backward(ctx.mode)
        mask = [True, ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2]]
        if ctx.overlap:
            gws, gbs = [], []
            g_parts, x_parts, y_parts = (torch.split(t, ctx.parts) for t in (grad, full_x, y))

            def partial(c: int) -> Tensor:  # the stage's backward on chunk c: dX_c, and dW, db parts
                gx, gw, gb = back(g_parts[c], x_parts[c], weight, y_parts[c], mask)
                gws.append(gw)
                gbs.append(gb)
                return gx
            gx = _matmul_reduce_scatter(ctx.parts, ctx.group, partial)
            gw = _timed("compute", lambda: torch.stack(gws).sum(0)) if mask[1] else None
            gb = _timed("compute", lambda: torch.stack(gbs).sum(0)) if mask[2] else None
        else:
            gx_full, gw, gb = _timed("compute", lambda: back(grad, full_x, weight, y, mask))
            gx = _timed("comm", lambda: group_reduce_scatter(gx_full, ctx.group, ctx.check))
        return gx, gw, gb, None, None, None, None


class _RowSP(torch.autograd.Function):
    """Sequence-parallel row layer: h is the whole batch's activations for this rank's input
    features; the output is this rank's rows of sigmoid(Σ_ranks h_r W_rᵀ + b)."""

    @staticmethod
    def forward(ctx, h, weight, bias, group, mode: str, overlap: bool, check: bool):
        modes.check_inputs(h, weight, bias)
        rank, size = group_info(group)
        parts = _split_sizes(h.shape[0], size)
        if overlap:
            chunks = torch.split(h, parts)
            z = _matmul_reduce_scatter(parts, group, lambda c: chunks[c] @ weight.t())
        else:
            partial = _timed("compute", lambda: h @ weight.t())
            z = _timed("comm", lambda: group_reduce_scatter(partial, group, check))
        y = _timed("compute", lambda: (z if bias is None else z.add_(bias)).sigmoid_())
        ctx.save_for_backward(h, weight, y)
        ctx.group, ctx.overlap, ctx.check, ctx.parts, ctx.has_bias = group, overlap, check, parts, bias is not None
        return y

    @staticmethod
    def backward(ctx, grad):
        h, weight, y = ctx.saved_tensors
        dz = _timed("compute", lambda: (1 - y).mul_(y).mul_(grad))  # sigmoid' on this rank's rows
        gb = None
        if ctx.has_bias and ctx.needs_input_grad[2]:  # b is whole on every rank, its rows are not
            gb = _timed("compute", lambda: dz.sum(0))
            _timed("comm", lambda: group_all_reduce(gb, ctx.group, ctx.check))
        need_w = ctx.needs_input_grad[1]
        if ctx.overlap:
            gh = torch.empty_like(h)
            gh_parts, h_parts = torch.split(gh, ctx.parts), torch.split(h, ctx.parts)
            gw = torch.zeros_like(weight) if need_w else None

            def compute(c: int, dz_c: Tensor) -> None:  # dz of chunk c is here: its GEMMs
                torch.mm(dz_c, weight, out=gh_parts[c])
                if need_w:
                    gw.addmm_(dz_c.t(), h_parts[c])
            _gather_matmul(dz, ctx.parts, ctx.group, compute)
        else:
            dz_full = _timed("comm", lambda: group_all_gather(dz, ctx.group, ctx.check))
            gh = _timed("compute", lambda: dz_full @ weight)
            gw = _timed("compute", lambda: dz_full.t() @ h) if need_w else None
        return gh, gw, gb, None, None, None, None


# ---------------------------------------------------------------------------
# The layers
# ---------------------------------------------------------------------------

class _ParallelDense(nn.Module):
    """What both layers share: a full modes.Dense initialisation cut into this rank's shard."""

    # parameter name -> the dimension it is split along (None: whole on every rank)
    tp_dims: dict[str, int | None]

    def __init__(self, in_features: int, out_features: int, bias: bool, mode: str, group, device, dtype,
                 split: str, sequence_parallel: bool, overlap: bool) -> None:
        super().__init__()
        self.group, self.mode = group, mode
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel, self.overlap, self.check = sequence_parallel, overlap, True
        rank, size = group_info(group)
        width = out_features if split == "out" else in_features
        self.sizes = shard_sizes(width, size, f"{'out' if split == 'out' else 'in'}_features")
        # The unsharded layer's initialisation, the same random draws in the same order, then
        # this rank's slice: gathered, the shards are exactly modes.Dense's weights for the seed.
        # (It materialises the whole layer once; a model too big for one rank would initialise
        # each shard from its own generator, or load a checkpoint shard by shard.)
        full = modes.Dense(in_features, out_features, bias, mode, device, dtype)
        dim = 0 if split == "out" else 1
        self.weight = nn.Parameter(torch.tensor_split(full.weight.detach(), size, dim=dim)[rank].clone())
        self.tp_dims = {"weight": dim}
        if bias:
            b = full.bias.detach()
            self.bias = nn.Parameter((torch.tensor_split(b, size)[rank] if split == "out" else b).clone())
            self.tp_dims["bias"] = 0 if split == "out" else None
        else:
            self.register_parameter("bias", None)

    def extra_repr(self) -> str:
        rank, size = group_info(self.group)
        return (f"in_features={self.in_features}, out_features={self.out_features}, mode={self.mode!r}, "
                f"shard {rank} of {size} {self.sizes}, sequence_parallel={self.sequence_parallel}")


class ColumnParallelDense(_ParallelDense):
    """sigmoid(x W_rᵀ + b_r) for this rank's output features: the stage's fused op, whole,
    because the sigmoid is elementwise. The input is whole on every rank (its gradient is
    all-reduced backward), or this rank's rows of the batch with ``sequence_parallel``
    (all-gathered forward). ``gather_output`` all-gathers the features after it."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, mode: str = "py",
                 group: dist.ProcessGroup | None = None, device=None, dtype=None, *,
                 gather_output: bool = False, sequence_parallel: bool = False, overlap: bool = False) -> None:
        super().__init__(in_features, out_features, bias, mode, group, device, dtype, "out",
                         sequence_parallel, overlap)
        self.gather_output = gather_output

    def forward(self, x: Tensor) -> Tensor:
        if self.sequence_parallel:
            # autocast's casts here, outside the Function, so that they carry gradients back to
            # float32 parameters (and the gathered rows travel in the autocast dtype)
            x, weight, bias = modes.autocast_inputs(x, self.weight, self.bias)
            y = _ColumnSP.apply(x, weight, bias, self.group, self.mode, self.overlap, self.check)
        else:
            y = modes.dense(self.mode)(CopyToTP.apply(x, self.group), self.weight, self.bias)
        return GatherFeatures.apply(y, self.group) if self.gather_output else y


class RowParallelDense(_ParallelDense):
    """sigmoid(Σ_r x_r W_rᵀ + b) from this rank's input features x_r (the output of a
    ColumnParallelDense). The sigmoid must wait for the sum: a partial GEMM per rank, a ring
    all-reduce (or, with ``sequence_parallel``, a reduce-scatter along the batch), then bias
    and sigmoid. ``input_is_parallel=False`` takes the whole input and keeps its own part."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, mode: str = "py",
                 group: dist.ProcessGroup | None = None, device=None, dtype=None, *,
                 input_is_parallel: bool = True, sequence_parallel: bool = False, overlap: bool = False) -> None:
        super().__init__(in_features, out_features, bias, mode, group, device, dtype, "in",
                         sequence_parallel, overlap)
        self.input_is_parallel = input_is_parallel

    def forward(self, x: Tensor) -> Tensor:
        if not self.input_is_parallel:
            x = ScatterFeatures.apply(x, self.group)
        x, weight, bias = modes.autocast_inputs(x, self.weight, self.bias)  # as in ColumnParallelDense
        if self.sequence_parallel:
            return _RowSP.apply(x, weight, bias, self.group, self.mode, self.overlap, self.check)
        return _RowParallel.apply(x, weight, bias, self.group, self.mode, self.check)


def build_tp_model(features: int, hidden: tuple[int, ...], classes: int, mode: str,
                   group: dist.ProcessGroup | None, device: str = "cpu") -> nn.Sequential:
    """parallel.common.training.build_model, tensor-parallel: hidden layers in Megatron's pairs
    (column then row), an unpaired last hidden layer column-parallel with its output gathered,
    and the linear head whole on every rank. Same indices, so the same state_dict keys."""
    layers: list[nn.Module] = []
    for i, width in enumerate(hidden):
        if i % 2 == 1:
            layers.append(RowParallelDense(features, width, mode=mode, group=group, device=device))
        else:
            last = i + 1 == len(hidden)
            layers.append(ColumnParallelDense(features, width, mode=mode, group=group, device=device,
                                              gather_output=last))
        features = width
    layers.append(nn.Linear(features, classes, device=device))
    return nn.Sequential(*layers)
