"""The numbers in the sentences of chapter 2 (cpp/README.md), by the names its number markers
give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each computed
from the record or the source that backs it."""

from __future__ import annotations

import functools
from collections.abc import Callable

from record_info import committed, source_match


@functools.cache
def overhead_us() -> dict[str, float]:
    """cpp/overhead.py's record: row name -> median µs per call."""
    return {r["name"]: r["median_us"] for r in committed("cpp_overhead.json")["rows"]}


@functools.cache
def _rows() -> tuple[str, str, str]:
    """The names overhead.py gives Function.apply's row, the C++ apply's under it, the binding's."""
    import cli

    overhead = cli.load_file("cpp/overhead.py")
    return overhead.APPLY, overhead.UNDER, overhead.BINDING


def overhead_features() -> str:
    """The overhead record's I = O (the page writes them as one)."""
    shape = committed("cpp_overhead.json")["shape"]
    if shape["in"] != shape["out"]:
        raise ValueError(f"cpp_overhead.json's shape has I != O ({shape}); the page writes I=O")
    return str(shape["in"])


def apply_over_under() -> str:
    """What Function.apply costs over the C++ apply under it, µs (medians' difference)."""
    apply, under, _ = _rows()
    return f"{overhead_us()[apply] - overhead_us()[under]:.1f}"


def binding_vs_forward() -> str:
    """Whether the inspect binding alone takes more or less than the reference's whole forward."""
    binding = overhead_us()[_rows()[2]]
    return "more" if binding > overhead_us()["reference: forward"] else "less"


NUMBERS: dict[str, Callable[[], str]] = {
    "cpp_overhead_batch": lambda: str(committed("cpp_overhead.json")["shape"]["batch"]),
    "cpp_overhead_features": overhead_features,
    "cpp_apply_over_under": apply_over_under,
    "cpp_binding_us": lambda: f"{overhead_us()[_rows()[2]]:.1f}",
    "cpp_binding_vs_forward": binding_vs_forward,
    "cpp_reference_forward_us": lambda: f"{overhead_us()['reference: forward']:.1f}",
    # the cores of the machine the CPU records were taken on (exercise 1's answer)
    "cpp_record_cpus": lambda: str(committed("cpu_sweep.json")["cpus"]),
    # the kernels' constants: the blocked paths' limit on input features and block size, the
    # few-rows path's limit, the rows a column sum keeps in float
    "cpp_blocked_max_in": lambda: source_match("cpp/dense.cpp", r"\bin_f <= (\d+)"),
    "cpp_block_kib": lambda: source_match("cpp/dense.cpp", r"\((\d+) << 10\)"),
    "cpp_few_rows": lambda: source_match("cpp/dense.cpp", r"constexpr int64_t kFewRows = (\d+);"),
    "cpp_sum_rows": lambda: source_match("cpp/dense.cpp", r"constexpr int64_t kSumRows = (\d+);"),
}
