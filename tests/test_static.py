"""The static evidence of chapters 3 and 4, checked without a GPU: the occupancy calculator, the
static report on today's kernels (sm_90 and sm_80, the tensor-core versions' HMMA and ldmatrix
counts, zero spills), the SASS of the PTX edits, the sigmoid's error bound, and that the chapters
show what the scripts wrote. What compiles (nvcc, ptxas, cuobjdump, the host compiler) is in the
slow suite; what reads the committed record or hand-made input is quick."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import ROOT, load_script, run_script

slow = pytest.mark.slow  # nvcc, ptxas, cuobjdump or the host compiler; or a script that imports torch


sr = load_script("cuda/static_report.py")
disasm, static_tables = load_script("cuda/sass.py"), load_script("cuda/static_tables.py")
catalog = load_script("cuda/catalog.py")
sass = load_script("ptx/sass_report.py")
bound = load_script("ptx/sigmoid_bound.py")

HAVE_NVCC = disasm.find_tool("nvcc") is not None and disasm.find_tool("ptxas") is not None
HAVE_SASS = disasm.sass_tools()[0] is not None
NO_NVCC = "needs nvcc and ptxas (the CUDA toolkit), not found"
NO_SASS = NO_NVCC if not HAVE_NVCC else disasm.sass_tools()[1]  # e.g. "the SASS needs cuobjdump, not found: ..."
needs_nvcc = pytest.mark.skipif(not HAVE_NVCC, reason=NO_NVCC)
needs_sass = pytest.mark.skipif(not (HAVE_NVCC and HAVE_SASS), reason=NO_SASS)
COMMITTED = ROOT / "docs" / "results" / "cuda_static_sm90.json"


# ---------------------------------------------------------------------------------------
# The occupancy calculator
# ---------------------------------------------------------------------------------------
# (registers, threads, static shared bytes, barriers) -> blocks per SM, worked by hand:
HAND_WORKED = [
    # 108 registers (the first v3's f32): 108·32 = 3456 -> 3584 per warp; 16384 // 3584 = 4 warps per sub-partition,
    # 16 per SM, 8 warps per block -> 2 blocks (shared: 9216 B each would allow 25).
    ((108, 256, 8192, 1), 2, ["registers"]),
    # 32 registers, 1024 threads: 1024 per warp, 64 warps fit -> 2 blocks; 64 warps // 32 too.
    ((32, 1024, 16384, 1), 2, ["warps", "registers"]),
    # 255 registers: 8160 -> 8192 per warp, 2 per sub-partition, 8 per SM -> 1 block of 8 warps.
    ((255, 256, 0, 1), 1, ["registers"]),
    # 48 KiB static + 1 KiB reserved = 50176 B; 233472 // 50176 = 4 blocks.
    ((32, 128, 49152, 1), 4, ["shared"]),
    # One byte more than the 48 KiB a block may hold statically: does not launch.
    ((32, 128, 49153, 1), 0, ["shared"]),
    # 32-thread blocks, few registers: the 32-blocks-per-SM cap binds (32 warps, 50%).
    ((16, 32, 0, 1), 32, ["blocks"]),
    # 40 registers, 3 warps: 1280 per warp, 12 per sub-partition = 48 per SM -> 16 blocks;
    # dividing the SM's 65536 registers as one pool would wrongly give 17.
    ((40, 96, 0, 1), 16, ["registers"]),
    # 64 registers × 1024 threads uses the whole 64 Ki register file: one block (warps would allow 2).
    ((64, 1024, 0, 1), 1, ["registers"]),
    # 65 registers × 1024 threads: 72 registers per thread after rounding; over the per-block limit.
    ((65, 1024, 0, 1), 0, ["registers"]),
]


@pytest.mark.parametrize("args, blocks, limited_by", HAND_WORKED)
def test_occupancy_hand_worked_cases(args, blocks, limited_by):
    registers, threads, shared, barriers = args
    got = sr.occupancy(registers, threads, shared, barriers=barriers)
    assert got["blocks_per_sm"] == blocks
    assert got["limited_by"] == limited_by
    assert got["occupancy"] == pytest.approx(blocks * -(-threads // 32) / 64)


@pytest.mark.parametrize("script", ["cuda/static_report.py", "cuda/figures.py", "cuda/emulated.py",
                                    "ptx/sass_report.py", "ptx/sigmoid_bound.py", "ptx/load_cost.py"])
@slow
def test_help_has_safe_examples(script):
    result = run_script(script, "--help")
    assert result.returncode == 0 and "Examples:" in result.stdout
    examples = result.stdout[result.stdout.index("Examples:"):]
    # an example that writes a tracked file would overwrite the committed results
    assert "docs/results" not in "\n".join(x for x in examples.splitlines() if x.strip().startswith("python")
                                          and "render.py" not in x)


def test_occupancy_rejects_nonsense():
    with pytest.raises(ValueError):
        sr.occupancy(32, 0)
    assert sr.occupancy(32, 1025)["blocks_per_sm"] == 0  # more threads than a block may have


HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "cuda_occupancy.h"
int main(int argc, char** argv) {
  cudaOccDeviceProp p;  // argv: compute capability major, minor, shared memory per SM, per block (opt-in)
  p.computeMajor = atoi(argv[1]); p.computeMinor = atoi(argv[2]); p.maxThreadsPerBlock = 1024;
  p.maxThreadsPerMultiprocessor = 2048; p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536; p.warpSize = 32;
  p.sharedMemPerBlock = 49152; p.sharedMemPerMultiprocessor = atoi(argv[3]); p.numSms = 132;
  p.sharedMemPerBlockOptin = atoi(argv[4]); p.reservedSharedMemPerBlock = 1024;
  for (int i = 5; i + 3 < argc; i += 4) {
    cudaOccFuncAttributes a;
    a.maxThreadsPerBlock = 1024; a.numRegs = atoi(argv[i]); a.sharedSizeBytes = atoi(argv[i + 2]);
    a.numBlockBarriers = atoi(argv[i + 3]);
    cudaOccDeviceState s;
    cudaOccResult r;
    cudaOccError e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, atoi(argv[i + 1]), 0);
    printf("%d %d\n", (int)e, e == CUDA_OCC_SUCCESS ? r.activeBlocksPerMultiprocessor : -1);
  }
  return 0;
}
"""


@slow
@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_occupancy_agrees_with_the_toolkits_calculator(tmp_path, arch):
    """cuda_occupancy.h is NVIDIA's own host-side calculator: same inputs, same answers, for each
    architecture's device (H100/H200, A100)."""
    header = next((p for p in (Path("/usr/local/cuda/include/cuda_occupancy.h"),
                               *(Path(disasm.find_tool("nvcc") or "/nonexistent").resolve().parent.parent
                                 .glob("include/cuda_occupancy.h"))) if p.is_file()), None)
    cxx = shutil.which("g++") or shutil.which("c++")
    if header is None or cxx is None:
        pytest.skip("needs a C++ compiler and the CUDA toolkit's include/cuda_occupancy.h")
    (tmp_path / "occ.cpp").write_text(HARNESS)
    build = subprocess.run([cxx, "-O1", f"-I{header.parent}", str(tmp_path / "occ.cpp"), "-o", str(tmp_path / "occ")],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    device = sr.DEVICES[arch]
    major, minor = device.compute_capability.split(".")
    cases = [(r, t, s, b) for r in (16, 26, 32, 40, 48, 56, 64, 65, 78, 108, 128, 168, 255)
             for t in (32, 96, 128, 256, 512, 1024) for s in (0, 8192, 16640, 40960, 49152) for b in (1, 2)]
    out = subprocess.run([str(tmp_path / "occ"), major, minor, str(device.shared_per_sm),
                          str(device.shared_per_block_optin), *(str(x) for c in cases for x in c)],
                         capture_output=True, text=True, timeout=60).stdout.split("\n")
    for case, line in zip(cases, out):
        err, blocks = map(int, line.split())
        assert err == 0, f"cuda_occupancy.h error {err} for {case}"
        registers, threads, shared, barriers = case
        assert sr.occupancy(registers, threads, shared, barriers=barriers, device=device)["blocks_per_sm"] == blocks, \
            (arch, case)
    assert len(out) > len(cases)  # every case answered (and the trailing newline)


def test_napkin_maths():
    # 128×128 tile, 8×8 per thread, float32, K = 4096: 2·128·128·4096 FLOPs over
    # ((128+128)·4096 + 128·128)·4 bytes; per k each thread reads 16 values for 64 FMAs.
    n = sr.napkin(128, 128, 8, 8, True, 4, 4096)
    assert n["flops_per_tile"] == 2 * 128 * 128 * 4096
    assert n["bytes_per_tile"] == (256 * 4096 + 128 * 128) * 4
    assert n["fma_per_operand_load"] == 4
    # v1 reads a row and a column per output: 1/4 FLOP per float32 byte, as K grows.
    assert sr.napkin(16, 16, 1, 1, False, 4, 1 << 20)["flop_per_byte"] == pytest.approx(0.25, rel=1e-5)
    # Split-K over 5 slices: same FLOPs and operand bytes, plus 5 partial tiles written and read back.
    s = sr.napkin(128, 128, 8, 8, True, 4, 4096, slices=5)
    assert s["flops_per_tile"] == n["flops_per_tile"]
    assert s["bytes_per_tile"] == (256 * 4096 + 11 * 128 * 128) * 4
    with pytest.raises(ValueError):
        sr.napkin(128, 128, 8, 8, True, 4, 4096, slices=0)


TILE_HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "dense_kernels.h"
int main(int argc, char** argv) {
  for (const dense_kernels::VersionInfo& info : dense_kernels::kVersionInfo)
    for (int d = 0; d < dense_kernels::kDTypes; ++d) {
      const auto dtype = static_cast<dense_kernels::DType>(d);
      if (info.id == 0 || !dense_kernels::version_builds(info.id, dtype)) continue;
      const int b = dense_kernels::acc_bytes(dtype);
      const dense_kernels::Tile t = dense_kernels::tile(info.id, b);
      std::printf("tile %d %s %d %d %d %d %d %d\n", info.id, dense_kernels::kDTypeNames[d], t.BM, t.BN, t.BK, t.TM,
                  t.TN, dense_kernels::threads(info.id, b));
    }
  for (int i = 0; i < dense_kernels::kTuneCount; ++i) {
    const dense_kernels::WarpTile w = dense_kernels::kTuneCandidates[i];
    std::printf("tune %d %d %d %d %d %d %d %d %d\n", i, w.BM, w.BN, w.BK, w.WM, w.WN, w.TM, w.TN, w.MINB);
  }
  for (int b : {4, 8}) {
    const dense_kernels::WarpTile w = dense_kernels::warp_tile(12, b);
    std::printf("skinny %d %d %d\n", b, w.BK, w.MINB);
  }
  for (const dense_kernels::VersionInfo& info : dense_kernels::kVersionInfo)
    if (dense_kernels::uses_tma(info.id)) std::printf("tma %d %zu\n", info.id, dense_kernels::tma_smem_bytes(info.id));
  for (int i = 1; i + 4 < argc; i += 5)
    std::printf("slices %d %d %d\n", dense_kernels::splitk_slices(atoll(argv[i]), atoll(argv[i + 1]),
                                                                  atoll(argv[i + 2]), atoi(argv[i + 3]),
                                                                  atoi(argv[i + 4])),
                dense_kernels::skinny_slices(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]), atoi(argv[i + 3]),
                                             atoi(argv[i + 4])),
                dense_kernels::hopper_slices(atoll(argv[i]), atoll(argv[i + 1]), atoll(argv[i + 2]),
                                             atoi(argv[i + 4])));
  return 0;
}
"""


@slow
def test_tiles_and_slices_agree_with_the_kernels_header(tmp_path):
    """TILES and TUNE_CANDIDATES (the napkin maths) and the Python mirrors of v9's and v12's slices
    against cuda/dense_kernels.h, compiled with the host compiler: the numbers the kernels are
    instantiated from, for every version of kVersionInfo and every element type it is built for
    (the tensor-core versions' k-steps, and their warp tiles against the block's threads, too)."""
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("needs a C++ compiler")
    (tmp_path / "t.cpp").write_text(TILE_HARNESS)
    build = subprocess.run([cxx, "-std=c++17", f"-I{ROOT / 'cuda'}", str(tmp_path / "t.cpp"), "-o",
                            str(tmp_path / "t")], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    cases = [(m, n, k, b, sms) for m in (1, 32, 100, 1000) for n in (64, 4096) for k in (100, 4096)
             for b in (4, 8) for sms in (8, 114, 132)]
    out = subprocess.run([str(tmp_path / "t"), *(str(x) for c in cases for x in c)], capture_output=True, text=True,
                         timeout=60).stdout.splitlines()
    tiles = {(int(v), dt): tuple(map(int, rest)) for v, dt, *rest in (line.split()[1:] for line in out
                                                                      if line.startswith("tile"))}
    assert set(tiles) == {(v, dt) for v, entry in sr.TILES.items() for dt in sr.DTYPES if dt in entry}
    assert {v for v, _ in tiles} >= {1, 12, 21, 24, 26}
    for (v, dt), (bm, bn, bk, tm, tn, threads) in tiles.items():
        entry = sr.TILES[v]
        want = entry[dt]
        assert (bm, bn, tm, tn) == want[:4], f"v{v} {dt}: header {bm}×{bn} ({tm}×{tn}), TILES {want}"
        assert threads == entry.get("threads", bm * bn // (tm * tn)), f"v{v} {dt}: header {threads} threads"
        if "bk" in entry:
            assert bk == entry["bk"], f"v{v} {dt}: header BK {bk}, TILES {entry['bk']}"
        if "mma" in entry:  # a warp (a warpgroup for wgmma's m64) holds its tile's accumulators
            wm, wn = entry["warp"]
            lanes = 128 if sr.mma_shape(entry["mma"])[0] == 64 else 32
            producers = (threads - (bm // wm) * (bn // wn) * lanes) // 128  # v33's TMA warpgroup
            assert threads == (bm // wm) * (bn // wn) * lanes + 128 * producers and producers in (0, 1), (v, dt)
            assert tm * tn == wm * wn // lanes, (v, dt)
    # the TMA versions' dynamic shared memory, as the launcher asks for it
    tma = {int(v): int(b) for _, v, b in (line.split() for line in out if line.startswith("tma"))}
    assert all(set(sr.TILES[v]["dynamic_shared"].values()) == {tma[v]} for v in tma), tma
    assert {v for v, e in sr.TILES.items() if "dynamic_shared" in e} == set(tma)
    tune = [tuple(map(int, line.split()[2:])) for line in out if line.startswith("tune")]
    assert tune == sr.TUNE_CANDIDATES
    skinny = {int(b): (int(bk), int(minb)) for _, b, bk, minb in (line.split() for line in out
                                                                   if line.startswith("skinny"))}
    assert skinny == {b: (sr.TILES[12]["bk"], sr.TILES[12]["min_blocks"][dt]) for b, dt in ((4, "f32"), (8, "f64"))}
    assert all(sr.TILES[12]["min_blocks"][dt] == sr.TILES[12]["min_blocks"]["f32"] for dt in ("bf16", "f16"))
    slices = [tuple(map(int, line.split()[1:])) for line in out if line.startswith("slices")]
    assert len(slices) == len(cases) and max(s[0] for s in slices) > 1 and max(s[1] for s in slices) > 1
    assert max(s[2] for s in slices) > 1
    for (m, n, k, b, sms), (v9, v12, v35) in zip(cases, slices):
        dt = "f32" if b == 4 else "f64"
        bm, bn = sr.TILES[9][dt][:2]
        assert sr.splitk_slices(m, n, k, bm, bn, sms) == v9, (m, n, k, b, sms)
        bm, bn = sr.TILES[12][dt][:2]
        assert sr.skinny_slices(m, n, k, bm, bn, sr.TILES[12]["bk"], sr.TILES[12]["min_blocks"][dt], sms) == v12, \
            (m, n, k, b, sms)
        bm, bn = sr.TILES[35]["bf16"][:2]
        assert sr.hopper_slices(m, n, k, bm, bn, sr.TILES[35]["bk"], sms) == v35, (m, n, k, sms)


def test_tensor_core_napkin_maths():
    """mma's and ldmatrix.x4's per k-step and warp, worked by hand from each kernel's loops."""
    # v24: a 64×32 warp tile is 4 × 4 tiles of 16×8; k-steps of 32 are 2 mma's deep: 32 mma's; per 16
    # of k, 4 ldmatrix.x4 for A (16 rows each) and 2 for B (two n8 fragments each): 12
    v24 = sr.mma_napkin(128, 128, 32, 64, 32, "m16n8k16")
    assert (v24["mma_per_k_step"], v24["ldmatrix_x4_per_k_step"], v24["warps"]) == (32, 12, 8)
    assert v24["flop_per_mma"] == 2 * 16 * 8 * 16
    # v22: 32×32 warp tiles, k-steps of 64: 2·4·4 = 32 mma's, (2 + 2)·4 = 16 ldmatrix
    v22 = sr.mma_napkin(64, 64, 64, 32, 32, "m16n8k16")
    assert (v22["mma_per_k_step"], v22["ldmatrix_x4_per_k_step"], v22["warps"]) == (32, 16, 4)
    # v21: one mma a k-step of 16, fragments from global memory; v26: split-TF32's three products
    assert sr.mma_napkin(32, 16, 16, 16, 8, "m16n8k16", fragments="global")["mma_per_k_step"] == 1
    assert sr.mma_napkin(32, 16, 16, 16, 8, "m16n8k16", fragments="global")["ldmatrix_x4_per_k_step"] == 0
    assert sr.mma_napkin(128, 128, 16, 64, 32, "m16n8k8", products=3, fragments="lds")["mma_per_k_step"] == 96
    # wgmma: the warpgroup's 64×128 tile is one m64n128k16 a 16 of k; v35's 32×64 tile, W as A, one
    # m64n32k16 (its m along C's n); v33's consumers each 64×256
    assert sr.mma_napkin(64, 128, 64, 64, 128, "m64n128k16", fragments="shared")["mma_per_k_step"] == 4
    assert sr.mma_napkin(32, 64, 64, 32, 64, "m64n32k16", fragments="shared", swap=True)["mma_per_k_step"] == 4
    assert sr.mma_napkin(128, 256, 64, 64, 256, "m64n256k16", fragments="shared")["warps"] == 2
    # v35's slices at B = 32, I = O = 4096 on 132 SMs: 64 tiles, 2 blocks an SM: 4 slices of 16 k-steps
    assert sr.hopper_slices(32, 4096, 4096, 32, 64, 64, 132) == 4
    with pytest.raises(ValueError):
        sr.mma_shape("16x8x16")
    # v21's loads: each of its 4 warps asks for its own 16 rows and 8 columns, (16+8)·4 per k
    n = sr.napkin(32, 16, 2, 2, False, 2, 4096, loads_per_k=96)
    assert n["bytes_per_tile"] == (96 * 4096 + 32 * 16) * 2
    # split-K partials in float32 for a 16-bit type: 2S tiles of 4 bytes beside the 2-byte output
    assert sr.napkin(32, 128, 4, 8, True, 2, 4096, slices=16, acc_bytes=4)["bytes_per_tile"] == \
        (160 * 4096 + 32 * 128) * 2 + 32 * 32 * 128 * 4


def test_archs_are_the_ones_the_stage_is_built_for():
    """The report's default architectures are modes.DEFAULT_CUDA_ARCHS ("8.0;9.0+PTX"), and the
    committed record has each one's figures."""
    import modes

    built = {"sm_" + a.split("+")[0].replace(".", "") for a in modes.DEFAULT_CUDA_ARCHS.split(";")}
    assert set(sr.ARCHS) == built
    record = json.loads(COMMITTED.read_text())
    assert set(record["archs"]) == built and record["arch"] == sr.ARCHS[0]
    for arch, found in record["archs"].items():
        assert found["device"]["compute_capability"] == sr.DEVICES[arch].compute_capability


# ---------------------------------------------------------------------------------------
# The SASS helpers, on hand-made input
# ---------------------------------------------------------------------------------------
SASS = """
        Function : k
        /*0000*/                   MOV R1, c[0x0][0x28] ;
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   LDS R8, [R0] ;
        /*0030*/                   LDS.128 R12, [R0+0x10] ;
        /*0040*/                   FFMA R9, R8, R12, R9 ;
        /*0050*/                   FFMA R9, R8, R13, R9 ;
        /*0060*/               @P0 BRA 0x20 ;
        /*0070*/                   FFMA R9, R8, R13, R9 ;
        /*0080*/              @!P1 BRA 0x10 ;
        /*0090*/                   EXIT ;
        /*00a0*/                   BRA 0xa0;
"""


def test_inner_loop_is_the_innermost_backward_branch_with_fmas():
    code = disasm.parse_sass(SASS)["k"]
    assert disasm.loops(code) == [(0x10, 0x80), (0x20, 0x60), (0xA0, 0xA0)]
    loop = disasm.inner_loop(code)
    assert (loop["start"], loop["end"]) == ("0x0020", "0x0060")
    assert loop["fma"] == 2 and loop["lds"] == {"32": 1, "128": 1} and loop["ldg"] == {}
    assert loop["fma_per_lds"] == 1


TC_SASS = """
        Function : tc
        /*0000*/                   HFMA2.MMA R4, -RZ, RZ, 0, 0 ;
        /*0008*/              @!PT LDS RZ, [RZ] ;
        /*0010*/                   LDGSTS.E.BYPASS.128 [R2], desc[UR4][R6.64] ;
        /*0020*/                   LDGDEPBAR ;
        /*0030*/                   DEPBAR.LE SB0, 0x1 ;
        /*0040*/                   LDSM.16.M88.4 R8, [R3] ;
        /*0050*/                   LDSM.16.MT88.4 R12, [R3+0x800] ;
        /*0060*/                   HMMA.16816.F32.BF16 R16, R8, R12, R16 ;
        /*0070*/                   HMMA.16816.F32.BF16 R20, R8, R14, R20 ;
        /*0080*/               @P0 BRA 0x8 ;
        /*0090*/                   FFMA R4, R16, R16, R4 ;
        /*00a0*/                   EXIT ;
"""


def test_inner_loop_of_a_tensor_core_kernel_counts_its_mma_and_ldmatrix():
    """The loop with HMMA's is the main loop (no FFMA in it); its census names each instruction
    as the SASS spells it; HFMA2.MMA, ptxas's way of zeroing a register, is neither an FMA nor an
    mma, and the `@!PT LDS` ptxas pads a cp.async with never runs: no shared load."""
    code = disasm.parse_sass(TC_SASS)["tc"]
    loop = disasm.inner_loop(code)
    assert (loop["start"], loop["end"]) == ("0x0008", "0x0080")
    assert (loop["mma"], loop["ldsm"], loop["fma"]) == (2, 2, 0)
    assert loop["census"] == {"DEPBAR.LE": 1, "HMMA.16816.F32.BF16": 2, "LDGDEPBAR": 1, "LDGSTS.E.BYPASS.128": 1,
                              "LDSM.16.M88.4": 1, "LDSM.16.MT88.4": 1}
    assert loop["ldgsts"] == {"128": 1} and not loop["lds"]
    assert disasm.census(code)["HMMA.16816.F32.BF16"] == 2 and "HFMA2.MMA" not in disasm.census(code)
    assert disasm.mix(code)["fma"] == 1  # the FFMA after the loop, not the HFMA2.MMA
    # wgmma's opcode holds its shape with lower-case x's: the whole name is the opcode
    (ins,) = disasm.parse_sass("Function : h\n /*0000*/ HGMMA.64x128x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT ;")["h"]
    assert ins.op == "HGMMA.64x128x16.F32.BF16" and disasm.is_mma(ins.op) and ins.args.startswith("R24")


PTX_A = """.func (.param .b32 r) f(.param .b32 x)
{
\tadd.f32 %f1, %f2, %f3;
}
.visible .entry g(.param .u64 p)
{
\tld.global.f32 %f1, [%rd1];  // a comment
}
"""


def test_edited_functions_are_found_by_their_code_not_their_comments():
    only_comments = PTX_A.replace("// a comment", "// EDIT-B: another comment")
    assert sass.edited_functions(PTX_A, only_comments) == []
    edited = only_comments.replace("ld.global.f32 %f1", "ld.global.v4.f32 {%f1, %f2, %f3, %f4}")
    assert sass.edited_functions(PTX_A, edited) == ["g"]
    assert sass.tag(sass.functions(edited)["g"][1]) == "EDIT-B"


def test_missing_sass_tools_are_named_with_the_pip_packages(monkeypatch):
    monkeypatch.setattr(disasm, "find_tool", lambda name: None if name == "nvdisasm" else f"/bin/{name}")
    tool, reason = disasm.sass_tools()
    assert tool is None and "nvdisasm" in reason and "requirements-cuda.txt" in reason


# ---------------------------------------------------------------------------------------
# The scripts on today's kernels and PTX
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def static_record(tmp_path_factory):
    if not HAVE_NVCC:
        pytest.skip(NO_NVCC)
    out = tmp_path_factory.mktemp("static") / "static.json"
    result = run_script("cuda/static_report.py", "--json", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


LAYOUTS = ("nt", "nn", "tn")
# ptxas 13.0 gives v4's nt float32 kernel 64 registers on sm_80 (where it is free to take 128) and
# spills 8 bytes: the one exception to "no spills, no stack", held to its bytes, so that another
# spill anywhere, or a change in this one, fails.
KNOWN_SPILLS = {("sm_80", "dense_gemm_v4_nt_f32"): (8, 8, 8)}  # spill stores, spill loads, stack frame
# mma.sync's SASS name for each element type (wgmma's: sass_mma)
HMMA = {"bf16": "HMMA.16816.F32.BF16", "f16": "HMMA.16816.F32", "f32": "HMMA.1688.F32.TF32"}
CP_ASYNC = {24, 25, 26}  # the tensor-core versions whose tiles come by cp.async


def sass_mma(mma: str, dtype: str) -> str:
    """The SASS name of an mma of this shape and element type: m16n8k16 bfloat16 is
    HMMA.16816.F32.BF16, wgmma m64n128k16 bfloat16 HGMMA.64x128x16.F32.BF16."""
    m, n, k = sr.mma_shape(mma)
    if m == 64:
        return f"HGMMA.64x{n}x{k}.F32" + {"bf16": ".BF16", "f16": "", "f32": ".TF32"}[dtype]
    return HMMA[dtype]


def check_no_spills_and_no_stack(record: dict) -> int:
    """Every entry on every architecture of the record: no spill stores or loads, no stack frame
    (KNOWN_SPILLS aside); the architectures hold the same entries. Returns the entries checked."""
    archs = record["archs"]
    names = {a: set(x["entries"]) for a, x in archs.items()}
    first = next(iter(names.values()))
    assert all(n == first for n in names.values()), {a: sorted(n ^ first)[:5] for a, n in names.items()}
    for arch, found in archs.items():
        for name, e in found["entries"].items():
            got = (e["spill_stores"], e["spill_loads"], e["stack_bytes"])
            assert got == KNOWN_SPILLS.get((arch, name), (0, 0, 0)), (arch, name, got)
    assert all(name in first for _, name in KNOWN_SPILLS)
    return sum(len(n) for n in names.values())


def check_tensor_core_loops(record: dict) -> int:
    """On every architecture, each tensor-core entry's main loop (one k-step a pass) has the mma's
    and ldmatrix's TILES' napkin maths predict, as the SASS names them: HMMA.16816.F32.BF16 for
    bfloat16, HMMA.16816.F32 for float16, HMMA.1688.F32.TF32 for TF32 (wgmma's HGMMA where the
    record has sm_90a); ldmatrix .trans
    (LDSM.16.MT88.4) exactly for the operands stored along m or n (nn: B; tn: A and B). v22 and v23
    load with plain 16-byte loads, v24 to v26 with cp.async (LDGSTS); v21 loads its fragments from
    global memory, with no shared memory at all. Returns the (entry, architecture) pairs checked."""
    checked = 0
    for k in record["kernels"]:
        tc = k.get("napkin", {}).get("tensor_cores")
        if tc is None:
            continue
        for arch, found in record["archs"].items():
            if k.get("needs") and k["needs"] != arch:
                continue  # compiled elsewhere, its kernels are a trap
            loop = found["entries"][k["name"]]["loop"]
            hmma = {op: n for op, n in loop["census"].items() if op.startswith(("HMMA", "HGMMA"))}
            assert hmma == {sass_mma(tc["mma"], k["dtype"]): tc["mma_per_k_step"]}, (arch, k["name"], hmma)
            assert loop["mma"] == tc["mma_per_k_step"], (arch, k["name"])
            if not k.get("needs"):  # the TMA versions' loop range also spans code ptxas laid out inside it
                assert loop["fma"] == 0, (arch, k["name"])
            ldsm = {op: n for op, n in loop["census"].items() if op.startswith("LDSM")}
            assert loop["ldsm"] == sum(ldsm.values()) == tc["ldmatrix_x4_per_k_step"], (arch, k["name"], ldsm)
            if tc["fragments"] == "ldmatrix":
                wm, wn = tc["warp_tile"]
                b_loads = (wn // 16) * (tc["k_step"] // 16)
                trans = {"nt": 0, "nn": b_loads, "tn": loop["ldsm"]}[k["layout"]]
                assert ldsm.get("LDSM.16.MT88.4", 0) == trans, (arch, k["name"], ldsm)
            cp_async = any(op.startswith("LDGSTS") for op in loop["census"])
            assert cp_async == (k["version"] in CP_ASYNC), (arch, k["name"])
            checked += 1
        if k["version"] == 21:
            assert k["shared_bytes"] == 0 and not k["inner_loop"]["lds"] and k["inner_loop"]["ldg"], k["name"]
    return checked


@slow
@needs_nvcc
def test_static_report_covers_every_gemm_version_with_sane_figures(static_record):
    kernels = static_record["kernels"]
    versions = {k["version"] for k in kernels}
    assert versions and min(versions) == 1
    # every version of the header in every element type it is built for, in every layout
    built = {x.id: x.dtypes for x in catalog.versions() if x.id != 0}
    assert versions == set(built)
    for v in versions:
        assert {(k["layout"], k["dtype"]) for k in kernels if k["version"] == v} == \
            {(layout, dt) for layout in LAYOUTS for dt in built[v]}, f"v{v} incomplete"
    for k in kernels:
        for key in ("version", "registers", "shared_bytes", "spill_bytes", "occupancy", "threads", "napkin"):
            assert key in k, f"{k['name']} lacks {key}"
        assert 1 <= k["registers"] <= 255 and k["shared_bytes"] >= 0 and k["spill_bytes"] >= 0
        assert 1 <= k["threads"] <= 1024 and k["threads_from"] == "__launch_bounds__"
        assert 0 < k["occupancy"] <= 1 and k["blocks_per_sm"] >= 1, k["name"]
        assert k["napkin"]["flop_per_byte"] > 0
    # TILES agrees with every kernel's launch bounds (else the table of napkin maths is stale)
    assert static_record["warnings"] == []
    assert versions == set(sr.TILES)
    # every autotuning candidate, float32, the three layouts, no spills, at least one block per SM
    candidates = static_record["candidates"]
    assert {(k["candidate"], k["layout"], k["dtype"]) for k in candidates} == \
        {(i, layout, "f32") for i in range(len(sr.TUNE_CANDIDATES)) for layout in LAYOUTS}
    for k in candidates:
        assert k["spill_bytes"] == 0 and k["blocks_per_sm"] >= 1 and k["threads_from"] == "__launch_bounds__", k
        assert k["threads"] == k["tile"]["bm"] * k["tile"]["bn"] // (k["tile"]["tm"] * k["tile"]["tn"]), k["name"]
    # the backward's kernels and the second passes are there too, in every element type, and fit on an SM
    others = {k["name"]: k for k in static_record["other_kernels"]}
    for name in ("dense_sigmoid_grad_v1_f32", "dense_sigmoid_grad_v1_x4_f32", "dense_sigmoid_grad_v2_f64",
                 "dense_sigmoid_grad_v3_bf16", "dense_bias_grad_v3_f16", "dense_splitk_reduce_bf16"):
        assert others[name]["blocks_per_sm"] >= 1 and others[name]["spill_bytes"] == 0, name
    for key in ("device", "tools", "date", "command", "arch"):
        assert static_record[key]
    assert static_record["device"]["max_warps_per_sm"] == 64 and static_record["device"]["shared_per_sm"] == 233472
    # and every architecture the stage is built for, entry by entry
    assert set(static_record["archs"]) == set(sr.ARCHS)
    every = set(others) | {k["name"] for k in kernels + candidates}
    assert set(static_record["archs"][sr.ARCHS[0]]["entries"]) == every


@slow
@needs_nvcc
def test_no_entry_spills_or_has_a_stack_frame_on_any_architecture(static_record):
    assert check_no_spills_and_no_stack(static_record) > 2 * 150


def test_no_entry_spills_or_has_a_stack_frame_in_the_committed_figures():
    """The committed record, both architectures: what the slow test above checks on a fresh run."""
    record = json.loads(COMMITTED.read_text())
    assert check_no_spills_and_no_stack(record) > 2 * 150


@slow
@needs_sass
def test_static_report_inner_loop_matches_the_register_tiles(static_record):
    """In the SASS of each CUDA-core GEMM's innermost multiply-add loop, FMAs per operand element
    loaded (from shared memory, or from global memory where nothing is staged) are TM·TN/(TM+TN):
    what TILES says each thread reuses; in each tensor-core GEMM's, the mma's and ldmatrix's of
    one k-step (check_tensor_core_loops). A stale TILES entry fails here."""
    assert static_record["tools"]["sass"]["available"]
    for k in static_record["kernels"] + static_record["candidates"]:
        loop = k["inner_loop"]
        if "tensor_cores" in k["napkin"]:
            continue
        assert loop is not None and loop["fma"] > 0, k["name"]
        # bfloat16 and float16 are converted to float32 on their way into shared memory
        element_bits = 64 if k["dtype"] == "f64" else 32
        source = loop["lds"] if k["tile"]["staged_in_shared"] else loop["ldg"]
        if not k["tile"]["staged_in_shared"]:
            assert not loop["lds"], f"{k['name']}: shared loads in a version that stages nothing"
        elements = sum(n * int(w) / element_bits for w, n in source.items())
        assert loop["fma"] / elements == pytest.approx(k["napkin"]["fma_per_operand_load"], rel=0.25), k["name"]
    assert check_tensor_core_loops(static_record) >= 2 * 3 * (4 * 2 + 2)  # archs × layouts × (v21-v24 × 2, v25, v26)
    # v2 and v3 of the backward add a column's 32 partial sums with a 5-step shuffle tree (a
    # SHFL moves 32 bits: two per step for a double; v3 holds the tree twice, one per destination
    # of its sums); v1 with none
    for k in static_record["other_kernels"]:
        per_tree = 10 if k["name"].endswith("_f64") else 5
        if k["name"].startswith("dense_sigmoid_grad_v2"):
            assert k["mix"]["shfl"] == per_tree, k["name"]
        elif k["name"].startswith("dense_sigmoid_grad_v3"):
            assert k["mix"]["shfl"] == 2 * per_tree, k["name"]
        elif k["name"].startswith("dense_sigmoid_grad_v1"):
            assert k["mix"]["shfl"] == 0, k["name"]


@slow
@needs_sass
def test_the_cuda_stage_inlines_the_sigmoid(static_record):
    """Every float32, bfloat16 and float16 GEMM's MUFU.EX2 (the sigmoid's exponential, in float32)
    is in its own code, none in a subroutine; the one subroutine left is the division's slow path
    (the split-K versions v9 and v12: and a 64-bit integer division). (float64's exp is a
    polynomial without MUFU.EX2: there only the count of calls.)"""
    for k in static_record["kernels"] + static_record["candidates"]:
        if k.get("needs"):
            continue  # a trap here
        c = k["calls"]
        if k["dtype"] != "f64":
            assert c["mufu_ex2_inline"] >= 1 and c["mufu_ex2_in_callees"] == 0, k["name"]
        assert c["targets"] == (2 if k.get("version") in (9, 12) else 1), k["name"]


def _view(record: dict) -> dict:
    """The figures a kernel change moves: per entry, ptxas's and the main loop's, on every architecture."""
    keys = ("registers", "shared_bytes", "spill_bytes", "threads", "blocks_per_sm")
    loop_keys = ("fma", "lds", "ldg", "ldgsts", "bar", "mma", "ldsm", "census")
    out = {}
    for k in record["kernels"] + record.get("candidates", []) + record["other_kernels"]:
        loop = k.get("inner_loop") or {}
        out[k["name"]] = ({x: k.get(x) for x in keys}, {x: loop.get(x) for x in loop_keys})
    for arch, found in record.get("archs", {}).items():
        out.update({(arch, name): e for name, e in found["entries"].items()})
    return out


@slow
@needs_sass
def test_committed_static_figures_are_todays(static_record):
    """docs/results/cuda_static_sm90.json matches what the script makes of today's kernels (with
    the same ptxas), on every architecture: a kernel change without regenerating the figures fails here."""
    committed = json.loads(COMMITTED.read_text())
    if committed["tools"]["ptxas"] != static_record["tools"]["ptxas"]:
        pytest.skip(f"the committed figures came from ptxas {committed['tools']['ptxas']}, this one differs")
    now, then = _view(static_record), _view(committed)
    differ = sorted(str(n) for n in now.keys() | then.keys() if now.get(n) != then.get(n))
    assert not differ, ("regenerate: python cuda/static_report.py --json docs/results/cuda_static_sm90.json && "
                        f"python docs/render.py (differences: {differ[:5]})")


def test_tensor_core_main_loops_in_the_committed_figures():
    """check_tensor_core_loops on the committed record: v21 to v26 on both architectures, every layout."""
    record = json.loads(COMMITTED.read_text())
    assert check_tensor_core_loops(record) >= 2 * 3 * (4 * 2 + 2)


def test_16bit_cuda_core_versions_run_float32s_inner_loop_in_the_committed_figures():
    """v11 and v12 in bfloat16 and float16: the FFMA's and 128-bit shared loads of float32's loop
    (the tiles hold float32), 16-bit global loads and no cp.async (each element is converted on
    its way into shared memory); half the bytes, so about twice float32's FLOP/B."""
    record = json.loads(COMMITTED.read_text())
    k = {(r["version"], r["layout"], r["dtype"]): r for r in record["kernels"]}
    for v in (11, 12):
        for lay in LAYOUTS:
            f32 = k[v, lay, "f32"]
            for dt in ("bf16", "f16"):
                r = k[v, lay, dt]
                assert (r["inner_loop"]["fma"], r["inner_loop"]["lds"]["128"]) == \
                    (f32["inner_loop"]["fma"], f32["inner_loop"]["lds"]["128"]), (v, lay, dt)
                assert "16" in r["inner_loop"]["ldg"] and not r["inner_loop"]["ldgsts"], (v, lay, dt)
                assert r["spill_bytes"] == 0 and r["blocks_per_sm"] == f32["blocks_per_sm"], (v, lay, dt)
                assert 1.5 < r["napkin"]["flop_per_byte"] / f32["napkin"]["flop_per_byte"] <= 2, (v, lay, dt)


def test_chapter_claims_hold_in_the_committed_static_figures():
    """What cuda/README.md says the static figures show, checked on the committed figures."""
    record = json.loads(COMMITTED.read_text())
    k = {(r["version"], r["layout"], r["dtype"]): r for r in record["kernels"]}
    layouts, dtypes = ("nt", "nn", "tn"), ("f32", "f64")
    every = [(lay, dt) for lay in layouts for dt in dtypes]
    if not record["tools"]["sass"]["available"]:
        pytest.skip("the committed figures have no SASS columns")
    loop = {key: r["inner_loop"] for key, r in k.items()}
    # 128-bit shared loads already in v5 (ptxas fused the unrolled reads); 128-bit global loads from v6 on
    for v in range(1, 6):
        assert all("128" not in loop[v, lay, dt]["ldg"] for lay, dt in every), v
    assert all("128" in loop[5, lay, dt]["lds"] for lay, dt in every)
    for v in range(6, 10):
        assert all("128" in loop[v, lay, dt]["ldg"] or loop[v, lay, dt]["ldgsts"] for lay, dt in every), v
    # v1 and v2 look the same statically; so do v6 and v7
    for a, b in ((1, 2), (6, 7)):
        for lay, dt in every:
            for x in ("registers", "shared_bytes", "threads", "occupancy"):
                assert k[a, lay, dt][x] == k[b, lay, dt][x], (a, b, lay, dt, x)
            assert k[a, lay, dt]["napkin"]["flop_per_byte"] == k[b, lay, dt]["napkin"]["flop_per_byte"]
            assert {x: loop[a, lay, dt][x] for x in ("fma", "lds", "ldg")} == \
                {x: loop[b, lay, dt][x] for x in ("fma", "lds", "ldg")}, (a, b, lay, dt)
    # two barriers per k-step up to v7, one with double buffering (v8 on)
    assert all(loop[v, lay, dt]["bar"] == 2 for v in range(3, 8) for lay, dt in every)
    assert all(loop[v, lay, dt]["bar"] == 1 for v in range(8, 13) for lay, dt in every)
    # cp.async (LDGSTS) where an operand needs no transposition: nn and tn, never nt
    for v in range(8, 13):
        for dt in dtypes:
            assert not loop[v, "nt", dt]["ldgsts"] and loop[v, "nn", dt]["ldgsts"] and loop[v, "tn", dt]["ldgsts"]
    # v5's f32 kernels: the most registers up to v10, one block (8 warps) per SM; v6 brings two back
    assert all(k[5, lay, "f32"]["blocks_per_sm"] == 1 for lay in layouts)
    assert all(k[6, lay, "f32"]["blocks_per_sm"] == 2 for lay in layouts)
    assert max(r["registers"] for r in record["kernels"] if r["version"] <= 10) == \
        max(k[5, lay, "f32"]["registers"] for lay in layouts)
    # v10 is v8 with 16 bytes more per row of each tile (2 buffers × BK rows × 2 operands), and the
    # same inner loop; v11's lanes hold 8×16 outputs: more registers than v5's, yet two of its
    # 128-thread blocks fit, and 24 values read per k feed 128 FMAs (v10: 16 for 64)
    for lay, dt in every:
        assert k[10, lay, dt]["shared_bytes"] == k[8, lay, dt]["shared_bytes"] + 2 * 8 * 2 * 16
        assert {x: loop[10, lay, dt][x] for x in ("fma", "lds", "ldg", "ldgsts")} == \
            {x: loop[8, lay, dt][x] for x in ("fma", "lds", "ldg", "ldgsts")}, (lay, dt)
    assert all(k[11, lay, "f32"]["registers"] > k[5, lay, "f32"]["registers"] for lay in layouts)
    assert all(k[11, lay, "f32"]["blocks_per_sm"] == 2 and k[11, lay, "f32"]["threads"] == 128 for lay in layouts)
    assert loop[11, "nt", "f32"]["fma"] / loop[11, "nt", "f32"]["lds"]["128"] == 1024 / 48
    # v12 (float32): at most 128 registers, 4 blocks of 128 threads per SM; 16 slices at B = 32
    assert all(k[12, lay, "f32"]["registers"] <= 128 and k[12, lay, "f32"]["blocks_per_sm"] == 4 for lay in layouts)
    assert k[12, "nt", "f32"]["napkin"]["slices"] == 16
    # the candidate that trades outputs per lane for blocks: 3 blocks of 256 threads per SM
    cand = {(r["candidate"], r["layout"]): r for r in record["candidates"]}
    assert max(r["blocks_per_sm"] * r["threads"] for r in record["candidates"]) == 3 * 256
    assert all(cand[4, lay]["blocks_per_sm"] == 3 and cand[4, lay]["registers"] <= 80 for lay in layouts)
    # from v4 on, registers bind the CUDA-core versions' occupancy; float64 does not use float32's register counts
    assert all(r["occupancy_limited_by"] == ["registers"] for r in record["kernels"] + record["candidates"]
               if 4 <= r.get("version", 4) <= 12)
    assert all(k[v, "nt", "f32"]["registers"] != k[v, "nt", "f64"]["registers"] for v in range(4, 10))
    # v9's nn kernel needs more registers than v8's and fits one block per SM where v8's fits two
    assert k[9, "nn", "f32"]["registers"] > k[8, "nn", "f32"]["registers"]
    assert (k[9, "nn", "f32"]["blocks_per_sm"], k[8, "nn", "f32"]["blocks_per_sm"]) == (1, 2)
    # split-K's partial products cost arithmetic intensity; full occupancy up to v3
    assert k[9, "nt", "f32"]["napkin"]["flop_per_byte"] < k[8, "nt", "f32"]["napkin"]["flop_per_byte"]
    assert all(k[v, lay, dt]["occupancy"] == 1 for v in (1, 2, 3) for lay, dt in every)
    assert k[3, "nt", "f32"]["napkin"]["flop_per_byte"] / k[1, "nt", "f32"]["napkin"]["flop_per_byte"] == \
        pytest.approx(32, rel=0.01)
    # the backward: a 5-step shuffle tree in v2 and v3 (two shuffles a step for a double; v3's code holds
    # the tree twice, once for each destination of its sums, db or a row of the workspace), none in v1;
    # x4 loads 32 bits at a time
    others = {r["name"]: r["mix"] for r in record["other_kernels"]}
    for dt, per_step in (("f32", 1), ("f64", 2), ("bf16", 1), ("f16", 1)):
        assert others[f"dense_sigmoid_grad_v1_{dt}"]["shfl"] == 0
        assert others[f"dense_sigmoid_grad_v2_{dt}"]["shfl"] == 5 * per_step
        assert others[f"dense_sigmoid_grad_v3_{dt}"]["shfl"] == 2 * 5 * per_step
    assert set(others["dense_sigmoid_grad_v1_x4_f32"]["ldg"]) == {"32"}


def test_chapter_table_keeps_chapter_3s_float32_rows():
    """Chapter 3's table: float32 rows of the CUDA-core versions, 1 to kVersions, and nothing of
    the tensor-core versions or the 16-bit types (those are tensor_core_table's)."""
    record = json.loads(COMMITTED.read_text())
    rows = [r.split("|")[1:3] for r in static_tables.chapter_table(record).splitlines() if re.match(r"\| \d", r)]
    assert [(int(v), dt.strip()) for v, dt in rows] == [(v, "f32") for v in catalog.cuda_core_versions()]
    full = [r.split("|")[1:3] for r in static_tables.table(record).splitlines() if re.match(r"\| \d", r)]
    assert {(int(v), dt.strip()) for v, dt in full} == \
        {(v, dt) for v in catalog.cuda_core_versions() for dt in sr.DTYPES if dt in sr.TILES[v]}


def test_tensor_core_table_shows_both_architectures():
    """tensor_core_table (the tensor-core chapter's marker): a row per tensor-core version and type
    after the 16-bit CUDA-core baseline, registers and blocks per SM on each of the record's
    architectures (sm_80, and sm_90 or sm_90a) from its per-architecture figures, each main loop's
    instructions by their SASS names; a version built for another architecture is named, not shown."""
    record = json.loads(COMMITTED.read_text())
    archs = sorted(record["archs"], key=lambda a: int(re.sub(r"\D", "", a)))
    assert len(archs) == 2 and archs[0] == "sm_80"
    text = static_tables.tensor_core_table(record)
    head, _, *rows = [r for r in text.splitlines() if r.startswith("|")]
    assert f"regs nt/nn/tn {archs[0]} | regs nt/nn/tn {archs[1]}" in head
    assert f"blocks/SM {archs[0]} | blocks/SM {archs[1]}" in head
    cells, merged = {}, set()
    for r in rows:  # a row "bf16, f16" stands for both types, whose figures it must then be
        for dt in r.split("|")[2].strip().split(", "):
            cells[int(r.split("|")[1]), dt] = [c.strip() for c in r.split("|")[1:-1]]
        if ", " in r.split("|")[2]:
            merged.add(int(r.split("|")[1]))
    hopper = {(v, dt) for v in (31, 32, 33, 35) for dt in ("bf16", "f16")} | {(34, "f32")}
    want = {(v, dt) for v in (11, 12, 21, 22, 23, 24) for dt in ("bf16", "f16")} | {(25, "f32"), (26, "f32")}
    assert set(cells) == want | (hopper if "sm_90a" in archs else set())
    columns = [c.strip() for c in head.split("|")[1:-1]]
    entries = {a: record["archs"][a]["entries"] for a in archs}
    for (v, dt), row in cells.items():
        names = [f"dense_gemm_v{v}_{lay}_{dt}" for lay in LAYOUTS]
        for a in archs:
            if sr.TILES[v].get("needs", a) != a:
                continue  # a trap there: checked below
            assert row[columns.index(f"regs nt/nn/tn {a}")] == "/".join(str(entries[a][n]["registers"]) for n in names)
            assert row[columns.index(f"blocks/SM {a}")] == "/".join(str(entries[a][n]["blocks_per_sm"]) for n in names)
        shown = "bf16" if v in merged else dt  # a merged row's main loop is bfloat16's
        if 21 <= v <= 26:
            assert HMMA[shown] in row[-1] and row[columns.index(f"MMA per pass {'/'.join(archs)}")] == \
                "/".join(str(entries[a][names[0]]["loop"]["mma"]) for a in archs)
        elif v > 30:  # Hopper's: no figures on sm_80, where the kernels are a trap
            assert sass_mma(sr.TILES[v]["mma"], shown) in row[-1] and row[columns.index("blocks/SM sm_80")] == "–/–/–"
    assert "LDSM.16.M88.4" in cells[24, "bf16"][-1] and "FFMA" in cells[11, "bf16"][-1]
    assert merged >= {21, 22, 23, 24, 31, 32, 33, 35}  # float16's figures are bfloat16's in these versions
    assert bool(re.search(r"v31(, v\d+)*: sm_90a only", text)) == ("sm_90a" not in archs)


SYNTHETIC = r"""
// A version the TILES table has never heard of, with launch bounds, one layout and dtype.
extern "C" __global__ void __launch_bounds__(128) dense_gemm_v42_nt_f32(const float* A, const float* B, float* C,
    const float* bias, long long M, long long N, long long K, int epilogue) {
  long long m = blockIdx.y, n = blockIdx.x * 128 + threadIdx.x;
  if (m >= M || n >= N) return;
  float acc = 0;
  for (long long k = 0; k < K; ++k) acc += A[m * K + k] * B[n * K + k];
  C[m * N + n] = acc;
}
extern "C" __global__ void dense_bias_grad_f32(const float* dz, float* db, long long rows, long long cols) {}
"""


@slow
@needs_nvcc
def test_static_report_discovers_versions_from_the_compiled_symbols(tmp_path):
    """After a re-cut the report still runs: versions come from the entry names, and a version
    missing from TILES is reported (napkin maths left out, occupancy from the launch bounds)."""
    (tmp_path / "k.cu").write_text(SYNTHETIC)
    out = tmp_path / "s.json"
    result = run_script("cuda/static_report.py", "--source", str(tmp_path / "k.cu"), "--json", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    (k,) = record["kernels"]
    assert (k["version"], k["layout"], k["dtype"], k["threads"]) == (42, "nt", "f32", 128)
    assert "napkin" not in k and k["occupancy"] > 0
    assert any("v42" in w and "TILES" in w for w in record["warnings"]) and "warning: " in result.stderr
    assert [o["name"] for o in record["other_kernels"]] == ["dense_bias_grad_f32"]
    assert "| 42 | f32 | ? | 128 | ? |" in result.stdout  # the table shows what is unknown as unknown


@slow
@needs_sass
def test_sass_option_prints_the_kernel_the_chapter_greps():
    """The chapter's command: one kernel's SASS, found through the tools wherever they are
    installed (pip puts cuobjdump off PATH), with the instructions the chapter counts."""
    result = run_script("cuda/static_report.py", "--sass", "dense_gemm_v6_nt_f32", timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    functions = re.findall(r"Function : (\S+)", result.stdout)
    assert functions == ["dense_gemm_v6_nt_f32"]
    assert "LDG.E.128" in result.stdout and "LDS.128" in result.stdout and "FFMA" in result.stdout


@slow
@needs_sass
def test_sass_option_names_kernels_that_exist(tmp_path):
    (tmp_path / "k.cu").write_text(SYNTHETIC)
    result = run_script("cuda/static_report.py", "--source", str(tmp_path / "k.cu"), "--sass", "dense_gemm_v41_nt_f32",
                        timeout=600)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "no such kernel; for example dense_gemm_v42_nt_f32" in result.stderr


@slow
@needs_nvcc
def test_static_report_without_sass_says_so(tmp_path):
    out = tmp_path / "s.json"
    result = run_script("cuda/static_report.py", "--arch", sr.ARCHS[0], "--no-sass", "--json", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert record["tools"]["sass"] == {"available": False, "reason": "not asked for (--no-sass)"}
    assert "no SASS" in result.stdout and all("inner_loop" not in k for k in record["kernels"])


def test_gpu_timings_join_the_table(tmp_path):
    """A benchmark.py record of `-m cuda --kernel 3` fills GFLOP/s and % of cuBLAS for v3 f32."""
    record = json.loads((ROOT / "docs" / "results" / "cuda_static_sm90.json").read_text())
    bench = {"device": "NVIDIA H100 80GB HBM3", "dtype": "float32", "kernel": 3, "date": "2026-11-22",
             "shape": {"batch": 4096, "in": 4096, "out": 4096}, "command": "python benchmark.py ...",
             "results": [{"mode": "reference", "forward_us": 3000.0, "forward_gflops": 45812.0},
                         {"mode": "cuda", "forward_us": 6000.0, "forward_gflops": 22906.0}]}
    (tmp_path / "b.json").write_text(json.dumps(bench))
    record["timings"] = sr.timings([str(tmp_path / "b.json")])
    assert record["timings"][0]["share_of_cublas"] == 0.5
    rows = {tuple(r.split("|")[1:3]): r for r in static_tables.table(record).splitlines() if r.startswith("| ")}
    assert "| 22906 | 50.0 |" in rows[(" 3 ", " f32 ")]
    assert rows[(" 3 ", " f64 ")].endswith("| not measured | not measured |")
    bench["kernel"] = 0  # automatic choice: not one version's figure
    (tmp_path / "b.json").write_text(json.dumps(bench))
    with pytest.raises(SystemExit, match="--kernel N"):
        sr.timings([str(tmp_path / "b.json")])


def test_occupancy_counts_dynamic_shared_memory():
    # 8 KiB static + 100 KiB dynamic (opt-in) + 1 KiB reserved = 111616 B: 2 blocks in 228 KiB.
    assert sr.occupancy(32, 256, 8192, 100 * 1024, optin=True)["blocks_per_sm"] == 2
    assert sr.occupancy(32, 256, 8192, 100 * 1024)["blocks_per_sm"] == 0  # without the opt-in: no launch


@slow
def test_static_report_refuses_bad_arguments_before_compiling(tmp_path):
    result = run_script("cuda/static_report.py", "--json", str(tmp_path / "missing" / "x.json"))
    assert result.returncode == 2 and "does not exist" in result.stderr
    result = run_script("cuda/static_report.py", "--timings", str(tmp_path / "none.json"))
    assert result.returncode == 2 and "no such timings file" in result.stderr
    result = run_script("cuda/static_report.py", "--arch", "sm_75")
    assert result.returncode == 2 and "sm_75" in result.stderr and "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def sass_record(tmp_path_factory):
    if not (HAVE_NVCC and HAVE_SASS):
        pytest.skip(NO_SASS)
    out = tmp_path_factory.mktemp("sass") / "sass.json"
    result = run_script("ptx/sass_report.py", "--json", str(out), timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


@slow
@needs_sass
def test_sass_of_the_sigmoid_edit(sass_record):
    """The edited sigmoid is MUFU.EX2 and MUFU.RCP with no refinement around them; the compiler's
    wraps the same two units in a range reduction, Newton steps and a slow-path call."""
    edits = [e for e in sass_record["edits"] if "MUFU.EX2" in e.get("edited", {}).get("mufu", {})]
    assert len(edits) == 1, [e["function"] for e in sass_record["edits"]]
    after, before = edits[0]["edited"], edits[0]["compiler"]
    assert after["mufu"] == {"MUFU.EX2": 1, "MUFU.RCP": 1}
    assert after["fma"] == 0 and after["calls"] == 0 and after["instructions"] <= 8
    assert before["fma"] > 0 and before["calls"] >= 1 and before["instructions"] > 4 * after["instructions"]


@slow
@needs_sass
def test_sass_of_the_vector_load_edit(sass_record):
    edits = [e for e in sass_record["edits"] if e.get("edited", {}).get("ldg", {}).get("128")]
    assert len(edits) == 1, [e["function"] for e in sass_record["edits"]]
    after, before = edits[0]["edited"], edits[0]["compiler"]
    assert "128" not in before["ldg"] and before["ldg"]["32"] >= 4 * after["ldg"]["128"] > 0
    assert after["ldg"].get("32", 0) < before["ldg"]["32"]


@slow
@pytest.mark.skipif(disasm.find_tool("ptxas") is None, reason="ptxas (CUDA toolkit) not found")
def test_assemble_says_whether_the_ptx_assembles(tmp_path):
    """The chapter's check of a hand edit: the edited PTX assembles; a typo gets ptxas's own error."""
    result = run_script("ptx/sass_report.py", "--assemble", timeout=600)
    assert result.returncode == 0 and "ptx/dense_kernels.ptx: assembles for sm_90" in result.stdout, result.stderr
    typo = tmp_path / "typo.ptx"
    typo.write_text((ROOT / "ptx" / "dense_kernels.ptx").read_text().replace("ex2.approx.ftz.f32", "ex2.aprox.ftz.f32"))
    result = run_script("ptx/sass_report.py", "--assemble", "--ptx", str(typo), timeout=600)
    assert result.returncode == 1 and "does NOT assemble" in result.stdout and "error" in result.stdout


@slow
def test_load_cost_without_a_gpu_is_one_line_and_its_table_reads_a_record():
    import torch

    if not torch.cuda.is_available():
        result = run_script("ptx/load_cost.py", timeout=300)
        assert result.returncode == 2 and "needs a GPU" in result.stderr and "Traceback" not in result.stderr
    cost = load_script("ptx/load_cost.py")
    rows = [{"mode": m, "case": c, "first_ms": f, "next_ms": 0.02, "runs": 3, "cache_bytes": 0}
            for m, c, f in (("ptx", "cold", 180.0), ("ptx", "warm", 9.5), ("cuda", "cold", 1.25))]
    text = cost.table({"device": "NVIDIA H100", "driver": "13.0", "torch": "2.11.0", "date": "d", "command": "c",
                       "results": rows})
    assert "| ptx | cold | 180.0 | 0.020 |" in text and "| cuda | cold | 1.2 |" in text and "median of 3" in text


# ---------------------------------------------------------------------------------------
# The sigmoid's error bound
# ---------------------------------------------------------------------------------------
@slow
def test_sigmoid_bound_holds_under_the_isa_worst_case():
    z = bound.samples(200_001)
    b, w = bound.bound(z), bound.emulate_worst(z)
    assert (w <= b).all(), z[w > b][:5]
    assert w.max() > 0.5 * b.max()  # the emulation does reach the bound's scale: it can fail
    assert bound.main(["-n", "1000"]) == 0


# ---------------------------------------------------------------------------------------
# The chapters
# ---------------------------------------------------------------------------------------
@slow
def test_chapters_show_what_the_scripts_wrote():
    assert "<!-- static: docs/results/cuda_static_sm90.json -->" in (ROOT / "cuda" / "README.md").read_text()
    assert "<!-- sass: docs/results/ptx_sass_sm90.json -->" in (ROOT / "ptx" / "README.md").read_text()
    result = run_script("docs/render.py", "--check")
    assert result.returncode == 0, result.stdout + result.stderr


def _shape(line: str) -> str:
    """A PTX line with its register numbers, labels and GEMM version blanked, for comparing the
    form (the chapter's excerpts survive a renumbering of registers or of versions)."""
    line = re.sub(r"%(r|rd|f|fd|p|rs)\d+", r"%\1N", line.split("//", 1)[0])
    line = re.sub(r"dense_gemm_v\d+_(nt|nn|tn)_(f32|f64)_param_\d+", "dense_gemm_param", line)
    return " ".join(re.sub(r"\$L__BB\d+_\d+", "$L", line).split())


@slow
def test_ptx_excerpts_in_the_chapter_occur_in_the_committed_ptx():
    ptx = {_shape(line) for line in (ROOT / "ptx" / "dense_kernels.ptx").read_text().splitlines()}
    blocks = re.findall(r"```ptx\n(.*?)```", (ROOT / "ptx" / "README.md").read_text(), re.S)
    assert blocks
    for block in blocks:
        for line in block.splitlines():
            if _shape(line):
                assert _shape(line) in ptx, f"not in ptx/dense_kernels.ptx: {line!r}"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-v"]))


def test_the_roofs_stay_out_of_the_backwards_table():
    """The tensor cores' roofs (cuda/units/tc_roof.cu) are kernels that are not GEMMs, so the
    report records them with the others (their registers and spills, on every architecture); the
    table of the backward's kernels and the second passes leaves them out."""
    record = json.loads(COMMITTED.read_text())
    grad = next(k for k in record["other_kernels"] if k["name"] == "dense_sigmoid_grad_v1_bf16")
    record["other_kernels"] += [{**grad, "name": name} for name in ("dense_roof_mma_bf16", "dense_roof_wgmma_bf16")]
    table = "\n".join(static_tables._other_table(record))
    assert "| `dense_sigmoid_grad_v1` |" in table and "roof" not in table
    assert all(name.startswith(static_tables.ROOF_PREFIX) for name in ("dense_roof_mma_bf16", "dense_roof_wgmma_bf16"))


def test_a_compile_is_used_again_until_a_header_or_the_toolkit_changes(tmp_path, monkeypatch):
    """The cache of compile_sources: the same sources, headers and tools compile once; a changed
    header (a file no unit names) or another ptxas compiles again; a source outside cuda/ (a
    test's planted copy) is never cached."""
    tree = tmp_path / "repo"
    (tree / "cuda" / "units").mkdir(parents=True)
    (tree / "cuda" / "kernels").mkdir()
    unit, header = tree / "cuda" / "units" / "gemm_v1.cu", tree / "cuda" / "kernels" / "v1.cuh"
    unit.write_text('#include "../kernels/v1.cuh"\n')
    header.write_text("// v1\n")
    tools = tmp_path / "nvcc", tmp_path / "ptxas"
    for tool in tools:
        tool.write_text("#!/bin/sh\n")
    calls = []

    def fake_compile(sources, arch, workdir, nvcc, ptxas):
        calls.append(workdir)
        for n in range(len(sources)):
            (workdir / f"{arch}_k{n}.cubin").write_text("cubin")
        return f"ptx {header.read_text()}", "ptxas log", []

    monkeypatch.setattr(sr, "ROOT", tree)
    monkeypatch.setattr(sr, "CACHE", tree / "build" / "static_report")
    monkeypatch.setattr(disasm, "find_tool", lambda name: str(tmp_path / name))
    monkeypatch.setattr(sr, "_compile", fake_compile)
    first = sr.compile_sources([unit], "sm_90", tmp_path / "unused")
    assert sr.compile_sources([unit], "sm_90", tmp_path / "unused") == first and len(calls) == 1
    assert Path(first[2][0]).read_text() == "cubin"
    header.write_text("// v1, edited\n")
    assert sr.compile_sources([unit], "sm_90", tmp_path / "unused")[0] == "ptx // v1, edited\n"
    assert len(calls) == 2
    sr.compile_sources([unit], "sm_80", tmp_path / "unused")
    tools[1].write_text("#!/bin/sh\n# another release\n")
    sr.compile_sources([unit], "sm_80", tmp_path / "unused")
    assert len(calls) == 4
    outside = tmp_path / "planted.cu"
    outside.write_text(unit.read_text())
    (tmp_path / "work").mkdir()
    sr.compile_sources([outside], "sm_90", tmp_path / "work")
    sr.compile_sources([outside], "sm_90", tmp_path / "work")
    assert calls[-2:] == [tmp_path / "work"] * 2
