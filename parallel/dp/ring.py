"""Ring collectives written on torch.distributed's point-to-point operations: the ring the
project uses (the gradient buckets, ZeRO, the tensor-parallel layers).

n ranks stand in a ring; each sends to its right neighbour and receives from its left.
A tensor is cut into n chunks (``torch.tensor_split`` along dimension 0: sizes differ by at
most one row). Two collectives move chunks round the ring, n − 1 steps each:

  reduce-scatter: at step s, rank r sends its partial sum of chunk (r − s − 1) mod n and adds
                  the partial sum it receives, of chunk (r − s − 2) mod n, to its own
                  contribution. After n − 1 steps rank r holds the complete sum of chunk r.
  all-gather:     rank r starts with chunk r. At step s it sends chunk (r − s) mod n and
                  receives chunk (r − s − 1) mod n straight into place.

The all-reduce is the one followed by the other, 2(n − 1) steps in which each rank sends
2(n − 1)/n of the data, whatever n is: the ring is bandwidth-optimal.

parallel/dp/simple.py is the same all-reduce in thirty lines. This one adds what a library
needs, each for a reason. The messages themselves go through parallel/common/p2p.py, which the
later chapters' collectives share:

- Agreement first (``p2p.agree``). On gloo, a receive whose size differs from its send kills
  the receiving process with a C++ terminate; here every rank first sees every other rank's
  call (kind, dtype, op, shape), and ranks that disagree all raise the same RingError instead.
- Any shape, any split. Chunks and pieces follow ``torch.tensor_split``, so sizes that n does
  not divide, empty tensors, 0-d tensors, non-contiguous tensors (through a copy) and, in the
  all-gather, ranks with different numbers of rows all work; ``avg`` as well as ``sum``, for
  every float and integer dtype.
- Clear errors before anything is sent (``_check_tensor``): a wrong op, a CPU tensor on NCCL,
  a CUDA tensor on gloo.
- NCCL as well as gloo (``p2p.post``): on NCCL a step is one ``batch_isend_irecv``, because
  separate isend/irecv calls can deadlock there.
- The reduce-scatter and the all-gather on their own, for ZeRO (parallel/collectives/zero.py)
  and the tensor-parallel layers (parallel/tp/layers.py).
- Overlap inside a call. Each chunk travels in pieces of about 4 MiB (on gloo, each as
  messages of at most about 1 MiB: ``p2p.MESSAGE_BYTES``), in a wavefront: piece k + 1 runs
  one step behind piece k, so adding one piece can overlap the transfer of the next, and the
  all-gather of the first pieces overlaps the reduce-scatter of the last. On gloo a rank waits
  for its receive alone and settles a send only before its piece is written again
  (``_LateSends``).
- No allocation per call: receive buffers are kept from call to call (``p2p.scratch``).

Buckets, the other overlap (reducing while backward still runs), are the caller's:
parallel/dp/reducer.py. The three public collectives run the same two step functions
(``_reduce_scatter_step``, ``_all_gather_step``) through the same wavefront scheduler
(``_wavefront``); the all-reduce only chains them.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from parallel.common.p2p import OPS, agree, exchange, peers, scratch, wait

# The pieces' size. `distributed.py --bench allreduce` times 1 and 16 MiB pieces beside it
# (its second table); none has been faster everywhere on the 2-core machine.
DEFAULT_SEGMENT_BYTES = 4 << 20
# Whether the all-reduces on gloo wait for a send only when they must (``_LateSends``). Only
# the allreduce benchmark turns it off, to measure what it is worth.
LATE_SENDS = True


# ---------------------------------------------------------------------------
# Checks every rank makes before any data moves
# ---------------------------------------------------------------------------

def _check_tensor(name: str, tensor: Tensor, op: str | None, group: dist.ProcessGroup | None) -> None:
    """Errors a rank can find alone (no message sent): wrong type, op, device for the backend."""
    if op is not None and op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not isinstance(tensor, Tensor):
        raise TypeError(f"{name} needs a torch.Tensor, got {type(tensor).__name__}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}; use 'sum'")
    backend = dist.get_backend(group)
    if backend == "gloo" and tensor.device.type != "cpu":
        raise ValueError(f"the gloo backend sends CPU tensors only; this tensor is on {tensor.device}")
    if backend == "nccl" and tensor.device.type != "cuda":
        raise ValueError(f"the nccl backend sends CUDA tensors only; this tensor is on {tensor.device}")


# ---------------------------------------------------------------------------
# The two step functions and the wavefront that runs them
# ---------------------------------------------------------------------------

# A posted step: its requests, and what to do once they complete (None: nothing).
Posted = tuple[list, "Callable[[], None] | None"]


def _wavefront(n_pieces: int, n_steps: int, post: Callable[[int, int], Posted]) -> None:
    """Run ``n_steps`` ring steps for each of ``n_pieces`` pieces: at slot t, piece k takes its
    step t − k. A piece's next step is posted as soon as its current one is done (and added),
    so the wire is busy while the next piece is being added. Every rank posts in the same
    order, so the messages between two neighbours pair up."""
    in_flight = [(0, 0, *post(0, 0))]
    for slot in range(n_pieces + n_steps - 1):
        posted, in_flight = in_flight, []
        for k, step, requests, done in posted:
            wait(requests)
            if done is not None:
                done()
            if step + 1 < n_steps:
                in_flight.append((k, step + 1, *post(k, step + 1)))
        if slot + 1 < n_pieces:  # the next piece joins one step behind
            in_flight.append((slot + 1, 0, *post(slot + 1, 0)))


class _LateSends:
    """Sends waited for only when they must be: before the piece they read is written again,
    or at the end of the call (the all-reduce on gloo).

    A step's receive is done when the left neighbour's data is in; its send, when the right
    neighbour has taken the data, which on gloo happens only once that neighbour has posted its
    receive. Waiting for both before the next step ties each rank to the pace of both its
    neighbours; waiting for the receive alone lets the next step's receive be posted while the
    right neighbour catches up. What that is worth, the allreduce benchmark measures (a wait
    per send, beside this). NCCL's step is one batch, waited for as a whole.
    """

    def __init__(self) -> None:
        self.pending: dict[tuple[int, int], list] = {}  # (chunk, piece) -> its sends' requests

    def post(self, tensor: Tensor, key: tuple[int, int], right: int, group: dist.ProcessGroup | None) -> None:
        self.pending.setdefault(key, []).extend(exchange(tensor, None, right, right, group))

    def settle(self, key: tuple[int, int] | None = None) -> None:
        """Wait for the sends of piece ``key`` (chunk, piece), or for all of them. Each request
        is waited for once: on gloo a second wait on a finished send hangs."""
        for requests in ([self.pending.pop(key, [])] if key is not None else self.pending.values()):
            wait(requests)
        if key is None:
            self.pending = {}


def _reduce_scatter_step(src: list[list[Tensor]], acc: Callable[[int, int], Tensor], out: list[Tensor],
                         recv_buf: Tensor, k: int, step: int, op: str, rank: int, size: int, right: int,
                         left: int, group: dist.ProcessGroup | None, late: _LateSends | None = None) -> Posted:
    """Piece k, step ``step`` of the reduce-scatter. ``src[c][k]`` is this rank's own
    contribution to piece k of chunk c; ``acc(c, k)`` is where its partial sum is kept between
    steps (the source itself for an in-place all-reduce); ``out[k]`` receives the finished sum
    of chunk ``rank``. The partial sum sent at step s is the one completed at step s − 1.
    With ``late``, the send is left to it and only the receive is waited for (the caller must
    then not write a sent piece before ``late.settle``-ing it)."""
    send_chunk, recv_chunk = (rank - step - 1) % size, (rank - step - 2) % size
    send = src[send_chunk][k] if step == 0 else acc(send_chunk, k)
    last = step == size - 2
    dst = out[k] if last else acc(recv_chunk, k)
    buf = recv_buf[: dst.numel()]
    own = src[recv_chunk][k]

    def done() -> None:
        torch.add(own, buf, out=dst)  # own + partial: the same bits as partial + own
        if last and op == "avg":
            dst.div_(size)
    if late is None:
        return exchange(send, buf, right, left, group), done
    receive = exchange(None, buf, right, left, group)  # the receive first, as exchange posts them
    late.post(send, (send_chunk, k), right, group)
    return receive, done


def _all_gather_step(chunks: list[list[Tensor]], k: int, step: int, rank: int, size: int, right: int,
                     left: int, group: dist.ProcessGroup | None, late: _LateSends | None = None) -> Posted:
    """Piece k, step ``step`` of the all-gather: pass a finished piece on, receive one in place
    (with ``late``: once any send still reading that place is done)."""
    send_chunk, recv_chunk = (rank - step) % size, (rank - step - 1) % size
    if late is None:
        return exchange(chunks[send_chunk][k], chunks[recv_chunk][k], right, left, group), None
    late.settle((recv_chunk, k))  # the all-reduce sent this piece in its reduce-scatter
    receive = exchange(None, chunks[recv_chunk][k], right, left, group)
    late.post(chunks[send_chunk][k], (send_chunk, k), right, group)
    return receive, None


def _pieces(chunks: list[Tensor], segment_bytes: int) -> tuple[list[list[Tensor]], int]:
    """Cut every chunk into the same number of pieces (a piece's send and its matching receive
    then always have the same size), about ``segment_bytes`` each for the longest chunk."""
    longest = max(c.numel() for c in chunks)
    n_pieces = max(1, -(-longest * chunks[0].element_size() // segment_bytes))
    return [list(torch.tensor_split(c, n_pieces)) for c in chunks], n_pieces


def _flat_rows(t: Tensor) -> Tensor:
    """A contiguous 2-d view (rows = dimension 0) of ``t``, copied only if it must be."""
    t = t.reshape(1) if t.dim() == 0 else t
    t = t if t.is_contiguous() else t.contiguous()
    return t.view(t.shape[0], math.prod(t.shape[1:]))


# ---------------------------------------------------------------------------
# The public collectives
# ---------------------------------------------------------------------------

def ring_reduce_scatter(tensor: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, *,
                        check: bool = True, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Tensor:
    """Sum (or average) ``tensor`` over the ranks of ``group`` and give rank r only its part:
    ``torch.tensor_split(total, n, dim=0)[r]`` (uneven when n does not divide dimension 0; a
    1-d tensor is split by elements). Every rank passes the same shape. ``tensor`` is not
    modified; the result is a new tensor. For a 1-d tensor the chunks are those of
    ``ring_all_reduce``, added in the same order: the results are its chunks, bit for bit.
    """
    _check_tensor("ring_reduce_scatter", tensor, op, group)
    rank, size, right, left = peers(group)
    if check:
        agree("reduce_scatter", tensor, op, group)
    rows = _flat_rows(tensor)
    chunks = [c.reshape(-1) for c in torch.tensor_split(rows, size)]
    result = torch.tensor_split(tensor.reshape(1) if tensor.dim() == 0 else tensor, size)[rank]
    out_flat = torch.empty(chunks[rank].numel(), dtype=tensor.dtype, device=tensor.device)
    out = out_flat.view(result.shape)
    if size == 1 or tensor.numel() == 0:
        out.copy_(result)
        if op == "avg":
            out.div_(size)
        return out
    src, n_pieces = _pieces(chunks, segment_bytes)
    out_pieces = list(torch.tensor_split(out_flat, n_pieces))
    # A piece is in the reduce-scatter for n − 1 consecutive slots, so n − 1 buffer pairs suffice:
    # one receives a partial sum, the other keeps this rank's sum of it until it is sent.
    n_buffers = min(n_pieces, size - 1)
    longest = src[0][0].numel()
    space = scratch(2 * n_buffers * longest, tensor).view(2 * n_buffers, longest)
    recv, keep = space[:n_buffers], space[n_buffers:]

    def acc(c: int, k: int) -> Tensor:
        return keep[k % n_buffers][: src[c][k].numel()]

    _wavefront(n_pieces, size - 1, lambda k, step: _reduce_scatter_step(
        src, acc, out_pieces, recv[k % n_buffers], k, step, op, rank, size, right, left, group))
    return out


def ring_all_gather(tensor: Tensor, group: dist.ProcessGroup | None = None, *, check: bool = True,
                    segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Tensor:
    """Concatenate every rank's ``tensor`` along dimension 0, in rank order; every rank gets
    the same (bit-identical) new tensor. Ranks may pass different sizes along dimension 0
    (uneven shards); the other dimensions and the dtype must match. A 0-d tensor counts as one
    element. With ``check=False`` every rank must pass the same shape (nothing is exchanged
    to learn the sizes).
    """
    _check_tensor("ring_all_gather", tensor, None, group)
    rank, size, right, left = peers(group)
    rows = _flat_rows(tensor)
    if check:
        agreed = agree("all_gather", tensor, "sum", group)
        counts, total_rows = [row[3] for row in agreed], sum(row[6] for row in agreed)
    else:
        counts, total_rows = [rows.numel()] * size, rows.shape[0] * size
    out = torch.empty(total_rows, *(tensor.shape[1:] if tensor.dim() else ()), dtype=tensor.dtype,
                      device=tensor.device)
    flat = out.view(-1)
    chunks = list(torch.split(flat, counts))
    chunks[rank].copy_(rows.view(-1))
    if size == 1 or flat.numel() == 0:
        return out
    pieces, n_pieces = _pieces(chunks, segment_bytes)
    _wavefront(n_pieces, size - 1, lambda k, step: _all_gather_step(pieces, k, step, rank, size, right,
                                                                     left, group))
    return out


def ring_all_reduce(tensor: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, *,
                    check: bool = True, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Tensor:
    """Sum (or average) ``tensor`` over all ranks of ``group``, in place; returns it.

    A reduce-scatter whose partial sums are kept in the tensor itself, then an all-gather of
    the finished chunks; each piece takes the 2(n − 1) steps of both in a row, so the
    all-gather of early pieces overlaps the reduce-scatter of later ones. Every rank ends with
    bit-identical values. ``check=False`` skips the agreement on sizes (n − 1 small messages)
    for callers that agreed once already, such as the gradient buckets of parallel.dp.reducer.
    A non-contiguous tensor is reduced through a contiguous copy and written back.
    """
    _check_tensor("ring_all_reduce", tensor, op, group)
    rank, size, right, left = peers(group)
    if check:
        agree("all_reduce", tensor, op, group)
    if size == 1 or tensor.numel() == 0:
        return tensor

    # region all-reduce
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    pieces, n_pieces = _pieces(list(torch.tensor_split(flat, size)), segment_bytes)
    n_buffers = min(n_pieces, size - 1)
    longest = pieces[0][0].numel()
    recv = scratch(n_buffers * longest, flat).view(n_buffers, longest)
    rs_steps = size - 1
    # On gloo, sends are waited for late. A reduce-scatter step never writes a piece it has
    # sent (it adds into the chunk it receives, sent at the next step); the all-gather
    # receives each piece into the place its reduce-scatter sent from, and settles that first.
    late = _LateSends() if LATE_SENDS and not flat.is_cuda else None

    def post(k: int, step: int) -> Posted:
        if step < rs_steps:  # partial sums stay in the tensor; the finished chunk lands in place
            return _reduce_scatter_step(pieces, lambda c, j: pieces[c][j], pieces[rank], recv[k % n_buffers],
                                        k, step, op, rank, size, right, left, group, late)
        return _all_gather_step(pieces, k, step - rs_steps, rank, size, right, left, group, late)

    _wavefront(n_pieces, 2 * rs_steps, post)
    if late is not None:
        late.settle()
    # endregion
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor


def ring_all_reduce_host(tensor: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Ring-sum a small CPU tensor (counts, losses, timings) on any backend, in place.

    NCCL sends CUDA tensors only, so there the values go through the current GPU and back.
    """
    if dist.get_backend(group) == "nccl":
        moved = tensor.to(torch.device("cuda", torch.cuda.current_device()))
        ring_all_reduce(moved, group=group)
        return tensor.copy_(moved.cpu())
    return ring_all_reduce(tensor, group=group)


def ring_broadcast_from_rank0(tensor: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Give every rank rank 0's values: the others contribute −0.0 to a ring sum.

    x + (−0.0) is exactly x for every float x, +0.0 and −0.0 included (x + 0.0 would turn
    −0.0 into +0.0), so this is a bit-exact broadcast built from the same ring. It moves
    more data than a tree broadcast would, and runs once per training run.
    """
    if dist.get_rank(group) != 0:
        tensor.fill_(-0.0 if tensor.is_floating_point() else 0)
    return ring_all_reduce(tensor, "sum", group)
