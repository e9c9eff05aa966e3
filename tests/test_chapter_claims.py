"""What the chapters' measurements and answers rest on, checked by computing it.

- Chapter 2's rows for chapter 1's Function.apply (cpp/overhead.py) time what their names say:
  the same work with and without the Python part, and the binding of the call's own arguments.
  (The figures the chapter quotes from its record are number markers: docs/render.py.)
- Chapter 4's answers to exercises 1 and 3: the instruction counts, computed by assembling the
  edits the exercises describe (needs nvcc, ptxas, cuobjdump and nvdisasm; slow).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from conftest import ROOT, load_script, run_script


def _chapter(path: str) -> str:
    """A chapter's text with each line break (and the indentation around it) folded into one space,
    so that a sentence matches across lines, and number markers (docs/render.py) reduced to their
    values; tabs inside a line, as in PTX, stay."""
    text = re.sub(r"<!-- (?:n \w+|/n) -->", "", (ROOT / path).read_text())
    return re.sub(r"[ \t]*\n\s*", " ", text)


# ---------------------------------------------------------------------------------------
# Chapter 2: what chapter 1's Function.apply and its binding cost (cpp/overhead.py's rows)
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def overhead():
    return load_script("cpp/overhead.py")


def test_the_apply_rows_time_the_same_work_with_and_without_the_binding(overhead):
    """Function.apply and the C++ apply under it compute the same output and record the same
    backward, so the difference between their rows is what apply adds; the binding row binds
    the call's own arguments."""
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(s, generator=gen).requires_grad_() for s in ((3, 5), (4, 5), (4,)))
    rows = overhead.apply_rows(x, w, b)
    assert set(rows) == {overhead.APPLY, overhead.UNDER, overhead.BINDING}
    via_apply, under = rows[overhead.APPLY][0](), rows[overhead.UNDER][0]()
    torch.testing.assert_close(via_apply, under, rtol=0, atol=0)
    assert type(via_apply.grad_fn) is type(under.grad_fn) and "DenseFunction" in type(under.grad_fn).__name__
    args, kwargs = rows[overhead.BINDING][0]()
    assert kwargs == {} and len(args) == 3 and all(a is t for a, t in zip(args, (x, w, b)))


# ---------------------------------------------------------------------------------------
# Chapter 4: the answers to exercises 1 and 3, computed
# ---------------------------------------------------------------------------------------
sr, disasm = load_script("cuda/static_report.py"), load_script("cuda/sass.py")
SASS_TOOLS = (disasm.find_tool("nvcc") is not None and disasm.find_tool("ptxas") is not None
              and disasm.sass_tools()[0] is not None)
NO_SASS = ("needs nvcc and ptxas (the CUDA toolkit), not found" if disasm.find_tool("nvcc") is None
           or disasm.find_tool("ptxas") is None else disasm.sass_tools()[1])

PTX = ROOT / "ptx" / "dense_kernels.ptx"
V4_STORE = re.compile(r"^(\s*)st\.global\.v4\.f32\s+\[(%\w+)(?:\+(-?\d+))?\],\s*\{([^}]*)\};.*$", re.M)


def exercise(text: str, number: int) -> str:
    """Exercise `number` of ptx/README.md (folded to one line)."""
    part = text.split("## Exercises", 1)[1].split("## Answers", 1)[0]
    return re.search(rf"(?:^| ){number}\. (.*?)(?= {number + 1}\. |$)", part)[1]


def answer(text: str, number: int) -> str:
    part = text.split("## Answers", 1)[1]
    return re.search(rf"(?:^| ){number}\. (.*?)(?= {number + 1}\. |$)", part)[1]


def stores_as_scalars(ptx: str) -> tuple[str, int]:
    """Exercise 3's edit: each st.global.v4.f32 becomes four st.global.f32, 4 bytes apart."""
    def four(m: re.Match) -> str:
        indent, base, offset, values = m[1], m[2], int(m[3] or 0), [v.strip() for v in m[4].split(",")]
        return "\n".join(f"{indent}st.global.f32 \t[{base}+{offset + 4 * i}], {v};" for i, v in enumerate(values))
    return V4_STORE.subn(four, ptx)


def sass_of(ptx: str, tmp: Path) -> dict:
    """ptx/sass_report.py on a copy of the PTX, run as the exercises tell the reader to: the record."""
    (tmp / "mine.ptx").write_text(ptx)
    result = run_script("ptx/sass_report.py", "--ptx", str(tmp / "mine.ptx"), "--json", str(tmp / "sass.json"),
                        timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return {e["function"]: e for e in json.loads((tmp / "sass.json").read_text())["edits"]}


@pytest.fixture(scope="module")
def exercises(tmp_path_factory):
    """The SASS report after exercise 1's edit and after exercise 3's, each on its own copy."""
    if not SASS_TOOLS:
        pytest.skip(NO_SASS)
    text, ptx = _chapter("ptx/README.md"), PTX.read_text()
    old, new = re.search(r"replace `([^`]+)` by `([^`]+)`", exercise(text, 1)).groups()
    assert ptx.count(old) == 1, f"exercise 1's line {old!r} is not once in {PTX.name}"
    one = sass_of(ptx.replace(old, new), tmp_path_factory.mktemp("exercise1"))
    scalar, n = stores_as_scalars(ptx)
    assert n == 5, f"exercise 3 names five 128-bit stores of dz; {PTX.name} has {n}"
    three = sass_of(scalar, tmp_path_factory.mktemp("exercise3"))
    return text, one, three


@pytest.mark.slow
def test_answer_1_counts_the_sigmoid_with_div_full(exercises):
    """div.full.f32 in place of rcp.approx: the sigmoid's SASS grows from the edited 6
    instructions (exercise 3's copy leaves the sigmoid as committed) to 11, still one MUFU.RCP
    and no call, with a test of the divisor (FSETP, FSEL) and two FMULs around the reciprocal."""
    text, one, three = exercises
    with_div, committed = one["dense_sigmoid_f32"]["edited"], three["dense_sigmoid_f32"]["edited"]
    m = re.search(r"(\d+) instructions instead of (\d+)", answer(text, 1))
    assert m and (int(m[1]), int(m[2])) == (with_div["instructions"], committed["instructions"])
    assert with_div["mufu"].get("MUFU.RCP") == 1 and with_div["calls"] == 0
    ops = with_div["opcodes"]
    assert any(op.startswith("FSETP") for op in ops) and any(op.startswith("FSEL") for op in ops)
    assert ops.get("FMUL") == 2


@pytest.mark.slow
def test_answer_3_counts_the_grad_kernel_with_scalar_stores(exercises):
    """Four 32-bit stores for each 128-bit one: STG back to the compiler's 21×32-bit, the loads
    untouched, and the kernel from the edited 505 instructions (exercise 1's copy leaves it as
    committed) to 528."""
    text, one, three = exercises
    grad = "dense_sigmoid_grad_v1_x4_f32"
    committed, scalar = one[grad]["edited"], three[grad]["edited"]
    a = answer(text, 3)
    m = re.search(r"from (\d+) to (\d+) instructions", a)
    assert m and (int(m[1]), int(m[2])) == (committed["instructions"], scalar["instructions"])
    m = re.search(r"(\d+)×32-bit", a)
    assert m and scalar["stg"] == three[grad]["compiler"]["stg"] == {"32": int(m[1])}
    m = re.search(r"`LDG` stays (\d+)×128-bit", a)
    assert m and scalar["ldg"] == committed["ldg"] == {"128": int(m[1])}
