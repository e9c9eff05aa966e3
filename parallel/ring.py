"""A ring all-reduce written on torch.distributed's point-to-point operations.

n ranks stand in a ring; each sends to its right neighbour and receives from its left.
The tensor is cut into n chunks. Two phases of n − 1 steps each:

  reduce-scatter: at step s, rank r sends chunk (r − s) mod n and adds the chunk it receives,
                  (r − s − 1) mod n, into its own copy. After n − 1 steps rank r holds the
                  complete sum of chunk (r + 1) mod n.
  all-gather:     at step s, rank r sends the complete chunk (r + 1 − s) mod n and receives
                  the complete chunk (r − s) mod n straight into place.

Each rank sends 2(n − 1) chunks of N/n elements: 2(n − 1)/n of the data, whatever n is,
which is why the ring is bandwidth-optimal. Every step is one batch_isend_irecv (send right,
receive left), which is deadlock-free on gloo and NCCL alike.

Each chunk travels in pieces of about 4 MiB, in a wavefront: piece k + 1 runs one step behind
piece k, so adding one piece overlaps the transfer of the next, and the all-gather of the
first pieces overlaps the reduce-scatter of the last. The receive buffers for the pieces being
reduced are the only memory this allocates.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

OPS = ("sum", "avg")
# Measured on the 2-core CPU machine with gloo: 4 MiB pieces beat 1 MiB (per-message cost)
# and 16 MiB (less overlap).
DEFAULT_SEGMENT_BYTES = 4 << 20
_DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.int32: 3,
                torch.float16: 4, torch.bfloat16: 5, torch.uint8: 6, torch.int8: 7}


class RingError(RuntimeError):
    """The ranks disagree about a call (sizes, dtypes, op), or a peer failed."""


def _peers(group: dist.ProcessGroup | None) -> tuple[int, int, int, int]:
    """(rank in group, group size, global rank of right neighbour, of left neighbour)."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)

    def glob(r: int) -> int:
        return r if group is None else dist.get_global_rank(group, r)

    return rank, size, glob((rank + 1) % size), glob((rank - 1) % size)


def _exchange(send: Tensor | None, recv: Tensor | None, right: int, left: int,
              group: dist.ProcessGroup | None) -> list:
    """Post one ring step: send to the right, receive from the left. Returns the requests."""
    ops = []
    if send is not None and send.numel():
        ops.append(dist.P2POp(dist.isend, send, right, group))
    if recv is not None and recv.numel():
        ops.append(dist.P2POp(dist.irecv, recv, left, group))
    return dist.batch_isend_irecv(ops) if ops else []


def _wait(requests: list) -> None:
    for req in requests:
        req.wait()


def _agree(tensor: Tensor, op: str, group: dist.ProcessGroup | None) -> None:
    """Make every rank check every other rank's numel, dtype and op before any data moves.

    On gloo, a receive whose size differs from the matching send kills the receiving
    process (a C++ terminate, not a Python error), so this must come first. The metadata is
    all-gathered around the same ring, n − 1 tiny steps, and every rank raises the same error.
    """
    rank, size, right, left = _peers(group)
    mine = torch.tensor([tensor.numel(), _DTYPE_CODES.get(tensor.dtype, -1), OPS.index(op)],
                        dtype=torch.int64, device=tensor.device)
    seen = torch.empty(size, 3, dtype=torch.int64, device=tensor.device)
    seen[rank] = mine
    for step in range(size - 1):
        _wait(_exchange(seen[(rank - step) % size], seen[(rank - step - 1) % size], right, left, group))
    if not bool((seen == mine).all()):
        rows = seen.tolist()
        names = {v: str(k).removeprefix("torch.") for k, v in _DTYPE_CODES.items()}
        detail = "; ".join(f"rank {r}: numel {n}, {names.get(d, 'other dtype')}, op {OPS[o]}"
                           for r, (n, d, o) in enumerate(rows))
        raise RingError(f"ring_all_reduce: ranks passed different tensors or ops ({detail})")


def ring_all_reduce(tensor: Tensor, op: str = "sum", group: dist.ProcessGroup | None = None, *,
                    check: bool = True, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> Tensor:
    """Sum (or average) ``tensor`` over all ranks of ``group``, in place; returns it.

    Every rank ends with bit-identical values. ``check=False`` skips the agreement on sizes
    (n − 1 small messages) for callers that agreed once already, such as the gradient
    buckets of parallel.trainer. A non-contiguous tensor is reduced through a contiguous
    copy and written back.
    """
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if not isinstance(tensor, Tensor):
        raise TypeError(f"ring_all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}; use 'sum'")
    backend = dist.get_backend(group)
    if backend == "gloo" and tensor.device.type != "cpu":
        raise ValueError(f"the gloo backend sends CPU tensors only; this tensor is on {tensor.device}")
    if backend == "nccl" and tensor.device.type != "cuda":
        raise ValueError(f"the nccl backend sends CUDA tensors only; this tensor is on {tensor.device}")
    rank, size, right, left = _peers(group)
    if check:
        _agree(tensor, op, group)
    if size == 1 or tensor.numel() == 0:
        return tensor

    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    chunks = torch.tensor_split(flat, size)
    # Every chunk is cut into the same number of pieces (sizes differ by at most one element),
    # so a piece's send and its matching receive always have the same size.
    longest = max(c.numel() for c in chunks)
    n_pieces = max(1, -(-longest * flat.element_size() // segment_bytes))
    pieces = [torch.tensor_split(c, n_pieces) for c in chunks]
    # A piece is in the reduce-scatter for n − 1 consecutive slots; so many buffers suffice.
    n_buffers = min(n_pieces, size - 1)
    buffers = [torch.empty(pieces[0][0].numel(), dtype=flat.dtype, device=flat.device) for _ in range(n_buffers)]
    steps = 2 * (size - 1)

    # A wavefront: at slot t, piece k takes its step t − k. Piece k + 1 runs one step behind
    # piece k, so the all-gather of early pieces overlaps the reduce-scatter of later ones.
    # A piece's next step is posted as soon as its current one is done (and added), so the
    # wire is busy while the next piece is being added. Every rank posts in the same order,
    # so the messages between two neighbours pair up.
    def post(k: int, step: int) -> tuple:
        if step < size - 1:  # reduce-scatter: send a partial sum, receive one to add
            dst = pieces[(rank - step - 1) % size][k]
            buf = buffers[k % n_buffers][: dst.numel()]
            return k, step, _exchange(pieces[(rank - step) % size][k], buf, right, left, group), dst, buf
        a = step - (size - 1)  # all-gather: pass a finished piece on, receive one straight into place
        return k, step, _exchange(pieces[(rank + 1 - a) % size][k], pieces[(rank - a) % size][k],
                                  right, left, group), None, None

    in_flight = [post(0, 0)]
    for slot in range(n_pieces + steps - 1):
        posted, in_flight = in_flight, []
        for k, step, requests, dst, buf in posted:
            _wait(requests)
            if dst is not None:
                dst.add_(buf)
                if step == size - 2 and op == "avg":  # this piece of the owned chunk is complete
                    dst.div_(size)
            if step + 1 < steps:
                in_flight.append(post(k, step + 1))
        if slot + 1 < n_pieces:  # the next piece joins one step behind
            in_flight.append(post(slot + 1, 0))

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
