"""Draw the CUDA chapter's figures: the thread hierarchy of a launch, how a block walks a GEMM,
who computes what, and each version's arithmetic intensity against its measured speed.

cuda_hierarchy.png: v1's launch for a small GEMM (HIERARCHY_SHAPE), as the host side makes it
(cuda/kernels/launch.cuh: gemm_geometry, then kernel<<<grid, block>>>): the grid of blocks over C,
one block's threads grouped into warps, and the blocks spread over SMs. `launch` gives the grid
and block from the tile of cuda/static_report.py's TILES by gemm_geometry's rule;
tests/test_figures_hierarchy.py checks them against gemm_geometry in cuda/dense_kernels.h.

cuda_banks.png: shared memory's 32 banks of 4 bytes, and warp 0's read of B's tile in v5's inner
loop (b[0..3] = Bs[kk][col0..col0+3], one 16-byte LDS.128 a lane: the merge nvcc makes and the
counters model), coloured by phase; its wavefronts come from the counters' own rule
(cnt_shared_wavefronts in cuda/emulate/counters.cpp), not from this script.

cuda_gemm.png: C = A·B cut into blocks. One block owns a BM×BN tile of C; it walks K in
steps of BK, staging a BM×BK tile of A and a BK×BN tile of B in shared memory at each step.

cuda_tiles.png: the block's tile of C at one scale, one panel per version that changes who
computes what (float32): every warp's outputs in a colour of their own, thread 0's in black.
Drawn: v1, v2, v3, v4, v5, v7, v11 and v12; v6 computes v5's outputs and v8, v9, v10 v7's (the
ninth panel says so). The tile sizes come from cuda/static_report.py's TILES
(tests/test_static.py checks them against cuda/dense_kernels.h); which thread owns which output
(`owner` below) is the kernels' own index arithmetic, and tests/test_cuda_figures.py checks it
against the kernels themselves, run by the CPU emulation.

cuda_roofline.png: each timed version's forward at the timed shape, its FLOPs per byte of the
operands its blocks ask of global memory (the static record's napkin maths, docs/results/
cuda_static_sm90.json, at that shape) against its measured speed (the newest record of kind
docs/results/cuda_gpu_{card}.json), under two roofs of that card: its float32 FFMA peak (SMs ×
128 lanes × 2 FLOPs × the record's maximum SM clock) and its memory bandwidth (BANDWIDTH below,
from NVIDIA's datasheet: the record names the card, not its bandwidth). `roofline` returns the
numbers drawn, for the chapter and its tests.

Needs matplotlib (an optional extra: pip install matplotlib).

Examples:
  python cuda/figures.py --out /tmp            # writes the five figures into /tmp
(The committed figures: python cuda/figures.py --out docs/figures)
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

NAMES = ("cuda_hierarchy.png", "cuda_banks.png", "cuda_gemm.png", "cuda_tiles.png", "cuda_roofline.png")
RESULTS = ROOT / "docs" / "results"
TIMINGS = "cuda_gpu_{card}.json"  # a kind of record: the newest, whichever card took it (docs/records.py)
STATIC = "cuda_static_sm90.json"
# Peak DRAM bandwidth, bytes per second, by the card's name as torch reports it (NVIDIA's
# datasheets: H100 SXM5 3.35 TB/s, H200 4.8 TB/s). A card missing here is refused, not guessed.
BANDWIDTH = {"NVIDIA H100 80GB HBM3": 3.35e12, "NVIDIA H200": 4.8e12}
# float32 FFMA lanes per SM, by compute capability (4 sub-partitions of 32 on sm_90)
FFMA_LANES = {"9.0": 128}
WARP_LANES_M, WARP_LANES_N = 8, 4  # dense_kernels::kWarpLanesM/N: a warp's lanes as an 8×4 grid (v7+)
# v11 and v12 (v11's template): the TM×TN of one piece, dense_kernels::warp_tile(v, 4). TILES holds a
# lane's outputs, all its pieces together: (WM/8)×(WN/4), which gives the warp tile WM×WN.
PIECE = {11: (8, 4), 12: (4, 8)}
SHOWN = (1, 2, 3, 4, 5, 7, 11, 12)  # the versions drawn; the others compute the outputs of:
SAME_AS = {6: 5, 8: 7, 9: 7, 10: 7}
# What each version changes, in a panel's few words (cuda/README.md says it at length).
CHANGE = {
    1: "one output per thread;\na warp walks down a column of C",
    2: "a warp walks along a row of C\n(neighbouring addresses)",
    3: "32×32 tiles of A and B\nstaged in shared memory",
    4: "a column of 8 outputs\nper thread",
    5: "an 8×8 block of outputs\nper thread",
    6: "128-bit loads, A's tile stored transposed",
    7: "each warp owns a compact\n64×32 sub-tile",
    8: "two buffers: the next k-step\nloads during this one",
    9: "K split over blocks\nwhen the batch is small",
    10: "shared rows padded by 16 bytes",
    12: "v11's template at a 32-row tile\n(the batch); K split over the SMs",
}


def static_report():
    """cuda/static_report.py, loaded once (its TILES, napkin maths and slice rules)."""
    return cli.load_file("cuda/static_report.py")


def tiles() -> dict[int, dict]:
    """cuda/static_report.py's TILES: per version, (BM, BN, TM, TN, staged) per dtype."""
    return static_report().TILES


def warp_shape(version: int) -> tuple[int, int, int, int]:
    """(WM, WN, TM, TN) of a warp-tiled version (v7+), float32: the warp's tile and one lane's
    piece of it. v7 to v10 are the one-piece case: a lane's TM×TN outputs in one block."""
    _, _, tm, tn, _ = tiles()[version]["f32"]  # a lane's outputs, all pieces together
    pm, pn = PIECE.get(version, (tm, tn))
    return WARP_LANES_M * tm, WARP_LANES_N * tn, pm, pn


def owner(version: int, t: int) -> list[tuple[range, range]]:
    """The pieces (rows, columns) of the block's float32 tile of C that thread t computes, as the
    kernels index it (cuda/kernels/v{N}_*.cuh); one piece up to v10."""
    bm, bn, tm, tn, _ = tiles()[version]["f32"]
    if version == 1:  # x (t % 32) along m, y along n
        return [(range(t % 32, t % 32 + 1), range(t // 32, t // 32 + 1))]
    if version in (2, 3):  # x along n
        return [(range(t // 32, t // 32 + 1), range(t % 32, t % 32 + 1))]
    if version <= 6:  # v4-v6: threads in row-major order over the grid of thread tiles
        across = bn // tn
        row0, col0 = (t // across) * tm, (t % across) * tn
        return [(range(row0, row0 + tm), range(col0, col0 + tn))]
    # v7+: warps over the tile in row-major order, a warp's lanes as an 8×4 grid of TM×TN pieces,
    # repeated over the warp's tile in steps of (8·TM)×(4·TN): wm0/wn0 and lm/ln of v11's template.
    wm, wn, pm, pn = warp_shape(version)
    warp, lane = divmod(t, 32)
    wm0, wn0 = (warp // (bn // wn)) * wm, (warp % (bn // wn)) * wn
    lm, ln = (lane // WARP_LANES_N) * pm, (lane % WARP_LANES_N) * pn
    step_m, step_n = WARP_LANES_M * pm, WARP_LANES_N * pn
    return [(range(wm0 + i * step_m + lm, wm0 + i * step_m + lm + pm),
             range(wn0 + j * step_n + ln, wn0 + j * step_n + ln + pn))
            for i in range(wm // step_m) for j in range(wn // step_n)]


def ownership(version: int) -> list[list[int]]:
    """For every output of the block's tile, the thread that computes it (-1: nobody)."""
    bm, bn, tm, tn, _ = tiles()[version]["f32"]
    grid = [[-1] * bn for _ in range(bm)]
    for t in range(bm * bn // (tm * tn)):
        for rows, cols in owner(version, t):
            for r in rows:
                for c in cols:
                    grid[r][c] = t
    return grid


def change(version: int) -> str:
    """A panel's few words on what the version changes (v11's from its shape)."""
    if version != 11:
        return CHANGE[version]
    wm, wn, pm, pn = warp_shape(version)
    sm, sn = WARP_LANES_M * pm, WARP_LANES_N * pn
    return (f"a warp's {wm}×{wn} in {wm // sm}×{wn // sn} steps of {sm}×{sn}:\n"
            f"a lane's pieces lie {sn} columns apart")


def draw_tiles(path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.colors import ListedColormap

    palette = ListedColormap(["#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6", "#ffff99", "#8dd3c7",
                              "#fccde5"])
    fig, axes = plt.subplots(3, 3, figsize=(10.5, 12.2))
    for version, ax in zip(SHOWN, axes.flat):
        bm, bn, tm, tn, _ = tiles()[version]["f32"]
        grid = ownership(version)
        warp = [[(t // 32) % palette.N for t in row] for row in grid]
        ax.imshow(warp, cmap=palette, vmin=0, vmax=palette.N - 1, extent=(0, bn, bm, 0), interpolation="nearest")
        pieces = owner(version, 0)
        for rows, cols in pieces:
            ax.add_patch(plt.Rectangle((cols.start, rows.start), len(cols), len(rows), color="black"))
        pm, pn = len(pieces[0][0]), len(pieces[0][1])
        if pm * pn > 1:  # the edges of the thread tiles (of their pieces in v11)
            for x in range(0, bn + 1, pn):
                ax.axvline(x, color="white", lw=0.3)
            for y in range(0, bm + 1, pm):
                ax.axhline(y, color="white", lw=0.3)
        ax.add_patch(plt.Rectangle((0, 0), bn, bm, fill=False, lw=1.2))
        ax.set_xlim(-2, 130)
        ax.set_ylim(130, -2)
        ax.set_aspect("equal")
        ax.set_xticks([0, bn])
        ax.set_yticks([0, bm])
        ax.tick_params(labelsize=7, length=2)
        threads = bm * bn // (tm * tn)
        per = "1 output each" if tm * tn == 1 else f"{tm}×{tn} outputs each"
        if len(pieces) > 1:
            per += f",\nin {len(pieces)} pieces of {pm}×{pn}"
        ax.set_title(f"v{version}: {bm}×{bn} tile, {threads} threads, {per}\n{change(version)}", fontsize=8.5)
    note = axes.flat[len(SHOWN)]
    note.axis("off")
    lines = ["Not drawn: the same outputs", "as the version named", ""]
    for version, same in SAME_AS.items():
        lines += [f"v{version}, as v{same}:", "  " + change(version).replace("\n", " "), ""]
    note.text(0.02, 0.95, "\n".join(lines), fontsize=9, va="top", transform=note.transAxes)
    shown = ", ".join(f"v{v}" for v in SHOWN[:-1]) + f" and v{SHOWN[-1]}"
    fig.suptitle(f"The block's tile of C in {shown} (float32, all at one scale; rows m down, columns n\n"
                 "across): each colour a warp's outputs (colours repeat after 8 warps), black: thread 0's",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.96))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# The thread hierarchy (cuda_hierarchy.png)
# ---------------------------------------------------------------------------------------
HIERARCHY_SHAPE = (64, 32, 16)  # M, N, K: small enough to draw every block and thread
SM_COUNT = 132  # an H100 SXM's (and an H200's) SMs
SM_WARPS = 64  # resident warps an SM can hold (sm_90)


def launch(version: int, m: int, n: int, k: int) -> dict:
    """The float32 launch of `version` (1 to 3) for C (m×n) = A (m×k) · B: gemm_geometry's grid
    and block (dense_kernels.h), from TILES. v1's x (the warp's fast index) runs along m."""
    if version not in (1, 2, 3):
        raise ValueError(f"v{version}: launch() draws the one-output-per-thread versions 1 to 3")
    bm, bn, tm, tn, _ = tiles()[version]["f32"]
    threads = bm * bn // (tm * tn)
    along_m = -(-m // bm), -(-n // bn)
    grid = along_m if version == 1 else along_m[::-1]
    return {"grid": (*grid, 1), "block": (32, threads // 32, 1), "tile": (bm, bn), "threads": threads,
            "warps": threads // 32, "blocks_per_sm": SM_WARPS // (threads // 32), "shape": (m, n, k)}


def draw_hierarchy(path: Path) -> None:
    import matplotlib.pyplot as plt

    m, n, k = HIERARCHY_SHAPE
    g = launch(1, m, n, k)
    gx, gy, _ = g["grid"]
    bx, by, _ = g["block"]
    bm, bn = g["tile"]
    colours = ["#a6cee3", "#fdbf6f", "#b2df8a", "#fb9a99", "#cab2d6", "#ffff99", "#8dd3c7", "#fccde5"]
    fig, (ax_c, ax_b, ax_s) = plt.subplots(1, 3, figsize=(11, 5.4), gridspec_kw={"width_ratios": [1, 1.1, 1.3]})
    # C (m down, n across): one rectangle per block, labelled blockIdx (x along m, y along n for v1)
    for i in range(gx):
        for j in range(gy):
            ax_c.add_patch(plt.Rectangle((j * bn, i * bm), bn, bm, fill=True, ec="black", lw=1,
                                         fc="#1f78b4" if (i, j) == (0, 1) else "#deebf7"))
            ax_c.text(j * bn + bn / 2, i * bm + bm / 2, f"({i},{j})", ha="center", va="center", fontsize=7.5,
                      color="white" if (i, j) == (0, 1) else "black")
    ax_c.set_xlim(-1, n + 1)
    ax_c.set_ylim(m + 1, -1)
    ax_c.set_aspect("equal")
    ax_c.set_xticks([0, n])
    ax_c.set_yticks([0, bm, m])
    ax_c.set_title(f"C ({m}×{n}): grid {gx}×{gy} blocks,\neach a {bm}×{bn} tile; blockIdx (x, y)", fontsize=9)
    # one block: threadIdx.x along m (down), threadIdx.y along n (across); a warp is one y
    for y in range(by):
        ax_b.add_patch(plt.Rectangle((y, 0), 1, bx, fc=colours[y % len(colours)], ec="black", lw=0.6))
        ax_b.text(y + 0.5, bx + 1.5, f"w{y}", ha="center", fontsize=7.5)
    for x in range(0, bx + 1, 8):
        ax_b.axhline(x, xmin=0.05, xmax=0.95, color="white", lw=0.3)
    ax_b.set_xlim(-0.5, by + 0.5)
    ax_b.set_ylim(bx + 3, -1)
    ax_b.set_xticks([0, by])
    ax_b.set_yticks([0, bx])
    ax_b.set_xlabel("threadIdx.y (n)", fontsize=8)
    ax_b.set_ylabel("threadIdx.x (m): a warp's 32 lanes", fontsize=8)
    ax_b.set_title(f"block (0,1): {bx}×{by} = {g['threads']} threads,\n{g['warps']} warps (w0-w{g['warps'] - 1}) "
                   "of 32 lanes", fontsize=9)
    # SMs: each block runs whole on one SM; which one is the hardware's choice
    ax_s.axis("off")
    shown = 6
    blocks = gx * gy
    for s in range(shown):
        y0 = s * 1.15
        ax_s.add_patch(plt.Rectangle((0, y0), 9, 1, fill=False, lw=1))
        ax_s.text(-0.3, y0 + 0.5, f"SM {s}", ha="right", va="center", fontsize=8)
        if s < blocks:
            i, j = divmod(s, gy)
            ax_s.add_patch(plt.Rectangle((0.2, y0 + 0.15), 2.2, 0.7, fc="#deebf7", ec="black", lw=0.6))
            ax_s.text(1.3, y0 + 0.5, f"({i},{j})", ha="center", va="center", fontsize=7.5)
    ax_s.text(4.5, shown * 1.15 + 0.1, f"⋮  (SM {shown} to SM {SM_COUNT - 1})", ha="center", fontsize=8)
    ax_s.text(0, shown * 1.15 + 1.0,
              f"{blocks} blocks for {SM_COUNT} SMs: each block runs whole\n"
              f"on one SM, which one the hardware picks (drawn:\none each). An SM holds up to "
              f"{SM_WARPS} warps: {g['blocks_per_sm']} blocks of v1\nif registers and shared memory allow.",
              fontsize=8, va="top")
    ax_s.set_xlim(-2.5, 10)
    ax_s.set_ylim(shown * 1.15 + 3.4, -0.4)
    ax_s.set_title("blocks on SMs", fontsize=9)
    fig.suptitle(f"v1 at M={m} N={n} K={k}, float32. Host (launch.cuh): geo = gemm_geometry(1, 4, M, N, K, sms); "
                 f"v1<<<dim3({gx},{gy},1), dim3({bx},{by},1)>>>", fontsize=9.5)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=80)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Shared memory's banks (cuda_banks.png)
# ---------------------------------------------------------------------------------------
BANKS, BANK_BYTES = 32, 4


def v5_b_request(kk: int = 0) -> list[tuple[int, int, int]]:
    """Warp 0's read of B's tile at step kk of v5's inner loop (cuda/kernels/v5_blocktile_2d.cuh):
    (lane, byte offset in Bs, bytes) of each lane's first LDS.128, b[0..3] = Bs[kk][col0 + 0..3]
    with col0 = (t % (BN / TN)) · TN, Bs a BK×BN array of floats."""
    bm, bn, tm, tn, _ = tiles()[5]["f32"]
    return [(lane, (kk * bn + (lane % (bn // tn)) * tn) * 4, 16) for lane in range(32)]


def bank(address: int) -> int:
    """The bank of a byte address: its 4-byte word modulo 32 (counters.cpp: buf[i] % 32 of words)."""
    return (address // BANK_BYTES) % BANKS


def wavefronts(request: list[tuple[int, int, int]], lib=None) -> tuple[float, float]:
    """(wavefronts, phases) of one warp request, by the counters' rule (cnt_shared_wavefronts):
    the instrumented build of cuda/counters.py (a minute to build the first time)."""
    import ctypes

    if lib is None:
        lib = cli.load_file("cuda/counters.py").library()
    lib.cnt_shared_wavefronts.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_uint,
                                          ctypes.POINTER(ctypes.c_double)]
    lib.cnt_shared_wavefronts.restype = ctypes.c_double
    sizes = {size for _, _, size in request}
    if len(sizes) != 1:
        raise ValueError("one request has one access size")
    addrs = (ctypes.c_uint64 * len(request))(*(a for _, a, _ in request))
    lanes = (ctypes.c_uint * len(request))(*(lane for lane, _, _ in request))
    phases = ctypes.c_double()
    found = lib.cnt_shared_wavefronts(addrs, lanes, len(request), sizes.pop(), ctypes.byref(phases))
    return found, phases.value


def draw_banks(path: Path, request: list[tuple[int, int, int]], counted: tuple[float, float]) -> None:
    import matplotlib.pyplot as plt

    size = request[0][2]
    per_phase = 32 if size <= 4 else 32 * 4 // size  # lanes a phase: 128 bytes of the request at a time
    colours = ["#1f78b4", "#e31a1c", "#33a02c", "#ff7f00"]
    rows = sorted({(a + b) // (BANKS * BANK_BYTES) for _, a, size_ in request for b in range(0, size_, BANK_BYTES)})
    fig, ax = plt.subplots(figsize=(11, 2.2 + 0.45 * len(rows)))
    cells: dict[tuple[int, int], list[int]] = {}
    for lane, address, nbytes in request:
        for b in range(0, nbytes, BANK_BYTES):
            word = (address + b) // BANK_BYTES
            cells.setdefault((rows.index(word // BANKS), word % BANKS), []).append(lane)
    for (r, col), lanes in cells.items():
        phase = lanes[0] // per_phase
        ax.add_patch(plt.Rectangle((col, r), 1, 1, fc=colours[phase % 4], alpha=0.35 + 0.15 * (phase % 2),
                                   ec="black", lw=0.4))
        ax.text(col + 0.5, r + 0.5, ",".join(map(str, lanes)), ha="center", va="center", fontsize=6.5)
    for col in range(BANKS + 1):
        ax.axvline(col, color="grey", lw=0.3)
    ax.set_xlim(0, BANKS)
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([c + 0.5 for c in range(BANKS)], [str(c) for c in range(BANKS)], fontsize=7)
    ax.set_yticks([r + 0.5 for r in range(len(rows))], [f"bytes {128 * w}-{128 * w + 127}" for w in rows],
                  fontsize=7)
    ax.set_xlabel("bank (4 bytes each; a 128-byte row of shared memory spans all 32)")
    found, phases = counted
    first = [(lane, a) for lane, a, _ in request if lane < per_phase]  # phase 0: which lane shares lane 0's banks
    apart = next((lane for lane, a in first if bank(a) == bank(first[0][1]) and a != first[0][1]), 0)
    # lanes of a later phase that read only words an earlier phase read: said, since their colour is hidden
    shared = sorted({lane for lanes in cells.values() for lane in lanes[1:]
                     if lane // per_phase != lanes[0] // per_phase})
    again = f"; lanes {shared[0]}-{shared[-1]} read the same words again" if shared else ""
    ax.set_title(f"v5, warp 0 reads B's tile (one LDS.128 a lane: {len(request)} lanes × {size} bytes; "
                 f"the numbers in a word: the lanes reading it{again}).\n{int(phases)} phases of {per_phase} lanes "
                 f"(colours): lanes t and t+{apart} read different words of the same 4 banks, so each phase takes "
                 f"{found / phases:g} wavefronts:\n{int(found)} wavefronts where {int(phases)} is the ideal "
                 "(the counters' rule, cuda/emulate/counters.cpp)", fontsize=8.5)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def draw_gemm(path: Path) -> None:
    import matplotlib.pyplot as plt

    # Drawn in units of elements for a small example: M = N = K = 8 tiles' worth.
    m, n, k, bm, bn, bk = 8, 8, 8, 2, 2, 1
    bi, bj, step = 2, 2, 3  # the block drawn, and its k-step
    fig, ax = plt.subplots(figsize=(9, 6.2))

    def matrix(x0: float, y0: float, w: int, h: int, name: str) -> None:
        ax.add_patch(plt.Rectangle((x0, y0), w, h, fill=False, lw=1.2))
        ax.text(x0 + w / 2, y0 - 0.5, name, ha="center", fontsize=11)

    ax_, ay = 0, n + 2          # A (M×K) lower left
    bx, by = k + 2, 0           # B (K×N) upper right
    cx, cy = k + 2, n + 2       # C (M×N) lower right
    matrix(ax_, ay, k, m, "A (M×K)")
    matrix(bx, by, n, k, "B (K×N)")
    matrix(cx, cy, n, m, "C (M×N)")
    panel = dict(color="#a6cee3")
    ax.add_patch(plt.Rectangle((ax_, ay + bi * bm), k, bm, **panel))           # the block's rows of A
    ax.add_patch(plt.Rectangle((bx + bj * bn, by), bn, k, **panel))      # its columns of B
    ax.add_patch(plt.Rectangle((cx + bj * bn, cy + bi * bm), bn, bm, color="#1f78b4"))
    ax.add_patch(plt.Rectangle((ax_ + step * bk, ay + bi * bm), bk, bm, color="#e31a1c"))
    ax.add_patch(plt.Rectangle((bx + bj * bn, by + step * bk), bn, bk, color="#e31a1c"))
    for j in range(1, k):  # the k-steps
        ax.plot([ax_ + j, ax_ + j], [ay + bi * bm, ay + (bi + 1) * bm], color="white", lw=0.8)
        ax.plot([bx + bj * bn, bx + bj * bn + bn], [by + j, by + j], color="white", lw=0.8)
    notes = [
        (cx + n + 0.4, cy + bi * bm + 1, "one block's BM×BN tile of C\n(a grid of such blocks covers C)"),
        (ax_ + step * bk + 0.5, ay + m + 1.2, "this k-step's BM×BK tile of A,\nstaged in shared memory"),
        (bx + n + 0.4, by + step * bk + 0.5, "and B's BK×BN tile"),
        (ax_, ay + m + 3.2, "The block walks K one step at a time: load both tiles, __syncthreads,\n"
                            "every thread multiply-adds its outputs from shared memory, __syncthreads.\n"
                            "Split-K (v9) gives the steps of K to several blocks and adds their partial tiles."),
    ]
    for x, y, text in notes:
        ax.text(x, y, text, fontsize=9, va="center")
    ax.set_xlim(-0.5, 2 * k + 10)
    ax.set_ylim(2 * n + 6, -1.5)
    ax.set_aspect("equal")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---------------------------------------------------------------------------------------
# Arithmetic intensity against speed (cuda_roofline.png)
# ---------------------------------------------------------------------------------------
def newest_timings(folder: Path = RESULTS) -> tuple[str, dict]:
    """(name, record) of the newest record of kind cuda_gpu_{card}.json: what chapter 3's table shows."""
    records = cli.load_file("docs/records.py")
    found = records.of_kind(TIMINGS, folder)
    if not found:
        raise cli.UserError(f"no record of kind {TIMINGS} under {folder}: python cuda/bench_gpu.py gemm takes one")
    return found[0]


def roofline(timed: dict, static: dict) -> dict:
    """What cuda_roofline.png draws, from a timing record (cuda/bench_gpu.py gemm) and the static
    record: the card's roofs, and per timed version its FLOPs per byte at the timed shape, its
    speed, and the share of its time that its blocks' requested bytes would take at the card's
    bandwidth if every one of them came from DRAM (an upper bound: L1 and L2 serve repeats)."""
    gpu = timed["gpu"]
    if gpu["device"] not in BANDWIDTH or gpu["compute_capability"] not in FFMA_LANES:
        raise cli.UserError(f"{gpu['device']} (compute capability {gpu['compute_capability']}): its bandwidth or "
                            f"float32 lanes are not in cuda/figures.py (BANDWIDTH, FFMA_LANES)")
    clock = float(gpu["nvidia_smi"]["clocks.max.sm"].split()[0]) * 1e6
    peak = gpu["sm_count"] * FFMA_LANES[gpu["compute_capability"]] * 2 * clock
    bandwidth = BANDWIDTH[gpu["device"]]
    b, i, o = timed["gemm"]["shape"]
    m, n, k = b, o, i  # the forward: C (B×O) = x (B×I) · Wᵀ
    sr = static_report()
    kernels = {r["name"]: r for r in static["kernels"]}
    points, cublas = [], None
    for row in timed["gemm"]["rows"]:
        if row["line"].startswith("cuBLAS"):
            cublas = row["gflops"]
        if not row["line"].startswith("v"):
            continue
        version = int(row["line"][1:])
        rec = kernels[f"dense_gemm_v{version}_nt_f32"]
        t = rec["tile"]
        split = sr.TILES[version].get("split_k")
        if split == "skinny":
            entry = sr.TILES[version]
            slices = sr.skinny_slices(m, n, k, t["bm"], t["bn"], entry["bk"], entry["min_blocks"]["f32"],
                                      gpu["sm_count"])
        elif split:
            slices = sr.splitk_slices(m, n, k, t["bm"], t["bn"], gpu["sm_count"])
        else:
            slices = 1
        napkin = sr.napkin(t["bm"], t["bn"], t["tm"], t["tn"], t["staged_in_shared"], 4, k, slices)
        blocks = -(-m // t["bm"]) * -(-n // t["bn"])
        requested = blocks * napkin["bytes_per_tile"]
        seconds = row["forward_us"] * 1e-6
        points.append({"version": version, "flop_per_byte": napkin["flop_per_byte"], "slices": slices,
                       "gflops": row["gflops"], "of_cublas": row["of_cublas"]["speed"], "us": row["forward_us"],
                       "requested_bytes": requested, "dram_share": requested / bandwidth / seconds,
                       "of_roof": row["gflops"] * 1e9 / min(peak, bandwidth * napkin["flop_per_byte"])})
    return {"device": gpu["device"], "shape": [b, i, o], "peak_flops": peak, "bandwidth": bandwidth,
            "ridge": peak / bandwidth, "cublas_gflops": cublas, "points": points}


def roofline_of(folder: Path = RESULTS) -> tuple[str, dict]:
    """(the timing record's name, roofline()) from the committed records in `folder`."""
    name, timed = newest_timings(folder)
    return name, roofline(timed, cli.read_record(str(folder / STATIC), "the static record", keys=("kernels",)))


def draw_roofline(path: Path, name: str, r: dict) -> None:
    import matplotlib.pyplot as plt

    peak, bw = r["peak_flops"] / 1e12, r["bandwidth"] / 1e12
    fig, ax = plt.subplots(figsize=(9, 6))
    xs = [0.1, r["ridge"], 100]
    ax.plot(xs, [min(peak, bw * x) for x in xs], color="black", lw=1.2)
    ax.text(1.5, bw * 1.5 * 0.45, f"memory: {bw:.2f} TB/s × FLOP/B", fontsize=8.5)
    ax.text(30, peak * 1.07, f"FFMA peak {peak:.1f} TFLOP/s", fontsize=8.5, ha="center")
    if r["cublas_gflops"]:
        ax.axhline(r["cublas_gflops"] / 1e3, color="#1f78b4", ls=":", lw=1)
        ax.text(0.12, r["cublas_gflops"] / 1e3 * 1.06, f"cuBLAS x·Wᵀ {r['cublas_gflops'] / 1e3:.1f} TFLOP/s "
                "(its intensity is not known)", fontsize=8.5, color="#1f78b4")
    # versions at one intensity share a column: their labels to the right, spaced apart, each
    # with a line to its point
    columns: dict[float, list[dict]] = {}
    for p in r["points"]:
        columns.setdefault(round(p["flop_per_byte"], 2), []).append(p)
    for group in columns.values():
        group.sort(key=lambda p: -p["gflops"])
        at = math.inf
        for p in group:
            y = p["gflops"] / 1e3
            at = min(math.log10(y), at - 0.075)  # at least this far (in decades) under the label above
            ax.plot([p["flop_per_byte"]], [y], "o", color="#e31a1c", ms=5)
            ax.annotate(f"v{p['version']} {100 * p['of_cublas']:.1f}%", (p["flop_per_byte"], y),
                        xytext=(p["flop_per_byte"] * 1.45, 10 ** at), fontsize=8.5, va="center",
                        arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"})
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(0.1, 100)
    ax.set_ylim(0.2, 120)
    ax.set_xlabel("FLOP per byte the blocks ask of global memory (static napkin maths at the timed shape)")
    ax.set_ylabel("measured TFLOP/s")
    b, i, o = r["shape"]
    ax.set_title(f"Forward at B={b} I={i} O={o}, float32: speed against arithmetic intensity "
                 f"(% of cuBLAS)\n{r['device']}, docs/results/{name} and {STATIC}", fontsize=9.5)
    ax.grid(True, which="major", lw=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    drawn = ", ".join(f"v{v}" for v in SHOWN)
    parser.add_argument("--out", required=True, metavar="DIR",
                        help=f"folder to write {', '.join(NAMES)} into (cuda_tiles.png draws {drawn})")
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if not out.is_dir():
        raise cli.UserError(f"--out {args.out}: not a folder (create it first)")
    paths = [cli.check_plot(str(out / name), "--out") for name in NAMES]
    timings, numbers = roofline_of()  # before drawing anything: a missing record is one line
    request = v5_b_request()
    counted = wavefronts(request)  # before drawing anything: the counters' build says what it lacks
    draw_hierarchy(paths[0])
    draw_banks(paths[1], request, counted)
    draw_gemm(paths[2])
    draw_tiles(paths[3])
    draw_roofline(paths[4], timings, numbers)
    for p in paths:
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":
    cli.run(main)
