"""One row of the allreduce benchmark's goal table, launch after launch: how far does auto's
busbw ratio to gloo's move between runs of the same code on the same machine?

Each launch starts fresh ranks and times one size exactly as `distributed.py --bench allreduce`
does (every variant, interleaved in a new order each round, a barrier before each sample, the
slowest rank's time), and keeps auto's median paired ratio and its 95% interval. If the
medians of launches spread wider than one launch's interval, a single run's distance from the
goal says little, and a change of code is judged only by launches alternated with the code
before it. --settings alternates launches between settings of $DENSE_GLOO_IO_NICE (gloo's I/O
threads; see the chapter's sidebar), so a difference between them is judged against the spread
within each.

Examples:
  python -m parallel.collectives.repeat --launches 2 --kib 64                 # about a minute
  python -m parallel.collectives.repeat --launches 3 --settings 0,19 --json /tmp/repeat_w2.json
(docs/results/allreduce_repeat_w2.json records the command that wrote it.)
"""

from __future__ import annotations

import datetime
import os
import statistics
import sys

import cli


def _goal() -> float:
    from parallel.collectives.bench import GOAL

    return GOAL


def _job(sizes: list[int]) -> dict:
    """On every rank: the allreduce benchmark at ``sizes``; its record."""
    from parallel.collectives.bench import allreduce_record

    return allreduce_record("cpu", sizes)


def _launch_row(record: dict, nbytes: int, setting: int | str) -> dict:
    by = {r["variant"]: r for r in record["results"] if r["bytes"] == nbytes}
    auto, ref = by["auto"], by["dist.all_reduce"]
    return {"setting": setting, "algorithm": auto["algorithm"], "ratio": auto["busbw_ratio_to_dist"],
            "ratio_ci": auto["ratio_ci"], "auto_us": auto["time_us"], "all_reduce_us": ref["time_us"],
            "date": record["date"], "gloo_io_thread_nices": record.get("gloo_io_thread_nices")}


def run(world_size: int, nbytes: int, launches: int, settings: tuple[int | str, ...]) -> dict:
    from parallel.collectives import cpp_loop
    from parallel.common.launch import launch
    from parallel.common.threads import IO_NICE_VAR

    if cpp_loop.unavailable() is None:
        cpp_loop.build()  # once, here, as distributed.py does before its ranks start
    rows, saved = [], os.environ.get(IO_NICE_VAR)
    try:
        for i in range(launches):
            for setting in settings:
                os.environ[IO_NICE_VAR] = str(setting)  # spawned ranks inherit it
                print(f"launch {i + 1}/{launches}: {IO_NICE_VAR}={setting} ...", file=sys.stderr, flush=True)
                record = launch(_job, world_size, ([nbytes],), timeout_s=120, deadline_s=900)[0]
                rows.append(_launch_row(record, nbytes, setting))
    finally:
        if saved is None:
            os.environ.pop(IO_NICE_VAR, None)
        else:
            os.environ[IO_NICE_VAR] = saved
    import torch

    from record_info import describe_device

    return {"benchmark": "allreduce_repeat", "device": describe_device("cpu"), "torch": torch.__version__,
            "backend": "gloo", "world_size": world_size, "bytes": nbytes, "settings": list(settings),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": "python -m parallel.collectives.repeat " + " ".join(sys.argv[1:]), "launches": rows}


def summary(record: dict) -> dict:
    """Per setting: the launches' median ratios (lowest, median, highest), how many launches'
    intervals hold the median of all of them, and the widest single interval."""
    out = {}
    for setting in record["settings"]:
        rows = [r for r in record["launches"] if r["setting"] == setting]
        ratios = [r["ratio"] for r in rows]
        middle = statistics.median(ratios)
        cis = [r["ratio_ci"] for r in rows if r["ratio_ci"]]
        out[setting] = {"launches": len(rows), "lowest": min(ratios), "median": middle, "highest": max(ratios),
                        "holding_median": sum(lo <= middle <= hi for lo, hi in cis), "with_interval": len(cis),
                        "widest_interval": max((hi - lo for lo, hi in cis), default=float("nan")),
                        "below_goal": sum(r < _goal() for r in ratios)}
    return out


def paired_shifts(record: dict) -> list[float]:
    """With two settings: per pair of launches (one at each, in turn), the first setting's ratio
    minus the second's."""
    if len(record["settings"]) != 2:
        return []
    first = [r["ratio"] for r in record["launches"] if r["setting"] == record["settings"][0]]
    second = [r["ratio"] for r in record["launches"] if r["setting"] == record["settings"][1]]
    return [a - b for a, b in zip(first, second)]


def _label(setting: int | str) -> str:
    return "left alone" if str(setting) == "0" else f"$DENSE_GLOO_IO_NICE={setting}"


def table(record: dict) -> str:
    """One row per launch (per pair of launches with two settings): auto's busbw over gloo's,
    paired, with its 95% interval; then the spread at each setting."""
    from parallel.collectives.costmodel import size_label

    settings = record["settings"]
    by = [[r for r in record["launches"] if r["setting"] == x] for x in settings]

    def cell(r: dict) -> str:
        lo, hi = r["ratio_ci"] or (float("nan"), float("nan"))
        return f"{r['ratio']:.2f} ({lo:.2f}–{hi:.2f})"

    head = " | ".join(f"{_label(x)}" for x in settings)
    rows = [f"| launch | {head} |" + (" difference |" if len(settings) == 2 else ""),
            "|---:|" + "---:|" * (len(settings) + (len(settings) == 2))]
    shifts = paired_shifts(record)
    for i, launches in enumerate(zip(*by)):
        rows.append(f"| {i + 1} | " + " | ".join(cell(r) for r in launches) + " |"
                    + (f" {shifts[i]:+.2f} |" if shifts else ""))
    spread = "; ".join(f"{_label(x)}: {s['lowest']:.2f} to {s['highest']:.2f}"
                       for x, s in summary(record).items())
    rows.append(f"\nauto / dist.all_reduce busbw, paired, median (95% CI) per launch; {spread}. "
                f"{size_label(record['bytes'])}, {record['world_size']} ranks on {record['backend']}, "
                f"{record['device']}, torch {record['torch']}, {record['date']}: `{record['command']}`")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    from parallel.collectives.bench import SIZES
    from parallel.collectives.ionice import settings_pair
    from parallel.common.threads import parse_io_setting

    parser = cli.parser(__doc__)
    parser.add_argument("--world-size", type=int, default=2, help="ranks per launch (at least 2)")
    parser.add_argument("--kib", type=int, default=4096, choices=[b >> 10 for b in SIZES],
                        help="the size timed, in KiB, one of the benchmark's (default: %(default)s)")
    parser.add_argument("--launches", type=cli.positive(int), default=4, help="launches per setting (default: 4)")
    parser.add_argument("--settings", default="0", metavar="A[,B]",
                        help="$DENSE_GLOO_IO_NICE of the launches, alternating if two: 0 (gloo's threads left "
                             "alone, the default), a niceness 1-19, 'batch' or 'idle'")
    parser.add_argument("--json", metavar="PATH", help="write the record here")
    args = parser.parse_args(argv)
    if args.world_size < 2:
        parser.error("--world-size must be at least 2 (a collective needs a peer)")
    try:
        settings = (settings_pair(args.settings) if "," in args.settings
                    else (parse_io_setting(args.settings, "--settings"),))
    except ValueError as e:
        parser.error(str(e))
    json_path = cli.check_output(args.json, "--json")  # before minutes of measuring, not after
    from parallel.common.launch import LaunchError

    try:
        record = run(args.world_size, args.kib << 10, args.launches, settings)
    except LaunchError as e:  # a rank failed or hung: what it said, in one message, not a traceback
        raise cli.UserError(str(e), code=1) from None
    return cli.publish(table(record), [(json_path, cli.json_writer(record))])


if __name__ == "__main__":
    cli.run(main)
