"""Gloo's I/O threads under two settings, side by side: the lock-holder-preemption experiment
of parallel/common/threads.py (opt-in; by default nothing changes any thread).

Launches the ranks again and again, alternately with two settings of $DENSE_GLOO_IO_NICE
(--settings; by default 0, gloo's threads left alone, then 19, the lowest niceness; "batch" is
Linux's SCHED_BATCH policy and "idle" SCHED_IDLE), and in each launch times single calls of our
all-reduce (``auto``) and of dist.all_reduce at 4 KiB and 1 MiB, interleaved round by round.
Priority can only be lowered without privilege, never raised back, so the two settings need
separate processes; alternating them pairs each launch at the first setting with the next at
the second, and the spread over the pairs says how much of a difference is the machine's mood.
Each launch also reports the CPU time gloo's I/O threads used while it timed, as a share of the
wall time: while they spin it is large. --busy N keeps N other processes spinning on the CPU
throughout (a machine loaded by other jobs): a lowered thread then waits for them too.

Examples:
  python -m parallel.collectives.ionice --world-size 2 --pairs 2 --rounds 200      # about half a minute
  python -m parallel.collectives.ionice --world-size 2 --pairs 2 --rounds 200 --settings 19,idle
  python -m parallel.collectives.ionice --world-size 4 --json /tmp/ionice_w4.json
  python -m parallel.collectives.ionice --world-size 2 --pairs 2 --rounds 50 --settings 0,batch --busy 2
"""

from __future__ import annotations

import datetime
import os
import statistics
import subprocess
import sys
import time

import cli

SIZES = (4 << 10, 1 << 20)
SETTINGS = (0, 19)  # $DENSE_GLOO_IO_NICE of the two launches of a pair, in this order, unless --settings
SLOW_US = 1000.0    # a call slower than this is one of the stalls


def _io_cpu_s() -> float:
    """CPU seconds used so far by this process's gloo I/O threads (from /proc)."""
    from parallel.common.threads import thread_cpu_s

    return thread_cpu_s().get("gloo I/O", 0.0)


def _job(sizes: tuple[int, ...], rounds: int) -> dict:
    """On every rank: per-call times (µs) of each variant, and the I/O threads' CPU share."""
    import torch
    import torch.distributed as dist

    from parallel.collectives.algorithms import all_reduce
    from parallel.collectives.costmodel import size_label
    from parallel.common.harness import warm_up
    from parallel.common.p2p import peers
    from parallel.common.threads import io_thread_nices
    from timing import measure

    warm_up(*peers(None)[2:])
    fns = {}
    for nbytes in sizes:
        t = torch.zeros(nbytes // 4)
        fns[f"all_reduce auto, {size_label(nbytes)}"] = lambda t=t: all_reduce(t, check=False)
        fns[f"dist.all_reduce, {size_label(nbytes)}"] = lambda t=t: dist.all_reduce(t)
    cpu, start = _io_cpu_s(), time.perf_counter()
    # number=1: every sample is one call, so the stalls show as single slow calls
    stats = measure(fns, rounds=rounds, warmup=3, number=1, order="shuffle")
    share = (_io_cpu_s() - cpu) / (time.perf_counter() - start)
    return {"samples": {k: s.samples for k, s in stats.items()}, "io_cpu_share": share, "io_nices": io_thread_nices()}


def _label(setting: int | str) -> str:
    from parallel.common.threads import POLICIES

    return POLICIES.get(setting, f"nice {setting}")


def settings_pair(text: str) -> tuple[int | str, int | str]:
    """--settings: two different settings of $DENSE_GLOO_IO_NICE, comma-separated (each as
    parallel.common.threads.parse_io_setting reads it)."""
    from parallel.common.threads import parse_io_setting

    values = [parse_io_setting(part, "each setting of --settings") for part in text.split(",")]
    if len(values) != 2 or values[0] == values[1]:
        raise ValueError(f"--settings takes two different settings, as in 19,idle; got {text!r}")
    return values[0], values[1]


def run(world_size: int, pairs: int, rounds: int, settings: tuple[int | str, int | str] = SETTINGS,
        busy: int = 0) -> dict:
    from parallel.common.launch import launch
    from parallel.common.threads import IO_NICE_VAR

    launches = []
    saved = os.environ.get(IO_NICE_VAR)
    spinners = []
    try:
        for _ in range(busy):  # other jobs on the machine: processes at normal priority that never block
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
        for pair in range(pairs):
            for nice in settings:
                os.environ[IO_NICE_VAR] = str(nice)  # spawned ranks inherit it
                print(f"pair {pair + 1}/{pairs}: {IO_NICE_VAR}={nice} ...", file=sys.stderr, flush=True)
                ranks = launch(_job, world_size, (SIZES, rounds), threads_per_rank=1, timeout_s=120,
                               deadline_s=900)
                variants = {}
                for name in ranks[0]["samples"]:
                    calls = [max(c) for c in zip(*(r["samples"][name] for r in ranks))]  # the slowest rank
                    variants[name] = {"median_us": statistics.median(calls), "mean_us": statistics.mean(calls),
                                      "slow_share": sum(c > SLOW_US for c in calls) / len(calls),
                                      "calls": len(calls)}
                launches.append({"pair": pair, "nice": nice, "variants": variants,
                                 "io_cpu_share": [r["io_cpu_share"] for r in ranks],
                                 "io_thread_nices": sorted({v for r in ranks for v in r["io_nices"]})})
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        if saved is None:
            os.environ.pop(IO_NICE_VAR, None)
        else:
            os.environ[IO_NICE_VAR] = saved
    first, second = settings
    summary = []
    for name in launches[0]["variants"]:
        before = [la["variants"][name] for la in launches if la["nice"] == first]
        after = [la["variants"][name] for la in launches if la["nice"] == second]
        ratios = [a["mean_us"] / b["mean_us"] for a, b in zip(after, before)]  # paired: one launch each
        row = {"variant": name}
        for key in ("mean_us", "median_us", "slow_share"):  # the keys of the first records: mean_us_nice0 …
            row[f"{key}_nice{first}"] = statistics.median(b[key] for b in before)
            row[f"{key}_nice{second}"] = statistics.median(a[key] for a in after)
        summary.append({**row, f"mean_ratio_{second}_to_{first}": statistics.median(ratios),
                        "mean_ratio_range": [min(ratios), max(ratios)]})
    import torch

    from record_info import describe_device

    return {"benchmark": "ionice", "device": describe_device("cpu"), "torch": torch.__version__, "backend": "gloo",
            "world_size": world_size, "threads_per_rank": 1, "settings": [first, second], "busy": busy,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.collectives.ionice " + " ".join(sys.argv[1:]),
            "method": f"{pairs} pairs of launches ({IO_NICE_VAR}={first}, then ={second}); in each, {rounds} rounds "
                      f"of one call "
                      f"of every variant (in a new order each round), the slowest rank's time per call; "
                      f"a stall is a call over {SLOW_US:.0f} µs; ratio: per pair, mean µs per call at {second} over "
                      f"at {first}",
            "summary": summary, "launches": launches}


def table(record: dict) -> str:
    first, second = record.get("settings", SETTINGS)  # the first records compared 0 and 19 only
    rows = [f"| variant | µs per call, mean: {_label(first)} → {_label(second).removeprefix('nice ')} "
            "| ratio (range over pairs) | median µs | calls over 1 ms |", "|---|---:|---:|---:|---:|"]
    for s in record["summary"]:
        lo, hi = s["mean_ratio_range"]
        rows.append(f"| {s['variant']} | {s[f'mean_us_nice{first}']:.0f} → {s[f'mean_us_nice{second}']:.0f} "
                    f"| {s[f'mean_ratio_{second}_to_{first}']:.2f} ({lo:.2f}–{hi:.2f}) "
                    f"| {s[f'median_us_nice{first}']:.0f} → {s[f'median_us_nice{second}']:.0f} "
                    f"| {100 * s[f'slow_share_nice{first}']:.1f}% → {100 * s[f'slow_share_nice{second}']:.1f}% |")
    shares = {n: [x for la in record["launches"] if la["nice"] == n for x in la["io_cpu_share"]]
              for n in (first, second)}
    rows.append("\nCPU time of gloo's I/O threads while timing, share of wall time per rank (median): "
                + ", ".join(f"{_label(n)}: {100 * statistics.median(v):.0f}%" for n, v in shares.items())
                + f". {record['world_size']} ranks on gloo, 1 thread each"
                + (f", {record['busy']} other processes spinning on the CPU meanwhile" if record.get("busy") else "")
                + f", {record['device']}, "
                f"torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--world-size", type=int, default=2, help="ranks per launch (at least 2)")
    parser.add_argument("--pairs", type=cli.positive(int), default=3, help="pairs of launches (one per setting)")
    parser.add_argument("--settings", default=",".join(map(str, SETTINGS)), metavar="A,B",
                        help="the two settings of $DENSE_GLOO_IO_NICE each pair launches with, in this order: 'idle' "
                             "(SCHED_IDLE), 'batch' (SCHED_BATCH) or a niceness 0-19 (default: %(default)s)")
    parser.add_argument("--rounds", type=cli.positive(int), default=600, help="calls of each variant per launch")
    parser.add_argument("--busy", type=cli.positive(int, allow_zero=True), default=0, metavar="N",
                        help="keep N other processes spinning on the CPU meanwhile, as other jobs would (default: 0)")
    parser.add_argument("--json", metavar="PATH", help="write the record here")
    args = parser.parse_args(argv)
    if args.world_size < 2:
        parser.error("--world-size must be at least 2 (a collective needs a peer)")
    try:
        settings = settings_pair(args.settings)
    except ValueError as e:
        parser.error(str(e))
    if not sys.platform.startswith("linux"):
        raise cli.UserError("thread priorities and /proc are read the Linux way; this needs Linux")
    json_path = cli.check_output(args.json, "--json")  # before minutes of measuring, not after
    record = run(args.world_size, args.pairs, args.rounds, settings, args.busy)
    return cli.publish(table(record), [(json_path, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
