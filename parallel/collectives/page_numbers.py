"""The numbers in the sentences of chapter 7, continued
(parallel/collectives/README.md), by the names its number markers give them
(<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed from the
record or the source that backs it."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path

RESULTS = Path(__file__).resolve().parent.parent.parent / "docs" / "results"


@functools.cache
def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _repeat_spread() -> str:
    """The widest spread of the launches' median ratios at one setting (highest − lowest)."""
    from parallel.collectives import repeat

    settings = repeat.summary(_record("allreduce_repeat_w2.json")).values()
    return f"{max(s['highest'] - s['lowest'] for s in settings):.2f}"


def _repeat_shift() -> str:
    """What lowering gloo's threads did to the ratio in each pair of launches (the second
    setting's ratio minus the first's), smallest change to largest."""
    from parallel.collectives import repeat

    changes = sorted((-d for d in repeat.paired_shifts(_record("allreduce_repeat_w2.json"))), key=abs)
    return f"{changes[0]:+.2f} to {changes[-1]:+.2f}".replace("-", "−")


def _links():
    from parallel.collectives.costmodel import INFINIBAND, NVLINK

    return NVLINK, INFINIBAND


NUMBERS: dict[str, Callable[[], str]] = {
    "coll_repeat_spread": _repeat_spread, "coll_repeat_shift": _repeat_shift,
    # the projection's links (costmodel.NVLINK, costmodel.INFINIBAND): bandwidth and NCCL's α
    "coll_nvlink_gbs": lambda: f"{1 / _links()[0].beta / 1e9:.0f}",
    "coll_ib_gbits": lambda: f"{8 / _links()[1].beta / 1e9:.0f}",
    "coll_nvlink_alpha": lambda: f"{_links()[0].alpha * 1e6:.1f}",
    "coll_ib_alpha": lambda: f"{_links()[1].alpha * 1e6:.1f}",
}
