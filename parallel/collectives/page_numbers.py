"""The numbers in the sentences of chapter 7, continued
(parallel/collectives/README.md), by the names its number markers give them
(<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed from the
record or the source that backs it."""

from __future__ import annotations

from collections.abc import Callable

from record_info import committed


def _repeat_spread() -> str:
    """The widest spread of the launches' median ratios at one setting (highest − lowest)."""
    from parallel.collectives import repeat

    settings = repeat.summary(committed("allreduce_repeat_w2.json")).values()
    return f"{max(s['highest'] - s['lowest'] for s in settings):.2f}"


def _repeat_shift() -> str:
    """What lowering gloo's threads did to the ratio in each pair of launches (the second
    setting's ratio minus the first's), smallest change to largest."""
    from parallel.collectives import repeat

    changes = sorted((-d for d in repeat.paired_shifts(committed("allreduce_repeat_w2.json"))), key=abs)
    return f"{changes[0]:+.2f} to {changes[-1]:+.2f}".replace("-", "−")


def _bf16() -> dict:
    return committed("bf16_gloo_w2.json")


def _bf16_range(key: Callable[[dict, dict], float]) -> str:
    """Lowest to highest of ``key(float32 row, bfloat16 row)`` over the all-reduce sizes from
    1 Mi elements up."""
    rows = {(r["numel"], r["dtype"]): r for r in _bf16()["allreduce"]}
    values = [key(rows[n, "float32"], rows[n, "bfloat16"]) for n, dtype in rows if dtype == "float32" and n >= 1 << 20]
    return f"{min(values):.2f} to {max(values):.2f}"


def _bf16_step(variant: str) -> dict:
    return next(r for r in _bf16()["step"] if r["variant"] == variant)


def _bf16_points() -> str:
    """The larger drop of the two bfloat16 variants' mean test accuracy under float32's, in points."""
    import statistics

    means: dict[str, list[float]] = {}
    for r in _bf16()["accuracy"]:
        means.setdefault(r["variant"], []).append(r["test_accuracy"])
    base = statistics.mean(means.pop("float32"))
    return f"{max(100 * (base - statistics.mean(v)) for v in means.values()):.2f}"


def _links():
    from parallel.collectives.costmodel import INFINIBAND, NVLINK

    return NVLINK, INFINIBAND


def _goal() -> str:
    from parallel.collectives.bench import GOAL

    return f"{GOAL:.2f}"


NUMBERS: dict[str, Callable[[], str]] = {
    "coll_goal": _goal,
    "coll_repeat_spread": _repeat_spread, "coll_repeat_shift": _repeat_shift,
    # the projection's links (costmodel.NVLINK, costmodel.INFINIBAND): bandwidth and NCCL's α
    "coll_nvlink_gbs": lambda: f"{1 / _links()[0].beta / 1e9:.0f}",
    "coll_ib_gbits": lambda: f"{8 / _links()[1].beta / 1e9:.0f}",
    "coll_nvlink_alpha": lambda: f"{_links()[0].alpha * 1e6:.1f}",
    "coll_ib_alpha": lambda: f"{_links()[1].alpha * 1e6:.1f}",
    # bf16_gloo_w2.json: the all-reduce, a step and the accuracy, float32 against bfloat16
    "coll_bf16_time": lambda: _bf16_range(lambda f, b: b["time_over_float32"]),
    "coll_bf16_add": lambda: _bf16_range(lambda f, b: b["add_us"] / f["add_us"]),
    "coll_bf16_step_f32_ms": lambda: f"{_bf16_step('float32')['allreduce_in_step_us'] / 1e3:.1f}",
    "coll_bf16_step_bf16_ms": lambda: f"{_bf16_step('bfloat16, bfloat16 reduction')['allreduce_in_step_us'] / 1e3:.1f}",
    "coll_bf16_step_ratio": lambda: f"{_bf16_step('bfloat16, bfloat16 reduction')['ratio_to_float32']:.2f}",
    "coll_bf16_points": _bf16_points,
    "coll_bf16_goal": lambda: f"{_bf16()['goal_points']:g}",
}
