"""The gradient buckets overlapping the backward, measured, and drawn.

``python distributed.py ... --trace PATH`` records, on every rank, for steps 2 to 9 of the first
epoch (the first step warms up): when the model's forward ended and backward ended, and for
every gradient bucket when its last gradient was ready and when its all-reduce started and
ended; then when the step's wait for the last bucket returned. Times are seconds from the start
of that step on that rank. This script draws one recorded step: a row per rank, the forward and
backward as bars, each bucket's all-reduce as a bar below them, starting (with overlap) while
backward still runs.

Examples:
  python distributed.py -m py --hidden 512,512,512 --bucket-kb 512 --epochs 1 --trace /tmp/trace.json
  python -m parallel.dp.trace /tmp/trace.json --out /tmp/overlap.png              # needs matplotlib
  python -m parallel.dp.trace /tmp/trace.json --out /tmp/overlap.png --step 5
"""

from __future__ import annotations

import cli  # first: a Ctrl-C during the imports below (torch takes seconds) is one line too

# isort: split
import sys
import time

STEPS = range(1, 9)  # the steps recorded, counted from 0: the first epoch's 2nd to 9th
EVENTS = ("ready", "start", "end")  # per bucket


class Tracer:
    """Held by the DataParallel strategy (parallel/dp/trainer.py) in a traced run: notes the times of
    the recorded steps, with the GradReducer's record of its buckets."""

    def __init__(self, reducer) -> None:
        self.reducer = reducer
        self.steps: list[dict] = []  # one per recorded step
        self._step: dict | None = None  # the step being recorded

    def step_started(self, epoch: int, step: int) -> None:
        if epoch == 0 and step in STEPS:
            self._step = {"step": step, "start": time.perf_counter()}
            self.reducer.trace = {}  # the reducer notes each bucket's ready, start and end

    def forward_ended(self, *_) -> None:  # a forward hook on the model
        if self._step is not None:
            self._step["forward_end_s"] = time.perf_counter() - self._step["start"]

    def step_ended(self, backward_end: float) -> None:
        """After the wait for the last bucket; ``backward_end``: when backward returned."""
        if self._step is None:
            return
        step, self._step = self._step, None
        t0, events = step.pop("start"), self.reducer.trace
        self.reducer.trace = None
        self.steps.append({**step, "backward_end_s": backward_end - t0, "step_end_s": time.perf_counter() - t0,
                           "buckets": [[events[i][k] - t0 if k in events.get(i, {}) else None for k in EVENTS]
                                       for i in range(len(self.reducer.buckets))]})

    def write(self, config, data_parallel_ranks: int) -> None:
        """Every rank: gather every rank's recorded steps; rank 0 writes the record to config.trace."""
        write(config, self, data_parallel_ranks)


def write(config, tracer: Tracer, data_parallel_ranks: int) -> None:
    import torch

    from parallel.common.harness import every_rank, header
    from parallel.common.launch import world

    buckets, steps = len(tracer.reducer.buckets), len(tracer.steps)
    fields = ["step", "forward_end_s", "backward_end_s", "step_end_s"]
    mine = torch.full((steps, len(fields) + 3 * buckets), float("nan"), dtype=torch.float64)
    for i, s in enumerate(tracer.steps):
        mine[i, : len(fields)] = torch.tensor([s.get(f, float("nan")) for f in fields], dtype=torch.float64)
        mine[i, len(fields):] = torch.tensor([float("nan") if v is None else v for b in s["buckets"] for v in b],
                                             dtype=torch.float64)
    table = every_rank(mine)  # every rank recorded the same steps
    head = header("trace", config.device)  # the machine, threads and command (every rank takes part)
    if world()[0] != 0:
        return

    def value(v: float) -> float | None:
        return None if v != v else v  # NaN: not recorded

    recorded = []
    for i in range(steps):
        ranks = []
        for row in table[:, i].tolist():
            ranks.append({**{f: value(v) for f, v in zip(fields[1:], row[1:len(fields)])},
                          "buckets": [dict(zip(EVENTS, map(value, row[len(fields) + 3 * b: len(fields) + 3 * b + 3])))
                                      for b in range(buckets)]})
        recorded.append({"step": int(table[0, i, 0].item()) + 1, "ranks": ranks})  # counted from 1
    sizes = [sum(p.numel() * p.element_size() for p in bucket) for bucket in tracer.reducer.buckets]
    record = {**head, "data_parallel_ranks": data_parallel_ranks, "mode": config.mode,
              "hidden": list(config.hidden), "global_batch": config.batch_size, "bucket_kb": config.bucket_kb,
              "overlap": config.overlap, "bucket_bytes": sizes,
              "how": "seconds from the step's start on each rank (time.perf_counter); buckets in the order they are "
                     "reduced (the last layers' gradients first)", "steps": recorded}
    for e in cli.write_outputs([(config.trace, cli.json_writer(record))]):
        print(f"distributed.py: {e}", file=sys.stderr, flush=True)


def figure(record: dict, path: str, step: int | None = None) -> None:
    """Draw one recorded step (default: the one whose slowest rank took the median time)."""
    from record_info import pyplot, save_figure

    plt = pyplot()
    steps = {s["step"]: s for s in record["steps"]}
    if step is None:
        by_time = sorted(steps.values(), key=lambda s: max(r["step_end_s"] for r in s["ranks"]))
        chosen = by_time[len(by_time) // 2]
    elif step in steps:
        chosen = steps[step]
    else:
        raise cli.UserError(f"--step {step}: the record holds steps {sorted(steps)}")
    ranks = chosen["ranks"]
    colours = plt.get_cmap("tab10")
    fig, ax = plt.subplots(figsize=(9, 1.2 + 1.0 * len(ranks)))
    for r, rank in enumerate(ranks):
        y = len(ranks) - 1 - r  # rank 0 on top
        fwd, bwd = rank["forward_end_s"] or 0.0, rank["backward_end_s"]
        ax.broken_barh([(0, fwd * 1e3)], (y + 0.5, 0.35), color="lightgray")
        ax.broken_barh([(fwd * 1e3, (bwd - fwd) * 1e3)], (y + 0.5, 0.35), color="tab:gray")
        for b, bucket in enumerate(rank["buckets"]):
            if bucket["start"] is None:
                continue
            ax.broken_barh([(bucket["start"] * 1e3, (bucket["end"] - bucket["start"]) * 1e3)], (y + 0.1, 0.35),
                           color=colours(b % 10), edgecolor="black", linewidth=0.3)
            if bucket["ready"] is not None:
                ax.plot([bucket["ready"] * 1e3] * 2, [y + 0.45, y + 0.9], color=colours(b % 10), linewidth=1.5)
        ax.axvline(rank["step_end_s"] * 1e3, ymin=y / len(ranks), ymax=(y + 1) / len(ranks), color="black",
                   linestyle=":", linewidth=1)
    ax.set_yticks([len(ranks) - 1 - r + 0.5 for r in range(len(ranks))], [f"rank {r}" for r in range(len(ranks))])
    ax.set_ylim(0, len(ranks))
    ax.set_xlabel("ms since the step started on that rank")
    how = "started as soon as it is ready" if record["overlap"] else "started after backward (--no-overlap)"
    ax.set_title(f"Step {chosen['step']}: forward (light grey), backward (dark grey); below, each gradient bucket's "
                 f"all-reduce, {how}.\nA tick: the bucket's last gradient is ready. Dotted: the step's wait for "
                 f"the last bucket returns. {len(record['bucket_bytes'])} buckets (at most {record['bucket_kb']} KiB, "
                 f"or one parameter),\nMLP {record['hidden']}, mode {record['mode']}, "
                 f"{record['data_parallel_ranks']} ranks on {record['backend']}", fontsize=8)
    fig.tight_layout()
    save_figure(fig, path)  # the picture carries the command that drew it (docs/records.py)


def main(argv: list[str] | None = None) -> int:
    p = cli.parser(__doc__)
    p.add_argument("record", metavar="JSON", help="written by distributed.py --trace")
    p.add_argument("--out", metavar="PATH", required=True, help="the figure (PNG or SVG)")
    p.add_argument("--step", type=cli.positive(int), help="which recorded step (2 to 9; default: the median one)")
    args = p.parse_args(argv)
    # The input first: a missing record is the mistake to report, whatever else is missing.
    record = cli.read_record(args.record, "record", "trace", "distributed.py --trace",
                             keys=("steps", "bucket_bytes", "overlap"))
    cli.check_plot(args.out, "--out")
    figure(record, args.out, args.step)
    return 0


if __name__ == "__main__":
    cli.run(main)
