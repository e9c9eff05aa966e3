"""All-reduce by recursive doubling, halving-doubling, one-shot, two-shot or a segmented ring, and
an entry point that picks by size.

The ring (parallel/dp/ring.py) sends the fewest bytes but takes 2(n − 1) steps: for small
tensors each step's fixed cost α dominates. These take log₂ of that:

  recursive doubling   log₂p steps; at step k rank r swaps its whole tensor with r XOR 2ᵏ and
                       both add. After step k every block of 2ᵏ⁺¹ ranks holds the same partial
                       sum. Few messages, but each carries all N bytes.
  halving-doubling     (Rabenseifner) reduce-scatter by recursive halving: at each step keep
                       half of the current range, send the other half to the partner, add what
                       comes back; after log₂p steps rank r owns block r, complete. Then an
                       all-gather by recursive doubling. 2·log₂p steps, and the ring's bytes.

When n is not a power of two, p = 2^⌊log₂n⌋ and the n − p extra ranks fold in: extra rank
p + i hands its tensor to rank i before the exchanges and gets the result back after them.

Bit-identical results on every rank: floating-point addition is commutative except for which
NaN's payload survives (x86 keeps the first operand's), so both partners compute
``lower rank's operand + higher rank's operand``, the same expression on the same bits. In
halving-doubling one rank finishes each element and the others only copy it. ``avg``
divides the same bits by the same n everywhere.

Both need a partner per step. With every pair of ranks connected (gloo opens a socket per
pair; NVSwitch connects every GPU of a node to every other), a rank can also talk to all the
others at once, and two "direct" algorithms take one or two steps whatever n is:

  one-shot             every rank sends its whole tensor to each of the others and adds the n
                       tensors itself, in rank order: one step, but (n − 1)·N bytes sent.
  two-shot             a direct reduce-scatter (rank r receives block r from each of the others
                       and adds the n of them in rank order), then a direct all-gather (rank r
                       sends its finished block to each of the others): two steps, and the
                       ring's 2(n − 1)/n·N bytes.

Bit-identical results on every rank: in two-shot one rank finishes each block and the others
copy it. In one-shot every rank computes ((t₀ + t₁) + t₂) + … with the same operands in the
same order, so the same bits come out everywhere, NaN payloads included.

The ring itself can be scheduled another way. ``ring`` (parallel/dp/ring.py) sends each step's
chunk as pieces of up to 4 MiB, waits for a whole piece, adds it, and lets the all-gather of
early pieces overlap the reduce-scatter of later ones. gloo's own all_reduce (``ring`` in
gloo/allreduce.cc) runs the same steps on another schedule, and so does

  segmented ring       every chunk in s ≥ 2 segments of at most SEGMENT_BYTES; the reduce-scatter's
                       (n − 1)·s segment steps run with two in flight: segment i is received
                       into one of two scratch buffers and added while segment i + 1 is on the
                       wire, then segment i + 2 is posted. The all-gather does the same once the
                       reduce-scatter is done. The ring's bytes and additions, in the ring's
                       order (its results are the ring's, bit for bit), in more, smaller messages.
                       Its loop also exists in C++ (parallel/collectives/cpp_loop.py), which ``auto`` runs
                       where the process has loaded it: the interpreter's share of a call,
                       between every pair of segments, is what 4 ranks on 2 cores could not afford.

Fixed cost: a call looks up a cached plan (ranks, partners, global ranks) for its group and
reuses a receive buffer per thread (``p2p.scratch``, as the ring does), instead of asking
torch.distributed and allocating on every call (``distributed.py --bench overhead`` measures the
difference).
"""

from __future__ import annotations

import weakref
from collections import deque
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from parallel.collectives import costmodel
from parallel.common import p2p
from parallel.common.p2p import OPS, RingError, agree, exchange, post, scratch, wait
from parallel.dp import ring
from parallel.dp.ring import ring_all_reduce

ALGORITHMS = ("auto", "ring", "doubling", "halving_doubling", "one_shot", "two_shot", "segmented_ring")
# The segmented ring's largest segment (parallel/collectives/costmodel.py models the same):
# gloo's own cap. The allreduce benchmark times 2 and 8 MiB segments beside it (the segment
# table in its output).
SEGMENT_BYTES = 1 << 20
# On gloo the segmented ring posts straight to the process group (no Python wrapper per message)
# and keeps a scratch of its own. The allreduce benchmark times the alternative beside it
# (through dist.irecv / dist.isend, p2p.post, with the scratch the other algorithms share);
# only the benchmark turns this off.
SEGMENTED_DIRECT = True

__all__ = ["ALGORITHMS", "RingError", "all_reduce", "choose"]


@dataclass(frozen=True)
class Plan:
    rank: int
    size: int
    p: int                  # the largest power of two <= size
    glob: tuple[int, ...]   # group rank -> global rank
    backend: str


# Weak keys: a cached plan must not keep its group alive. A group that outlived
# destroy_process_group() kept gloo's worker threads running into interpreter shutdown, where
# one of them, freeing a finished request, took the GIL and aborted the process ("terminate
# called without an active exception"; parallel/common/launch.py, ``_leave``).
_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def group_plan(group: dist.ProcessGroup | None) -> Plan:
    pg = group if group is not None else dist.group.WORLD
    plan = _plans.get(pg)
    if plan is not None:
        return plan
    size = dist.get_world_size(group)
    glob = tuple(range(size)) if group is None else tuple(dist.get_global_rank(group, r) for r in range(size))
    plan = _plans[pg] = Plan(dist.get_rank(group), size, 1 << (size.bit_length() - 1), glob,
                              dist.get_backend(group))
    return plan


def _add_ordered(mine: Tensor, theirs: Tensor, i_am_lower: bool) -> None:
    """mine ← lower rank's operand + higher rank's operand (the same expression on both partners)."""
    if i_am_lower:
        mine.add_(theirs)
    else:
        torch.add(theirs, mine, out=mine)


_choices: dict[tuple[int, int], str] = {}


def choose(numel: int, element_size: int, world_size: int, backend: str = "gloo") -> str:
    """The algorithm ``auto`` uses (the same on every rank). On gloo, the fastest by the cost
    model fitted on this machine (parallel/collectives/alphabeta_gloo.json).

    On NCCL, always the ring: a fixed rule, not a fit. The fit measures gloo over loopback on a
    CPU, whose α (tens of µs of software per message) says nothing about NVLink or InfiniBand,
    and no fit of our algorithms over NCCL exists here (the GPU machines have one GPU each, and
    NCCL refuses two ranks on one GPU). The ring sends the fewest bytes an all-reduce can send,
    which is what matters for gradient buckets of megabytes."""
    if backend == "nccl":
        return "ring"
    key = (numel * element_size, world_size)
    choice = _choices.get(key)
    if choice is None:  # a training loop asks about the same few sizes every step
        choice = _choices[key] = "ring" if world_size == 1 else costmodel.choose(
            world_size, key[0], costmodel.link_for(world_size))
    return choice


def _fold_in(flat: Tensor, plan: Plan, group) -> bool:
    """Extra ranks hand their tensor to a partner. Returns whether this rank sits the exchanges out."""
    extra = plan.size - plan.p
    if plan.rank >= plan.p:  # an extra rank: send, then wait for the result in _fold_out
        wait(exchange(flat, None, plan.glob[plan.rank - plan.p], plan.glob[plan.rank - plan.p], group))
        return True
    if plan.rank < extra:
        partner = plan.glob[plan.rank + plan.p]
        buf = scratch(flat.numel(), flat)
        wait(exchange(None, buf, partner, partner, group))
        _add_ordered(flat, buf, True)  # rank i < its extra rank p + i
    return False


def _fold_out(flat: Tensor, plan: Plan, group) -> None:
    extra = plan.size - plan.p
    if plan.rank >= plan.p:
        partner = plan.glob[plan.rank - plan.p]
        wait(exchange(None, flat, partner, partner, group))
    elif plan.rank < extra:
        partner = plan.glob[plan.rank + plan.p]
        wait(exchange(flat, None, partner, partner, group))


def doubling(flat: Tensor, plan: Plan, group) -> None:
    buf = scratch(flat.numel(), flat)
    d = 1
    while d < plan.p:
        partner = plan.rank ^ d
        wait(exchange(flat, buf, plan.glob[partner], plan.glob[partner], group))
        _add_ordered(flat, buf, plan.rank < partner)
        d <<= 1


def halving_doubling(flat: Tensor, plan: Plan, op: str, group) -> None:
    p, r, numel = plan.p, plan.rank, flat.numel()
    q, rem = divmod(numel, p)

    def start(block: int) -> int:  # p blocks whose sizes differ by at most one element
        return block * q + min(block, rem)

    lo, hi, d = 0, p, p >> 1
    buf = scratch((p // 2) * (q + 1), flat)  # the larger half: p/2 blocks of at most q + 1
    while d >= 1:  # reduce-scatter by recursive halving: keep one half, send the other
        partner, mid = r ^ d, (lo + hi) // 2
        keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
        mine = flat[start(keep[0]): start(keep[1])]
        recv = buf[: mine.numel()]
        wait(exchange(flat[start(give[0]): start(give[1])], recv, plan.glob[partner], plan.glob[partner], group))
        _add_ordered(mine, recv, r < partner)
        lo, hi = keep
        d >>= 1
    if op == "avg":  # block r is complete here and nowhere else: divide once, before it is copied
        flat[start(r): start(r + 1)].div_(plan.size)
    d = 1
    while d < p:  # all-gather by recursive doubling: swap owned ranges, received straight into place
        partner = r ^ d
        width = hi - lo
        other = (lo - width, lo) if r & d else (hi, hi + width)
        wait(exchange(flat[start(lo): start(hi)], flat[start(other[0]): start(other[1])],
                        plan.glob[partner], plan.glob[partner], group))
        lo, hi = min(lo, other[0]), max(hi, other[1])
        d <<= 1


def _sum_in_rank_order(terms: list[Tensor], out: Tensor, rank: int) -> None:
    """out ← ((terms[0] + terms[1]) + terms[2]) + …, written so that every rank runs the same
    expression on the same operands. terms[rank] is ``out`` itself; the others are receive
    buffers, which may be overwritten."""
    if rank == 0:  # out holds terms[0]: accumulate in place
        for t in terms[1:]:
            out.add_(t)
        return
    acc = terms[0]
    for t in terms[1:-1]:
        acc.add_(t)
    torch.add(acc, terms[-1], out=out)


def one_shot(flat: Tensor, plan: Plan, op: str, group) -> None:
    r, n, numel = plan.rank, plan.size, flat.numel()
    buf = scratch((n - 1) * numel, flat).view(n - 1, numel)
    others = [(r + i) % n for i in range(1, n)]  # peers in a rotated order: not all to rank 0 first
    slot = {j: buf[i] for i, j in enumerate(others)}
    wait(post([(plan.glob[j], slot[j]) for j in others], [(plan.glob[j], flat) for j in others], group))
    _sum_in_rank_order([flat if j == r else slot[j] for j in range(n)], flat, r)
    if op == "avg":
        flat.div_(n)


def two_shot(flat: Tensor, plan: Plan, op: str, group) -> None:
    r, n = plan.rank, plan.size
    blocks = torch.tensor_split(flat, n)  # sizes differ by at most one element
    mine = blocks[r]
    others = [(r + i) % n for i in range(1, n)]
    buf = scratch((n - 1) * mine.numel(), flat).view(n - 1, mine.numel())
    slot = {j: buf[i] for i, j in enumerate(others)}
    # reduce-scatter: block j goes to rank j; every other rank's block r comes here
    receives, sends = [(plan.glob[j], slot[j]) for j in others], [(plan.glob[j], blocks[j]) for j in others]
    if flat.is_cuda or not ring.LATE_SENDS:  # one batch on NCCL; or (the benchmark's alternative) a wait per send
        wait(post(receives, sends, group))
        sends = []
    else:  # on gloo, add while the sends finish (see ring._LateSends)
        receives = post(receives, [], group)
        sends = post([], sends, group)
        wait(receives)
    _sum_in_rank_order([mine if j == r else slot[j] for j in range(n)], mine, r)
    wait(sends)  # the all-gather receives into the blocks they read
    if op == "avg":
        mine.div_(n)
    # all-gather: the finished block to every other rank; theirs straight into place
    wait(post([(plan.glob[j], blocks[j]) for j in others], [(plan.glob[j], mine) for j in others], group))


def _in_pairs(count: int, start, finish) -> None:
    """Run ``count`` steps with two in flight: step i + 2 is posted once step i is finished."""
    pending: deque = deque()
    for i in range(count):
        if len(pending) == 2:
            finish(*pending.popleft())
        pending.append(start(i))
    while pending:
        finish(*pending.popleft())


def _segments_per_chunk(longest_chunk_bytes: int) -> int:
    """How many segments the segmented ring cuts every chunk into: at least two (one is added
    while the other travels), few enough that the longest chunk's are at most SEGMENT_BYTES."""
    return max(2, -(-longest_chunk_bytes // SEGMENT_BYTES))


def loop_in_cpp() -> bool:
    """Whether this process has loaded parallel/collectives/segmented_ring.cpp (parallel.collectives.cpp_loop.build()):
    then ``auto``'s segmented ring runs its loop there. Nothing here builds it."""
    return hasattr(torch.ops.dense_collectives, "segmented_ring_")


def segmented_ring(flat: Tensor, plan: Plan, op: str, group, cpp: bool = False) -> None:
    r, n = plan.rank, plan.size
    right, left = plan.glob[(r + 1) % n], plan.glob[(r - 1) % n]
    chunks = torch.tensor_split(flat, n)  # the ring's chunks; every chunk in the same number of segments
    s = _segments_per_chunk(chunks[0].numel() * flat.element_size())
    pg = group if group is not None else dist.group.WORLD
    if cpp:  # the loop below in C++: the same segments, messages, order and additions, the same bits
        space = scratch(2 * -(-chunks[0].numel() // s), flat, "segmented")  # two of the longest segment
        torch.ops.dense_collectives.segmented_ring_(flat, pg.group_name, s, op == "avg", space)
        return
    segments = [torch.tensor_split(c, s) for c in chunks]
    direct = SEGMENTED_DIRECT and not flat.is_cuda
    # two segments (segment 0 of chunk 0 is the longest), at most 2·SEGMENT_BYTES
    space = scratch(2 * segments[0][0].numel(), flat, "segmented" if direct else "").view(2, -1)
    steps = [(step, j) for step in range(n - 1) for j in range(s)]

    def post_segment(send: Tensor, recv: Tensor) -> tuple[list, list]:
        """A segment step's receives and sends: the receive posted first, the send waited for after the add."""
        if flat.is_cuda:  # NCCL: one batch, waited for as a whole
            return exchange(send, recv, right, left, group), []
        if not direct:
            return post([(left, recv)], [], group, message_bytes=0), post([], [(right, send)], group, message_bytes=0)
        p2p.SENT_BYTES["data"] += send.numel() * send.element_size()  # as post counts what it sends
        return ([pg.recv([recv], (r - 1) % n, 0)] if recv.numel() else [],  # group ranks, one message each
                [pg.send([send], (r + 1) % n, 0)] if send.numel() else [])

    def reduce_post(i: int) -> tuple:
        step, j = steps[i]  # as in the ring: send chunk r − step − 1, receive and add chunk r − step − 2
        mine = segments[(r - step - 2) % n][j]
        recv = space[i % 2][: mine.numel()]
        return (*post_segment(segments[(r - step - 1) % n][j], recv), mine, recv, step == n - 2)

    def reduce_finish(receives: list, sends: list, mine: Tensor, recv: Tensor, last: bool) -> None:
        wait(receives)
        torch.add(mine, recv, out=mine)  # own + partial, as the ring adds: the same bits
        if last and op == "avg":
            mine.div_(n)
        wait(sends)

    def gather_post(i: int) -> tuple:
        step, j = steps[i]  # pass chunk r − step on, receive chunk r − step − 1 in place
        return post_segment(segments[(r - step) % n][j], segments[(r - step - 1) % n][j])

    _in_pairs(len(steps), reduce_post, reduce_finish)
    _in_pairs(len(steps), gather_post, lambda receives, sends: (wait(receives), wait(sends)))


def validate(tensor: Tensor, op: str, algorithm: str) -> None:
    """The caller's mistakes, found before any process group is asked anything."""
    if not isinstance(tensor, Tensor):
        raise TypeError(f"all_reduce needs a torch.Tensor, got {type(tensor).__name__}")
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    if algorithm not in ALGORITHMS:
        raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    if op == "avg" and not (tensor.is_floating_point() or tensor.is_complex()):
        raise TypeError(f"op 'avg' needs a floating-point tensor, got {tensor.dtype}; use 'sum'")


def check_device(tensor: Tensor, backend: str) -> None:
    if backend == "gloo" and tensor.device.type != "cpu":
        raise ValueError(f"the gloo backend sends CPU tensors only; this tensor is on {tensor.device}")
    if backend == "nccl" and tensor.device.type != "cuda":
        raise ValueError(f"the nccl backend sends CUDA tensors only; this tensor is on {tensor.device}")


def all_reduce(tensor: Tensor, op: str = "sum", algorithm: str = "auto", group: dist.ProcessGroup | None = None,
               *, check: bool = True) -> Tensor:
    """Sum (or average) ``tensor`` over the ranks of ``group`` in place; returns it.

    ``algorithm="auto"`` picks by size from the fitted cost model on gloo (parallel/collectives/costmodel.py),
    and the ring on NCCL (``choose``);
    where it picks the segmented ring on CPU and this process has loaded the C++ loop
    (parallel.collectives.cpp_loop.build()), that loop runs it: the same messages and the same bits.
    "ring" is parallel.dp.ring.ring_all_reduce. Every rank ends with bit-identical values.
    ``check=True`` first makes the ranks agree on numel, dtype and op (a RingError on every
    rank if they differ); callers that agreed once already pass ``check=False``.
    """
    validate(tensor, op, algorithm)
    plan = group_plan(group)
    check_device(tensor, plan.backend)
    cpp = False
    if algorithm == "auto":
        algorithm = choose(tensor.numel(), tensor.element_size(), plan.size, plan.backend)
        cpp = algorithm == "segmented_ring" and tensor.device.type == "cpu" and loop_in_cpp()
    if algorithm == "ring":
        return ring_all_reduce(tensor, op, group, check=check)
    if check:
        agree("all_reduce", tensor, op, group)
    if plan.size == 1 or tensor.numel() == 0:
        return tensor
    flat = tensor.view(-1) if tensor.is_contiguous() else tensor.contiguous().view(-1)
    if algorithm == "one_shot":
        one_shot(flat, plan, op, group)
    elif algorithm == "two_shot":
        two_shot(flat, plan, op, group)
    elif algorithm == "segmented_ring":
        segmented_ring(flat, plan, op, group, cpp)
    else:  # the exchanges need a power of two: extra ranks fold in first and get the result last
        if not _fold_in(flat, plan, group):
            if algorithm == "doubling":
                doubling(flat, plan, group)
                if op == "avg":
                    flat.div_(plan.size)
            else:
                halving_doubling(flat, plan, op, group)
        _fold_out(flat, plan, group)
    if flat.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
        tensor.copy_(flat.view_as(tensor))
    return tensor
