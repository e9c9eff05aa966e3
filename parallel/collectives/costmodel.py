"""The α-β(-γ) cost model of our collectives: fitted from measurements, used to choose and to predict.

A message of m bytes between two ranks costs α + m·β: α is the fixed cost of a message (on
gloo over loopback mostly software: Python, the gloo pair, the kernel's TCP stack), β the
cost of a byte (the copies, 1/bandwidth). Adding m bytes costs m·γ. The time of every
algorithm in parallel/collectives/algorithms.py follows from counting its messages, bytes and additions:

  ring all-reduce            2(n−1)·α + 2(n−1)/n·N·β + (n−1)·piece·γ
  segmented ring             2·(α + (n−1)·s·max(m·β, (α + m·β)/2)) + m·γ   (s segments of m bytes
                             a chunk, two in flight: see below)
  recursive doubling         log₂p·(α + N·β + N·γ)                         (+ fold-in)
  halving-doubling           2·log₂p·α + 2(p−1)/p·N·β + (p−1)/p·N·γ       (+ fold-in)
  one-shot (direct)          α_d + (n−1)·N·β_d + (n−1)·N·γ
  two-shot (direct)          2·α_d + 2(n−1)/n·N·β_d + (n−1)/n·N·γ
  fold-in (n not 2^k)        2·(α + N·β) + N·γ: the n − p extra ranks hand their tensor to a
                             partner first and get the result back last (p = 2^⌊log₂n⌋)
  ring reduce-scatter        (n−1)·α + (n−1)/n·N·β + (n−1)·piece·γ
  ring all-gather            (n−1)·α + (n−1)/n·N·β

Two assumptions are worth saying. The direct algorithms post n − 1 messages at once, and
a step of theirs costs what it was measured to cost: `fit` times direct steps (the same bytes
cut in n − 1 messages, one to each other rank) next to the ring steps and fits them a line of
their own, α_d + β_d·(bytes sent). With 2 ranks a direct step is a ring step. Past the world
sizes measured, `choose` offers them only up to DIRECT_MAX_RANKS ranks. And the ring's chunks travel in
pieces of at most PIECE_BYTES (a chunk of N/n bytes in ⌈N/n / PIECE_BYTES⌉ equal pieces:
``ring_piece``), so adding one piece overlaps the transfer of the next: of each of its n − 1
reduce steps only one piece's addition is charged. The direct algorithms add whole
blocks after they have all arrived and are charged every addition. (Whether the ring's
additions really hide is for measurement to say: `plot` draws the model against the allreduce
benchmark's records.)

The segmented ring keeps two segment steps in flight, so a step's fixed cost overlaps the
other's transfer: each phase pays one α, then a step every max(m·β, (α + m·β)/2) (the wire's
time for one segment, or half a whole step's when α dominates), and only the last segment's
addition is charged. It sends the ring's bytes; what the model gives it over the ring is the
α of all but one step a phase and the smaller addition in the open.

Examples:
  python -m parallel.collectives.costmodel fit --world-sizes 2 --rounds 2          # a quick look: 2 ranks, about 10 s
  python -m parallel.collectives.costmodel fit --json /tmp/alphabeta.json          # measure and fit, W = 2, 3, 4
  python -m parallel.collectives.costmodel show                      # the fit auto reads, and its choices
  python -m parallel.collectives.costmodel show --fit /tmp/alphabeta.json           # the one you just made
  python -m parallel.collectives.costmodel plot docs/results/allreduce_gloo_w2.json --out /tmp/model.png
  python -m parallel.collectives.costmodel predict --compute-ms 12 --optimizer-ms 2 --json /tmp/predict.json
  python -m parallel.collectives.costmodel predict --compute-ms 12 --optimizer-ms 2 --fit /tmp/alphabeta.json
  python -m parallel.collectives.costmodel predict --validate docs/results/zero_gloo_w2.json   # compute from the record
(The fit auto reads is parallel/collectives/alphabeta_gloo.json, beside this file; show, plot and
predict use it unless given --fit, and say on stderr which fit they used.)
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import cli

ROOT = Path(__file__).resolve().parent.parent.parent
FIT_PATH = Path(__file__).resolve().parent / "alphabeta_gloo.json"
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
# Ties go to the earlier: at n = 2 one-shot is doubling step for step, and two-shot sends the
# ring's messages (in blocks, where the ring sends pieces).
ALL_REDUCE = ("one_shot", "two_shot", "doubling", "halving_doubling", "ring", "segmented_ring")
DIRECT = ("one_shot", "two_shot")
DIRECT_MAX_RANKS = 8  # a choice, not a measurement: see the module's docstring


@dataclass(frozen=True)
class Link:
    """α seconds per message, β seconds per byte, γ seconds per byte added. A direct step (a
    message to each of the n − 1 others at once) costs α_d + β_d·(bytes sent); without a
    fit of its own it costs what n − 1 messages would if their fixed costs overlapped, α + β·bytes."""

    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""
    alpha_direct: float | None = None
    beta_direct: float | None = None

    def direct(self) -> tuple[float, float]:
        """(α_d, β_d) of a direct step."""
        return (self.alpha if self.alpha_direct is None else self.alpha_direct,
                self.beta if self.beta_direct is None else self.beta_direct)


# ---------------------------------------------------------------------------
# Predicted times, in seconds, of N bytes over n ranks
# ---------------------------------------------------------------------------

def size_label(nbytes: int) -> str:
    """4 KiB, 64 MiB: how the tables and records name a message size."""
    return f"{nbytes >> 20} MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10} KiB"


PIECE_BYTES = 4 << 20  # parallel.dp.ring.DEFAULT_SEGMENT_BYTES (a test checks that they agree)


def ring_piece(n: int, nbytes: float) -> float:
    """The bytes of one of the ring's pieces: it cuts each chunk (N/n) into as many equal pieces
    as it takes to keep them at most PIECE_BYTES (``_pieces`` in parallel/dp/ring.py), so a chunk of 1.5
    pieces' worth travels as two of 0.75."""
    chunk = nbytes / n
    return chunk / max(1, math.ceil(chunk / PIECE_BYTES))


def _ring_adds(n: int, nbytes: float, link: Link) -> float:
    """The additions on the ring's critical path: one piece's in each of its n − 1 reduce steps
    (the other pieces' additions overlap the transfers of the pieces after them)."""
    return (n - 1) * ring_piece(n, nbytes) * link.gamma


def _pow2_below(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _fold(n: int, nbytes: float, link: Link) -> float:
    """The extra ranks' hand-in and hand-back when n is not a power of two."""
    return 0.0 if n == _pow2_below(n) else 2 * (link.alpha + nbytes * link.beta) + nbytes * link.gamma


def ring(n: int, nbytes: float, link: Link) -> float:
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes * link.beta + _ring_adds(n, nbytes, link)


SEGMENT_BYTES = 1 << 20  # parallel.collectives.algorithms.SEGMENT_BYTES (a test checks that they agree)


def ring_segments(n: int, nbytes: float) -> tuple[int, float]:
    """(segments a chunk, bytes a segment) of the segmented ring: at least two, at most
    SEGMENT_BYTES each (parallel.collectives.algorithms.segmented_ring)."""
    chunk = nbytes / n
    s = max(2, math.ceil(chunk / SEGMENT_BYTES))
    return s, chunk / s


def segmented_ring(n: int, nbytes: float, link: Link) -> float:
    if n == 1:
        return 0.0
    s, m = ring_segments(n, nbytes)
    step = max(m * link.beta, (link.alpha + m * link.beta) / 2)  # two in flight
    return 2 * (link.alpha + (n - 1) * s * step) + m * link.gamma


def doubling(n: int, nbytes: float, link: Link) -> float:
    p = _pow2_below(n)
    steps = p.bit_length() - 1
    return steps * (link.alpha + nbytes * (link.beta + link.gamma)) + _fold(n, nbytes, link)


def halving_doubling(n: int, nbytes: float, link: Link) -> float:
    p = _pow2_below(n)
    steps = p.bit_length() - 1
    return (2 * steps * link.alpha + 2 * (p - 1) / p * nbytes * link.beta + (p - 1) / p * nbytes * link.gamma
            + _fold(n, nbytes, link))


def one_shot(n: int, nbytes: float, link: Link) -> float:
    alpha, beta = link.direct()
    return alpha + (n - 1) * nbytes * (beta + link.gamma) if n > 1 else 0.0


def two_shot(n: int, nbytes: float, link: Link) -> float:
    if n == 1:
        return 0.0
    alpha, beta = link.direct()
    return 2 * alpha + 2 * (n - 1) / n * nbytes * beta + (n - 1) / n * nbytes * link.gamma


def reduce_scatter(n: int, nbytes: float, link: Link) -> float:
    if n == 1:
        return 0.0
    return (n - 1) * link.alpha + (n - 1) / n * nbytes * link.beta + _ring_adds(n, nbytes, link)


def all_gather(n: int, nbytes: float, link: Link) -> float:
    return (n - 1) * link.alpha + (n - 1) / n * nbytes * link.beta if n > 1 else 0.0


PREDICT = {"ring": ring, "doubling": doubling, "halving_doubling": halving_doubling, "one_shot": one_shot,
           "two_shot": two_shot, "segmented_ring": segmented_ring}


def candidates(n: int) -> tuple[str, ...]:
    """The algorithms offered at n ranks: the direct ones only up to DIRECT_MAX_RANKS."""
    return ALL_REDUCE if n <= DIRECT_MAX_RANKS else tuple(a for a in ALL_REDUCE if a not in DIRECT)


def choose(n: int, nbytes: int, link: Link) -> str:
    """The all-reduce algorithm the model predicts fastest (ties go to the earlier in ALL_REDUCE)."""
    return min(candidates(n), key=lambda a: PREDICT[a](n, nbytes, link))


def best(n: int, nbytes: float, link: Link) -> float:
    """The predicted time of the algorithm ``choose`` picks."""
    return PREDICT[choose(n, nbytes, link)](n, nbytes, link)


# ---------------------------------------------------------------------------
# The fitted links of this machine
# ---------------------------------------------------------------------------

# The fit ``auto`` reads is configuration, kept beside the code (FIT_PATH: written by `fit --json`,
# its command inside). Used only if that file is missing: a rounded 2-rank fit of the 2-core
# machine, so that "auto" still chooses sensibly.
_FALLBACK = Link(alpha=150e-6, beta=1.0e-9, gamma=0.25e-9, name="gloo (fallback)")
_links: dict[Path, dict[int, Link]] = {}


def fitted_links(path: Path = FIT_PATH) -> dict[int, Link]:
    """World size -> fitted Link, from the fit in ``path`` (each file read once per process)."""
    path = Path(path)
    if path not in _links:
        try:
            record = json.loads(path.read_text())
            _links[path] = {int(w): Link(f["alpha_s"], f["beta_s_per_byte"], f["gamma_s_per_byte"],
                                         f"gloo, {w} ranks", f.get("alpha_direct_s"), f.get("beta_direct_s_per_byte"))
                            for w, f in record["fits"].items()}
        except (OSError, KeyError, ValueError):
            _links[path] = {}
    return _links[path]


def link_for(n: int, fit: Path = FIT_PATH) -> Link:
    """The fit in ``fit`` for n ranks, or for the nearest measured world size (every rank gets
    the same)."""
    links = fitted_links(fit)
    if not links:
        return _FALLBACK
    return links[min(links, key=lambda w: (abs(w - n), w))]


# ---------------------------------------------------------------------------
# Measuring and fitting (run with `fit`)
# ---------------------------------------------------------------------------

def _p2p_job(sizes: list[int], rounds: int) -> dict:
    """On every rank: time one ring step (p2p.exchange: send right, receive left) per size;
    with 3 ranks or more, one direct step too (the same bytes, cut in n − 1 equal messages, one
    to each other rank, posted at once as one-shot and two-shot post theirs: p2p.post, peers
    in a rotated order); and the addition of a received piece. Returns this rank's samples, µs
    per call."""
    import torch
    import torch.distributed as dist

    from parallel.common.harness import warm_up
    from parallel.common.p2p import exchange, peers, post, wait
    from parallel.common.threads import io_thread_nices
    from timing import measure

    rank, n, right, left = peers(None)
    out: dict = {"steps": {}, "direct": {}, "add": {}}
    warm_up(right, left)
    others = [(rank + i) % n for i in range(1, n)]
    bufs = {nbytes: (torch.zeros(nbytes // 4), torch.empty(nbytes // 4)) for nbytes in sizes}
    fns = {}
    for nbytes, (send, recv) in bufs.items():
        fns[("steps", nbytes)] = lambda s=send, r=recv: wait(exchange(s, r, right, left, None))
        if n > 2:
            block = nbytes // 4 // (n - 1)
            inbox = recv[: block * (n - 1)].view(n - 1, block)
            fns[("direct", nbytes)] = lambda s=send[:block], r=inbox: wait(
                post([(j, r[i]) for i, j in enumerate(others)], [(j, s) for j in others], None))
    # All sizes and both kinds of step interleaved round by round, so a burst of load from
    # elsewhere hits them alike instead of spoiling one. The same number of calls on every
    # rank: each is a message. A barrier starts every sample, as in the all-reduce benchmark
    # whose times the model predicts (parallel/collectives/bench.py): without it a rank's clock started
    # when it finished the previous sample, and the slowest rank's time also counted the skew.
    stats = measure(fns, rounds=rounds, warmup=2, number=4, order="shuffle", sync=dist.barrier)
    for (kind, nbytes), st in stats.items():
        out[kind][nbytes] = st.samples
    # The additions last: by now the receives have written every page of the buffers. An
    # untouched page reads as the kernel's shared zero page, from cache, and an add over it looks
    # several times faster than it is (measured here: γ at 3 ranks 0.053 ns/byte over untouched
    # pages, 0.140 after the receives).
    for nbytes, (send, recv) in bufs.items():
        out["add"][nbytes] = measure({"add": lambda s=send, r=recv: s.add_(r)}, rounds=5, warmup=1)["add"].median
    out["io_nices"] = io_thread_nices()
    dist.barrier()
    return out


def fit_line(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of t = α + β·m, each point weighted by 1/t: relative errors count, so the
    4 KiB points (latency) weigh as much as the 64 MiB ones (bandwidth)."""
    import numpy as np

    m = np.array([p[0] for p in points], dtype=float)
    t = np.array([p[1] for p in points], dtype=float)
    a = np.stack([1 / t, m / t], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a, np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


def _fit_steps(ranks: list[dict], kind: str) -> tuple[float, float, list[dict]]:
    """α, β and the points with their residuals, from every rank's samples of one kind of step."""
    points = []
    for nbytes in SIZES:  # per-call times: each sample timed 4 steps
        slowest = [max(s) for s in zip(*(r[kind][nbytes] for r in ranks))]  # a step ends with its last rank
        points.append((nbytes, statistics.median(slowest) * 1e-6))
    a, b = fit_line(points)
    return a, b, [{"bytes": m, "measured_us": t * 1e6, "fitted_us": (a + b * m) * 1e6,
                   "residual_pct": 100 * ((a + b * m) / t - 1)} for m, t in points]


def fit(world_sizes: list[int], rounds: int) -> dict:
    import torch

    from parallel.common.launch import launch
    from parallel.common.threads import io_nice
    from record_info import describe_device

    fits = {}
    for w in world_sizes:
        ranks = launch(_p2p_job, w, (SIZES, rounds), threads_per_rank=1, timeout_s=120, deadline_s=900)
        alpha, beta, points = _fit_steps(ranks, "steps")
        nices = Counter(v for r in ranks for v in r["io_nices"])
        adds = [(nbytes, max(r["add"][nbytes] for r in ranks) * 1e-6) for nbytes in SIZES]
        gamma = fit_line([a for a in adds if a[0] >= 1 << 20])[1]  # memory-bound sizes: in cache it is faster
        fits[str(w)] = {
            "alpha_s": alpha, "beta_s_per_byte": beta, "gamma_s_per_byte": gamma,
            "bandwidth_gbs": 1e-9 / beta, "add_gbs": 1e-9 / gamma, "points": points,
            "add_points": [{"bytes": m, "measured_us": t * 1e6} for m, t in adds],
            # how many of gloo's I/O threads, over all ranks, had each niceness (as in the
            # benchmarks' records: parallel/common/threads.py)
            "gloo_io_thread_nices": {str(v): nices[v] for v in sorted(nices, key=str)},
        }
        text = ""
        if w > 2:  # with 2 ranks a direct step is a ring step: one message each way
            alpha_d, beta_d, direct_points = _fit_steps(ranks, "direct")
            fits[str(w)].update({"alpha_direct_s": alpha_d, "beta_direct_s_per_byte": beta_d,
                                 "direct_points": direct_points})
            text = f"; direct steps: α_d = {alpha_d * 1e6:.1f} µs, β_d = {beta_d * 1e9:.3f} ns/byte"
        print(f"{w} ranks: α = {alpha * 1e6:.1f} µs, β = {beta * 1e9:.3f} ns/byte ({1e-9 / beta:.2f} GB/s), "
              f"γ = {gamma * 1e9:.3f} ns/byte{text}", flush=True)
    return {"benchmark": "alphabeta", "device": describe_device("cpu"), "torch": torch.__version__,
            "backend": "gloo", "threads_per_rank": 1, "gloo_io_nice": io_nice(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.collectives.costmodel " + " ".join(sys.argv[1:]),
            "method": "per size: median over rounds (all sizes interleaved in each round; a barrier, then 4 timed "
                      "steps, per sample) of the slowest rank's time of one p2p.exchange step "
                      "(send right, receive left: on gloo irecv, then isend); "
                      "t = α + β·m fitted by least squares weighted by 1/t; from 3 ranks, direct steps "
                      "(m bytes in n − 1 equal messages, one to each other rank, at once; interleaved with the "
                      "ring steps) fitted the same way, t = α_d + β_d·m; "
                      "γ: slope of the time of add_ over the sizes from 1 MiB (out of cache); "
                      "0.5 s of small exchanges first (a fresh gloo pair is slow for its first messages)",
            "fits": fits}


def _io_text(setting: int | str | None) -> str:
    """A record's gloo_io_nice in words ("idle" and "batch" are parallel/common/threads.py's policies)."""
    from parallel.common.threads import POLICIES

    if setting in (None, 0):
        return "left alone"
    return f"under {POLICIES[setting]}" if setting in POLICIES else f"at niceness {setting}"


def fit_table(record: dict) -> str:
    rows = ["| ranks | α µs | β ns/byte (GB/s) | γ ns/byte | worst residual | residuals 4 KiB … 64 MiB "
            "| direct step: α_d µs | β_d ns/byte | worst residual |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for w, f in record["fits"].items():
        res = [p["residual_pct"] for p in f["points"]]
        if "alpha_direct_s" in f:
            direct = (f"| {f['alpha_direct_s'] * 1e6:.0f} | {f['beta_direct_s_per_byte'] * 1e9:.3f} "
                      f"| {max((p['residual_pct'] for p in f['direct_points']), key=abs):+.0f}% |")
        else:  # with 2 ranks a direct step is a ring step; a record may hold no direct fit
            direct = "| = α | = β | — |" if w == "2" else "| — | — | — |"
        rows.append(f"| {w} | {f['alpha_s'] * 1e6:.0f} | {f['beta_s_per_byte'] * 1e9:.3f} ({f['bandwidth_gbs']:.2f}) "
                    f"| {f['gamma_s_per_byte'] * 1e9:.3f} | {max(res, key=abs):+.0f}% | "
                    + " ".join(f"{r:+.0f}%" for r in res) + " " + direct)
    rows.append(f"\nOne step = one p2p.exchange between neighbours; a direct step sends the same bytes to the "
                f"n − 1 others at once (with 2 ranks it is a ring step); slowest rank, median; on gloo, "
                f"{record['threads_per_rank']} thread per rank"
                + (f", gloo's I/O threads {_io_text(record['gloo_io_nice'])}" if "gloo_io_nice" in record else "")
                + f", {record['device']}, torch {record['torch']}, "
                f"{record['date']}: `{record['command']}`")
    return "\n".join(rows)


# ---------------------------------------------------------------------------
# Past this machine: step time, communication share and scaling efficiency
# ---------------------------------------------------------------------------

# Documented GPU fabrics (NVIDIA's H100 datasheet, ConnectX-7 / Quantum-2 NDR specifications, DGX H100
# user guide, and NVIDIA/nccl). α: NCCL's own tuning model
# (src/graph/tuning.cc) charges a ring step 1.9 µs on NVLink and 4.0 µs over the network
# (protocol LL128). β: NVLink 4 on an H100 SXM is 900 GB/s in both directions together, 450 GB/s
# each way; InfiniBand NDR is 400 Gb/s = 50 GB/s per port, one port per GPU in a DGX H100.
# γ: an add reads 8 and writes 4 bytes per float, at the H100's 3.35 TB/s of HBM3.
NVLINK = Link(alpha=1.9e-6, beta=1 / 450e9, gamma=3 / 3.35e12, name="NVLink 4 (H100 SXM)")
INFINIBAND = Link(alpha=4.0e-6, beta=1 / 50e9, gamma=3 / 3.35e12, name="InfiniBand NDR, one 400 Gb/s port per GPU")
GPUS_PER_NODE = 8


def fabric(kind: str, n: int, fit: Path = FIT_PATH) -> Link:
    """The link a collective over n ranks is limited by: NVLink inside an 8-GPU node, the network
    beyond it (a flat ring over the slowest link); on gloo, this machine's fit (the file ``fit``)."""
    if kind == "gloo":
        return link_for(n, fit)
    return NVLINK if n <= GPUS_PER_NODE else INFINIBAND


def mlp_parameters(hidden: list[int], features: int = 32, classes: int = 10) -> int:
    sizes = [features, *hidden, classes]
    return sum(a * b + b for a, b in zip(sizes, sizes[1:]))


def project(kind: str, n: int, params: int, compute_s: float, optimizer_s: float, hidden: list[int],
            batch_per_rank: int, tp: int = GPUS_PER_NODE, fit: Path = FIT_PATH) -> dict:
    """Predicted step of DP, DP + ZeRO-1 and DP × TP at n ranks (weak scaling: every rank's
    computation is the same at every n). Communication is not overlapped with computation."""
    grad = 4 * params  # float32 gradients
    link = fabric(kind, n, fit)
    out = {}
    out["dp"] = (compute_s, best(n, grad, link), 8 * params)
    # ZeRO-1: reduce-scatter + all-gather (the ring's bytes), Adam on 1/n of the parameters
    zero_comm = reduce_scatter(n, grad, link) + all_gather(n, grad, link)
    out["dp+zero"] = (compute_s - optimizer_s + optimizer_s / n, zero_comm, 8 * params / n)
    # DP × TP: t ranks of one node split every layer (Megatron: column- then row-parallel, one
    # all-reduce of the activations per pair forward and one backward); each replica of t ranks
    # takes t ranks' samples; the replicas all-reduce their 1/t of the gradient over the network.
    t = min(tp, n)
    tp_link = fabric(kind, t, fit)
    activations = 4 * batch_per_rank * t * max(hidden)
    tp_comm = 2 * math.ceil(len(hidden) / 2) * best(t, activations, tp_link)
    replicas = n // t
    dp_link = fabric(kind, n, fit) if replicas > 1 else tp_link
    dp_comm = best(replicas, grad / t, dp_link) if replicas > 1 else 0.0
    out["dp×tp"] = (compute_s, tp_comm + dp_comm, 8 * params / t)
    return {name: {"compute_s": c, "comm_s": m, "step_s": c + m, "comm_share": m / (c + m),
                   "efficiency": compute_s / (c + m), "optimizer_state_bytes": mem, "tp": t if name == "dp×tp" else 1}
            for name, (c, m, mem) in out.items()}


ZERO_VARIANTS = ("compute only", "adam step alone", "dp", "zero")


def _zero_record(path: str) -> dict:
    """A record of ``distributed.py --bench zero``, or one line saying what is wrong with it."""
    record = cli.read_record(path, "--validate", "zero", "distributed.py --bench zero",
                             keys=("results", "world_size", "parameters", "hidden", "batch_per_rank"))
    try:
        variants = {r["variant"]: r["step_us"] for r in record["results"]}
    except (TypeError, KeyError):
        variants = {}
    missing = [v for v in ZERO_VARIANTS if v not in variants]
    if missing:
        raise cli.UserError(f"--validate {path}: no step time for {', '.join(missing)} (a damaged record?)")
    return record


def predict(args: argparse.Namespace, records: list[dict] = ()) -> dict:
    """The projections, and each of ``records`` (zero benchmark records, read by _zero_record)
    predicted and compared with what it measured."""
    params = mlp_parameters(args.hidden)
    ranks = [2 ** k for k in range(1, 11)]
    rows = []
    for kind in ("gloo", "nvlink+infiniband"):
        compute = args.compute_ms * 1e-3 if kind == "gloo" else args.gpu_compute_ms * 1e-3
        opt = args.optimizer_ms * 1e-3 if kind == "gloo" else args.optimizer_ms * 1e-3 * compute / (
            args.compute_ms * 1e-3)
        for n in ranks:
            for strategy, r in project(kind.split("+")[0], n, params, compute, opt, args.hidden,
                                       args.batch_per_rank, fit=args.fit).items():
                rows.append({"fabric": kind, "ranks": n, "strategy": strategy, **r})
    validation = []
    for path, rec in zip(args.validate or [], records):
        by = {r["variant"]: r for r in rec["results"]}
        n = rec["world_size"]
        compute, adam = by["compute only"]["step_us"] * 1e-6, by["adam step alone"]["step_us"] * 1e-6
        for strategy, variant in (("dp", "dp"), ("dp+zero", "zero")):
            # the measured computation of this run, plus the model's communication
            r = project("gloo", n, rec["parameters"], compute, adam, rec["hidden"], rec["batch_per_rank"],
                        fit=args.fit)[strategy]
            measured = by[variant]["step_us"] * 1e-6
            in_step = by[variant].get("allreduce_in_step_us_by_rank")  # dp only, where the record holds it
            waiting = by[variant].get("allreduce_in_step_waiting_us_by_rank")  # and its part spent waiting
            validation.append({"ranks": n, "strategy": strategy, "predicted_s": r["step_s"], "measured_s": measured,
                               "error_pct": 100 * (r["step_s"] / measured - 1), "model_comm_s": r["comm_s"],
                               **({"allreduce_in_step_s": [t * 1e-6 for t in in_step]} if in_step else {}),
                               **({"allreduce_waiting_s": [t * 1e-6 for t in waiting]} if waiting else {}),
                               "source": path})
    return {"benchmark": "predict", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.collectives.costmodel " + " ".join(sys.argv[1:]),
            "model": {"hidden": args.hidden, "parameters": params, "batch_per_rank": args.batch_per_rank,
                      "compute_ms": args.compute_ms, "gpu_compute_ms": args.gpu_compute_ms,
                      "optimizer_ms": args.optimizer_ms},
            "fit": _shown(args.fit),
            "links": {"gloo": {str(w): vars(link) for w, link in fitted_links(args.fit).items()},
                      "nvlink": vars(NVLINK), "infiniband": vars(INFINIBAND)},
            "projections": rows, "validation": validation}


def predict_table(record: dict) -> str:
    strategies = list(dict.fromkeys(r["strategy"] for r in record["projections"]))
    rows = ["| fabric | ranks | " + " | ".join(f"{s} step ms (comm share, efficiency)" for s in strategies) + " |",
            "|---|---:|" + "---:|" * len(strategies)]
    by = {(r["fabric"], r["ranks"], r["strategy"]): r for r in record["projections"]}
    for fab, n in dict.fromkeys((r["fabric"], r["ranks"]) for r in record["projections"]):
        if n not in (2, 4, 8, 16, 64, 1024):
            continue
        cells = []
        for s in strategies:
            r = by[(fab, n, s)]
            cells.append(f"{r['step_s'] * 1e3:.2f} ({100 * r['comm_share']:.0f}%, {100 * r['efficiency']:.0f}%)")
        rows.append(f"| {fab} | {n} | " + " | ".join(cells) + " |")
    m = record["model"]
    fit = f"gloo: the fit in {record['fit']}; " if "fit" in record else ""  # the α-β fit the gloo rows used
    rows.append(f"\nMLP {m['hidden']} ({m['parameters']:,} parameters), {m['batch_per_rank']} samples per rank; "
                f"computation {m['compute_ms']:.1f} ms per step on this CPU (Adam {m['optimizer_ms']:.1f} ms of it), "
                f"{m['gpu_compute_ms']} ms assumed on a GPU; {fit}"
                f"{record['date']}: `{record['command']}`")
    if record["validation"]:
        rows.append("\n| ranks (gloo, here) | strategy | predicted ms | measured ms | error "
                    "| model's communication ms | all-reduce inside the step ms (ranks' means, min–max) "
                    "| of which waiting for the last rank to arrive ms |")
        rows.append("|---:|---|---:|---:|---:|---:|---:|---:|")
        for v in record["validation"]:
            comm = f"{v['model_comm_s'] * 1e3:.2f}" if "model_comm_s" in v else "—"
            inside, waiting = (f"{min(v[k]) * 1e3:.2f}–{max(v[k]) * 1e3:.2f}" if k in v else "—"
                               for k in ("allreduce_in_step_s", "allreduce_waiting_s"))
            rows.append(f"| {v['ranks']} | {v['strategy']} | {v['predicted_s'] * 1e3:.2f} "
                        f"| {v['measured_s'] * 1e3:.2f} | {v['error_pct']:+.0f}% | {comm} | {inside} | {waiting} |")
    return "\n".join(rows)


def plot_predict(record: dict, path: str) -> None:
    from record_info import pyplot, save_figure

    plt = pyplot()
    fabrics = list(dict.fromkeys(r["fabric"] for r in record["projections"]))
    fig, axes = plt.subplots(1, len(fabrics), figsize=(5 * len(fabrics), 3.4), sharey=True)
    for ax, fab in zip(axes, fabrics):
        rows = [r for r in record["projections"] if r["fabric"] == fab]
        for strategy in dict.fromkeys(r["strategy"] for r in rows):
            pts = [r for r in rows if r["strategy"] == strategy]
            ax.plot([r["ranks"] for r in pts], [100 * r["efficiency"] for r in pts], marker="o", label=strategy)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("ranks")
        ax.set_title(fab, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("scaling efficiency (%)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)  # the command in the file: docs/records.py redraws it from there


def plot_model(records: list[dict], path: str, fit: Path = FIT_PATH) -> None:
    """Model (lines, from the fit in ``fit``) against measurement (markers): one panel per world size."""
    from record_info import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, len(records), figsize=(4.2 * len(records), 3.6), sharey=True, squeeze=False)
    colours = {"ring": "tab:blue", "doubling": "tab:orange", "halving_doubling": "tab:green",
               "one_shot": "tab:red", "two_shot": "tab:purple", "segmented_ring": "tab:brown",
               "dist.all_reduce": "black"}
    for ax, record in zip(axes[0], records):
        n = record["world_size"]
        link = link_for(n, fit)
        sizes = sorted({r["bytes"] for r in record["results"]})
        for algorithm, colour in colours.items():
            measured = [r for r in record["results"] if r["variant"] == algorithm]
            ours = algorithm in PREDICT
            ax.plot([r["bytes"] for r in measured], [r["time_us"] for r in measured], "o" if ours else "x",
                    color=colour, label=algorithm.replace("_", "-") if ours else algorithm)
            if algorithm in PREDICT:  # the model's line, in the same colour
                ax.plot(sizes, [PREDICT[algorithm](n, m, link) * 1e6 for m in sizes], "-", color=colour, alpha=0.7)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("bytes")
        ax.set_title(f"{n} ranks, {record['device']}", fontsize=9)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("µs per all-reduce")
    axes[0][0].legend(fontsize=6)
    fig.suptitle("dots: measured; lines: the cost model's prediction, from the fit", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)  # with this command inside: docs/records.py draws it again


def model_table(record: dict) -> str:
    """Predicted against measured time of each algorithm, from an allreduce benchmark record."""
    n, link = record["world_size"], link_for(record["world_size"])
    rows = ["| size | " + " | ".join(f"{a.replace('_', '-')} model / measured µs" for a in ALL_REDUCE) + " |",
            "|---:|" + "---:|" * len(ALL_REDUCE)]
    by = {(r["bytes"], r["variant"]): r for r in record["results"]}
    for m in sorted({r["bytes"] for r in record["results"]}):
        rows.append(f"| {size_label(m)} | " + " | ".join(
            f"{PREDICT[a](n, m, link) * 1e6:.0f} / " + (f"{by[(m, a)]['time_us']:.0f}" if (m, a) in by else "—")
            for a in ALL_REDUCE) + " |")
    rows.append(f"\n{n} ranks; model: the fit in {_shown(FIT_PATH)} for {link.name}; measured: "
                f"`{record['command']}` ({record['date']})")
    return "\n".join(rows)


RENDERERS = {"alphabeta": fit_table, "model": model_table, "predict": predict_table}


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    f = cli.command(sub, "fit", __doc__, "measure point-to-point steps and fit α, β, γ")
    f.add_argument("--world-sizes", default="2,3,4", help="comma-separated, each at least 2")
    f.add_argument("--rounds", type=cli.positive(int), default=15)
    f.add_argument("--json", metavar="PATH", help="write the fit and its residuals here")
    sh = cli.command(sub, "show", __doc__, "print a fit (default: the one auto reads) and the algorithm it chooses")
    pl = cli.command(sub, "plot", __doc__, "draw the model against allreduce benchmark records (needs matplotlib)")
    pl.add_argument("records", nargs="+", help="JSON written by distributed.py --bench allreduce")
    pl.add_argument("--out", required=True, metavar="PNG")
    pr = cli.command(sub, "predict", __doc__, "project step time and scaling of DP, DP + ZeRO, DP × TP to 1024 ranks")
    pr.add_argument("--hidden", default="1024,1024", help="hidden widths of the MLP (32 features in, 10 out)")
    pr.add_argument("--batch-per-rank", type=cli.positive(int), default=128)
    pr.add_argument("--compute-ms", type=cli.positive(),
                    help="measured computation of one step on one rank here (forward, backward, Adam); "
                         "default: 'compute only' of the first --validate record")
    pr.add_argument("--optimizer-ms", type=cli.positive(allow_zero=True),
                    help="the part of it that is Adam's step; default: 'adam step alone' of that record")
    pr.add_argument("--gpu-compute-ms", type=cli.positive(), default=1.0, help="the same step's computation on a GPU")
    pr.add_argument("--validate", nargs="*", metavar="JSON", help="zero benchmark records to check predictions against")
    pr.add_argument("--json", metavar="PATH")
    pr.add_argument("--plot", metavar="PATH", help="scaling efficiency against ranks (needs matplotlib)")
    for sp in (sh, pl, pr):
        sp.add_argument("--fit", metavar="JSON", type=Path, default=FIT_PATH,
                        help=f"the α-β fit to use, as `fit --json` writes it (default: {_shown(FIT_PATH)}, "
                             "the one auto reads)")
    args = parser.parse_args(argv)
    if args.command != "fit":
        _check_fit(args.fit)
    if args.command == "fit":
        try:
            sizes = [int(s) for s in args.world_sizes.split(",")]
        except ValueError:
            parser.error(f"--world-sizes takes integers separated by commas, got {args.world_sizes!r}")
        if min(sizes) < 2:
            parser.error("every world size must be at least 2 (a fit needs a peer)")
        if len(set(sizes)) < len(sizes):
            parser.error(f"--world-sizes {args.world_sizes}: each world size once (the fit keeps one line per size)")
        json_path = cli.check_output(args.json, "--json")  # before minutes of measuring, not after
        record = fit(sizes, args.rounds)
        return cli.publish(fit_table(record), [(json_path, cli.json_writer(record))])
    elif args.command == "predict":
        try:
            args.hidden = [int(h) for h in args.hidden.split(",")]
        except ValueError:
            parser.error(f"--hidden takes widths separated by commas, got {args.hidden!r}")
        if min(args.hidden) < 1:
            parser.error(f"--hidden: every width must be at least 1, got {args.hidden}")
        # before anything is computed
        json_path, plot_path = cli.check_output(args.json, "--json"), cli.check_plot(args.plot, "--plot")
        records = [_zero_record(path) for path in args.validate or []]
        if args.compute_ms is None or args.optimizer_ms is None:
            if not records:
                missing = [f for f, v in (("--compute-ms", args.compute_ms), ("--optimizer-ms", args.optimizer_ms))
                           if v is None]
                parser.error(f"{' and '.join(missing)} {'are' if len(missing) > 1 else 'is'} needed (or a "
                             f"--validate record to take {'them' if len(missing) > 1 else 'it'} from)")
            first = {r["variant"]: r for r in records[0]["results"]}
            if args.compute_ms is None:
                args.compute_ms = first["compute only"]["step_us"] / 1e3
            if args.optimizer_ms is None:
                args.optimizer_ms = first["adam step alone"]["step_us"] / 1e3
        if args.optimizer_ms >= args.compute_ms:
            parser.error(f"--optimizer-ms {args.optimizer_ms:g} is the part of --compute-ms {args.compute_ms:g} that "
                         "is Adam's step: it must be smaller")
        _say_fit(args.fit)
        record = predict(args, records)
        return cli.publish(predict_table(record), [(json_path, cli.json_writer(record)),
                                                   (plot_path, lambda p: plot_predict(record, p))])
    elif args.command == "plot":
        records = [cli.read_record(p, "plot", "allreduce", "distributed.py --bench allreduce",
                                   keys=("world_size", "results")) for p in args.records]
        cli.check_plot(args.out, "--out")
        _say_fit(args.fit)
        plot_model(records, args.out, args.fit)
    elif args.command == "show":
        _say_fit(args.fit)
        print(fit_table(_check_fit(args.fit)))
        for w in sorted(fitted_links(args.fit)):
            print(f"{w} ranks: " + ", ".join(f"{s >> 10} KiB→{choose(w, s, link_for(w, args.fit))}" for s in SIZES))
    return 0


def _shown(path: Path) -> str:
    """A path as the user would type it: relative to the repository where it lies inside it."""
    path = Path(path).resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _say_fit(path: Path) -> None:
    """Which fit the numbers below come from (on stderr: stdout carries the table)."""
    print(f"using the fit in {_shown(path)}", file=sys.stderr, flush=True)


def _check_fit(path: Path) -> dict:
    """The fit record at ``path``, or one line saying what is wrong with it."""
    if Path(path).resolve() == FIT_PATH and not FIT_PATH.exists():
        raise cli.UserError(f"{_shown(FIT_PATH)} is missing: git checkout it, or measure a new one with "
                            f"python -m parallel.collectives.costmodel fit --json {_shown(FIT_PATH)}")
    record = cli.read_record(str(path), "--fit", "alphabeta", "python -m parallel.collectives.costmodel fit",
                             keys=("fits", "threads_per_rank", "device", "torch", "date", "command"))
    if not fitted_links(Path(path)):
        raise cli.UserError(f"--fit {path}: its fits cannot be read (damaged, or written by another version)")
    return record


if __name__ == "__main__":
    cli.run(main)
