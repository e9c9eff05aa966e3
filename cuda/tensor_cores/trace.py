"""The TMA ring of v32-v35 (cuda/tensor_cores/tma_pipeline.cuh) as a timeline, from an emulated run.

The CPU emulation records, when asked (cuda/emulate/trace.h, emu_trace), the Hopper instructions'
events of one warpgroup's first thread: mbarrier init, TMA copy issued, its bytes landed, a
barrier's phase completed, arrive, wait begun and completed, wgmma issued and waited. Their clock
is the emulator's own: `seq` orders the events one tick each, `step` counts the scheduler's fiber
switches. It is an order, not a time on a GPU: which event came before which in this run.

v33 (warp-specialized, bfloat16) by default: warpgroup 0 produces (its thread 0 issues the TMA
copies), warpgroups 1 and 2 consume. Its rows: producer, the copy engine (bytes landed, phases
completed), consumer 0, consumer 1; each event coloured by its stage of the ring.

`check_protocol` holds the order to the mbarrier protocol: every wait completes after the phase
it waited for, and a full barrier's phase after its stage's announced bytes landed.

Writes a Chrome trace-event file ({"traceEvents": [...]}), which https://ui.perfetto.dev (Open
trace file) and chrome://tracing (Load) open, and with --png a picture of it.

Examples:
  python cuda/tensor_cores/trace.py --out /tmp/v33_trace.json                  # v33, 128×256×384
  python cuda/tensor_cores/trace.py --out /tmp/v32.json --version 32 --shape 64 128 512 --png /tmp/v32.png
(The chapter's figure: python cuda/tensor_cores/figures.py --out docs/figures, which draws tc_pipeline.png)
"""

from __future__ import annotations

import ctypes
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

# trace.h's TraceKind, in its order
KINDS = ("init", "tma issued", "landed", "phase completed", "arrive", "wait begun", "wait completed",
         "wgmma issued", "wgmma waited")
FIELDS = ("seq", "step", "block_x", "block_y", "thread", "kind", "bar", "value")
SHAPE = (128, 256, 384)  # v33's one block (128×256), six k-steps of 64: the ring of 4 wraps once
STAGE_COLOURS = ("#1f78b4", "#e31a1c", "#33a02c", "#ff7f00", "#6a3d9a", "#b15928")


def library(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    """The emulation library (cuda/emulated.py's build), its trace exports typed."""
    emu = cli.load_file("cuda/emulated.py")
    if lib is None:
        if emu.unavailable_reason():
            raise cli.UserError(f"cannot run the emulation: {emu.unavailable_reason()}")
        lib = emu.library()
    lib.emu_trace.argtypes, lib.emu_trace.restype = [ctypes.c_int], None
    lib.emu_trace_count.argtypes, lib.emu_trace_count.restype = [], ctypes.c_int64
    lib.emu_trace_read.argtypes = [ctypes.c_void_p, ctypes.c_int64]
    lib.emu_trace_read.restype = ctypes.c_int64
    return lib


def run(version: int = 33, shape: tuple[int, int, int] = SHAPE, lib: ctypes.CDLL | None = None) -> list[dict]:
    """Run `version`'s forward (bfloat16, nt) at shape (M, N, K) in the emulation with the trace on;
    the events of block (0, 0), in order."""
    import torch

    emu = cli.load_file("cuda/emulated.py")
    lib = library(lib)
    m, n, k = shape
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).to(torch.bfloat16)
    b = torch.randn(n, k, generator=g).to(torch.bfloat16)
    c = torch.empty(m, n, dtype=torch.bfloat16)
    lib.emu_trace(1)
    try:
        emu.gemm(version, "nt", a, b, c, None, m, n, k, emu.KPLAIN, lib=lib)
    finally:
        lib.emu_trace(0)
    count = lib.emu_trace_count()
    buf = (ctypes.c_int64 * (8 * count))()
    got = lib.emu_trace_read(buf, count)
    rows = [dict(zip(FIELDS, buf[8 * i:8 * i + 8])) for i in range(got)]
    events = [r for r in rows if (r["block_x"], r["block_y"]) == (0, 0)]
    for e in events:
        e["kind"] = KINDS[e["kind"]]
    return events


def barriers(events: list[dict]) -> dict[int, tuple[str, int]]:
    """Each barrier's (role, stage) from its init: `full` (one arrival: the producer's) or `empty`
    (the consumers'), the stage by the order of their shared offsets."""
    inits = [e for e in events if e["kind"] == "init"]
    out = {}
    for role, pick in (("full", lambda e: e["value"] == 1), ("empty", lambda e: e["value"] != 1)):
        for stage, bar in enumerate(sorted(e["bar"] for e in inits if pick(e))):
            out[bar] = (role, stage)
    return out


def role(thread: int) -> str:
    """The row a thread's events go on (v33's warpgroups; v32's one warpgroup is a consumer that
    also produces)."""
    return {-1: "copy engine", 0: "producer", 128: "consumer 0", 256: "consumer 1"}.get(thread, f"thread {thread}")


def check_protocol(events: list[dict]) -> list[str]:
    """What in the order breaks the mbarrier protocol (empty: nothing). A barrier's phases complete
    in order; each completed wait names its parity: the thread's i-th wait on a barrier must come
    after that barrier's phase i completed (the phase whose parity it waited for), and a full
    barrier's phase completes only after the bytes its producer announced (expect_tx) landed."""
    bars = barriers(events)
    phases: dict[int, list[int]] = {}
    landed: dict[int, int] = {}
    announced: dict[int, int] = {}
    waits: dict[tuple[int, int], int] = {}
    wrong = []
    for e in events:
        bar, kind = e["bar"], e["kind"]
        if kind == "arrive" and e["value"]:
            announced[bar] = announced.get(bar, 0) + e["value"]
        elif kind == "landed":
            landed[bar] = landed.get(bar, 0) + e["value"]
        elif kind == "phase completed":
            done = phases.setdefault(bar, [])
            if e["value"] != len(done):
                wrong.append(f"seq {e['seq']}: barrier {bar} completed phase {e['value']} after {len(done)} phases")
            if bars.get(bar, ("", 0))[0] == "full" and landed.get(bar, 0) != announced.get(bar, 0):
                wrong.append(f"seq {e['seq']}: full barrier {bar} completed phase {e['value']} with "
                             f"{landed.get(bar, 0)} of {announced.get(bar, 0)} announced bytes landed")
            done.append(e["seq"])
        elif kind == "wait completed":
            # the producer's waits on `empty` start at the round before (producer_acquire waits for
            # step - Stages): its i-th wait is for the barrier's phase i all the same
            i = waits.get((e["thread"], bar), 0)
            waits[e["thread"], bar] = i + 1
            done = phases.get(bar, [])
            if i >= len(done) or done[i] > e["seq"] or i % 2 != e["value"]:
                wrong.append(f"seq {e['seq']}: {role(e['thread'])}'s wait {i} on {bars.get(bar, ('?', 0))[0]} "
                             f"barrier {bar} (parity {e['value']}) completed before phase {i} did")
    return wrong


def chrome_trace(events: list[dict], version: int = 33) -> dict:
    """The events as Chrome trace events: one process, a track (tid) per row; a wait a slice from
    its beginning to its completion, every other event a 1-tick slice; ts in the emulator's event
    order (seq), said in the process's name: not microseconds on a GPU."""
    bars = barriers(events)
    rows = sorted({role(e["thread"]) for e in events}, key=lambda r: ROWS.index(r) if r in ROWS else 99)
    tid = {r: i for i, r in enumerate(rows)}
    out = [{"ph": "M", "name": "process_name", "pid": 0,
            "args": {"name": f"v{version} emulated: ts = event order (seq), not GPU time"}}]
    out += [{"ph": "M", "name": "thread_name", "pid": 0, "tid": i, "args": {"name": r}} for r, i in tid.items()]
    begun: dict[tuple[int, int], dict] = {}
    for e in events:
        which, stage = bars.get(e["bar"], ("", -1))
        args = {"seq": e["seq"], "scheduler_step": e["step"], "value": e["value"]}
        if stage >= 0:
            args |= {"barrier": which, "stage": stage}
        name = e["kind"] + (f" {which}[{stage}]" if stage >= 0 else "")
        if e["kind"] == "wait begun":
            begun[e["thread"], e["bar"]] = e
            continue
        ts, dur = e["seq"], 1
        if e["kind"] == "wait completed":
            start = begun.pop((e["thread"], e["bar"]))
            ts, dur, name = start["seq"], e["seq"] - start["seq"] + 1, f"wait {which}[{stage}] parity {e['value']}"
        out.append({"ph": "X", "name": name, "cat": e["kind"], "pid": 0, "tid": tid[role(e["thread"])], "ts": ts,
                    "dur": dur, "args": args})
    return {"traceEvents": out, "displayTimeUnit": "ns",
            "otherData": {"clock": "the CPU emulator's event order (seq); not a time on a GPU", "version": version}}


ROWS = ("producer", "copy engine", "consumer 0", "consumer 1")


def draw(path: Path, events: list[dict], version: int = 33) -> None:
    """The timeline: a row per role, waits as bars from begun to completed, the other events as
    marks, each coloured by its stage (wgmma black)."""
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D

    bars = barriers(events)
    rows = [r for r in ROWS if any(role(e["thread"]) == r for e in events)]
    y = {r: i for i, r in enumerate(rows)}
    marks = {"tma issued": "v", "landed": "^", "phase completed": "|", "arrive": "o", "wgmma issued": "s",
             "wgmma waited": "x", "init": "."}
    fig, ax = plt.subplots(figsize=(11, 3.6))
    begun: dict[tuple[int, int], int] = {}
    for e in events:
        r = role(e["thread"])
        if r not in y:
            continue
        which, stage = bars.get(e["bar"], ("", -1))
        colour = STAGE_COLOURS[stage % len(STAGE_COLOURS)] if stage >= 0 else "black"
        if e["kind"] == "wait begun":
            begun[e["thread"], e["bar"]] = e["seq"]
        elif e["kind"] == "wait completed":
            start = begun.pop((e["thread"], e["bar"]))
            ax.barh(y[r], e["seq"] - start + 1, left=start, height=0.5 if which == "full" else 0.25, color=colour,
                    alpha=0.55, edgecolor=colour)
        else:
            ax.plot([e["seq"]], [y[r] + (0.3 if e["kind"] == "phase completed" else 0)], marks[e["kind"]],
                    color=colour, ms=5 if e["kind"] != "wgmma issued" else 3)
    ax.set_yticks(range(len(rows)), rows)
    ax.invert_yaxis()
    ax.set_xlabel("the emulator's event order (seq): an order, not a time on a GPU")
    stages = sorted({s for _, s in bars.values()})
    handles = [Line2D([], [], color=STAGE_COLOURS[s % len(STAGE_COLOURS)], lw=6, alpha=0.55, label=f"stage {s}")
               for s in stages]
    handles += [Line2D([], [], color="grey", marker=m, ls="", label=k) for k, m in marks.items() if k != "init"]
    ax.legend(handles=handles, fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"v{version}'s TMA ring, emulated (one block): bars are waits (thick: on full, thin: on empty), "
                 "marks the other events", fontsize=9)
    fig.tight_layout()
    import record_info  # (the repository's record_info.py: the command that drew it goes into the PNG)

    record_info.save_figure(fig, path, dpi=80)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--out", required=True, metavar="FILE", help="the Chrome trace-event JSON file to write")
    parser.add_argument("--version", type=int, default=33, choices=(32, 33, 34, 35), help="a TMA version (33)")
    parser.add_argument("--shape", type=int, nargs=3, default=SHAPE, metavar=("M", "N", "K"),
                        help=f"the forward's shape (default {' '.join(map(str, SHAPE))})")
    parser.add_argument("--png", metavar="FILE", help="also draw the timeline into this PNG (needs matplotlib)")
    args = parser.parse_args(argv)
    out = cli.check_output(args.out, "--out")
    png = cli.check_plot(args.png, "--png") if args.png else None
    events = run(args.version, tuple(args.shape))
    wrong = check_protocol(events)
    out.write_text(json.dumps(chrome_trace(events, args.version)))
    print(f"wrote {out}: {len(events)} events of block (0, 0); open it in https://ui.perfetto.dev or chrome://tracing")
    if png:
        draw(png, events, args.version)
        print(f"wrote {png}")
    for line in wrong:
        print(f"protocol: {line}", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    cli.run(main)
