"""The numbers in the sentences of chapter 1 (py/README.md), by the names their number
markers give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each
computed from the record or the source that backs it.

The records: the 1024³ timing (cpu_1024.json) and chapter 2's costs of a small call
(cpp_overhead.json); the source: grad_check.py's rule for a 16-bit answer."""

from __future__ import annotations

from collections.abc import Callable

import cli
from record_info import committed, source_constants


def _cpp():
    """Chapter 2's numbers, which read the same record of a small call's costs."""
    return cli.load_file("cpp/page_numbers.py")


def _overhead_us() -> dict[str, float]:
    return _cpp().overhead_us()


def binding_over_forward() -> bool:
    """Whether Function.apply's binding alone takes longer than the reference's whole forward."""
    return _overhead_us()["py: inspect binding alone"] > _overhead_us()["reference: forward"]


def apply_over_forward() -> bool:
    """Whether Function.apply alone takes longer than the reference's whole forward."""
    return _overhead_us()["py: Function.apply"] > _overhead_us()["reference: forward"]


def shape(key: str) -> str:
    return str(committed("cpu_1024.json")["shape"][key])


NUMBERS: dict[str, Callable[[], str]] = {
    # the small call chapter 2 times: its shape, and what the binding and apply cost against
    # the reference's forward
    "py_overhead_batch": lambda: str(committed("cpp_overhead.json")["shape"]["batch"]),
    "py_overhead_features": lambda: _cpp().overhead_features(),
    "py_binding_longer": lambda: "longer" if binding_over_forward() else "less time",
    "py_apply_more": lambda: "more" if apply_over_forward() else "less",
    # grad_check's rule: FACTOR times nn.Linear's error plus FLOOR·u of the largest size
    "py_factor": lambda: f"{source_constants('grad_check.py')['FACTOR']:g}",
    "py_floor": lambda: f"{source_constants('grad_check.py')['FLOOR']:g}",
    # the timing's shape: B × I → O
    "py_timed_batch": lambda: shape("batch"),
    "py_timed_in": lambda: shape("in"),
    "py_timed_out": lambda: shape("out"),
}
