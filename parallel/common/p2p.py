"""Point-to-point messages, the pieces every collective of chapters 7 and 8 is built from.

A collective here is a schedule of messages between ranks: ``post`` sends and receives
tensors to and from any peers at once, ``exchange`` is one ring step (send right, receive
left), ``wait`` waits for the requests. ``peers`` gives a rank its neighbours. ``agree`` makes
the ranks compare their calls before any data moves, and ``stack_rows`` gathers a small row
from every rank. ``scratch`` keeps receive buffers from call to call.

The ring of chapter 7 (parallel/dp/ring.py), the other all-reduces of its second part
(parallel/collectives/algorithms.py) and the tensor-parallel layers of chapter 8
(parallel/tp/layers.py) all send through these.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor

OPS = ("sum", "avg")
_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.int32: 3,
                torch.float16: 4, torch.bfloat16: 5, torch.uint8: 6, torch.int8: 7}
_KINDS = ("all_reduce", "reduce_scatter", "all_gather")
_SHOWN_DIMS = 4  # the metadata row carries the first dimensions (for the message) and a hash of all


class RingError(RuntimeError):
    """The ranks disagree about a call (sizes, dtypes, op), or a peer failed."""


def peers(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of right neighbour, of left neighbour)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def glob(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    return rank, size, glob((rank + 1) % size), glob((rank - 1) % size)


# Bytes this process has sent, by purpose (parallel/tp/report.py's table of bytes per step).
SENT_BYTES = {"data": 0, "metadata": 0}


def post(recvs: list[tuple[int, Tensor]], sends: list[tuple[int, Tensor]], group: dist.ProcessGroup | None,
         purpose: str = "data", message_bytes: int | None = None) -> list:
    """Post receives from and sends to any peers (global ranks) at once. Returns the requests.

    NCCL needs the whole set as one batch_isend_irecv (separate calls can deadlock). On gloo an
    isend or irecv never blocks, so the receives are posted first, straight to the process
    group: the data finds its buffers waiting, and no batching code runs (the overhead
    benchmark, ``distributed.py --bench overhead``, times both ways). Empty tensors are
    skipped, on both sides alike when both derive the sizes from the same agreed numel. On gloo
    a tensor goes as messages of at most ``message_bytes`` (default ``MESSAGE_BYTES``; 0: one).
    """
    recvs = [(peer, t) for peer, t in recvs if t.numel()]
    sends = [(peer, t) for peer, t in sends if t.numel()]
    for _, t in sends:
        SENT_BYTES[purpose] += t.numel() * t.element_size()
    if not (sends or recvs):
        return []
    if (sends or recvs)[0][1].is_cuda:
        return dist.batch_isend_irecv([dist.P2POp(dist.isend, t, peer, group) for peer, t in sends] +
                                      [dist.P2POp(dist.irecv, t, peer, group) for peer, t in recvs])
    limit = MESSAGE_BYTES if message_bytes is None else message_bytes
    return ([dist.irecv(m, peer, group) for peer, t in recvs for m in _messages(t, limit)] +
            [dist.isend(m, peer, group) for peer, t in sends for m in _messages(t, limit)])


# On gloo a tensor larger than this goes as several messages, all posted at once (0: one
# message). gloo's own all_reduce cuts its segments at 1 MiB too. The allreduce benchmark
# times the ring and two-shot with one message per piece beside them; why gloo's TCP transport
# moves one large message more slowly than the same bytes as several is not traced.
MESSAGE_BYTES = 1 << 20


def _messages(t: Tensor, limit: int) -> tuple[Tensor, ...]:
    """``t`` cut into ⌈bytes / limit⌉ messages whose sizes differ by one element at most (0: one
    message). The sender and the receiver hold tensors of the same numel and dtype, so both cut
    them the same way."""
    n = -(-t.numel() * t.element_size() // limit) if limit else 1
    return (t,) if n <= 1 else torch.tensor_split(t.view(-1), n)


_local = threading.local()


def scratch(numel: int, like: Tensor, owner: str = "") -> Tensor:
    """Scratch space of ``numel`` elements, reused across calls (one per thread, dtype, device
    and ``owner``: the algorithms share the default ""; one that names itself keeps its own).

    A fresh buffer per call costs an allocation (and, for large ones, page faults) each time;
    the allreduce benchmark times the ring with one beside the ring without.
    Nothing returned to a caller lives here, and a collective is done with it when it returns,
    so the next call on the same thread may overwrite it.
    """
    cache = _local.__dict__.setdefault("buffers", {})
    key = (like.dtype, like.device, owner)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(max(numel, 1024), dtype=like.dtype, device=like.device)
    return buf[:numel]


def exchange(send: Tensor | None, recv: Tensor | None, right: int, left: int,
             group: dist.ProcessGroup | None, purpose: str = "data") -> list:
    """Post one ring step: send to the right, receive from the left (either may be None)."""
    return post([] if recv is None else [(left, recv)], [] if send is None else [(right, send)], group, purpose)


def wait(requests: list) -> None:
    """Wait for every request ``post`` or ``exchange`` returned."""
    for req in requests:
        req.wait()


@contextlib.contextmanager
def fresh_scratch() -> Iterator[None]:
    """Inside, ``scratch`` starts from nothing on this thread, so a collective allocates its
    buffer as one that kept none would (the allreduce benchmark times what reuse is worth);
    the kept buffers are back afterwards."""
    kept = _local.__dict__.get("buffers")
    _local.buffers = {}
    try:
        yield
    finally:
        if kept is not None:
            _local.buffers = kept


def stack_rows(mine: Tensor, group: dist.ProcessGroup | None = None, purpose: str = "metadata") -> Tensor:
    """Every rank's ``mine`` (the same shape and dtype on all, small), stacked in rank order
    along a new first dimension: passed round the ring, n − 1 steps. Every rank of ``group``
    must call it, and gets the same tensor."""
    rank, size, right, left = peers(group)
    rows = torch.empty(size, *mine.shape, dtype=mine.dtype, device=mine.device)
    rows[rank] = mine
    for step in range(size - 1):
        wait(exchange(rows[(rank - step) % size], rows[(rank - step - 1) % size], right, left, group, purpose))
    return rows


# ---------------------------------------------------------------------------
# Agreement: every rank sees every other rank's call before any data moves
# ---------------------------------------------------------------------------

def _metadata(kind: str, tensor: Tensor, op: str) -> list[int]:
    shape = tuple(tensor.shape) or (1,)  # a 0-d tensor is one row of one element
    shown = list(shape[:_SHOWN_DIMS]) + [-1] * (_SHOWN_DIMS - min(len(shape), _SHOWN_DIMS))
    # Python hashes tuples of ints the same way in every process (no hash randomisation).
    trailing = hash(shape[1:]) & ((1 << 62) - 1)
    return [_KINDS.index(kind), _DTYPE_CODES.get(tensor.dtype, -1), OPS.index(op), tensor.numel(),
            len(shape), trailing, *shown]


def agree(kind: str, tensor: Tensor, op: str, group: dist.ProcessGroup | None) -> list[list[int]]:
    """Make every rank see every other rank's call (kind, dtype, op, shape) before data moves.

    On gloo, a receive whose size differs from the matching send kills the receiving
    process (a C++ terminate, not a Python error), so this must come first. The rows are
    gathered round the ring (``stack_rows``), n − 1 tiny steps, and every rank raises the same error.
    The all-gather allows different sizes along dimension 0; everything else must match.
    Returns every rank's row (the all-gather needs the sizes).
    """
    mine = torch.tensor(_metadata(kind, tensor, op), dtype=torch.int64, device=tensor.device)
    rows = stack_rows(mine, group).tolist()
    if kind == "all_gather":  # sizes along dimension 0 may differ: compare the rest
        key = [(r[0], r[1], r[2], r[4], r[5]) for r in rows]
    elif kind == "all_reduce":  # only the number of elements matters
        key = [(r[0], r[1], r[2], r[3]) for r in rows]
    else:
        key = [tuple(r) for r in rows]
    if len(set(key)) > 1:
        names = {v: str(k).removeprefix("torch.") for k, v in _DTYPE_CODES.items()}

        def describe(r: int, row: list[int]) -> str:
            k, d, o, numel, ndim, _, *shown = row
            dims = ", ".join(str(s) for s in shown[:ndim]) + (", ..." if ndim > _SHOWN_DIMS else "")
            op_text = f", op {OPS[o]}" if kind != "all_gather" else ""
            call = f"{_KINDS[k]}, " if k != _KINDS.index(kind) else ""
            return f"rank {r}: {call}numel {numel}, shape ({dims}), {names.get(d, 'other dtype')}{op_text}"

        detail = "; ".join(describe(r, row) for r, row in enumerate(rows))
        what = "shapes" if kind == "all_gather" else "tensors or ops"
        raise RingError(f"ring_{kind}: ranks passed different {what} ({detail})")
    return rows

