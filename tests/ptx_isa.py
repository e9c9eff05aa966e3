"""The PTX ISA's tables, written from the ISA's text and independent of the emulator, for the
tests that check the emulator (test_instructions.py, test_hopper.py) and the figures drawn from
it (test_tc_figures.py): mma's fragments (ptx_table) and ldmatrix's (ldmatrix_ptx), wgmma's
accumulator (d_table), its matrix descriptor's fields (FIELDS, encode) and the shared-memory
swizzles (SWIZZLE, SPAN, swizzle_rows). A layout is (shape, stride): index
v = v0 + s0·v1 + ... (first mode fastest) maps to the offset Σ vi·stride_i."""

from __future__ import annotations

import functools

SWIZZLE = {"none": 0, "128B": 1, "64B": 2, "32B": 3}  # the descriptor's bits 62-63
SPAN = {0: 0, 1: 128, 2: 64, 3: 32}


# mma's fragments: (thread shape, thread stride, value shape, value stride) mapping
# lane = t0 + 4·t1 (t0 = threadID_in_group, t1 = groupID) and element index v to an offset in the
# matrix stored column-major (offset = row + rows·col). A is M×K, B is K×N but stored here as N×K
# (its columns are what a lane holds), C is M×N.
LAYOUTS = {
    # table id of emu_fragment: (rows, cols, (thread shape, stride), (value shape, stride), transposed)
    0: (16, 16, ((4, 8), (32, 1)), ((2, 2, 2), (16, 8, 128)), False),  # m16n8k16 A: M16 × K16
    1: (8, 16, ((4, 8), (16, 1)), ((2, 2), (8, 64)), True),            # m16n8k16 B: stored N8 × K16
    2: (16, 8, ((4, 8), (32, 1)), ((2, 2), (16, 8)), False),           # C/D: M16 × N8
    3: (16, 8, ((4, 8), (16, 1)), ((2, 2), (8, 64)), False),           # m16n8k8 tf32 A: M16 × K8
    4: (8, 8, ((4, 8), (8, 1)), ((2,), (32,)), True),                  # m16n8k8 tf32 B: stored N8 × K8
}
ELEMENTS = {0: 8, 1: 4, 2: 4, 3: 4, 4: 2}


def offset(shape: tuple[int, ...], stride: tuple[int, ...], index: int) -> int:
    """Index `index` of a layout (shape, stride), first mode fastest, as an offset."""
    total = 0
    for n, s in zip(shape, stride):
        total += (index % n) * s
        index //= n
    return total


def ptx_table(table: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(lane, element) -> (row, col) of the operand as mma reads it (A: m, k; B: k, n; C: m, n)."""
    rows, _, (tshape, tstride), (vshape, vstride), transposed = LAYOUTS[table]
    out = {}
    for lane in range(32):
        for v in range(ELEMENTS[table]):
            o = offset(tshape, tstride, lane) + offset(vshape, vstride, v)
            r, c = o % rows, o // rows
            out[lane, v] = (c, r) if transposed else (r, c)
    return out


def ldmatrix_ptx(trans: bool) -> dict[tuple[int, int], tuple[int, int]]:
    """(lane, half) -> (row, col) of the 8×8 matrix as stored: the PTX ISA's figure, row by row:
    row r's eight elements go, two at a time, to lanes 4r, 4r+1, 4r+2, 4r+3; .trans hands out the
    transposed matrix's rows instead."""
    out = {}
    for r in range(8):
        for pair in range(4):
            for half in range(2):
                c = 2 * pair + half
                out[4 * r + pair, half] = (c, r) if trans else (r, c)
    return out


@functools.cache
def d_table(n: int) -> dict[tuple[int, int], tuple[int, int]]:
    """(thread, element) -> (row, col) of wgmma's m64nNk accumulator, for N = `n`."""
    out = {}
    for thread in range(128):
        for v in range(n // 2):
            o = offset((4, 8, 4), (128, 1, 16), thread) + offset((2, 2, n // 8), (64, 8, 512), v)
            out[thread, v] = (o % 64, o // 64)
    return out


FIELDS = {"start": (0, 14), "lbo": (16, 14), "sbo": (32, 14), "base_offset": (49, 3), "swizzle": (62, 2)}


def encode(**values) -> int:
    """A wgmma matrix descriptor from its FIELDS' values (addresses in bytes, multiples of 16)."""
    desc = 0
    for name, (low, width) in FIELDS.items():
        v = values.get(name, 0)
        if name in ("start", "lbo", "sbo"):
            assert v % 16 == 0
            v >>= 4  # addresses and offsets in units of 16 bytes
        assert 0 <= v < 1 << width
        desc |= v << low
    return desc


def swizzle_rows(addr: int, mode: int) -> int:
    """128B: rows of 128 bytes, chunk ^ (row % 8). 64B: rows of 64 bytes, two rows to 128 bytes,
    chunk ^ (row // 2 % 4). 32B: rows of 32 bytes, chunk ^ (row // 4 % 2). (Every atom repeats
    every 1024 bytes: the row counted within it.)"""
    s = SPAN[mode]
    if s == 0:
        return addr
    row, chunk, within = addr // s, addr % s // 16, addr % 16
    key = {128: row % 8, 64: row // 2 % 4, 32: row // 4 % 2}[s]
    return row * s + (chunk ^ key) * 16 + within
