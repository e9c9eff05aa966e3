"""Chapter 8's measured figures: bytes sent per step (DP, TP, DP × TP), who holds which shard,
and the overlap timeline of a `distributed.py --bench tp` run.

Examples:
  python -m parallel.tp.report bytes                      # print the table (4 local ranks)
  python -m parallel.tp.report bytes --world-size 8       # every dp × tp layout of 8 ranks
  python -m parallel.tp.report bytes --json /tmp/tp_bytes.json
  python -m parallel.tp.report shards --out /tmp/tp_shards.png           # needs matplotlib
  python -m parallel.tp.report timeline docs/results/tp_gloo_w2.json --out /tmp/tp_timeline.png

The chapter's files come from the same commands with --json docs/results/tp_bytes.json,
--out docs/results/tp_shards.png and --out docs/results/tp_timeline_w2.png; each picture keeps
the command that drew it in its metadata (record_info.save_figure).
"""

from __future__ import annotations

import cli  # first: a Ctrl-C during the imports below (torch takes seconds) is one line too

# isort: split
import datetime
import sys

import torch
import torch.nn.functional as F

# The model of the bytes table: features -> hidden pair -> classes, a global batch. Every world
# size offered divides the batch and the hidden widths, so every rank's count is the formula's.
FEATURES, HIDDEN, CLASSES, BATCH = 64, (256, 256), 16, 128
WORLD_SIZES = (2, 4, 8)


def layouts(world: int) -> list[tuple[str, int]]:
    """Every way to arrange ``world`` ranks as dp × tp: (layout name, tp), dp = world / tp."""
    tps = [t for t in range(1, world + 1) if world % t == 0]
    return [("DP" if t == 1 else "TP" if t == world else "DP × TP", t) for t in tps]


def _one_step(tp: int) -> dict:
    """One training step on this rank; the bytes this rank's ring sends during it. The dp group
    sums the gradients with one ring all-reduce, so that both kinds of traffic go by the ring
    and its formula. (In distributed.py's training the gradient buckets go by the all-reduce
    that picks an algorithm by message size, chapter 7 continued: over 4 ranks a small bucket
    may go by recursive doubling, which sends 2N, not 1.5N.)"""
    from parallel.common.p2p import SENT_BYTES
    from parallel.common.training import build_model
    from parallel.dp.ring import ring_all_reduce
    from parallel.tp.layers import build_tp_model
    from parallel.tp.training import make_layout

    layout = make_layout(tp)
    torch.manual_seed(0)
    if tp > 1:
        model = build_tp_model(FEATURES, HIDDEN, CLASSES, "py", layout.tp_group)
    else:
        model = build_model(FEATURES, HIDDEN, CLASSES, "py")
    g = torch.Generator().manual_seed(layout.dp_rank)  # the ranks of a tp group share a shard
    x = torch.randn(BATCH // layout.dp, FEATURES, generator=g)
    y = torch.randint(CLASSES, (BATCH // layout.dp,), generator=g)
    for key in SENT_BYTES:
        SENT_BYTES[key] = 0
    (F.cross_entropy(model(x), y, reduction="sum") / BATCH).backward()
    if layout.dp > 1:  # the gradient averaging: every parameter's gradient, one flat buffer
        grads = torch.cat([p.grad.view(-1) for p in model.parameters()])
        ring_all_reduce(grads, group=layout.dp_group, check=False)
    params = sum(p.numel() for p in model.parameters())
    return {**SENT_BYTES, "parameters_per_rank": params}


def formula(tp: int, world: int) -> dict:
    """Bytes each rank sends in one step, float32. A ring all-reduce of N elements over n ranks
    sends 2(n − 1)/n · N of them. DP: the gradients, over the dp ranks. TP (this MLP: one
    column/row pair, data as input): the row layer's partial outputs, (B/dp) × H₂, over the tp
    ranks, forward; nothing backward (the first layer's input, the data, needs no gradient).
    DP × TP: both, with each rank's gradients 1/tp of the sharded layers plus the whole head."""
    dp = world // tp
    h1, h2 = HIDDEN
    sharded = (FEATURES * h1 + h1) + h1 * h2
    whole = h2 + h2 * CLASSES + CLASSES  # the row layer's bias, the head
    per_rank = sharded // tp + whole
    grads = 2 * (dp - 1) / dp * per_rank * 4
    acts = 2 * (tp - 1) / tp * (BATCH // dp) * h2 * 4
    return {"gradients": grads, "activations": acts, "total": grads + acts, "parameters_per_rank": per_rank}


def bytes_record(world: int) -> dict:
    from parallel.common.launch import launch

    results = []
    for name, tp in layouts(world):
        ranks = launch(_one_step, world, (tp,), deadline_s=300)
        results.append({"layout": name, "dp": world // tp, "tp": tp, "formula": formula(tp, world),
                        "measured_data_bytes": [r["data"] for r in ranks],
                        "measured_metadata_bytes": [r["metadata"] for r in ranks],
                        "parameters_per_rank": ranks[0]["parameters_per_rank"]})
    return {"benchmark": "tp_bytes", "torch": torch.__version__,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.tp.report " + " ".join(sys.argv[1:]),
            "model": {"features": FEATURES, "hidden": list(HIDDEN), "classes": CLASSES, "global_batch": BATCH,
                      "world_size": world, "dtype": "float32"}, "results": results}


def bytes_table(record: dict) -> str:
    rows = ["| layout | dp × tp | parameters per rank | gradients (formula) | activations (formula) "
            "| total, formula | total, measured (every rank) | + size agreements |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in record["results"]:
        f, measured = r["formula"], sorted(set(r["measured_data_bytes"]))
        meta = sorted(set(r["measured_metadata_bytes"]))
        rows.append(f"| {r['layout']} | {r['dp']} × {r['tp']} | {r['parameters_per_rank']:,} | {f['gradients']:,.0f} "
                    f"| {f['activations']:,.0f} | {f['total']:,.0f} | {', '.join(f'{m:,}' for m in measured)} "
                    f"| {', '.join(f'{m:,}' for m in meta)} |")
    m = record["model"]
    rows.append(f"\nBytes each rank sends in one training step (forward, backward, and the gradients' ring "
                f"all-reduce), "
                f"{m['dtype']}: MLP {m['features']} → {m['hidden']} → {m['classes']}, global batch "
                f"{m['global_batch']}, {m['world_size']} ranks; torch {record['torch']}, {record['date']}: "
                f"`{record['command']}`")
    return "\n".join(rows)


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

COLOURS = ["tab:blue", "tab:orange", "tab:green", "tab:red"]


def shards_figure(path: str) -> None:
    """Who holds what for 4 ranks = 2 (dp) × 2 (tp): the pair's weights cut by tp rank,
    copied across dp ranks; the batch cut by dp rank."""
    from record_info import pyplot, save_figure

    plt = pyplot()
    from matplotlib.patches import Rectangle

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for d, ax in enumerate(axes):
        ax.set_title(f"data-parallel replica {d}: batch half {d} (ranks {2 * d}, {2 * d + 1})", fontsize=9)
        # W1: H1 × D, rows split (column-parallel); W2: H2 × H1, columns split (row-parallel)
        for t in range(2):
            rank = 2 * d + t
            ax.add_patch(Rectangle((0, 4 - 2 * t), 3, 2, color=COLOURS[t], alpha=0.75))
            ax.text(1.5, 5 - 2 * t, f"W₁ rows, half {t}\nb₁, half {t}\nrank {rank}", ha="center", va="center",
                    fontsize=8)
            ax.add_patch(Rectangle((4 + 2 * t, 0), 2, 6, color=COLOURS[t], alpha=0.75))
            ax.text(5 + 2 * t, 3, f"W₂ columns,\nhalf {t}\nrank {rank}", ha="center", va="center", fontsize=8)
        ax.add_patch(Rectangle((9, 0), 1, 6, color="lightgray"))
        ax.text(9.5, 3, "b₂, head:\nwhole on\nboth", ha="center", va="center", fontsize=7, rotation=90)
        ax.text(1.5, 1.8, "column-parallel:\nσ(X W₁ᵀ + b₁)\non each rank", ha="center", va="top", fontsize=7)
        ax.text(6, -0.3, "row-parallel: partial products summed, then σ(· + b₂)", ha="center", va="top", fontsize=7)
        ax.set_xlim(-0.5, 10.5)
        ax.set_ylim(-1.2, 6.5)
        ax.axis("off")
    fig.suptitle("4 ranks = 2 data-parallel × 2 tensor-parallel: colour = tensor-parallel rank", fontsize=10)
    fig.tight_layout()
    save_figure(fig, path)


def timeline_figure(record: dict, path: str) -> None:
    """One measured step per variant: each rank's computation and communication over time."""
    from record_info import pyplot, save_figure

    plt = pyplot()
    variants = list(record["timeline"])
    fig, axes = plt.subplots(len(variants), 1, figsize=(9, 1.2 + 1.1 * len(variants) * record["world_size"] / 2),
                             sharex=True)
    axes = list(axes) if len(variants) > 1 else [axes]
    for ax, name in zip(axes, variants):
        events = record["timeline"][name]
        t0 = min(e[2] for e in events)
        for rank, kind, start, end in events:
            y = rank + (0.0 if kind == "compute" else 0.4)
            ax.broken_barh([((start - t0) * 1e3, (end - start) * 1e3)], (y, 0.35),
                           color="tab:blue" if kind == "compute" else "tab:red")
        ax.set_yticks([r + 0.375 for r in range(record["world_size"])],
                      [f"rank {r}" for r in range(record["world_size"])])
        step = next(r["step_us"] for r in record["results"] if r["variant"] == name)
        ax.set_title(f"{name}: median step {step / 1e3:.1f} ms (blue: computing; red: in a collective or "
                     "waiting for a transfer)", fontsize=9)
    axes[-1].set_xlabel("ms since the step started (one recorded step)")
    fig.tight_layout()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    sub = p.add_subparsers(dest="what", required=True)
    b = cli.command(sub, "bytes", __doc__, "measure the bytes each rank sends in one step, against the formula")
    b.add_argument("--world-size", type=int, choices=WORLD_SIZES, default=4,
                   help="local ranks; every dp × tp layout of them is measured (default 4)")
    b.add_argument("--json", metavar="PATH")
    s = cli.command(sub, "shards", __doc__, "draw which rank holds which shard (needs matplotlib)")
    s.add_argument("--out", metavar="PATH", required=True)
    t = cli.command(sub, "timeline", __doc__, "draw the overlap timeline from a --bench tp JSON (needs matplotlib)")
    t.add_argument("record", metavar="JSON")
    t.add_argument("--out", metavar="PATH", required=True)
    args = p.parse_args(argv)
    # Outputs and matplotlib before any work (cli.py: folders are not created).
    if args.what == "bytes":
        json_path = cli.check_output(args.json, "--json")
    else:
        cli.check_plot(args.out, "--out")
    if args.what == "bytes":
        record = bytes_record(args.world_size)
        return cli.publish(bytes_table(record), [(json_path, cli.json_writer(record))])
    elif args.what == "shards":
        shards_figure(args.out)
    else:
        record = cli.read_record(args.record, "timeline", "tp", "distributed.py --bench tp", keys=("timeline",))
        timeline_figure(record, args.out)
    return 0


if __name__ == "__main__":
    cli.run(main)
