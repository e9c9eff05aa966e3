"""Draw the tensor-core chapter's figures from the CPU emulation's own model of the instructions.

Every figure but the last asks the emulation library (cuda/emulated.py's build, through ctypes)
what it does, and draws the answer: no table is typed here, so a wrong model draws a wrong
picture. tests/test_tc_figures.py holds each function's numbers against the separate encodings
of the PTX ISA in tests/test_instructions.py and tests/test_hopper.py.

tc_mma_fragments.png: mma.sync.m16n8k16 (bfloat16): which lane holds each element of A (16×16),
B (16×8, k down) and C/D (16×8), and in which register (emu_fragment).
tc_ldmatrix.png: ldmatrix.x4: which lane's address gives each row of the four 8×8 matrices, and
which lane receives each element (emu_run_ldmatrix, run on rows placed at scrambled addresses).
tc_wgmma_d.png: wgmma m64n16k16's accumulator D: each element's thread and register, the rows
coloured by warp (emu_wgmma_fragment).
tc_swizzle128.png: the 128-byte swizzle on an 8-row × 128-byte tile: where each 16-byte chunk
of each row lands (emu_swizzle).
tc_descriptor.png: the 64-bit matrix descriptor: each field's bits, found by decoding every
single-bit descriptor (emu_descriptor_decode), and an example descriptor (v31's B operand at its
second k-step) decoded.
tc_pipeline.png: v33's TMA ring (tma_pipeline.cuh) as a timeline of its producer, the copy engine
and its two consumers, from an emulated run with the emulator's event trace on
(cuda/tensor_cores/trace.py, which also writes the events as a Chrome trace-event file).
tc_split_tf32.png: the forward GEMM's error against K for float32, TF32 and split-TF32, from the
record of cuda/tensor_cores/tf32_error.py (--record).

Needs matplotlib (an optional extra: pip install matplotlib).

Examples:
  python cuda/tensor_cores/figures.py --out /tmp                 # every figure, into /tmp
  python cuda/tensor_cores/figures.py --out /tmp --only tc_swizzle128.png
(The committed figures: python cuda/tensor_cores/figures.py --out docs/figures)
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

NAMES = ("tc_mma_fragments.png", "tc_ldmatrix.png", "tc_wgmma_d.png", "tc_swizzle128.png", "tc_descriptor.png",
         "tc_pipeline.png", "tc_split_tf32.png")
RECORD = ROOT / "docs" / "results" / "tf32_error_cpu.json"
# Okabe and Ito's eight colours, told apart with every common colour-vision deficiency.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#999999")
# emu_fragment's tables: 0 m16n8k16 A, 1 its B, 2 C/D, 5 ldmatrix (emulate.cpp)
TABLES = {"A": (0, 16, 16, 8), "B": (1, 16, 8, 4), "C": (2, 16, 8, 4)}  # table, rows, cols, elements a lane
PER_REGISTER = {"A": 2, "B": 2, "C": 1}  # bfloat16 A and B: two elements a 32-bit register
# An example descriptor: v31's B operand in the nt layout at its second k-step of 16,
# smem_desc(Bs + 32, 16, 1024, kSwizzle128B) with Bs 8192 bytes into the shared window
# (cuda/tensor_cores/v31_wgmma.cuh): K-major rows of 128 bytes, 8-row atoms 1024 bytes apart.
EXAMPLE_DESCRIPTOR = 0x4000004000010202
DESCRIPTOR_FIELDS = ("start", "lbo", "sbo", "base_offset", "swizzle")  # emu_descriptor_decode's out[5]
FIELD_TITLES = {"start": "start address", "lbo": "leading byte offset", "sbo": "stride byte offset",
                "base_offset": "base offset", "swizzle": "swizzle mode"}
WGMMA_N = 16
DPI = 100


def library(lib: ctypes.CDLL | None = None) -> ctypes.CDLL:
    """The emulation library (built once, cached), its instruction exports typed."""
    if lib is None:
        emu = cli.load_file("cuda/emulated.py")
        if emu.unavailable_reason():
            raise cli.UserError(f"cannot ask the emulation: {emu.unavailable_reason()}")
        try:
            lib = emu.library()
        except RuntimeError as e:
            raise cli.UserError(str(e).splitlines()[0]) from None
    i32, u32, u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_uint64
    lib.emu_fragment.argtypes = [i32, i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.emu_fragment.restype = i32
    lib.emu_run_ldmatrix.argtypes = [i32, i32, ctypes.c_void_p, i32, ctypes.c_void_p, ctypes.c_void_p]
    lib.emu_run_ldmatrix.restype = i32
    lib.emu_wgmma_fragment.argtypes = [i32, i32, ctypes.POINTER(i32), ctypes.POINTER(i32)]
    lib.emu_wgmma_fragment.restype = None
    lib.emu_swizzle.argtypes, lib.emu_swizzle.restype = [u32, i32], u32
    lib.emu_descriptor_decode.argtypes, lib.emu_descriptor_decode.restype = [u64, ctypes.POINTER(u32)], None
    return lib


# ---------------------------------------------------------------------------------------------
# The numbers each figure draws
# ---------------------------------------------------------------------------------------------
def mma_fragments(lib: ctypes.CDLL | None = None) -> dict[str, dict[tuple[int, int], tuple[int, int]]]:
    """mma.m16n8k16's operands: {"A" | "B" | "C": {(row, col): (lane, element)}}, A as M×K, B as
    K×N, C as M×N; element e of a lane's fragment is in register e // 2 of A and B (two bfloat16
    a register, the lower element in the lower half) and in register e of C."""
    lib = library(lib)
    row, col = ctypes.c_int(), ctypes.c_int()
    out = {}
    for name, (table, _, _, count) in TABLES.items():
        cells = {}
        for lane in range(32):
            for e in range(count):
                if lib.emu_fragment(table, lane, e, ctypes.byref(row), ctypes.byref(col)) != 0:
                    raise RuntimeError(f"the emulation has no element {e} of table {table}")
                cells[row.value, col.value] = (lane, e)
        out[name] = cells
    return out


def ldmatrix_x4(lib: ctypes.CDLL | None = None) -> dict[str, dict]:
    """One ldmatrix.x4 (no .trans) run by the emulation. Each lane's row address points at a row
    of its own, at a scrambled place in shared memory, whose elements say where they lie; the
    registers that come back say which lanes' addresses filled each register and who received
    each element: {"sources": {(matrix j, row r): lane}, "received": {(j, r, col): (lane, half)}},
    matrix j being the 8 rows register j was filled from, row r the r-th of their addresses in
    lane order (half 0: the lower 16 bits of the register)."""
    import numpy as np

    lib = library(lib)
    slot = [(5 * lane + 3) % 32 for lane in range(32)]  # lane -> the 16-byte row its address names
    image = (np.arange(32, dtype=np.uint16)[:, None] * 8 + np.arange(8, dtype=np.uint16)).ravel()  # slot·8 + col
    offsets = np.array([16 * s for s in slot], dtype=np.int32)
    regs = np.zeros((32, 4), dtype=np.uint32)
    rc = lib.emu_run_ldmatrix(4, 0, image.ctypes.data, image.nbytes, offsets.ctypes.data, regs.ctypes.data)
    if rc != 0:
        raise RuntimeError(f"the emulated ldmatrix.x4 failed ({rc})")
    lane_of_slot = {s: lane for lane, s in enumerate(slot)}
    got = {}  # (register j, receiving lane, half) -> (source lane, column)
    for lane in range(32):
        for j in range(4):
            for half in range(2):
                value = int(regs[lane, j] >> (16 * half)) & 0xFFFF
                got[j, lane, half] = (lane_of_slot[value // 8], value % 8)
    # matrix j: the rows register j was filled from, row r the r-th of their addresses in lane order
    rows = {j: sorted({src for (jj, _, _), (src, _) in got.items() if jj == j}) for j in range(4)}
    if any(len(r) != 8 for r in rows.values()):
        raise RuntimeError(f"ldmatrix.x4 filled a register from other than 8 rows: {rows}")
    sources = {(j, r): rows[j][r] for j in range(4) for r in range(8)}
    cells = {(j, rows[j].index(src), col): (lane, half) for (j, lane, half), (src, col) in got.items()}
    return {"sources": sources, "received": cells}


def wgmma_d(n: int = WGMMA_N, lib: ctypes.CDLL | None = None) -> dict[tuple[int, int], tuple[int, int]]:
    """wgmma m64nNk16's float32 accumulator: {(row, col): (thread, register)} over the warpgroup's
    128 threads, N/2 registers each."""
    lib = library(lib)
    row, col = ctypes.c_int(), ctypes.c_int()
    cells = {}
    for thread in range(128):
        for i in range(n // 2):
            lib.emu_wgmma_fragment(thread, i, ctypes.byref(row), ctypes.byref(col))
            cells[row.value, col.value] = (thread, i)
    return cells


def swizzle128(lib: ctypes.CDLL | None = None) -> list[list[int]]:
    """The 128-byte swizzle on a 1024-byte tile of 8 rows × 128 bytes: [row][chunk] -> the 16-byte
    chunk of the same row where the emulation stores that chunk (its bytes in order)."""
    lib = library(lib)
    grid = []
    for r in range(8):
        row = []
        for c in range(8):
            first = lib.emu_swizzle(128 * r + 16 * c, 1)
            if first // 128 != r or any(lib.emu_swizzle(128 * r + 16 * c + b, 1) != first + b for b in range(16)):
                raise RuntimeError(f"the 128-byte swizzle moves row {r}, chunk {c} out of its row or splits it")
            row.append(first % 128 // 16)
        grid.append(row)
    return grid


def descriptor(value: int = EXAMPLE_DESCRIPTOR, lib: ctypes.CDLL | None = None) -> dict:
    """The matrix descriptor as the emulation decodes it: {"fields": {name: (low bit, width, unit)}}
    found by decoding each single-bit descriptor (unit: what the field's lowest bit is worth, 16
    bytes for the addresses and offsets), "unused": the bits no field reads, and "decoded": the
    fields of ``value``."""
    lib = library(lib)
    out = (ctypes.c_uint32 * 5)()
    bits: dict[str, list[tuple[int, int]]] = {name: [] for name in DESCRIPTOR_FIELDS}
    unused = []
    for b in range(64):
        lib.emu_descriptor_decode(1 << b, out)
        read = [(name, v) for name, v in zip(DESCRIPTOR_FIELDS, out) if v]
        if not read:
            unused.append(b)
        for name, v in read:
            bits[name].append((b, v))
    fields = {}
    for name, found in bits.items():
        low, width = found[0][0], len(found)
        if [b for b, _ in found] != list(range(low, low + width)):
            raise RuntimeError(f"the descriptor's {name} is not one run of bits: {[b for b, _ in found]}")
        if any(v != found[0][1] << (b - low) for b, v in found):
            raise RuntimeError(f"the descriptor's {name}: its bits are not worth successive powers of two")
        fields[name] = (low, width, found[0][1])
    lib.emu_descriptor_decode(value, out)
    decoded = dict(zip(DESCRIPTOR_FIELDS, out))
    return {"fields": fields, "unused": unused, "value": value, "decoded": decoded,
            "swizzle_bytes": swizzle_span(decoded["swizzle"], lib)}


def swizzle_span(mode: int, lib: ctypes.CDLL | None = None) -> int:
    """The bytes of a swizzle atom's row in mode ``mode`` as emu_swizzle applies it (0: no
    swizzle): 16 bytes times 2 to the number of address bits it XORs into the chunk's."""
    lib = library(lib)
    moved = [k for k in range(4, 16) if lib.emu_swizzle(1 << k, mode) != 1 << k]
    return 16 << len(moved) if moved else 0


def split_tf32(rec: dict) -> dict[str, list[tuple[int, float]]]:
    """The forward GEMM's largest error at each K, per variant, from a tf32_error record;
    "allowed": what float32's rule allows there (v26's entries)."""
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rec["results"]:
        if r["tensor"] == "forward GEMM":
            out.setdefault(r["variant"], []).append((r["in"], r["error"]))
            if r["variant"] == "v26":
                out.setdefault("allowed", []).append((r["in"], r["allowed"]))
    return {k: sorted(v) for k, v in out.items()}


# ---------------------------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------------------------
def tint(colour: str, amount: float = 0.55) -> tuple[float, float, float]:
    """A colour mixed with white: text stays readable on it."""
    from matplotlib.colors import to_rgb

    return tuple(c + (1 - c) * amount for c in to_rgb(colour))


def cells(ax, x0: float, y0: float, rows: int, cols: int, label, colour, fontsize: float = 6.0,
          size: float = 1.0) -> None:
    """A grid of labelled square cells of side ``size``, row 0 on top, its top left corner at (x0, y0)."""
    import matplotlib.pyplot as plt

    for r in range(rows):
        for c in range(cols):
            x, y = x0 + c * size, y0 + r * size
            ax.add_patch(plt.Rectangle((x, y), size, size, facecolor=colour(r, c), edgecolor="white", lw=0.6))
            ax.text(x + size / 2, y + 0.52 * size, label(r, c), ha="center", va="center", fontsize=fontsize,
                    linespacing=0.95)


def axes_labels(ax, x0: float, y0: float, rows: int, cols: int, row_name: str, col_name: str, title: str,
                every: int = 1) -> None:
    for r in range(0, rows, every):
        ax.text(x0 - 0.25, y0 + r + 0.5, str(r), ha="right", va="center", fontsize=6)
    for c in range(0, cols, every):
        ax.text(x0 + c + 0.5, y0 - 0.2, str(c), ha="center", va="bottom", fontsize=6)
    ax.text(x0 - 1.1, y0 + rows / 2, f"{row_name}\n↓" if row_name else "", ha="right", va="center", fontsize=9)
    ax.text(x0 + cols / 2, y0 - 1.0, f"{title}\n{col_name} →", ha="center", va="bottom", fontsize=9)


def finish(fig, ax, path: Path, width: float, height: float) -> None:
    import record_info

    ax.set_xlim(0, width)
    ax.set_ylim(height, 0)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    record_info.save_figure(fig, path, dpi=DPI)
    import matplotlib.pyplot as plt

    plt.close(fig)


def draw_mma_fragments(path: Path, frags: dict) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(11.5, 13.5))
    letters = {"A": "a", "B": "b", "C": "c"}
    # C = A·B drawn as multiplied: B above C, A to C's left
    places = {"A": (2.5, 21.5), "B": (20.5, 2.5), "C": (20.5, 21.5)}
    names = {"A": ("A (16×16, bfloat16)", "m", "k"), "B": ("B (16×8, bfloat16)", "k", "n"),
             "C": ("C and D (16×8, float32)", "m", "n")}
    for name, (x0, y0) in places.items():
        table = frags[name]
        _, rows, cols, _ = TABLES[name]

        def label(r: int, c: int, table=table, name=name) -> str:
            lane, e = table[r, c]
            return f"T{lane}\n{letters[name]}{e}"

        def colour(r: int, c: int, table=table, name=name) -> tuple:
            return tint(OKABE_ITO[table[r, c][1] // PER_REGISTER[name]])

        cells(ax, x0, y0, rows, cols, label, colour, fontsize=6.5)
        title, rname, cname = names[name]
        axes_labels(ax, x0, y0, rows, cols, rname, cname, title)
    handles = [Patch(facecolor=tint(OKABE_ITO[r]), label=f"register {r}: a{2 * r}, a{2 * r + 1}; "
                     + (f"b{2 * r}, b{2 * r + 1}; " if r < 2 else "") + f"c{r}") for r in range(4)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.0, 0.98), fontsize=8.5, frameon=False,
              title="Tn: lane n of the warp; a, b, c: the element's index in that lane's fragment\n"
                    "(two bfloat16 a 32-bit register, the lower index in the lower 16 bits)",
              title_fontsize=8.5, alignment="left")
    fig.suptitle("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: which lane holds which element\n"
                 "(the emulation's fragment tables, emu_fragment)", fontsize=11)
    finish(fig, ax, path, 29, 38)


def draw_ldmatrix(path: Path, ld: dict) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 9.0))
    sources, received = ld["sources"], ld["received"]
    # left: the row addresses, matrix j's rows from the lanes shown
    cells(ax, 2.5, 5, 8, 4, lambda r, c: f"T{sources[c, r]}", lambda r, c: tint(OKABE_ITO[c]), fontsize=8)
    axes_labels(ax, 2.5, 5, 8, 4, "row", "matrix", "whose address\ngives each row")
    # right: the four matrices, each element labelled with the lane that receives it
    for j in range(4):
        x0, y0 = 10 + 10 * (j % 2), 5 + 11 * (j // 2)
        cells(ax, x0, y0, 8, 8, lambda r, c, j=j: f"T{received[j, r, c][0]}\n{('lo', 'hi')[received[j, r, c][1]]}",
              lambda r, c, j=j: tint(OKABE_ITO[j]), fontsize=6.5)
        axes_labels(ax, x0, y0, 8, 8, "row" if j % 2 == 0 else "", "column", f"matrix {j}: register {j} of lane")
    ax.text(0.5, 25.5, "ldmatrix.sync.aligned.m8n8.x4.shared.b16: each of the 32 lanes gives the address of one "
            "16-byte row (left);\nevery lane receives, in register j, two neighbouring 16-bit elements of matrix j, "
            "the lower column in the\nlower half (lo) (right). Run by the emulation (emu_run_ldmatrix) on rows placed "
            "at scrambled addresses:\nthe picture is what the emulated instruction did.", fontsize=8.5, va="top")
    fig.suptitle("ldmatrix.x4: four 8×8 matrices of 16-bit elements, one register each", fontsize=11)
    finish(fig, ax, path, 28, 29)


def draw_wgmma_d(path: Path, d: dict, n: int = WGMMA_N) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(13.0, 8.6))
    warp_colour = lambda r, c, first=0: tint(OKABE_ITO[d[first + r, c][0] // 32], 0.5)  # noqa: E731
    for half in range(2):  # every element's thread: rows 0-31 (warps 0, 1) and 32-63 (warps 2, 3) side by side
        x0, first = 2 + half * (n + 2.5), 32 * half
        cells(ax, x0, 3, 32, n, lambda r, c, first=first: str(d[first + r, c][0]),
              lambda r, c, first=first: warp_colour(r, c, first), fontsize=5.8)
        for r in range(0, 32, 4):
            ax.text(x0 - 0.25, 3 + r + 0.5, str(first + r), ha="right", va="center", fontsize=6.5)
        for c in range(0, n, 2):
            ax.text(x0 + c + 0.5, 2.8, str(c), ha="center", va="bottom", fontsize=6.5)
        ax.text(x0 + n / 2, 1.8, f"rows {first}-{first + 31}: each element's thread", ha="center", fontsize=9)
    # warp 0's rows, larger, with each element's register
    z, x0 = 1.45, 2 * n + 9
    cells(ax, x0, 3, 16, n, lambda r, c: f"T{d[r, c][0]}\nd{d[r, c][1]}", warp_colour, fontsize=7.2, size=z)
    for r in range(16):
        ax.text(x0 - 0.25, 3 + (r + 0.5) * z, str(r), ha="right", va="center", fontsize=6.5)
    for c in range(n):
        ax.text(x0 + (c + 0.5) * z, 2.8, str(c), ha="center", va="bottom", fontsize=6.5)
    ax.text(x0 + n * z / 2, 1.8, "warp 0's rows 0-15: thread Tn, its register di", ha="center", fontsize=9)
    handles = [Patch(facecolor=tint(OKABE_ITO[w], 0.5), label=f"warp {w}: threads {32 * w}-{32 * w + 31}, "
                     f"rows {16 * w}-{16 * w + 15}") for w in range(4)]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(0.63, 0.23), fontsize=9, frameon=False)
    fig.suptitle(f"wgmma.mma_async m64n{n}k16: the float32 accumulator D (64×{n}) over the warpgroup's 128 threads "
                 f"({n // 2} registers each)\n(the emulation's table, emu_wgmma_fragment): warp w holds rows 16w to "
                 "16w+15 in mma.m16n8's C layout, again every 8 columns", fontsize=10.5)
    finish(fig, ax, path, x0 + n * z + 0.5, 36)


def draw_swizzle(path: Path, grid: list[list[int]]) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10.5, 5.4))
    where = {(r, grid[r][c]): c for r in range(8) for c in range(8)}
    cells(ax, 2, 2.5, 8, 8, lambda r, c: f"{c}", lambda r, c: tint(OKABE_ITO[c], 0.35), fontsize=9)
    axes_labels(ax, 2, 2.5, 8, 8, "row (128 bytes)", "16-byte chunk", "the tile as the program sees it")
    cells(ax, 13, 2.5, 8, 8, lambda r, p: f"{where[r, p]}", lambda r, p: tint(OKABE_ITO[where[r, p]], 0.35),
          fontsize=9)
    axes_labels(ax, 13, 2.5, 8, 8, "", "16-byte chunk (4 banks)", "where it lies in shared memory")
    ax.text(2, 11.3, "The 128-byte swizzle (emu_swizzle, mode 1): chunk c of row r is stored at chunk "
            "c XOR (r mod 8) of that row.\nEach column on the right is one group of 4 banks: the 8 rows of a "
            "logical chunk (one colour) lie in 8 different groups,\nso 8 lanes reading one chunk of 8 rows "
            "(an ldmatrix phase, a wgmma operand) hit every bank once.", fontsize=8.5, va="top")
    finish(fig, ax, path, 22, 14)


def draw_descriptor(path: Path, desc: dict) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12.5, 4.9))
    fields, value, decoded = desc["fields"], desc["value"], desc["decoded"]
    owner = {b: name for name, (low, width, _) in fields.items() for b in range(low, low + width)}
    colours = {name: OKABE_ITO[k] for k, name in enumerate(fields)}
    for line, top in enumerate((63, 31)):  # bits 63..32 above, 31..0 below, most significant on the left
        y0 = 1.5 + 4.2 * line
        for k in range(32):
            b = top - k
            name = owner.get(b)
            face = tint(colours[name], 0.35) if name else "#eeeeee"
            ax.add_patch(plt.Rectangle((1 + k, y0), 1, 1, facecolor=face, edgecolor="white", lw=0.8))
            ax.text(1.5 + k, y0 + 0.5, str(value >> b & 1), ha="center", va="center", fontsize=9,
                    color="black" if name else "#888888")
            if b % 4 == 0 or b == top:
                ax.text(1.5 + k, y0 - 0.15, str(b), ha="center", va="bottom", fontsize=6.5)
        for name, (low, width, unit) in fields.items():
            bits = [b for b in range(low, low + width) if top - 31 <= b <= top]
            if not bits:
                continue
            left, right = 1 + top - max(bits), 1 + top - min(bits) + 1
            ax.plot([left + 0.1, right - 0.1], [y0 + 1.2, y0 + 1.2], color=colours[name], lw=2.5)
            raw = value >> low & ((1 << width) - 1)
            shown = decoded[name]
            if name == "swizzle":
                span = desc["swizzle_bytes"]
                text = f"{shown}: {span}-byte swizzle" if span else f"{shown}: none"
            elif name == "base_offset":
                text = f"{shown}"
            else:
                text = f"{raw} × {unit} = {shown} bytes"
            ax.text((left + right) / 2, y0 + 1.45, f"{FIELD_TITLES[name]}\nbits {low}-{low + width - 1}\n{text}",
                    ha="center", va="top", fontsize=8.5)
    ax.text(1, 10.2, f"The example {value:#018x}: v31's B operand at its second k-step (K-major, 128-byte swizzle), "
            "decoded by the emulation (emu_descriptor_decode).\nEach field's bits were found by decoding every "
            "single-bit descriptor; grey bits are read by no field. Addresses and offsets count 16-byte units.",
            fontsize=8, va="top")
    fig.suptitle("The wgmma matrix descriptor (64 bits)", fontsize=11)
    finish(fig, ax, path, 34, 11.5)


def draw_split_tf32(path: Path, errors: dict, rec: dict) -> None:
    import matplotlib.pyplot as plt

    import record_info

    styles = {  # (label, colour, marker, line): v34 hollow over v26's (the same bits)
        "float32": ("float32, torch on the CPU (the reference)", "#000000", "o", "-"),
        "tf32": ("TF32 GEMM (TF32Linear)", OKABE_ITO[5], "s", "--"),
        "v25": ("v25: TF32 on mma.sync", OKABE_ITO[6], "x", ":"),
        "split": ("split-TF32, its three products summed in float64", OKABE_ITO[1], "^", "-."),
        "v26": ("v26: split-TF32 on mma.sync", OKABE_ITO[4], "D", "-"),
        "v34": ("v34: split-TF32 on wgmma (v26's bits)", OKABE_ITO[0], "o", "none"),
        "allowed": ("what float32's rule allows (4× float32's + 2u·size)", "#777777", "", (0, (1, 3))),
    }
    fig, ax = plt.subplots(figsize=(8.6, 6.6))
    for key, (label, colour, marker, line) in styles.items():
        if key not in errors:
            continue
        ks, es = zip(*errors[key])
        hollow = key == "v34"
        ax.plot(ks, es, label=label, color=colour, marker=marker, linestyle=line, ms=11 if hollow else 6,
                markerfacecolor="none" if hollow else colour, markeredgewidth=1.5)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([k for k, _ in errors["float32"]], [str(k) for k, _ in errors["float32"]])
    ax.set_xlabel("K, the reduction's length (in features)")
    ax.set_ylabel("largest |error| of x·Wᵀ against float64")
    s = rec["shape"]
    ax.set_title(f"The forward GEMM's error, B={s['batch']} O={s['out']} (the tensor-core versions emulated on the "
                 "CPU:\nthe algorithm's error, not a GPU's), docs/results/tf32_error_cpu.json", fontsize=9.5)
    ax.grid(True, which="major", lw=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2, frameon=False)
    fig.tight_layout()
    record_info.save_figure(fig, path, dpi=DPI)
    plt.close(fig)


def draw_pipeline(path: Path, lib: ctypes.CDLL) -> None:
    """v33's ring at trace.py's shape (one block, six k-steps: the ring of four wraps), emulated."""
    trace = cli.load_file("cuda/tensor_cores/trace.py")
    events = trace.run(33, trace.SHAPE, trace.library(lib))
    wrong = trace.check_protocol(events)
    if wrong:
        raise RuntimeError(f"v33's emulated ring broke the mbarrier protocol: {wrong[0]}")
    trace.draw(path, events, 33)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the figures into")
    parser.add_argument("--only", nargs="+", choices=NAMES, metavar="NAME",
                        help=f"write only these figures (of {', '.join(NAMES)})")
    parser.add_argument("--record", default=str(RECORD.relative_to(ROOT)), metavar="PATH",
                        help="tc_split_tf32.png's record, from cuda/tensor_cores/tf32_error.py "
                             "(default: docs/results/tf32_error_cpu.json)")
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if not out.is_dir():
        raise cli.UserError(f"--out {args.out}: not a folder (create it first)")
    names = [n for n in NAMES if n in (args.only or NAMES)]
    paths = {name: cli.check_plot(str(out / name), "--out") for name in names}
    rec = None
    if "tc_split_tf32.png" in names:
        rec = cli.read_record(str(Path(ROOT, args.record)) if not Path(args.record).is_absolute() else args.record,
                              "--record", kind="tf32_error", writer="cuda/tensor_cores/tf32_error.py",
                              keys=("results", "shape"))
    emulated = [n for n in names if n != "tc_split_tf32.png"]
    lib = library() if emulated else None  # before drawing anything: a missing compiler is one line
    draw = {
        "tc_mma_fragments.png": lambda p: draw_mma_fragments(p, mma_fragments(lib)),
        "tc_ldmatrix.png": lambda p: draw_ldmatrix(p, ldmatrix_x4(lib)),
        "tc_wgmma_d.png": lambda p: draw_wgmma_d(p, wgmma_d(WGMMA_N, lib)),
        "tc_swizzle128.png": lambda p: draw_swizzle(p, swizzle128(lib)),
        "tc_descriptor.png": lambda p: draw_descriptor(p, descriptor(EXAMPLE_DESCRIPTOR, lib)),
        "tc_pipeline.png": lambda p: draw_pipeline(p, lib),
        "tc_split_tf32.png": lambda p: draw_split_tf32(p, split_tf32(rec), rec),
    }
    for name in names:
        draw[name](paths[name])
        print(f"wrote {paths[name]}")
    return 0


if __name__ == "__main__":
    cli.run(main)
