"""The numbers in the sentences of chapter 7 (parallel/dp/README.md) and chapter 8
(parallel/tp/README.md), by the names their number markers give them
(<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed from the
record or the source that backs it."""

from __future__ import annotations

import re
from collections.abc import Callable

from record_info import committed


def _mib(nbytes: int) -> str:
    if nbytes % (1 << 20):
        raise ValueError(f"{nbytes} bytes is not a whole number of MiB")
    return f"{nbytes >> 20} MiB"


def segment_mib() -> str:
    """The size of the pieces ring.py cuts each chunk into, by default."""
    from parallel.dp import ring

    return _mib(ring.DEFAULT_SEGMENT_BYTES)


def tp_parameters_per_rank(layout: str) -> str:
    """parameters_per_rank of `layout`'s row of the bytes-per-step record."""
    row = next(r for r in committed("tp_bytes.json")["results"] if r["layout"] == layout)
    return f"{row['parameters_per_rank']:,}"


def _tp_goal(prefix: str) -> tuple[float, bool]:
    """The threshold and the verdict of the tp record's goal whose key starts with `prefix`
    (the key carries the threshold: overlapped_at_most_0.85_of_unoverlapped)."""
    key, met = next((k, v) for k, v in committed("tp_gloo_w2.json")["goals"].items() if k.startswith(prefix))
    return float(re.search(r"_(\d+\.\d+)(?:_|$)", key)[1]), met


def tp_formula_bytes(tp: int, world: int, field: str) -> str:
    """report.py's formula for one layout: the bytes a rank sends in a step (or its parameters),
    for exercise 3's answer, which predicts world sizes the record does not hold."""
    from parallel.tp import report

    return f"{round(report.formula(tp, world)[field]):,}"


def tp_split_steps() -> str:
    """The steps recorded, beyond the timed ones, to split a step into communication and computation."""
    m = re.search(r"medians of (\d+) recorded steps", committed("tp_gloo_w2.json")["how"])
    if m is None:
        raise ValueError("tp_gloo_w2.json's 'how' no longer says how many steps were recorded")
    return m[1]


NUMBERS: dict[str, Callable[[], str]] = {
    # chapter 7
    "dp_segment_mib": segment_mib,
    # chapter 8: the bytes-per-step record
    "tp_dp_parameters_per_rank": lambda: tp_parameters_per_rank("DP"),
    "tp_tp_parameters_per_rank": lambda: tp_parameters_per_rank("TP"),
    "tp_bytes_ranks": lambda: str(committed("tp_bytes.json")["model"]["world_size"]),
    # chapter 8, exercise 3: the formula's bytes per rank on 8 ranks, by layout dp × tp
    "tp_w8_8x1_total": lambda: tp_formula_bytes(1, 8, "total"),
    "tp_w8_4x2_gradients": lambda: tp_formula_bytes(2, 8, "gradients"),
    "tp_w8_4x2_activations": lambda: tp_formula_bytes(2, 8, "activations"),
    "tp_w8_4x2_total": lambda: tp_formula_bytes(2, 8, "total"),
    "tp_w8_2x4_gradients": lambda: tp_formula_bytes(4, 8, "gradients"),
    "tp_w8_2x4_activations": lambda: tp_formula_bytes(4, 8, "activations"),
    "tp_w8_2x4_total": lambda: tp_formula_bytes(4, 8, "total"),
    "tp_w8_1x8_total": lambda: tp_formula_bytes(8, 8, "total"),
    "tp_w8_1x8_parameters": lambda: tp_formula_bytes(8, 8, "parameters_per_rank"),
    # chapter 8: the tp benchmark's record
    "tp_bench_ranks": lambda: str(committed("tp_gloo_w2.json")["world_size"]),
    "tp_split_steps": tp_split_steps,
    "tp_comm_share_goal": lambda: f"{_tp_goal('comm_share_at_least')[0]:.0%}",
    "tp_overlap_goal": lambda: f"{_tp_goal('overlapped_at_most')[0]:.2f}",
    "tp_overlap_goal_verdict": lambda: "met" if _tp_goal("overlapped_at_most")[1] else "missed",
    "tp_collective_mib": lambda: _mib(committed("tp_gloo_w2.json")["bytes_per_collective"]),
}
