"""Draw chapter 7's figure of the ring all-reduce: who holds which partial sum, step by step.

dp_ring.png: parallel/dp/simple.py's ``ring_all_reduce`` run on 4 simulated ranks (threads that
pass messages through queues in place of torch.distributed), with one element per chunk. Rank r
contributes 2^r, so each element's value says which ranks' contributions it holds. One row per
step, the state before it; in each rank, the chunk it sends to its right neighbour that step is
outlined in red. The figure is the code's own message pattern, not a drawing of it.
Needs matplotlib (an optional extra: pip install matplotlib).

Examples:
  python -m parallel.dp.figures --out /tmp          # writes /tmp/dp_ring.png
  python -m parallel.dp.figures --out /tmp --ranks 3
(The committed figure: python -m parallel.dp.figures --out docs/figures)
"""

from __future__ import annotations

import cli  # first: a Ctrl-C during the imports below (torch takes seconds) is one line too

# isort: split
import queue
import threading
import types
from dataclasses import dataclass
from pathlib import Path

NAME = "dp_ring.png"


@dataclass
class Step:
    """One rank at the start of one ring step: what each chunk holds and which chunk it sends."""

    holds: list[int]  # per chunk, a bit mask of the ranks whose contribution it contains
    sends: int | None  # the chunk sent to the right this step (None: the state after the last)


def trace_ring(n: int) -> list[list[Step]]:
    """Run simple.ring_all_reduce on ``n`` ranks (threads) and return, per rank, its Steps: one per
    ring step, then the final state."""
    import torch

    from parallel.dp import simple

    local = threading.local()
    wires = {(src, (src + 1) % n): queue.Queue() for src in range(n)}  # a ring: only to the right
    steps: list[list[Step]] = [[] for _ in range(n)]
    tensors: dict[int, torch.Tensor] = {}

    class Done:
        def wait(self) -> None:
            pass

    class Receive:
        def __init__(self, into: torch.Tensor, src: int) -> None:
            self.into, self.src = into, src

        def wait(self) -> None:
            self.into.copy_(wires[(self.src, local.rank)].get(timeout=30))

    def isend(t: torch.Tensor, dst: int) -> Done:
        mine = tensors[local.rank]
        sent = (t.data_ptr() - mine.data_ptr()) // mine.element_size()  # one element per chunk
        steps[local.rank].append(Step(mine.tolist(), sent))
        wires[(local.rank, dst)].put(t.clone())
        return Done()

    fake = types.SimpleNamespace(is_initialized=lambda: True, get_world_size=lambda: n,
                                 get_rank=lambda: local.rank, isend=isend,
                                 irecv=lambda t, src: Receive(t, src))
    errors: list[BaseException] = []

    def rank_main(r: int) -> None:
        local.rank = r
        tensors[r] = torch.full((n,), 1 << r, dtype=torch.int64)
        try:
            simple.ring_all_reduce(tensors[r])
            steps[r].append(Step(tensors[r].tolist(), None))
        except BaseException as e:  # reported on the main thread
            errors.append(e)

    real, simple.dist = simple.dist, fake
    try:
        threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        simple.dist = real
    if errors:
        raise errors[0]
    return steps


def draw(steps: list[list[Step]], path: Path) -> None:
    from record_info import pyplot, save_figure

    plt = pyplot()
    from matplotlib.patches import Rectangle

    n = len(steps)
    rows = len(steps[0])
    letters = "abcdefghijklmnop"
    cmap = plt.get_cmap("Blues")
    fig, ax = plt.subplots(figsize=(2.3 * n + 1.8, 0.62 * rows + 1.4))
    for row in range(rows):
        y = rows - 1 - row
        for r in range(n):
            step = steps[r][row]
            for c, mask in enumerate(step.holds):
                x = r * (n + 1) + c
                count = bin(mask).count("1")
                sent = step.sends == c
                ax.add_patch(Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, facecolor=cmap(0.15 + 0.75 * count / n),
                                       edgecolor="tab:red" if sent else "gray", linewidth=2.5 if sent else 0.5))
                who = "all" if count == n else "+".join(str(k) for k in range(n) if mask >> k & 1)
                ax.text(x + 0.5, y + 0.5, f"{letters[c]}\n{who}", ha="center", va="center", fontsize=7,
                        color="white" if count > n / 2 else "black")
    for r in range(n):
        ax.text(r * (n + 1) + n / 2, rows + 0.15, f"rank {r}", ha="center", va="bottom", fontsize=9)
    labels = ([f"reduce-scatter {s + 1}" for s in range(n - 1)] + [f"all-gather {s + 1}" for s in range(n - 1)]
              + ["done"])
    for row, label in enumerate(labels[:rows]):
        ax.text(-0.3, rows - 1 - row + 0.5, label, ha="right", va="center", fontsize=8)
    ax.set_xlim(-3.2, n * (n + 1))
    ax.set_ylim(0, rows + 0.8)
    ax.axis("off")
    ax.set_title(f"Ring all-reduce on {n} ranks (parallel/dp/simple.py). Each rank's tensor is cut into chunks "
                 f"{', '.join(letters[:n])};\na cell lists the ranks whose contributions it holds. Red: the chunk "
                 f"the rank sends right this step (rank {n - 1} sends to rank 0);\nthe receiver adds it to its own "
                 "(reduce-scatter) or stores it in place (all-gather).", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)  # the picture carries the command that drew it


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--out", required=True, metavar="DIR", help=f"folder to write {NAME} into")
    parser.add_argument("--ranks", type=cli.positive(int), default=4, help="ranks in the ring, 2 to 8 (default 4)")
    args = parser.parse_args(argv)
    if not 2 <= args.ranks <= 8:
        raise cli.UserError(f"--ranks {args.ranks}: draw between 2 and 8 ranks")
    out = Path(args.out).expanduser()
    if not out.is_dir():
        raise cli.UserError(f"--out {args.out}: not a folder (create it first)")
    path = cli.check_plot(str(out / NAME), "--out")
    draw(trace_ring(args.ranks), path)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    cli.run(main)
