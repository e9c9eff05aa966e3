"""The numbers in the sentences of chapter 4 (ptx/README.md), by the names their number
markers give them (<!-- n NAME -->value<!-- /n -->, written by python docs/render.py), each
computed from the record or the source that backs it.

The records: the SASS of the two edits (ptx_sass_sm90.json) and the newest timing of the edited
PTX against the compiler's (ptx_gpu_{card}.json, the one the chapter's table shows); the source:
ptx/sigmoid_bound.py's derived bound on EDIT-A's error."""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from functools import cache
from pathlib import Path

import cli
from record_info import RESULTS, committed, in_words

ROOT = Path(__file__).resolve().parent.parent

PTX = ROOT / "ptx" / "dense_kernels.ptx"
V4_STORE = re.compile(r"^\s*st\.global\.v4\.f32\s+\[%\w+(?:\+-?\d+)?\],\s*\{[^}]*\};", re.M)
BOUND_SAMPLES = 200_001  # evenly spaced z for the bound's maximum (a tenth of a second)


@cache
def timing() -> dict:
    """The newest record of the PTX timings, the one the chapter's gpu_ptx table shows."""
    found = cli.load_file("docs/records.py").of_kind("ptx_gpu_{card}.json", RESULTS)
    if not found:
        raise ValueError("no ptx_gpu_{card}.json record in docs/results")
    return found[0][1]["ptx"]


def sass(tag: str, which: str) -> dict:
    """The SASS figures of an edit (EDIT-A, EDIT-B), from the compiler's PTX or the edited one."""
    return next(e for e in committed("ptx_sass_sm90.json")["edits"] if e["tag"] == tag)[which]


def width(counts: dict[str, int]) -> str:
    """One width of access, as the table writes it: {"32": 21} -> "21×32-bit"."""
    if len(counts) != 1:
        raise ValueError(f"accesses of more than one width: {counts}")
    (bits, n), = counts.items()
    return f"{n}×{bits}-bit"


@cache
def _bound() -> tuple[float, float, object]:
    """The sigmoid bound's maximum over z, the z where it is reached, and the module."""
    bound = cli.load_file("ptx/sigmoid_bound.py")
    z = bound.samples(BOUND_SAMPLES)
    b = bound.bound(z)
    return float(b.max()), float(z[b.argmax()]), bound


def bound_max() -> str:
    """2.069e-07 -> "2.1e-7"."""
    mantissa, exponent = f"{_bound()[0]:.1e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def grad_v4_stores() -> str:
    """The 128-bit stores of dz in EDIT-B's kernel (exercise 3 turns each back into four)."""
    text = PTX.read_text()
    start = text.index(".entry dense_sigmoid_grad_v1_x4_f32")
    return in_words(len(V4_STORE.findall(text, start, text.index("\n}\n", start))))


def square() -> int:
    """The edge of the square shape the edits are timed at (B = I = O)."""
    b, i, o = timing()["shapes"]["4096"]["shape"]
    if not b == i == o:
        raise ValueError(f"the square shape is {b}, {i}, {o}; the page writes it as a cube")
    return b


def elementwise_faster() -> str:
    """How much faster the training step is with EDIT-B at the elementwise-heavy shape."""
    return f"{(timing()['shapes']['elementwise']['fwd+bwd']['speedup'] - 1) * 100:.1f}%"


NUMBERS: dict[str, Callable[[], str]] = {
    # EDIT-A's error bound: its maximum, in units of u = 2^-24, where it is reached, the
    # rounding of the constant log2 e in u, and the range the script samples
    "ptx_bound_max": bound_max,
    "ptx_bound_max_u": lambda: f"{_bound()[0] / _bound()[2].U:.1f}",
    "ptx_bound_argmax": lambda: f"{_bound()[1]:.2f}",
    "ptx_bound_eps_c": lambda: f"{_bound()[2].EPS_C / _bound()[2].U:.2f}",
    "ptx_bound_limit": lambda: f"{inspect.signature(_bound()[2].samples).parameters['limit'].default:g}",
    # the timings: the square shape (its K: the multiply-adds per sigmoid), EDIT-B's gain on the
    # training step, and the elementwise-heavy shape it is measured at
    "ptx_square": lambda: str(square()),
    "ptx_edit_b_faster": elementwise_faster,
    "ptx_elementwise_b": lambda: str(timing()["shapes"]["elementwise"]["shape"][0]),
    "ptx_elementwise_i": lambda: str(timing()["shapes"]["elementwise"]["shape"][1]),
    "ptx_elementwise_o": lambda: str(timing()["shapes"]["elementwise"]["shape"][2]),
    # the SASS record: the architecture it is for, and, as the answers quote it, the edited
    # sigmoid's and grad kernel's sizes, the edited kernel's loads and the compiler's stores
    "ptx_sass_arch": lambda: committed("ptx_sass_sm90.json")["arch"],
    "ptx_edit_a_instructions": lambda: str(sass("EDIT-A", "edited")["instructions"]),
    "ptx_edit_b_instructions": lambda: str(sass("EDIT-B", "edited")["instructions"]),
    "ptx_edit_b_ldg": lambda: width(sass("EDIT-B", "edited")["ldg"]),
    "ptx_compiler_stg": lambda: width(sass("EDIT-B", "compiler")["stg"]),
    # the source: the 128-bit stores exercise 3 names
    "ptx_grad_v4_stores": grad_v4_stores,
}
