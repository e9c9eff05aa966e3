"""The emulator's GPU instructions held against definitions written separately from it.

A kernel that agrees with a wrong emulator proves nothing, so each instruction the kernels use is
tested here against its own encoding of the PTX ISA's definition, never against a kernel:

- the fragment tables of mma.sync (which lane's register holds which element of A, B, C and D),
  transcribed from the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating point type"
  and "... mma.m16n8k8 ... .tf32" as thread/value layouts (the shape:stride notation CuTe uses
  for the same tables), a different form from the emulator's lane arithmetic
  (cuda/emulate/warp_matrix.h);
- ldmatrix's distribution of 8×8 matrices over the lanes, enumerated row by row as the PTX
  ISA's figure draws it;
- mma's arithmetic, on registers filled at random and read back through the tables above;
- cvt.rna.tf32.f32 (to nearest, ties away from zero), by a float64 implementation, on every
  boundary case: ties, carries into the exponent, subnormals, the largest finite values, ±inf, NaN;
- the bfloat16 and float16 conversions, on all 65,536 patterns, against torch's;
- cp.async, whose bytes arrive only at the wait that completes their group.

The emulator built with a planted wrong table (-DCUDA_EMU_PLANT_FRAGMENT) must fail these tests.
"""

from __future__ import annotations

import ctypes
import math
from itertools import product

import numpy as np
import pytest
import torch
from ptx_isa import ELEMENTS, LAYOUTS, ldmatrix_ptx, ptx_table

from conftest import load_script

emu = load_script("cuda/emulated.py")
if emu.unavailable_reason():
    pytest.skip(f"the emulation {emu.unavailable_reason()}", allow_module_level=True)

P, I32, I64 = ctypes.c_void_p, ctypes.c_int, ctypes.c_int64


def typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    lib.emu_fragment.argtypes = [I32, I32, I32, ctypes.POINTER(I32), ctypes.POINTER(I32)]
    lib.emu_fragment.restype = I32
    lib.emu_run_mma.argtypes, lib.emu_run_mma.restype = [I32, P, P, P, P], I32
    lib.emu_run_ldmatrix.argtypes, lib.emu_run_ldmatrix.restype = [I32, I32, P, I32, P, P], I32
    lib.emu_cvt_rna_tf32.argtypes, lib.emu_cvt_rna_tf32.restype = [P, P, I64], None
    lib.emu_convert.argtypes, lib.emu_convert.restype = [I32, I32, P, P, I64], None
    lib.emu_run_cp_async.argtypes, lib.emu_run_cp_async.restype = [P, P], I32
    return lib


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    return typed(emu.library())


# ---------------------------------------------------------------------------------------------
# The emulator's fragment tables against the PTX ISA's (tests/ptx_isa.py: LAYOUTS, ptx_table)
# ---------------------------------------------------------------------------------------------
def emulator_table(lib: ctypes.CDLL, table: int, count: int) -> dict[tuple[int, int], tuple[int, int]]:
    row, col = I32(), I32()
    out = {}
    for lane in range(32):
        for v in range(count):
            assert lib.emu_fragment(table, lane, v, ctypes.byref(row), ctypes.byref(col)) == 0
            out[lane, v] = (row.value, col.value)
    return out


@pytest.mark.parametrize("table", sorted(LAYOUTS), ids=["m16n8k16.A", "m16n8k16.B", "C", "m16n8k8.tf32.A",
                                                        "m16n8k8.tf32.B"])
def test_fragment_tables_are_the_ptx_isas(lib, table):
    want = ptx_table(table)
    rows, cols = LAYOUTS[table][:2]
    # every element of the operand once (the encoding itself is a bijection)
    assert len(set(want.values())) == rows * cols == 32 * ELEMENTS[table]
    assert emulator_table(lib, table, ELEMENTS[table]) == want


@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
def test_ldmatrix_table_is_the_ptx_isas(lib, trans):
    row, col = I32(), I32()
    got = {}
    for lane, half in product(range(32), range(2)):
        assert lib.emu_fragment(5, lane, half + 2 * trans, ctypes.byref(row), ctypes.byref(col)) == 0
        got[lane, half] = (row.value, col.value)
    assert got == ldmatrix_ptx(trans)


# ---------------------------------------------------------------------------------------------
# mma's arithmetic, through registers
# ---------------------------------------------------------------------------------------------
def pack16(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return lo.astype(np.uint32) | (hi.astype(np.uint32) << 16)


def bits16(values: np.ndarray, kind: str) -> np.ndarray:
    t = torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16 if kind == "bf16" else torch.float16)
    return t.view(torch.int16).numpy().view(np.uint16)


def value16(bits: np.ndarray, kind: str) -> np.ndarray:
    dtype = torch.bfloat16 if kind == "bf16" else torch.float16
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(dtype).float().numpy().astype(np.float64)


def run_mma(lib, kind: str, values_a: np.ndarray, values_b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Registers from per-lane element values (a: 32×elements...), one mma, d as 32×4."""
    code = {"bf16": 0, "f16": 1, "tf32": 2}[kind]
    if kind == "tf32":
        a = values_a.astype(np.float32).view(np.uint32)
        b = values_b.astype(np.float32).view(np.uint32)
    else:
        ea, eb = bits16(values_a, kind), bits16(values_b, kind)
        a = pack16(ea[:, 0::2], ea[:, 1::2])
        b = pack16(eb[:, 0::2], eb[:, 1::2])
    a, b = np.ascontiguousarray(a, np.uint32), np.ascontiguousarray(b, np.uint32)
    c = np.ascontiguousarray(c, np.float32)
    d = np.zeros((32, 4), np.float32)
    assert lib.emu_run_mma(code, a.ctypes.data, b.ctypes.data, c.ctypes.data, d.ctypes.data) == 0
    return d


def check_mma(lib, kind: str, integers: bool, seed: int) -> None:
    """Random registers, one mma; the matrices read back through the PTX tables, D = A·B + C."""
    rng = np.random.default_rng(seed)
    k = 8 if kind == "tf32" else 16
    ta, tb, tc = (3, 4, 2) if kind == "tf32" else (0, 1, 2)
    draw = (lambda *s: rng.integers(-8, 9, size=s).astype(np.float64)) if integers else \
        (lambda *s: rng.standard_normal(s))
    va, vb, vc = draw(32, ELEMENTS[ta]), draw(32, ELEMENTS[tb]), draw(32, 4)
    d = run_mma(lib, kind, va, vb, vc)
    # the values mma sees: rounded to the operand type (tf32: its bits, the low 13 ignored)
    if kind == "tf32":
        seen = lambda v: (v.astype(np.float32).view(np.uint32) & 0xFFFFE000).view(np.float32).astype(np.float64)  # noqa: E731
    else:
        seen = lambda v: value16(bits16(v, kind), kind)  # noqa: E731
    sa, sb = seen(va), seen(vb)
    A, B, C = np.zeros((16, k)), np.zeros((k, 8)), np.zeros((16, 8))
    for (lane, v), (r, c) in ptx_table(ta).items():
        A[r, c] = sa[lane, v]
    for (lane, v), (r, c) in ptx_table(tb).items():
        B[r, c] = sb[lane, v]
    for (lane, v), (r, c) in ptx_table(tc).items():
        C[r, c] = np.float32(vc[lane, v])
    D = A @ B + C
    want = np.array([[D[ptx_table(tc)[lane, v]] for v in range(4)] for lane in range(32)])
    if integers:  # every product and sum exact: bit for bit
        assert np.array_equal(d, want.astype(np.float32))
    else:
        np.testing.assert_allclose(d, want, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", ["bf16", "f16", "tf32"])
@pytest.mark.parametrize("integers", [True, False], ids=["integers", "normal"])
def test_mma_computes_a_times_b_plus_c_through_the_ptx_tables(lib, kind, integers):
    for seed in range(3):
        check_mma(lib, kind, integers, seed)


# ---------------------------------------------------------------------------------------------
# ldmatrix
# ---------------------------------------------------------------------------------------------
def check_ldmatrix(lib, n: int, trans: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    image = rng.integers(0, 1 << 16, size=2048, dtype=np.uint16)  # 4 KiB of shared memory
    # lanes 8j..8j+7 give matrix j's rows: any 16-byte-aligned places, here in a shuffled order
    offsets = (rng.permutation(256)[:32] * 16).astype(np.int32)
    out = np.zeros((32, 4), np.uint32)
    assert lib.emu_run_ldmatrix(n, int(trans), image.ctypes.data, image.nbytes, offsets.ctypes.data,
                                out.ctypes.data) == 0
    table = ldmatrix_ptx(trans)
    for lane, j, half in product(range(32), range(n), range(2)):
        r, c = table[lane, half]
        want = image[offsets[8 * j + r] // 2 + c]
        assert (int(out[lane, j]) >> (16 * half)) & 0xFFFF == want, (n, trans, lane, j, half)
    assert not out[:, n:].any()


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True], ids=["plain", "trans"])
def test_ldmatrix_hands_out_the_rows_as_the_ptx_isa_says(lib, n, trans):
    for seed in range(2):
        check_ldmatrix(lib, n, trans, seed)


# ---------------------------------------------------------------------------------------------
# A planted wrong table is caught
# ---------------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("plant", [1, 2], ids=["mma A rows and columns swapped", "ldmatrix .trans ignored"])
def test_a_planted_wrong_table_fails_these_checks(plant):
    wrong = typed(emu.load((f"-DCUDA_EMU_PLANT_FRAGMENT={plant}",)))
    if plant == 1:
        assert emulator_table(wrong, 0, 8) != ptx_table(0)
        with pytest.raises(AssertionError):
            check_mma(wrong, "bf16", True, 0)
    else:
        with pytest.raises(AssertionError):
            check_ldmatrix(wrong, 4, True, 0)


# ---------------------------------------------------------------------------------------------
# cvt.rna.tf32.f32
# ---------------------------------------------------------------------------------------------
TF32_MAX = (2 - 2.0 ** -10) * 2.0 ** 127


def rna_tf32(x: float) -> float:
    """float32 -> tf32, to nearest, ties away from zero, in float64 arithmetic: the quantum is
    2^(e-11) for |x| in [2^(e-1), 2^e) (11 significant bits), 2^-136 below float32's normal range
    (its subnormals keep their top 10 bits), and anything that rounds past TF32_MAX is inf."""
    if math.isnan(x) or math.isinf(x) or x == 0:
        return x
    _, e = math.frexp(abs(x))
    quantum = 2.0 ** (max(e, -125) - 11)
    r = math.floor(abs(x) / quantum + 0.5) * quantum
    return math.copysign(math.inf if r > TF32_MAX else r, x)


def boundary_floats() -> np.ndarray:
    """Every exponent, with the low 13 bits at and around a tie, below a carry, and the like."""
    lows = [0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF]
    highs = [0x000000, 0x002000, 0x3FE000, 0x7FC000, 0x7FE000, 0x400000]
    bits = [(s << 31) | (e << 23) | h | lo for s in (0, 1) for e in range(255) for h in highs for lo in lows]
    return np.array(bits, np.uint32).view(np.float32)


def test_cvt_rna_tf32_rounds_to_nearest_ties_away_on_every_boundary(lib):
    x = boundary_floats()
    got = np.zeros(len(x), np.uint32)
    lib.emu_cvt_rna_tf32(x.ctypes.data, got.ctypes.data, len(x))
    want = np.array([rna_tf32(float(v)) for v in x], np.float32).view(np.uint32)
    assert not (got & 0x1FFF).any(), "a tf32 result keeps only the top 10 mantissa bits"
    assert np.array_equal(got, want), f"{np.count_nonzero(got != want)} of {len(x)} differ"
    # the three kinds of edge by name: a tie goes away from zero, a carry reaches the exponent,
    # the largest float32 rounds to inf
    assert got[np.where(x.view(np.uint32) == 0x3F801000)[0][0]] == 0x3F802000
    assert got[np.where(x.view(np.uint32) == 0xBF801000)[0][0]] == 0xBF802000
    special = np.array([np.inf, -np.inf, np.nan, np.float32(3.4028235e38), 0.0, -0.0], np.float32)
    out = np.zeros(len(special), np.uint32)
    lib.emu_cvt_rna_tf32(special.ctypes.data, out.ctypes.data, len(special))
    assert list(out[:2]) == [0x7F800000, 0xFF800000] and math.isnan(out[2:3].view(np.float32)[0])
    assert out[3] == 0x7F800000 and list(out[4:]) == [0, 0x80000000]


def test_grad_checks_tf32_reference_rounds_as_the_definition_does():
    """grad_check.TF32Linear, the reference a TF32 kernel is judged against, rounds with
    grad_check.tf32: the same definition, on every boundary."""
    import grad_check

    x = boundary_floats()
    got = grad_check.tf32(torch.from_numpy(x.copy())).numpy().view(np.uint32)
    want = np.array([rna_tf32(float(v)) for v in x], np.float32).view(np.uint32)
    nan = np.isnan(x)
    assert np.isnan(got[nan].view(np.float32)).all()
    assert np.array_equal(got[~nan], want[~nan]), f"{np.count_nonzero(got[~nan] != want[~nan])} differ"


# ---------------------------------------------------------------------------------------------
# bfloat16 and float16: the emulator's conversions against torch's, on every pattern
# ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, dtype", [(0, torch.bfloat16), (1, torch.float16)], ids=["bf16", "f16"])
def test_16_bit_types_convert_as_torch_does_on_all_65536_patterns(lib, kind, dtype):
    patterns = np.arange(1 << 16, dtype=np.uint16)
    as_float = np.zeros(1 << 16, np.float32)
    lib.emu_convert(kind, 1, patterns.ctypes.data, as_float.ctypes.data, len(patterns))
    ref = torch.from_numpy(patterns.view(np.int16)).view(dtype).float().numpy()
    assert np.array_equal(as_float.view(np.uint32), ref.view(np.uint32))  # NaN payloads too
    # back: every 16-bit value, and the float32 values at and around the halfway points between them
    upper = np.arange(1 << 16, dtype=np.uint32) << 16
    floats = np.concatenate([upper | low for low in (0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF)]).view(np.float32)
    if kind == 1:  # float16's halfway points lie elsewhere: every float16 value and its neighbours
        halves = ref.astype(np.float64)
        halves = halves[np.isfinite(halves)]
        mids = (np.sort(halves)[1:] + np.sort(halves)[:-1]) / 2
        floats = np.concatenate([floats, mids.astype(np.float32), np.nextafter(mids.astype(np.float32), np.inf),
                                 np.nextafter(mids.astype(np.float32), -np.inf)])
    got = np.zeros(len(floats), np.uint16)
    lib.emu_convert(kind, 0, floats.ctypes.data, got.ctypes.data, len(floats))
    want = torch.from_numpy(floats).to(dtype).view(torch.int16).numpy().view(np.uint16)
    nan = np.isnan(floats)
    assert np.array_equal(got[~nan], want[~nan]), f"{np.count_nonzero(got[~nan] != want[~nan])} differ"
    # NaN stays NaN (the emulation gives cvt.rn's canonical 0x7FFF; torch gives 0x7FC0 / 0x7E00)
    back = torch.from_numpy(got[nan].view(np.int16)).view(dtype).float()
    assert back.isnan().all() and set(got[nan].tolist()) == {0x7FFF}


# ---------------------------------------------------------------------------------------------
# cp.async
# ---------------------------------------------------------------------------------------------
def test_cp_async_bytes_arrive_at_the_wait_that_completes_their_group(lib):
    src = np.arange(32 * 8, dtype=np.float32) + 1
    out = np.zeros((32, 32), np.float32)
    assert lib.emu_run_cp_async(src.ctypes.data, out.ctypes.data) == 0
    mine = src.reshape(32, 8)
    before, after_one, after_all, neighbour = out[:, :8], out[:, 8:16], out[:, 16:24], out[:, 24:]
    assert (before == -1).all(), "copies landed before any wait"
    assert np.array_equal(after_one[:, :4], mine[:, :4]) and (after_one[:, 4:] == -1).all()
    assert np.array_equal(after_all, mine)
    assert np.array_equal(neighbour, np.roll(mine, -1, axis=0))
