"""The numbers in the sentences of the README and the measuring appendix (README.md,
docs/README.md), by the names their number markers give them (<!-- n NAME -->value<!-- /n -->,
written by python docs/render.py), each computed from the record or the source that backs it.

The records: the 1024³ timing (cpu_1024.json) and the sweep (cpu_sweep.json); the source: the
timing harness (timing.py), grad_check.py's tolerances and rule, the budgets in docs/render.py,
the cap on records in tests/test_records.py and the Python pyproject.toml requires."""

from __future__ import annotations

import ast
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path

import cli
from record_info import SUPERSCRIPT, committed, source_constants, source_match

ROOT = Path(__file__).resolve().parent.parent


def _default(path: str, function: str, argument: str) -> object:
    """The default value of a function's keyword argument, from its source."""
    node = next(n for n in ast.parse((ROOT / path).read_text()).body
                if isinstance(n, ast.FunctionDef) and n.name == function)
    args = node.args.args
    defaults = dict(zip([a.arg for a in args[len(args) - len(node.args.defaults):]], node.args.defaults))
    return ast.literal_eval(defaults[argument])


def power_of_ten(x: float) -> str:
    """1e-4 -> "10⁻⁴"."""
    exponent = round(math.log10(x))
    if 10.0 ** exponent != x:
        raise ValueError(f"{x} is not a power of ten")
    return "10" + str(exponent).translate(SUPERSCRIPT)


def fewest_rounds() -> str:
    """The fewest per-round ratios timing.median_ci gives an interval for."""
    timing = cli.load_file("timing.py")
    n = 1
    while timing.median_ci(list(range(n))) is None:
        n += 1
    return str(n)


@cache
def _render() -> object:
    return cli.load_file("docs/render.py")


def words(n: int) -> str:
    return f"{n:,}"


def budget_exceptions() -> str:
    """The chapters whose budget is not the common one: "6,000 for `a` and `b`"."""
    render = _render()
    by: dict[int, list[str]] = {}
    for page, words_ in render.BUDGET_EXCEPTIONS.items():
        if words_ != render.BUDGET_CHAPTER:
            by.setdefault(words_, []).append(f"`{page}`")
    return "; ".join(f"{words(n)} for {' and '.join(sorted(pages))}" for n, pages in sorted(by.items()))


NUMBERS: dict[str, Callable[[], str]] = {
    # README.md: the Python it needs, and the level of the timing table's intervals
    "book_python": lambda: source_match("pyproject.toml", r'^requires-python\s*=\s*">=\s*([\d.]+)"'),
    "book_table_ci": lambda: f"{committed('cpu_1024.json')['ci_level']:.0%}",
    # docs/README.md, how a benchmark times: a CPU sample's least length, the intervals' level,
    # the fewest rounds that give one, the sweep's replicates
    "book_sample_ms": lambda: f"{_default('timing.py', 'measure', 'min_sample_s') * 1000:g}",
    "book_ci_level": lambda: f"{source_constants('timing.py')['CI_LEVEL']:.0%}",
    "book_fewest_rounds": fewest_rounds,
    "book_sweep_replicates": lambda: str(committed("cpu_sweep.json")["replicates"]),
    # how an answer is judged: grad_check's tolerances and rule
    "book_rtol32": lambda: power_of_ten(source_constants("grad_check.py")["RTOL"]),
    "book_rtol64": lambda: power_of_ten(source_constants("grad_check.py")["RTOL64"]),
    "book_factor": lambda: f"{source_constants('grad_check.py')['FACTOR']:g}",
    "book_floor": lambda: f"{source_constants('grad_check.py')['FLOOR']:g}",
    # the cap on kinds of record, and the prose budgets
    "book_max_records": lambda: str(source_constants("tests/test_records.py")["MAX_RECORDS"]),
    "book_budget_chapter": lambda: words(_render().BUDGET_CHAPTER),
    "book_budget_exceptions": lambda: budget_exceptions(),
    "book_budget_all": lambda: words(_render().BUDGET_ALL),
}
