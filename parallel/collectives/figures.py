"""Draw chapter 7 (continued)'s three figures: two all-reduces of four ranks, and ZeRO's step.

collectives_doubling.png: recursive doubling. At step k rank r swaps its whole tensor with rank
r XOR 2ᵏ and both add; each cell says whose contributions that part of the tensor holds.

collectives_halving_doubling.png: halving-doubling (Rabenseifner). A reduce-scatter by
recursive halving (keep half of the range, send the other half, add what comes back), then an
all-gather by recursive doubling (swap the ranges owned so far).

collectives_zero.png: ZeRO stage 1 through one step (reduce-scatter the gradient, Adam on one
shard, all-gather the parameters), and the bytes per parameter a rank holds with and without it.

The cells are not drawn by hand: ``doubling`` and ``halving_doubling`` below replay the loops of
parallel/collectives/algorithms.py on sets of rank numbers, and tests/test_collectives_figures.py
checks that they end where an all-reduce must. Needs matplotlib (an optional extra:
pip install matplotlib).

Examples:
  python -m parallel.collectives.figures --out /tmp     # writes /tmp/collectives_*.png
(The committed figures: python -m parallel.collectives.figures --out docs/figures)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import cli

NAMES = ("collectives_doubling.png", "collectives_halving_doubling.png", "collectives_zero.png")
RANKS = 4

# A stage of an algorithm: a title, and per rank per block the set of ranks whose contributions
# that block holds (None: the rank sent it away and no longer needs it).
Stage = tuple[str, list[list[frozenset[int] | None]]]


def doubling(p: int = RANKS) -> list[Stage]:
    """Recursive doubling over p = 2^k ranks, as algorithms.doubling runs it."""
    held = [[frozenset({r})] * p for r in range(p)]
    stages: list[Stage] = [("start: each rank its own tensor", held)]
    d = 1
    while d < p:
        held = [[held[r][b] | held[r ^ d][b] for b in range(p)] for r in range(p)]
        stages.append((f"step {d.bit_length()}: r ↔ r XOR {d}\neach sends N bytes", held))
        d <<= 1
    return stages


def halving_doubling(p: int = RANKS) -> list[Stage]:
    """Halving-doubling over p = 2^k ranks, as algorithms.halving_doubling runs it (blocks, not
    elements: p blocks of N/p bytes)."""
    held: list[list[frozenset[int] | None]] = [[frozenset({r})] * p for r in range(p)]
    owned = [(0, p)] * p
    stages: list[Stage] = [("start", held)]
    d, step = p >> 1, 1
    while d >= 1:  # reduce-scatter by recursive halving
        new = [row[:] for row in held]
        for r in range(p):
            partner, (lo, hi) = r ^ d, owned[r]
            mid = (lo + hi) // 2
            keep, give = ((lo, mid), (mid, hi)) if r & d == 0 else ((mid, hi), (lo, mid))
            for b in range(*keep):
                new[r][b] = held[r][b] | held[partner][b]
            for b in range(*give):
                new[r][b] = None
            owned[r] = keep
        sent = d  # blocks each rank sent: half of its range
        held = new
        stages.append((f"step {step}: r ↔ r XOR {d}\neach sends {_fraction(sent, p)}", held))
        d, step = d >> 1, step + 1
    d = 1
    while d < p:  # all-gather by recursive doubling
        new = [row[:] for row in held]
        grown = []
        for r in range(p):
            partner, (lo, hi) = r ^ d, owned[r]
            width = hi - lo
            other = (lo - width, lo) if r & d else (hi, hi + width)
            for b in range(*other):
                new[r][b] = held[partner][b]
            grown.append((min(lo, other[0]), max(hi, other[1])))
        stages.append((f"step {step}: r ↔ r XOR {d}\neach sends {_fraction(owned[0][1] - owned[0][0], p)}", new))
        held, owned = new, grown
        d, step = d << 1, step + 1
    return stages


def _fraction(blocks: int, p: int) -> str:
    """Blocks of N/p bytes, as a fraction of N: "N/2", "N/4", "N"."""
    from math import gcd

    g = gcd(blocks, p)
    num, den = blocks // g, p // g
    return "N" if den == 1 else f"{'' if num == 1 else num}N/{den}"


def label(contributions: frozenset[int] | None, p: int) -> str:
    """A cell's text: whose contributions it sums ("0+2"), Σ when it holds all p, blank when sent away."""
    if contributions is None:
        return ""
    return "Σ" if len(contributions) == p else "+".join(map(str, sorted(contributions)))


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    from record_info import save_figure  # the command that drew it, in the PNG

    save_figure(fig, path)


def _grid(ax, cells: list[list[frozenset[int] | None]], p: int, title: str) -> None:
    """One stage: a row of blocks per rank, shaded by how many ranks' contributions each holds."""
    from matplotlib.patches import Rectangle

    cmap = _pyplot().get_cmap("Blues")
    for r, row in enumerate(cells):
        y = p - 1 - r
        for b, c in enumerate(row):
            if c is None:
                ax.add_patch(Rectangle((b, y), 1, 1, facecolor="0.93", edgecolor="0.6", hatch="//", lw=0.8))
                continue
            share = len(c) / p
            ax.add_patch(Rectangle((b, y), 1, 1, facecolor=cmap(0.15 + 0.75 * share), edgecolor="black", lw=0.8))
            ax.text(b + 0.5, y + 0.5, label(c, p), ha="center", va="center", fontsize=8,
                    color="white" if share > 0.6 else "black")
    ax.set_xlim(-0.9, p + 0.1)
    ax.set_ylim(-0.1, p + 0.1)
    for r in range(p):
        ax.text(-0.15, p - 1 - r + 0.5, f"rank {r}", ha="right", va="center", fontsize=8)
    ax.set_title(title, fontsize=8.5)
    ax.set_aspect("equal")
    ax.axis("off")


def draw_stages(stages: list[Stage], p: int, heading: str, path: Path) -> None:
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(stages), figsize=(2.3 * len(stages), 2.4 + 0.2 * heading.count("\n")))
    for ax, (title, cells) in zip(axes, stages):
        _grid(ax, cells, p, title)
    fig.suptitle(heading, fontsize=9.5)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def draw_zero(path: Path, p: int = RANKS) -> None:
    """ZeRO stage 1's step on p ranks (one row of p shards per rank), then the memory per rank."""
    from matplotlib.patches import Rectangle

    plt = _pyplot()
    colours = {"g": "#fdd9b5", "Σg": "#e6761b", "W": "0.85", "W'": "#5aae61", "": "0.97"}
    panels = [
        ("1. after backward:\neach rank's own gradient g", lambda r, s: "g"),
        ("2. reduce-scatter:\nrank r gets Σg of shard r", lambda r, s: "Σg" if s == r else ""),
        ("3. Adam on shard r only,\nwith m, v of shard r alone", lambda r, s: "W'" if s == r else "W"),
        ("4. all-gather: every rank\nhas every updated W'", lambda r, s: "W'"),
    ]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(13, 3.0),
                             gridspec_kw={"width_ratios": [1] * len(panels) + [1.15]})
    for ax, (title, cell) in zip(axes, panels):
        for r in range(p):
            for s in range(p):
                text = cell(r, s)
                ax.add_patch(Rectangle((s, p - 1 - r), 1, 1, facecolor=colours[text],
                                       edgecolor="black" if text else "0.7", lw=0.8))
                ax.text(s + 0.5, p - 1 - r + 0.5, text, ha="center", va="center", fontsize=8)
            ax.text(-0.15, p - 1 - r + 0.5, f"rank {r}", ha="right", va="center", fontsize=8)
        for s in range(p):
            ax.text(s + 0.5, p + 0.15, f"shard {s}", ha="center", va="bottom", fontsize=6.5)
        ax.set_xlim(-0.9, p + 0.1)
        ax.set_ylim(-0.1, p + 0.8)
        ax.set_aspect("equal")
        ax.axis("off")
        ax.set_title(title, fontsize=8.5)
    ax = axes[-1]
    parts = (("weights", 4, 4, "0.7"), ("gradient", 4, 4, "#fdd9b5"), ("Adam's m and v", 8, 8 / p, "#9e9ac8"))
    bottoms = [0.0, 0.0]
    for name, plain, zero, colour in parts:
        ax.bar([0, 1], [plain, zero], bottom=bottoms, color=colour, edgecolor="black", lw=0.6, label=name)
        bottoms = [bottoms[0] + plain, bottoms[1] + zero]
    for x, total in enumerate(bottoms):
        ax.text(x, total + 0.3, f"{total:g}", ha="center", fontsize=8)
    ax.set_xticks([0, 1], ["plain DP", f"ZeRO-1, {p} ranks"], fontsize=8)
    ax.set_ylabel("bytes per parameter, per rank", fontsize=8)
    ax.set_ylim(0, 18.5)
    ax.legend(fontsize=7, loc="upper right")
    ax.set_title("float32 Adam: what each rank holds", fontsize=8.5)
    fig.tight_layout()
    _save(fig, path)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--out", required=True, metavar="DIR", help=f"folder to write {', '.join(NAMES)} into")
    args: argparse.Namespace = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if not out.is_dir():
        raise cli.UserError(f"--out {args.out}: not a folder (create it first)")
    paths = [cli.check_plot(str(out / name), "--out") for name in NAMES]  # matplotlib, before any work
    draw_stages(doubling(), RANKS, "Recursive doubling, 4 ranks: log₂4 = 2 steps, each sending the whole tensor",
                paths[0])
    draw_stages(halving_doubling(), RANKS, "Halving-doubling, 4 ranks: a reduce-scatter by recursive halving "
                "(steps 1-2),\nthen an all-gather by recursive doubling (steps 3-4). "
                "Hatched: a partial sum sent on, no longer needed", paths[1])
    draw_zero(paths[2])
    for path in paths:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    cli.run(main)
