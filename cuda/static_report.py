"""Napkin maths and static evidence for every GEMM version, for sm_90 and sm_80, without a GPU.

For each GEMM entry point found in the compiled kernels (dense_gemm_v{N}_{nt|nn|tn}_{f32|f64|bf16|f16},
and the autotuning candidates dense_gemm_tune{I}_{nt|nn|tn}_f32, in a table of their own):
  * FLOPs and global-memory bytes per output tile (from TILES below) and the arithmetic
    intensity they give; for the tensor-core versions also the mma's and ldmatrix's per k-step;
  * registers, shared memory, spills and stack frame from ptxas (-v), and the launch bounds (.maxntid);
  * the occupancy these allow (the CUDA occupancy rules, `occupancy()`, of each architecture);
  * from the SASS (cuobjdump -sass; optional) the instruction mix of the innermost loop
    that multiplies: FFMA/DFMA or the tensor cores' HMMA, shared loads (LDS, ldmatrix's LDSM),
    global loads (LDG) and cp.async (LDGSTS) by width.
Every architecture asked for (--arch; by default those the cuda stage is built for,
modes.DEFAULT_CUDA_ARCHS, the newest first) gets registers, spills, stack, shared memory, blocks per
SM and the main loop's tensor-core instructions for every entry; the first gets the full analysis.
GPU timings (GFLOP/s, % of cuBLAS) join the table when benchmark.py records are given.

Examples:
  python cuda/static_report.py                                  # print the tables, write nothing
  python cuda/static_report.py --json /tmp/static.json          # also write the JSON
  python cuda/static_report.py --arch sm_90 --no-sass           # one architecture, ptxas figures only
  python cuda/static_report.py --sass dense_gemm_v24_nt_bf16    # one kernel's SASS, nothing else
(The committed tables, cuda/README.md's "The static figures" and the tensor-core chapter's, are
docs/results/cuda_static_sm90.json rendered by docs/render.py; the record holds the command that
wrote it, docs/README.md lists them all.)
"""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # cli.py, from any working directory
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

disasm = cli.load_file("cuda/sass.py")  # ptxas's lines and the SASS, read
tables = cli.load_file("cuda/static_tables.py")  # the record's tables

# The cuda stage's translation units (cuda/dense.py builds the same list), one per GEMM version.
DEFAULT_SOURCES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "cuda" / "units").glob("*.cu"))
GEMM = re.compile(r"^dense_gemm_v(\d+)_(nt|nn|tn)_(f32|f64|bf16|f16)$")
TUNE = re.compile(r"^dense_gemm_tune(\d+)_(nt|nn|tn)_(f32|f64)$")  # the autotuning candidates

# ---------------------------------------------------------------------------------------
# The one table to keep in step with the kernels: per version and element type, the block's output
# tile (BM×BN), each thread's register tile (TM×TN), and whether operands are staged in
# shared memory. Threads per block = BM·BN/(TM·TN); the report checks that against each
# kernel's __launch_bounds__ and warns when they disagree (the table is then stale).
# A version that allocates dynamic shared memory (extern __shared__, which ptxas cannot see)
# adds "dynamic_shared": {dtype: bytes}; it counts towards the occupancy.
# bfloat16 and float16 take float32's tiles (dense_kernels::tile() is given the accumulator's size).
# ---------------------------------------------------------------------------------------
_V11 = (128, 128, 8, 16, True)
_V12 = (32, 128, 4, 8, True)
TILES: dict[int, dict] = {
    1: {"idea": "naive, uncoalesced: one thread per output, a warp's lanes walk down a column",
        "f32": (32, 8, 1, 1, False), "f64": (32, 8, 1, 1, False)},
    2: {"idea": "naive, coalesced: a warp's lanes take neighbouring columns",
        "f32": (8, 32, 1, 1, False), "f64": (8, 32, 1, 1, False)},
    3: {"idea": "32×32 tiles of A and B staged in shared memory",
        "f32": (32, 32, 1, 1, True), "f64": (32, 32, 1, 1, True)},
    4: {"idea": "1-D register blocking: a column of 8 outputs per thread",
        "f32": (64, 64, 8, 1, True), "f64": (64, 64, 8, 1, True)},
    5: {"idea": "2-D register blocking: an 8×8 (f64 4×4) block of outputs per thread",
        "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True)},
    6: {"idea": "vectorised: 128-bit global loads, A's tile stored transposed",
        "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True)},
    7: {"idea": "warp tiling: a warp's lanes own one compact sub-tile",
        "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True)},
    8: {"idea": "double buffering (cp.async on sm_80+)",
        "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True)},
    9: {"idea": "split-K for small batches, slices from the SM count",
        "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True), "split_k": True},
    10: {"idea": "padded tiles: the transposing store hits 32 banks",
         "f32": (128, 128, 8, 8, True), "f64": (64, 64, 4, 4, True)},
    # The warp-tiled versions: TM×TN is a lane's outputs, all its pieces together (WM/8 × WN/4).
    11: {"idea": "warp tiling in pieces (SGEMM_CUDA's kernel 10), one template",
         "f32": _V11, "f64": (64, 64, 4, 8, True), "bf16": _V11, "f16": _V11},
    # v12 splits K until every SM holds its MINB blocks (dense_kernels::skinny_slices).
    12: {"idea": "skinny batches: 32-row tiles, K split over every SM",
         "f32": _V12, "f64": _V12, "bf16": _V12, "f16": _V12, "split_k": "skinny", "bk": 16,
         "min_blocks": {"f32": 4, "f64": 2, "bf16": 4, "f16": 4}},
    # The tensor-core versions (cuda/tensor_cores/). TM×TN counts a lane's float32 accumulators
    # (WM·WN/32; a lane holds them in pieces of 4, one per m16n8 tile). Also: the k-step BK, the
    # warp tile WM×WN, the mma's shape, how many mma's one product takes (split-TF32: three), and
    # where the fragments come from: global memory, ldmatrix (16-bit tiles) or plain shared loads.
    21: {"idea": "mma.sync m16n8k16, one warp a 16×8 tile, fragments from global memory",
         "bf16": (32, 16, 2, 2, False), "f16": (32, 16, 2, 2, False),
         "bk": 16, "warp": (16, 8), "mma": "m16n8k16", "fragments": "global"},
    22: {"idea": "64×64 tiles in shared memory, fragments by ldmatrix.x4",
         "bf16": (64, 64, 8, 4, True), "f16": (64, 64, 8, 4, True),
         "bk": 64, "warp": (32, 32), "mma": "m16n8k16", "fragments": "ldmatrix"},
    23: {"idea": "the same tiles XOR-swizzled",
         "bf16": (64, 64, 8, 4, True), "f16": (64, 64, 8, 4, True),
         "bk": 64, "warp": (32, 32), "mma": "m16n8k16", "fragments": "ldmatrix"},
    24: {"idea": "8 warps of 64×32, a 3-stage cp.async ring, the epilogue fused",
         "bf16": (128, 128, 8, 8, True), "f16": (128, 128, 8, 8, True),
         "bk": 32, "warp": (64, 32), "mma": "m16n8k16", "fragments": "ldmatrix"},
    25: {"idea": "TF32: mma.sync m16n8k8 after cvt.rna.tf32",
         "f32": (128, 128, 8, 8, True), "bk": 16, "warp": (64, 32), "mma": "m16n8k8", "fragments": "lds"},
    26: {"idea": "split-TF32: three mma's on big and small parts",
         "f32": (128, 128, 8, 8, True), "bk": 16, "warp": (64, 32), "mma": "m16n8k8", "fragments": "lds",
         "products": 3},
    # Hopper: "warp" is a warpgroup's tile; the operands stay in shared memory (no fragments).
    # Built for sm_90a only ("needs"): compiled for another architecture their kernels are a trap.
    # The TMA versions' rings are dynamic shared memory (dense_kernels::tma_smem_bytes); v33 adds a
    # producer warpgroup to its two consumers ("threads"); v35 swaps the operands, W as wgmma's A,
    # so the mma's m runs along C's n ("swap"), and splits K (dense_kernels::hopper_slices).
    31: {"idea": "wgmma: one warpgroup, m64n128k16 on operands in shared memory",
         "bf16": (64, 128, 8, 8, True), "f16": (64, 128, 8, 8, True),
         "bk": 64, "warp": (64, 128), "mma": "m64n128k16", "fragments": "shared", "needs": "sm_90a"},
    32: {"idea": "TMA into a ring of 4 stages with mbarriers",
         "bf16": (64, 128, 8, 8, True), "f16": (64, 128, 8, 8, True),
         "bk": 64, "warp": (64, 128), "mma": "m64n128k16", "fragments": "shared", "needs": "sm_90a",
         "dynamic_shared": {"bf16": 99392, "f16": 99392}},
    33: {"idea": "warp specialization: a TMA producer, two wgmma consumers",
         "bf16": (128, 256, 8, 16, True), "f16": (128, 256, 8, 16, True),
         "bk": 64, "warp": (64, 256), "mma": "m64n256k16", "fragments": "shared", "needs": "sm_90a",
         "dynamic_shared": {"bf16": 197696, "f16": 197696}, "threads": 384},
    34: {"idea": "split-TF32 on wgmma: three m64n128k8 a k-step of 8",
         "f32": (64, 128, 8, 8, True), "bk": 32, "warp": (64, 128), "mma": "m64n128k8", "fragments": "shared",
         "products": 3, "needs": "sm_90a", "dynamic_shared": {"f32": 148528}},
    35: {"idea": "small batches: W as wgmma's A, K split over every SM",
         "bf16": (32, 64, 4, 4, True), "f16": (32, 64, 4, 4, True),
         "bk": 64, "warp": (32, 64), "mma": "m64n32k16", "fragments": "shared", "needs": "sm_90a", "swap": True,
         "dynamic_shared": {"bf16": 66624, "f16": 66624}, "split_k": "hopper"},
}
DTYPES = ("f32", "f64", "bf16", "f16")  # dense_kernels::kDTypeNames
ELEMENT_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2}  # dense_kernels::dtype_bytes
ACC_BYTES = {"f32": 4, "f64": 8, "bf16": 4, "f16": 4}  # dense_kernels::acc_bytes: the tiles' size


def is_tensor_core(version: int) -> bool:
    """Whether TILES describes `version` as a tensor-core version (it names an mma shape)."""
    return "mma" in TILES.get(version, {})


# The autotuning candidates, v11's template at other shapes (float32 only): (BM, BN, BK, WM, WN, TM,
# TN, MINB), read from their one list in cuda/dense_kernels.h.
TUNE_CANDIDATES: list[tuple[int, ...]] = [c.shape for c in cli.load_file("cuda/catalog.py",
                                                                          "dense_cuda_catalog").candidates()]


# ---------------------------------------------------------------------------------------
# Occupancy. The limits of compute capability 9.0 (H100 and H200 alike) and 8.0 (A100) are those
# of the CUDA C++ Programming Guide, "Technical Specifications per Compute Capability", and the
# Hopper and Ampere Tuning Guides (per SM 228 KiB of shared memory, at most 227 KiB per block, on
# 9.0; 164 KiB and 163 KiB on 8.0); the rules (per-warp register allocation in units of 256,
# registers split over 4 sub-partitions, 1 KiB reserved shared memory per block, 128-byte shared
# allocation unit, named barriers counted from 9.0 on) are those of cuda_occupancy.h, the
# calculator shipped in the toolkit's include/ folder, which tests/test_static.py compiles and
# compares against for both.
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    name: str = "H100 / H200 (compute capability 9.0)"
    compute_capability: str = "9.0"
    warp_size: int = 32
    max_threads_per_block: int = 1024
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32
    registers_per_sm: int = 65536
    registers_per_block: int = 65536
    max_registers_per_thread: int = 255
    register_allocation_unit: int = 256        # registers, per warp
    register_sub_partitions: int = 4
    shared_per_sm: int = 228 * 1024
    shared_per_block: int = 48 * 1024          # static, or dynamic without the opt-in
    shared_per_block_optin: int = 227 * 1024   # dynamic, after cudaFuncSetAttribute
    shared_reserved_per_block: int = 1024
    shared_allocation_unit: int = 128
    barriers_per_block_slot: int = 2           # named barriers available: 2 per block slot (0: not a limit)
    # Only for v9's napkin maths (its slices depend on it; the kernels query the real device):
    # an H100 SXM and an H200 have 132 SMs, an H100 PCIe 114 (--sms).
    sm_count: int = 132
    sources: tuple[str, ...] = (
        "CUDA C++ Programming Guide: Technical Specifications per Compute Capability (9.0)",
        "NVIDIA Hopper Tuning Guide: shared memory capacity per SM 228 KB, 227 KB per thread block",
        "cuda_occupancy.h (CUDA toolkit include/): allocation granularities and sub-partitions",
    )


H100 = Device()
# An A100: registers and warps as on 9.0, less shared memory, 108 SMs; cuda_occupancy.h counts
# named barriers against occupancy only from compute capability 9.0 on.
A100 = Device(name="A100 (compute capability 8.0)", compute_capability="8.0", shared_per_sm=164 * 1024,
              shared_per_block_optin=163 * 1024, barriers_per_block_slot=0, sm_count=108,
              sources=("CUDA C++ Programming Guide: Technical Specifications per Compute Capability (8.0)",
                       "NVIDIA Ampere Tuning Guide: shared memory capacity per SM 164 KB, 163 KB per thread block",
                       "cuda_occupancy.h (CUDA toolkit include/): allocation granularities and sub-partitions"))
# sm_90a: an H100's rules, and the code of the versions that need Hopper's own instructions.
DEVICES = {"sm_90": H100, "sm_80": A100, "sm_90a": H100}


def stage_archs(modes_py: Path = ROOT / "modes.py") -> tuple[str, ...]:
    """The architectures the cuda stage is built for, modes.DEFAULT_CUDA_ARCHS ("8.0;9.0+PTX"), as
    ptxas names them, the newest first: ("sm_90", "sm_80"). Read from the file's text, since
    importing modes imports torch."""
    m = re.search(r'^DEFAULT_CUDA_ARCHS = "([^"]+)"', modes_py.read_text(), re.M)
    if not m:
        raise ValueError(f"{modes_py} has no DEFAULT_CUDA_ARCHS = \"...\" line")
    archs = ["sm_" + a.split("+")[0].strip().replace(".", "") for a in m.group(1).split(";") if a.strip()]
    return tuple(sorted(archs, key=lambda a: -int(re.sub(r"\D", "", a))))


# The report's default architectures, the first analysed in full.
ARCHS = stage_archs()


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def occupancy(registers: int, threads: int, static_shared: int = 0, dynamic_shared: int = 0, barriers: int = 1,
              device: Device = H100, optin: bool = False) -> dict:
    """Resident blocks per SM for one kernel, and what limits them (the cuda_occupancy.h rules).

    Returns blocks_per_sm, warps_per_sm, occupancy (resident warps over the SM's maximum),
    limited_by (the limits equal to the result) and the limit from each resource.
    """
    if registers < 0 or threads < 1 or static_shared < 0 or dynamic_shared < 0 or barriers < 0:
        raise ValueError("registers, shared bytes and barriers must be >= 0 and threads >= 1")
    d = device
    warps = -(-threads // d.warp_size)
    limits: dict[str, int] = {}
    limits["threads"] = 0 if threads > d.max_threads_per_block else math.inf
    limits["warps"] = d.max_warps_per_sm // warps
    limits["blocks"] = d.max_blocks_per_sm
    # Registers go to warps in units of 256, out of four sub-partitions of 16384 each; the
    # hardware's per-block check assumes the block's warps are rounded up to the 4 partitions.
    per_warp = _round_up(registers * d.warp_size, d.register_allocation_unit)
    if registers > d.max_registers_per_thread or \
            per_warp * _round_up(warps, d.register_sub_partitions) > d.registers_per_block:
        limits["registers"] = 0
    elif per_warp == 0:
        limits["registers"] = math.inf
    else:
        per_partition = (d.registers_per_sm // d.register_sub_partitions) // per_warp
        limits["registers"] = per_partition * d.register_sub_partitions // warps
    # Shared memory: 1 KiB per block is the driver's; allocations are in 128-byte units.
    shared = _round_up(static_shared + dynamic_shared + d.shared_reserved_per_block, d.shared_allocation_unit)
    per_block_limit = (d.shared_per_block_optin if optin else d.shared_per_block) + d.shared_reserved_per_block
    limits["shared"] = 0 if shared > per_block_limit else d.shared_per_sm // shared
    limits["barriers"] = (d.max_blocks_per_sm * d.barriers_per_block_slot) // barriers \
        if barriers and d.barriers_per_block_slot else math.inf
    blocks = int(min(limits.values()))
    limited_by = [k for k, v in limits.items() if v == blocks]
    return {"blocks_per_sm": blocks, "warps_per_sm": blocks * warps,
            "occupancy": blocks * warps / d.max_warps_per_sm, "limited_by": limited_by,
            "limits": {k: (None if v == math.inf else int(v)) for k, v in limits.items()},
            "shared_allocated_per_block": shared, "registers_allocated_per_warp": per_warp}


# ---------------------------------------------------------------------------------------
# Napkin maths per output tile
# ---------------------------------------------------------------------------------------
def napkin(bm: int, bn: int, tm: int, tn: int, staged: bool, element_bytes: int, k: int, slices: int = 1,
           acc_bytes: int | None = None, loads_per_k: int | None = None) -> dict:
    """FLOPs and global bytes of one BM×BN output tile over a K-long reduction.

    Staged operands: the block loads each of its BM rows of A and BN columns of B once, so
    (BM+BN)·K elements. Unstaged (v1, v2): every thread loads its own row and column, so
    2·BM·BN·K elements are requested (caches may serve repeats; the instructions ask anyway);
    `loads_per_k` overrides both (v21: each warp loads its own WM rows and WN columns).
    Plus the BM·BN outputs written once. Per thread and per k, TM+TN operands are read for
    TM·TN multiply-adds: the register-level reuse that the SASS ratio below should show.
    Split-K (v9, v12) over S > 1 slices: the slices partition K, so FLOPs and operand bytes of the
    tile are unchanged; each slice writes a BM×BN partial product and the reduce reads the S
    partials back and writes the output once: 2S·BM·BN partial elements (of acc_bytes, the
    accumulator's size: float32 for the 16-bit types) besides the BM·BN outputs.
    """
    if slices < 1:
        raise ValueError("slices must be at least 1")
    flops = 2 * bm * bn * k
    loads = loads_per_k * k if loads_per_k is not None else (bm + bn) * k if staged else 2 * bm * bn * k
    partials = 0 if slices == 1 else 2 * slices * bm * bn
    nbytes = (loads + bm * bn) * element_bytes + partials * (acc_bytes or element_bytes)
    return {"k": k, "slices": slices, "flops_per_tile": flops, "bytes_per_tile": nbytes,
            "flop_per_byte": flops / nbytes, "fma_per_operand_load": tm * tn / (tm + tn)}


def mma_shape(mma: str) -> tuple[int, int, int]:
    """(m, n, k) of an mma shape's name: m16n8k16 -> (16, 8, 16), m64n128k16 -> (64, 128, 16)."""
    m = re.fullmatch(r"m(\d+)n(\d+)k(\d+)", mma)
    if not m:
        raise ValueError(f"not an mma shape: {mma!r} (e.g. m16n8k16)")
    return int(m.group(1)), int(m.group(2)), int(m.group(3))


def mma_napkin(bm: int, bn: int, bk: int, wm: int, wn: int, mma: str, products: int = 1,
               fragments: str = "ldmatrix", swap: bool = False) -> dict:
    """A tensor-core block's work per k-step of BK, per warp (per warpgroup for wgmma): the
    mma's (its WM×WN tile is (WM/m)·(WN/n) tiles of the mma's m×n, each BK/k mma's deep,
    `products` mma's a product: split-TF32 takes 3) and, where fragments come by ldmatrix.x4
    (a 16×16 piece of 16-bit elements each), WM/16 of them for A and WN/16 for B per 16 of k.
    The static HMMA and LDSM counts of the main loop's SASS should be these (one k-step a pass).
    `swap`: the mma computes the transposed tile (W as its A), its m along WN and its n along WM."""
    m, n, k = mma_shape(mma)
    mmas = ((wn // m) * (wm // n) if swap else (wm // m) * (wn // n)) * (bk // k) * products
    ldsm = (wm // 16 + wn // 16) * (bk // 16) if fragments == "ldmatrix" else 0
    return {"mma": mma, "k_step": bk, "warp_tile": [wm, wn], "warps": (bm // wm) * (bn // wn),
            "fragments": fragments, "products": products, "mma_per_k_step": mmas, "ldmatrix_x4_per_k_step": ldsm,
            "flop_per_mma": 2 * m * n * k}


# v9's choice of slices, as dense_kernels::splitk_slices (cuda/dense_kernels.h) makes it; the
# napkin maths evaluate it at the small batch v9 exists for. tests/test_static.py compiles the
# header with the host compiler and compares the two.
MIN_SLICE_K = 128  # dense_kernels::kMinSliceK
SPLITK_BATCH = 32


def splitk_slices(m: int, n: int, k: int, bm: int, bn: int, sm_count: int) -> int:
    """Slices of K so that tiles × slices covers every SM once, each slice at least 128 deep."""
    tiles = -(-m // bm) * -(-n // bn)
    if tiles <= 0 or tiles >= sm_count:
        return 1
    return max(1, min(-(-sm_count // tiles), k // MIN_SLICE_K))


def skinny_slices(m: int, n: int, k: int, bm: int, bn: int, bk: int, min_blocks: int, sm_count: int) -> int:
    """v12's (dense_kernels::skinny_slices): slices of K so that tiles × slices fills every SM with
    min_blocks blocks, each slice at least 128 deep, then as few as give each the same whole
    number of k-steps."""
    tiles, target = -(-m // bm) * -(-n // bn), sm_count * min_blocks
    if tiles <= 0 or tiles >= target:
        return 1
    s = min(-(-target // tiles), k // MIN_SLICE_K)
    if s <= 1:
        return 1
    steps = -(-k // bk)
    return -(-steps // -(-steps // s))


def hopper_slices(m: int, n: int, k: int, bm: int, bn: int, bk: int, sm_count: int, blocks: int = 2) -> int:
    """v35's (dense_kernels::hopper_slices): slices of K so that every SM has `blocks` blocks, each
    slice at least two k-steps deep, then as few as give each the same whole number of k-steps."""
    tiles, steps = -(-n // bn) * -(-m // bm), -(-k // bk)
    s = min(blocks * sm_count // tiles if tiles > 0 else 1, steps // 2)
    if s <= 1:
        return 1
    return -(-steps // -(-steps // s))


# ---------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------
@dataclass
class Report:
    kernels: list[dict] = field(default_factory=list)
    candidates: list[dict] = field(default_factory=list)
    other_kernels: list[dict] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    archs: dict[str, dict] = field(default_factory=dict)  # per architecture: compact figures of every entry


CACHE = ROOT / "build" / "static_report"  # git-ignored; a compile per state of cuda/ and the toolkit
CACHE_KEEP = 4


def _cache_key(sources: list[Path], arch: str, tools: tuple[str, str]) -> str | None:
    """A digest of everything the compile reads: every source and header under cuda/ (the units
    include only those, by relative path), the architecture, and which nvcc and ptxas (path, size,
    modification time). None when a source lies outside cuda/ (a test's planted copy): not cached."""
    cuda = ROOT / "cuda"
    if not all(Path(s).resolve().is_relative_to(cuda) for s in sources):
        return None
    files = sorted(p for p in cuda.rglob("*") if p.suffix in (".cu", ".cuh", ".h") and p.is_file())
    which = [f"{tool} {tool.stat().st_size} {tool.stat().st_mtime_ns}" for tool in (Path(t).resolve() for t in tools)]
    return cli.source_digest(files, arch, *(str(Path(s).resolve()) for s in sources), *which)


def compile_sources(sources: list[Path], arch: str, workdir: Path) -> tuple[str, str, list[str]]:
    """nvcc -ptx then ptxas -v for each source, the units side by side (one job per core):
    (all PTX, all ptxas output, cubin paths), in the order of `sources`. The outputs are kept in
    build/static_report/ and used again while nothing they come from has changed (the report, its
    --sass and the tests ask for the same compile several times; it takes minutes on 2 cores)."""
    nvcc, ptxas = disasm.find_tool("nvcc"), disasm.find_tool("ptxas")
    if nvcc is None or ptxas is None:
        raise SystemExit("nvcc and ptxas are needed: nothing can be compiled without them; install the CUDA toolkit, "
                         f"or {cli.CUDA_TOOLS_PIP} (no GPU needed)")
    key = _cache_key(sources, arch, (nvcc, ptxas))
    if key is None:
        return _compile(sources, arch, workdir, nvcc, ptxas)
    out = CACHE / key
    with cli.build_lock(out):
        if not (out / "done").exists():
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            ptx, log, _ = _compile(sources, arch, out, nvcc, ptxas)
            (out / "all.ptx").write_text(ptx)
            (out / "ptxas.log").write_text(log)
            (out / "done").write_text("")
            finished = [d for d in CACHE.iterdir() if (d / "done").exists() and d != out]  # never one being built
            for old in sorted(finished, key=lambda d: (d / "done").stat().st_mtime)[:-CACHE_KEEP]:
                shutil.rmtree(old, ignore_errors=True)
        (out / "done").touch()  # most recently used
        cubins = [str(out / f"{arch}_k{n}.cubin") for n in range(len(sources))]
        return (out / "all.ptx").read_text(), (out / "ptxas.log").read_text(), cubins


def run(cmd: list[str], what: str) -> subprocess.CompletedProcess:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"{what} failed ({' '.join(cmd)}):\n{result.stderr[-3000:]}")
    return result


def _compile(sources: list[Path], arch: str, workdir: Path, nvcc: str, ptxas: str) -> tuple[str, str, list[str]]:
    def one(n: int, src: Path) -> tuple[str, str, str]:
        ptx, cubin = workdir / f"{arch}_k{n}.ptx", workdir / f"{arch}_k{n}.cubin"
        run([nvcc, "-ptx", "-O3", "-std=c++17", f"-arch={arch}", str(src), "-o", str(ptx)], f"nvcc -ptx {src}")
        log = run([ptxas, f"-arch={arch}", "-v", str(ptx), "-o", str(cubin)], f"ptxas {src}")
        return ptx.read_text(), log.stdout + log.stderr, str(cubin)

    with ThreadPoolExecutor(max_workers=max(1, min(len(sources), os.cpu_count() or 1))) as pool:
        done = list(pool.map(one, range(len(sources)), sources))
    return "\n".join(d[0] for d in done), "\n".join(d[1] for d in done), [d[2] for d in done]


def analyse(sources: list[Path], arch: str, k: int, cuobjdump: str | None, device: Device) -> Report:
    """Compile for one architecture, disassemble and tabulate every entry, with `device`'s rules."""
    report = Report()
    with tempfile.TemporaryDirectory() as tmp:
        ptx, log, cubins = compile_sources(sources, arch, Path(tmp))
        functions: dict[str, list[disasm.Instr]] = {}
        if cuobjdump:
            for cubin in cubins:
                functions.update(disasm.parse_sass(disasm.disassemble(Path(cubin), cuobjdump)))
    usage, bounds = disasm.parse_ptxas(log), disasm.launch_bounds(ptx)
    if not any(GEMM.match(n) for n in usage):
        raise SystemExit(f"no dense_gemm_v*_{{nt,nn,tn}}_{{{','.join(DTYPES)}}} entry found in "
                         f"{', '.join(map(str, sources))}")
    for name in sorted(usage, key=lambda n: (GEMM.match(n) is None and TUNE.match(n) is None, *(_sort_key(n)))):
        u = usage[name]
        m = GEMM.match(name) or TUNE.match(name)
        rec: dict = {"name": name}
        threads, source = bounds.get(name), "__launch_bounds__"
        if m:
            number, layout, dtype = int(m.group(1)), m.group(2), m.group(3)
            rec.update(layout=layout, dtype=dtype)
            entry = TILES.get(number, {}) if m.re is GEMM else {}
            if m.re is TUNE:
                rec["candidate"] = number
                shape = TUNE_CANDIDATES[number] if number < len(TUNE_CANDIDATES) and dtype == "f32" else None
                tile = None if shape is None else (shape[0], shape[1], shape[3] // 8, shape[4] // 4, True)
                if shape is not None:
                    rec["shape"] = dict(zip(("bm", "bn", "bk", "wm", "wn", "tm", "tn", "min_blocks"), shape))
                what = f"candidate {number} {dtype} in TUNE_CANDIDATES"
            else:
                rec["version"] = number
                tile = entry.get(dtype)
                rec["idea"] = entry.get("idea")
                if "needs" in entry:  # elsewhere its kernels are a trap: figures, but not of the version's code
                    rec["needs"] = entry["needs"]
                what = f"v{number} {dtype} in TILES"
            if tile is None:
                report.warnings.append(f"{name}: no entry for {what} (cuda/static_report.py)")
            else:
                bm, bn, tm, tn, staged = tile
                rec["tile"] = {"bm": bm, "bn": bn, "tm": tm, "tn": tn, "staged_in_shared": staged}
                split = entry.get("split_k")
                slices = 1
                if split == "skinny":
                    slices = skinny_slices(SPLITK_BATCH, k, k, bm, bn, entry["bk"], entry["min_blocks"][dtype],
                                           device.sm_count)
                elif split == "hopper":
                    slices = hopper_slices(SPLITK_BATCH, k, k, bm, bn, entry["bk"], device.sm_count)
                elif split:
                    slices = splitk_slices(SPLITK_BATCH, k, k, bm, bn, device.sm_count)
                mma = None
                if "mma" in entry:
                    wm, wn = entry["warp"]
                    rec["tile"].update(bk=entry["bk"], wm=wm, wn=wn)
                    mma = mma_napkin(bm, bn, entry["bk"], wm, wn, entry["mma"], entry.get("products", 1),
                                     entry["fragments"], entry.get("swap", False))
                loads = mma["warps"] * (mma["warp_tile"][0] + mma["warp_tile"][1]) \
                    if mma and entry["fragments"] == "global" else None
                rec["napkin"] = napkin(bm, bn, tm, tn, staged, ELEMENT_BYTES[dtype], k, slices, ACC_BYTES[dtype], loads)
                if mma:  # a lane's accumulators are not a register tile of FMAs: the mma's are the ratio
                    rec["napkin"].update(fma_per_operand_load=None, tensor_cores=mma)
                if slices > 1:
                    rec["napkin"]["slices_at"] = {"batch": SPLITK_BATCH, "in": k, "out": k, "sm_count": device.sm_count}
                expected = entry.get("threads", bm * bn // (tm * tn))
                if threads is None:
                    threads, source = expected, "TILES (the kernel has no __launch_bounds__)"
                elif threads != expected:
                    report.warnings.append(f"{name}: __launch_bounds__ {threads} threads, TILES says {expected} "
                                           f"(BM·BN/(TM·TN) unless it says otherwise): update TILES")
        if threads is None:
            report.warnings.append(f"{name}: no __launch_bounds__ and no TILES entry: occupancy not computed")
        rec.update(threads=threads, threads_from=source, registers=u["registers"], barriers=u["barriers"],
                   shared_bytes=u["shared_bytes"], spill_bytes=u["spill_stores"] + u["spill_loads"],
                   spill_stores=u["spill_stores"], spill_loads=u["spill_loads"], stack_bytes=u["stack_bytes"])
        dynamic = TILES.get(int(m.group(1)), {}).get("dynamic_shared", {}).get(m.group(3), 0) \
            if m and m.re is GEMM else 0
        rec["dynamic_shared_bytes"] = dynamic
        if threads is not None:
            occ = occupancy(u["registers"], threads, u["shared_bytes"], dynamic, u["barriers"], device,
                            optin=u["shared_bytes"] + dynamic > device.shared_per_block)
            rec.update(occupancy=occ["occupancy"], blocks_per_sm=occ["blocks_per_sm"],
                       warps_per_sm=occ["warps_per_sm"], occupancy_limited_by=occ["limited_by"],
                       occupancy_limits=occ["limits"])
        else:
            rec.update(occupancy=None, blocks_per_sm=None, warps_per_sm=None)
        if functions:
            code = functions.get(name, [])
            rec["sass_instructions"] = len(code)
            if m:
                rec["inner_loop"] = disasm.inner_loop(code)
                rec["calls"] = disasm.calls(code)
                rec["census"] = disasm.census(code)  # the whole kernel's
            else:  # the backward's kernels and the second passes: the whole kernel's mix
                rec["mix"] = disasm.mix(code)
        (report.other_kernels if not m else report.kernels if m.re is GEMM else report.candidates).append(rec)
    return report


def build(sources: list[Path], archs: tuple[str, ...] = ARCHS, k: int = 4096, sass: bool = True,
          devices: dict[str, Device] | None = None) -> tuple[Report, dict]:
    """Compile, disassemble and tabulate for each architecture. The report holds the first
    architecture's full records, and every architecture's compact figures (Report.archs).
    Returns the report and a description of the tools."""
    devices = {**DEVICES, **(devices or {})}
    cuobjdump, why_not = disasm.sass_tools() if sass else (None, "not asked for (--no-sass)")
    tools = {"nvcc": disasm.tool_version(disasm.find_tool("nvcc") or "nvcc") if disasm.find_tool("nvcc") else None,
             "ptxas": disasm.tool_version(disasm.find_tool("ptxas")) if disasm.find_tool("ptxas") else None,
             "cuobjdump": disasm.tool_version(cuobjdump) if cuobjdump else None,
             "sass": {"available": cuobjdump is not None, "reason": why_not or None}}
    report: Report | None = None
    for arch in archs:
        got = analyse(sources, arch, k, cuobjdump, devices[arch])
        if report is None:
            report = got
        report.warnings += [w for w in got.warnings if w not in report.warnings]
        every = got.kernels + got.candidates + got.other_kernels
        report.archs[arch] = {"device": asdict(devices[arch]), "entries": {r["name"]: tables.compact(r) for r in every}}
    assert report is not None, "no architecture given"
    return report, tools


def _sort_key(name: str) -> tuple:
    m = GEMM.match(name) or TUNE.match(name)
    if not m:
        return (0, name, 0)
    return (m.re is TUNE, int(m.group(1)), DTYPES.index(m.group(3)), ("nt", "nn", "tn").index(m.group(2)))


# ---------------------------------------------------------------------------------------
# GPU timings, joined when measured (benchmark.py records of the cuda mode, one per --kernel)
# ---------------------------------------------------------------------------------------
def timings(paths: list[str]) -> list[dict]:
    """From benchmark.py JSON records: per (kernel version, dtype) the fused forward's GFLOP/s
    and its speed as a share of the reference (cuBLAS addmm + sigmoid) in the same run."""
    rows = []
    for p in paths:
        rec = json.loads(Path(p).read_text())
        got = {r["mode"]: r for r in rec.get("results", [])}
        if "cuda" not in got or "reference" not in got or not rec.get("kernel"):
            raise SystemExit(f"{p}: not a benchmark.py record of the cuda mode with --kernel N (N >= 1)")
        rows.append({"version": rec["kernel"], "dtype": {"float32": "f32", "float64": "f64"}[rec["dtype"]],
                     "gflops": got["cuda"]["forward_gflops"],
                     "share_of_cublas": got["reference"]["forward_us"] / got["cuda"]["forward_us"],
                     "shape": rec["shape"], "device": rec["device"], "date": rec["date"],
                     "command": rec["command"], "file": os.path.relpath(p, ROOT)})
    return rows


def print_sass(sources: list[Path], arch: str, names: list[str]) -> int:
    """--sass: compile the sources and print the named kernels' SASS."""
    cuobjdump, why_not = disasm.sass_tools()
    if cuobjdump is None:
        raise cli.UserError(why_not)
    with tempfile.TemporaryDirectory() as tmp:
        _, _, cubins = compile_sources(sources, arch, Path(tmp))
        sass = "\n".join(disasm.disassemble(Path(c), cuobjdump) for c in cubins)
    found = disasm.parse_sass(sass)
    for name in names:
        text = disasm.function_text(sass, name)
        if text is None:
            near = difflib.get_close_matches(name, found, n=6, cutoff=0.5) or sorted(found)[:6]
            raise cli.UserError(f"--sass {name}: no such kernel; for example {', '.join(near)}")
        print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = cli.parser(doc)
    parser.add_argument("--json", metavar="PATH", help="write the report as JSON")
    parser.add_argument("--source", action="append", metavar="FILE",
                        help=f"CUDA file(s) with the entry points (default: {' '.join(DEFAULT_SOURCES)})")
    parser.add_argument("--arch", action="append", choices=sorted(DEVICES), metavar="ARCH",
                        help=f"target architecture, repeatable, the first analysed in full (default: "
                             f"{' '.join(ARCHS)}; known: {', '.join(sorted(DEVICES))})")
    parser.add_argument("-k", type=int, default=4096, help="reduction length for the per-tile napkin maths")
    parser.add_argument("--sms", type=int,
                        help="SM count for v9's and v12's slices in the napkin maths (default: the first "
                             "architecture's device: H100 SXM/H200 132 (H100 PCIe: 114), A100 108)")
    parser.add_argument("--no-sass", action="store_true", help="skip the SASS (cuobjdump) columns")
    parser.add_argument("--sass", action="append", metavar="KERNEL",
                        help="print this kernel's SASS (e.g. dense_gemm_v6_nt_f32; repeatable) instead of the table")
    parser.add_argument("--timings", nargs="*", default=[], metavar="JSON",
                        help="benchmark.py records of the cuda mode (one per --kernel N) to join into the table")
    args = parser.parse_args(argv)
    archs = tuple(dict.fromkeys(args.arch or ARCHS))
    if unknown := [a for a in archs if a not in DEVICES]:  # modes.DEFAULT_CUDA_ARCHS names a new one
        parser.error(f"no occupancy rules for {', '.join(unknown)} here (known: {', '.join(sorted(DEVICES))})")
    if args.k < 1:
        parser.error("-k must be at least 1")
    if args.sms is not None and args.sms < 1:
        parser.error("--sms must be at least 1")
    # --sms is the first architecture's (the napkin maths are computed for it)
    devices = {archs[0]: dataclasses.replace(DEVICES[archs[0]], sm_count=args.sms)} if args.sms else {}
    sources = [ROOT / s if not Path(s).is_absolute() else Path(s) for s in (args.source or DEFAULT_SOURCES)]
    for s in sources:
        if not s.is_file():
            parser.error(f"no such source file: {s}")
    json_path = cli.check_output(args.json, "--json")
    for t in args.timings:
        if not Path(t).is_file():
            parser.error(f"no such timings file: {t}")
    joined = timings(args.timings)  # before the compile: a bad file fails fast
    if args.sass:
        return print_sass(sources, archs[0], args.sass)
    if not args.no_sass and disasm.sass_tools()[0] is None:
        print(f"note: {disasm.sass_tools()[1]}; the SASS columns are left out", file=sys.stderr)

    report, tools = build(sources, archs, args.k, sass=not args.no_sass, devices=devices)
    record = {"arch": archs[0], "k": args.k, "device": report.archs[archs[0]]["device"], "tools": tools,
              "sources": [os.path.relpath(s, ROOT) for s in sources],
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "command": " ".join(["python cuda/static_report.py", *(sys.argv[1:] if argv is None else argv)]),
              "kernels": report.kernels, "candidates": report.candidates, "other_kernels": report.other_kernels,
              "timings": joined,
              "warnings": report.warnings, "archs": report.archs}
    text = "\n\n".join(t(record) for t in (tables.table, tables.candidates_table, tables.tensor_core_table))
    status = cli.publish(text, [(json_path, cli.json_writer(record, indent=1))])
    for w in report.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return status


if __name__ == "__main__":
    cli.run(main)
