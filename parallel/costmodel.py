"""The α-β(-γ) cost model of our collectives: fitted from measurements, used to choose and to predict.

A message of m bytes between two ranks costs α + m·β: α is the fixed cost of a message (on
gloo over loopback mostly software: Python, the gloo pair, the kernel's TCP stack), β the
cost of a byte (the copies, 1/bandwidth). Adding m bytes costs m·γ. The time of every
algorithm in parallel/collectives.py follows from counting its messages, bytes and additions:

  ring all-reduce            2(n−1)·α + 2(n−1)/n·N·β + (n−1)/n·N·γ
  recursive doubling         log₂p·(α + N·β + N·γ)                         (+ fold-in)
  halving-doubling           2·log₂p·α + 2(p−1)/p·N·β + (p−1)/p·N·γ       (+ fold-in)
  fold-in (n not 2^k)        2·(α + N·β) + N·γ: the n − p extra ranks hand their tensor to a
                             partner first and get the result back last (p = 2^⌊log₂n⌋)
  ring reduce-scatter        (n−1)·α + (n−1)/n·N·β + (n−1)/n·N·γ
  ring all-gather            (n−1)·α + (n−1)/n·N·β
  binomial-tree broadcast    ⌈log₂n⌉·(α + N·β)

Examples:
  python -m parallel.costmodel fit --json /tmp/alphabeta.json          # measure and fit, W = 2, 3, 4
  python -m parallel.costmodel show                                     # the committed fit and its choices
The committed fit comes from
  python -m parallel.costmodel fit --json docs/results/alphabeta_gloo.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FIT_PATH = ROOT / "docs" / "results" / "alphabeta_gloo.json"
SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
ALL_REDUCE = ("ring", "doubling", "halving_doubling")


@dataclass(frozen=True)
class Link:
    """α seconds per message, β seconds per byte, γ seconds per byte added."""

    alpha: float
    beta: float
    gamma: float = 0.0
    name: str = ""


# ---------------------------------------------------------------------------
# Predicted times, in seconds, of N bytes over n ranks
# ---------------------------------------------------------------------------

def _pow2_below(n: int) -> int:
    return 1 << (n.bit_length() - 1)


def _fold(n: int, nbytes: float, link: Link) -> float:
    """The extra ranks' hand-in and hand-back when n is not a power of two."""
    return 0.0 if n == _pow2_below(n) else 2 * (link.alpha + nbytes * link.beta) + nbytes * link.gamma


def ring(n: int, nbytes: float, link: Link) -> float:
    if n == 1:
        return 0.0
    return 2 * (n - 1) * link.alpha + 2 * (n - 1) / n * nbytes * link.beta + (n - 1) / n * nbytes * link.gamma


def doubling(n: int, nbytes: float, link: Link) -> float:
    p = _pow2_below(n)
    steps = p.bit_length() - 1
    return steps * (link.alpha + nbytes * (link.beta + link.gamma)) + _fold(n, nbytes, link)


def halving_doubling(n: int, nbytes: float, link: Link) -> float:
    p = _pow2_below(n)
    steps = p.bit_length() - 1
    return (2 * steps * link.alpha + 2 * (p - 1) / p * nbytes * link.beta + (p - 1) / p * nbytes * link.gamma
            + _fold(n, nbytes, link))


def reduce_scatter(n: int, nbytes: float, link: Link) -> float:
    return (n - 1) * link.alpha + (n - 1) / n * nbytes * (link.beta + link.gamma) if n > 1 else 0.0


def all_gather(n: int, nbytes: float, link: Link) -> float:
    return (n - 1) * link.alpha + (n - 1) / n * nbytes * link.beta if n > 1 else 0.0


def tree_broadcast(n: int, nbytes: float, link: Link) -> float:
    return math.ceil(math.log2(n)) * (link.alpha + nbytes * link.beta) if n > 1 else 0.0


PREDICT = {"ring": ring, "doubling": doubling, "halving_doubling": halving_doubling}


def choose(n: int, nbytes: int, link: Link) -> str:
    """The all-reduce algorithm the model predicts fastest (ties go to the earlier in ALL_REDUCE)."""
    return min(ALL_REDUCE, key=lambda a: PREDICT[a](n, nbytes, link))


# ---------------------------------------------------------------------------
# The fitted links of this machine
# ---------------------------------------------------------------------------

# Used only if docs/results/alphabeta_gloo.json is missing: the rounded W = 2 fit it held when
# this was written, so that "auto" still chooses sensibly.
_FALLBACK = Link(alpha=150e-6, beta=1.0e-9, gamma=0.25e-9, name="gloo (fallback)")
_links: dict[int, Link] | None = None


def fitted_links(path: Path = FIT_PATH) -> dict[int, Link]:
    """World size -> fitted Link, from the committed fit (read once per process)."""
    global _links
    if _links is None:
        try:
            record = json.loads(Path(path).read_text())
            _links = {int(w): Link(f["alpha_s"], f["beta_s_per_byte"], f["gamma_s_per_byte"], f"gloo, {w} ranks")
                      for w, f in record["fits"].items()}
        except (OSError, KeyError, ValueError):
            _links = {}
    return _links


def link_for(n: int) -> Link:
    """The fit for n ranks, or for the nearest measured world size (every rank gets the same)."""
    links = fitted_links()
    if not links:
        return _FALLBACK
    return links[min(links, key=lambda w: (abs(w - n), w))]


# ---------------------------------------------------------------------------
# Measuring and fitting (run with `fit`)
# ---------------------------------------------------------------------------

def warm_up(right: int, left: int, group=None, seconds: float = 0.5) -> None:
    """Exchange small messages for a while first: the first few hundred on a fresh gloo pair are
    several times slower (measured here: the first size timed took 5× the next one)."""
    import time

    import torch
    import torch.distributed as dist

    from parallel.ring import _exchange, _wait

    a, b = torch.zeros(1024), torch.zeros(1024)
    end = torch.tensor([time.perf_counter() + seconds], dtype=torch.float64)
    dist.broadcast(end, 0, group)  # every rank stops after the same number of exchanges
    go = torch.ones(1)
    while go.item():
        _wait(_exchange(a, b, right, left, group))
        go.fill_(float(time.perf_counter() < end.item()))
        dist.broadcast(go, 0, group)


def _p2p_job(sizes: list[int], rounds: int) -> dict:
    """On every rank: time one ring step (batch_isend_irecv: send right, receive left) per size,
    and the addition of a received piece. Returns this rank's samples, µs per call."""
    import torch
    import torch.distributed as dist

    from benchmark import measure
    from parallel.ring import _exchange, _peers, _wait

    _, _, right, left = _peers(None)
    out: dict = {"steps": {}, "add": {}}
    warm_up(right, left)
    for nbytes in sizes:
        send = torch.zeros(nbytes // 4)
        recv = torch.empty_like(send)
        number = max(1, min(50, (1 << 20) // nbytes))  # the same on every rank: each call is a message
        stats = measure({"step": lambda s=send, r=recv: _wait(_exchange(s, r, right, left, None))},
                        rounds=rounds if nbytes < (16 << 20) else max(5, rounds // 2), warmup=2, number=number)
        out["steps"][nbytes] = stats["step"].samples
        out["add"][nbytes] = measure({"add": lambda s=send, r=recv: s.add_(r)}, rounds=5, warmup=1)["add"].median
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


def fit(world_sizes: list[int], rounds: int) -> dict:
    import torch

    from benchmark import describe_device
    from parallel.launch import launch

    fits = {}
    for w in world_sizes:
        ranks = launch(_p2p_job, w, (SIZES, rounds), threads_per_rank=1, timeout_s=120, deadline_s=900)
        points = []
        for nbytes in SIZES:
            slowest = [max(s) for s in zip(*(r["steps"][nbytes] for r in ranks))]  # a step ends with its last rank
            points.append((nbytes, statistics.median(slowest) * 1e-6))
        alpha, beta = fit_line(points)
        adds = [(nbytes, max(r["add"][nbytes] for r in ranks) * 1e-6) for nbytes in SIZES]
        gamma = fit_line([a for a in adds if a[0] >= 1 << 20])[1]  # memory-bound sizes: in cache it is faster
        fits[str(w)] = {
            "alpha_s": alpha, "beta_s_per_byte": beta, "gamma_s_per_byte": gamma,
            "bandwidth_gbs": 1e-9 / beta, "add_gbs": 1e-9 / gamma,
            "points": [{"bytes": m, "measured_us": t * 1e6, "fitted_us": (alpha + beta * m) * 1e6,
                        "residual_pct": 100 * ((alpha + beta * m) / t - 1)} for m, t in points],
            "add_points": [{"bytes": m, "measured_us": t * 1e6} for m, t in adds],
        }
        print(f"{w} ranks: α = {alpha * 1e6:.1f} µs, β = {beta * 1e9:.3f} ns/byte ({1e-9 / beta:.2f} GB/s), "
              f"γ = {gamma * 1e9:.3f} ns/byte", flush=True)
    return {"benchmark": "alphabeta", "device": describe_device("cpu"), "torch": torch.__version__,
            "backend": "gloo", "threads_per_rank": 1,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.costmodel " + " ".join(sys.argv[1:]),
            "method": "per size: median over rounds of the slowest rank's time of one batch_isend_irecv step "
                      "(send right, receive left); t = α + β·m fitted by least squares weighted by 1/t; "
                      "γ: slope of the time of add_ over the sizes from 1 MiB (out of cache); "
                      "0.5 s of small exchanges first (a fresh gloo pair is slow for its first messages)",
            "fits": fits}


def fit_table(record: dict) -> str:
    rows = ["| ranks | α µs | β ns/byte (GB/s) | γ ns/byte | worst residual | residuals 4 KiB … 64 MiB |",
            "|---:|---:|---:|---:|---:|---|"]
    for w, f in record["fits"].items():
        res = [p["residual_pct"] for p in f["points"]]
        rows.append(f"| {w} | {f['alpha_s'] * 1e6:.0f} | {f['beta_s_per_byte'] * 1e9:.3f} ({f['bandwidth_gbs']:.2f}) "
                    f"| {f['gamma_s_per_byte'] * 1e9:.3f} | {max(res, key=abs):+.0f}% | "
                    + " ".join(f"{r:+.0f}%" for r in res) + " |")
    rows.append(f"\nOne step = one batch_isend_irecv between neighbours, slowest rank, median; on gloo, "
                f"{record['threads_per_rank']} thread per rank, {record['device']}, torch {record['torch']}, "
                f"{record['date']}: `{record['command']}`")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__[__doc__.index("Examples:"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("fit", help="measure point-to-point steps and fit α, β, γ")
    f.add_argument("--world-sizes", default="2,3,4", help="comma-separated, each at least 2")
    f.add_argument("--rounds", type=int, default=15)
    f.add_argument("--json", metavar="PATH", help="write the fit and its residuals here")
    sub.add_parser("show", help="print the committed fit and the algorithm it chooses per size")
    args = parser.parse_args(argv)
    if args.command == "fit":
        try:
            sizes = [int(s) for s in args.world_sizes.split(",")]
        except ValueError:
            parser.error(f"--world-sizes takes integers separated by commas, got {args.world_sizes!r}")
        if min(sizes) < 2:
            parser.error("every world size must be at least 2 (a fit needs a peer)")
        if args.json:  # fail before minutes of measuring, not after
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        record = fit(sizes, args.rounds)
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
        print(fit_table(record))
    elif args.command == "show":
        if not FIT_PATH.exists():
            raise SystemExit(f"{FIT_PATH.relative_to(ROOT)} is missing; run the fit command in this module's help")
        record = json.loads(FIT_PATH.read_text())
        print(fit_table(record))
        for w in sorted(fitted_links()):
            print(f"{w} ranks: " + ", ".join(f"{s >> 10} KiB→{choose(w, s, link_for(w))}" for s in SIZES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
