"""cuda/exact_check.py away from a GPU: the committed expected bits are the CPU emulation's and
cover every entry of the catalogue; the comparison catches a planted one-bit difference and stops
at a fault; the inputs are exact in every type and the same on any machine."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from conftest import ROOT, load_script

exact = load_script("cuda/exact_check.py")
emulated = load_script("cuda/emulated.py")

needs_emulation = pytest.mark.skipif(emulated.unavailable_reason() is not None,
                                     reason=f"the emulation {emulated.unavailable_reason()}")


@pytest.fixture(scope="module")
def expected() -> dict:
    return exact.read_expected()


def _tma(version: int, dtype: str) -> bool:
    return exact.row_multiples()(version, exact.TORCH_DTYPES[dtype]) > 1


@needs_emulation
def test_the_committed_file_holds_every_entry_of_the_catalogue_and_nothing_else(expected):
    """A version, type or candidate added to cuda/dense_kernels.h (or a shape to EXACT_SHAPES)
    fails this until `python cuda/exact_check.py expect` writes the file anew."""
    assert [e["key"] for e in exact.plan()] == list(expected["expected"])
    assert expected["sm_count"] == exact.SM_COUNT == 132
    assert exact.from_keys(list(expected["expected"])) == exact.plan()  # the GPU side reads the plan back


@needs_emulation
@pytest.mark.parametrize("unit", ["v3", "v12", "v35", "candidate 0"])
def test_the_committed_bits_are_the_emulations(expected, unit):
    """A sample (the whole file: the slow test below): the emulation as it is now, at the lent
    cards' SM count, gives the very bits the file holds."""
    entries = exact.entries_of(unit, exact.plan())
    result = exact.compare(entries, expected["expected"], exact.emulation_gemm(expected["sm_count"]),
                           say=lambda s: None)
    assert result["status"] == "SAME" and result["compared"] == len(entries) > 0, result


@pytest.mark.slow
@needs_emulation
def test_every_committed_bit_is_the_emulations():
    got = subprocess.run([sys.executable, "cuda/exact_check.py", "check"], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    assert got.returncode == 0 and "SAME" in got.stdout, got.stdout[-2000:] + got.stderr[-2000:]


@needs_emulation
def test_the_comparison_finds_a_planted_one_bit_difference(expected, capsys):
    """Bits, not values: the lowest bit of one element of one result flipped is a DIFF that names
    the entry, where, and the two values; the other entries still compare."""
    entries = exact.entries_of("v3", exact.plan())
    truth = exact.emulation_gemm(expected["sm_count"])
    planted = entries[4]["key"]

    def gemm(version, layout, a, b, m, n, k):
        c = truth(version, layout, a, b, m, n, k)
        if exact.entry_key("v3", {torch.float32: "f32", torch.float64: "f64"}[a.dtype], layout, (m, n, k)) == planted:
            bits = {torch.float32: torch.int32, torch.float64: torch.int64}[c.dtype]
            c.view(-1).view(bits)[7] ^= 1
        return c
    result = exact.compare(entries, expected["expected"], gemm)
    assert result["status"] == "DIFF" and result["compared"] == len(entries)
    assert len(result["differences"]) == 1 and result["differences"][0].startswith(f"{planted}: first at [")
    assert "1 of" in result["differences"][0] and f"DIFF  {planted}" in capsys.readouterr().out


def test_a_fault_stops_the_version_and_says_which_entry_and_the_error():
    """After a sticky error nothing more on the GPU can be trusted: no entry after it is launched."""
    entries = [{"key": f"v9 f32 nt M={m} N=1 K=1", "label": "v9", "version": 9, "dtype": "f32", "layout": "nt",
                "shape": [m, 1, 1]} for m in (1, 2, 3)]
    launched = []

    def gemm(version, layout, a, b, m, n, k):
        launched.append(m)
        if m == 2:
            raise exact.Fault("CUDA error: an illegal memory access was encountered")
        return exact.exact_product(layout, a, b)
    want = {e["key"]: exact.digest(exact.exact_product("nt", *exact.entry_inputs(e["key"], "nt", (e["shape"][0], 1, 1),
                                                                                  "f32"))) for e in entries}
    result = exact.compare(entries, want, gemm, say=lambda s: None)
    assert launched == [1, 2] and result["status"] == "FAULT" and result["compared"] == 1
    assert result["fault"] == "v9 f32 nt M=2 N=1 K=1: CUDA error: an illegal memory access was encountered"


def test_an_entry_the_file_lacks_is_a_difference():
    entries = [{"key": "v9 f32 nt M=1 N=1 K=1", "label": "v9", "version": 9, "dtype": "f32", "layout": "nt",
                "shape": [1, 1, 1]}]
    result = exact.compare(entries, {}, lambda *a: pytest.fail("nothing to compare with: no launch"),
                           say=lambda s: None)
    assert result["status"] == "DIFF" and result["missing"] == ["v9 f32 nt M=1 N=1 K=1"]


@needs_emulation
def test_an_entry_that_takes_none_of_the_shapes_is_refused(monkeypatch):
    """Odd shapes only: the TMA versions would go unchecked, which must not pass as agreement."""
    monkeypatch.setattr(exact, "EXACT_SHAPES", ((5, 3, 7),))
    with pytest.raises(exact.cli.UserError, match="v32 bf16: none of"):
        exact.plan()


@needs_emulation
def test_the_exact_shapes_give_the_tma_versions_partial_tiles():
    """Each TMA version (32-35, rows of whole 16 bytes) takes the shapes that are multiples of 8 in
    every dimension, and they still leave partial tiles: M and N not multiples of the 64-row and
    128-column tiles, K not a multiple of 64-wide k-steps, a batch under 32 (v35's), and K long
    enough for 5 k-steps, more than the 4 stages of v32's and v33's rings."""
    aligned = [s for s in exact.EXACT_SHAPES if all(d % 8 == 0 for d in s)]
    odd = [s for s in exact.EXACT_SHAPES if s not in aligned]
    assert len(aligned) >= 3 and odd and all(any(d % 2 for d in s) for s in odd)
    assert any(m % 64 and n % 128 and k % 64 for m, n, k in aligned)
    assert any(m < 32 for m, _, _ in aligned) and max(k for _, _, k in aligned) > 4 * 64
    tma = set()
    for label, v, dtype in exact.exact_entries():
        shapes = exact.exact_shapes(v, dtype, exact.row_multiples())
        assert shapes == (aligned if _tma(v, dtype) else list(exact.EXACT_SHAPES)), label
        tma |= {label} if _tma(v, dtype) else set()
    assert tma == {"v32", "v33", "v34", "v35"}


def test_the_inputs_are_the_same_on_any_machine_and_exact_in_every_type():
    """Integers -2 to 2 from integer arithmetic alone (a random generator's stream may change
    between torch versions): pinned here by a few values; a K-long dot product is an integer of
    at most 4·K, which float32's 24 bits hold, and bfloat16 and float16 hold every input."""
    a = exact.integer_operands((64, 257), 12345)
    assert set(a.unique().tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}
    assert a[0, :8].tolist() == exact.integer_operands((1, 8), 12345)[0].tolist()
    assert torch.equal(a, exact.integer_operands((64, 257), 12345))
    assert not torch.equal(a, exact.integer_operands((64, 257), 12346))
    assert exact.integer_operands((2, 4), 7).tolist() == PINNED
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(a.to(dtype).float(), a)
    assert max(k for _, _, k in exact.EXACT_SHAPES) * 4 < 2 ** 24


PINNED = [[0.0, 2.0, 1.0, 2.0], [2.0, 2.0, 2.0, -2.0]]  # integer_operands((2, 4), 7), as computed when written


@needs_emulation
def test_the_exact_inputs_are_exact_in_tf32_and_leave_split_tf32_nothing_small():
    """cvt.rna.tf32 (the emulation's, held to the PTX ISA's rounding by tests/test_instructions.py)
    leaves -2..2 unchanged: v25's rounding changes nothing, and split-TF32's a − tf32(a) is 0."""
    import ctypes

    lib = emulated.library()
    lib.emu_cvt_rna_tf32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    values = torch.arange(-2, 3, dtype=torch.float32)
    bits = torch.empty(5, dtype=torch.int32)
    lib.emu_cvt_rna_tf32(values.data_ptr(), bits.data_ptr(), 5)
    assert torch.equal(bits.view(torch.float32), values) and torch.equal(values - bits.view(torch.float32),
                                                                         torch.zeros(5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_first_difference_compares_bits(dtype):
    a = torch.zeros(3, 4, dtype=dtype)
    assert exact.first_difference(a, a.clone()) is None
    b = a.clone()
    b[2, 1] = -0.0  # equal as numbers, not as bits
    assert exact.first_difference(b, a).startswith("first at [2, 1]: -0.0 against the expected 0.0")
    assert "against the expected" in exact.first_difference(a, torch.zeros(4, 3, dtype=dtype))


def test_every_candidate_and_every_version_in_every_type_is_an_entry():
    entries = exact.exact_entries()
    candidates = [(label, v) for label, v, t in entries if label.startswith("candidate")]
    assert candidates == [(f"candidate {c.index}", c.version) for c in exact.catalog.candidates()]
    assert all(t == "f32" for label, _, t in entries if label.startswith("candidate"))
    assert exact.units()[:2] == ["v0", "v1"] and exact.unit_name("33") == "v33"
    assert exact.unit_name("candidate3") == exact.unit_name("candidate 3") == "candidate 3"


@pytest.mark.slow  # a subprocess that imports torch
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal of a machine without a GPU")
def test_one_refuses_in_one_line_without_a_gpu():
    got = subprocess.run([sys.executable, "cuda/exact_check.py", "one", "--version", "3"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert got.returncode == 2 and "no GPU here" in got.stderr and "Traceback" not in got.stderr
    assert json.loads((ROOT / "cuda" / "exact_expected.json").read_text())["command"].startswith(
        "python cuda/exact_check.py expect")
