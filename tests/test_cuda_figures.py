"""Chapter 3's figures (cuda/figures.py): who computes what in each version's block, checked
against the kernels themselves, and the script's output."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections import Counter

import pytest

import cli
from conftest import ROOT, load_script, run_script

figures = load_script("cuda/figures.py")
# chapter 3's versions (the CUDA cores'): the tensor-core versions in TILES have tiles of their own
TILES = {v: t for v, t in figures.tiles().items()
         if v in cli.load_file("cuda/catalog.py").cuda_core_versions()}

# The kernels as the CPU emulation runs them (cuda/emulate/emulate.cpp, the launch code and the
# geometry of cuda/dense_kernels.h), with one change: every output is stored as the linear id of
# the thread that stores it instead of its value. The macro replaces the calls to epilogue() in
# the kernels' stores, after common.cuh has defined the function; it takes the accumulator's type
# from its argument (the tensor-core kernels included beside them are not all templates on T).
HARNESS = r"""
#include "emulate/cuda_emu.h"
#include "kernels/common.cuh"
#define epilogue(acc, bias, n, kind) \
  static_cast<std::decay_t<decltype(acc)>>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))
#include "emulate/emulate.cpp"
#include <cstdio>
#include <cstdlib>
#include <vector>
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {  // one block's tile, two k-steps, float32, the nt layout
    const int v = std::atoi(argv[i]);
    const dense_kernels::Tile t = dense_kernels::tile(v, 4);
    const int64_t K = 2 * t.BK;
    std::vector<float> A(t.BM * K), B(t.BN * K), C(t.BM * t.BN, -1.f);
    const int rc = emu_gemm(v, "nt", dense_kernels::kF32, A.data(), B.data(), C.data(), nullptr, t.BM, t.BN, K, 0, 132,
                            nullptr);
    std::printf("v %d %d %d %d\n", v, rc, t.BM, t.BN);
    for (float c : C) std::printf("%d ", static_cast<int>(c));
    std::printf("\n");
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def stored_by(tmp_path_factory) -> dict[int, list[list[int]]]:
    """Per version, the id of the thread that stored each output of the block's tile (-1: none)."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        pytest.skip("needs a C++ compiler (none found as $CXX or c++)")
    exe = tmp_path_factory.mktemp("owners") / "owners"
    build = subprocess.run([cxx, "-std=c++17", "-O0", "-pthread", f"-I{ROOT / 'cuda'}", "-x", "c++", "-", "-o",
                            str(exe)], input=HARNESS, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe), *map(str, sorted(TILES))], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    grids = {}
    for head, values in zip(lines[::2], lines[1::2]):
        v, rc, bm, bn = map(int, head.split()[1:])
        assert rc == 0, f"v{v}: the emulated launch returned {rc}"
        cells = list(map(int, values.split()))
        grids[v] = [cells[r * bn:(r + 1) * bn] for r in range(bm)]
    return grids


@pytest.mark.parametrize("version", sorted(TILES))
def test_owner_is_which_thread_the_kernel_stores_each_output_from(stored_by, version):
    """figures.owner against the kernel's own stores: v11's lane holds 4 separate pieces."""
    assert figures.ownership(version) == stored_by[version]


def test_a_v11_lane_holds_pieces_16_columns_apart():
    """Worked by hand from dense_kernels::warp_tile(11, 4): warp tiles 64×64, pieces 8×4, a warp
    covers its tile in 1×4 steps of 64×16. Lane 5 of warp 3 (thread 101): warp 3 is the lower
    right 64×64 (rows 64.., columns 64..); lane 5 sits at row 5 // 4 = 1, column 5 % 4 = 1 of the
    8×4 lane grid, i.e. rows 64 + 8 = 72..79 and columns 64 + 4 = 68..71, then every 16 columns."""
    assert figures.owner(11, 101) == [(range(72, 80), range(c, c + 4)) for c in (68, 84, 100, 116)]
    assert figures.owner(12, 101) == [(range(4, 8), range(104, 112))]  # warp 3's 32×32, one 4×8 piece


def test_every_output_of_a_block_tile_has_exactly_one_thread():
    for version, tiles in TILES.items():
        bm, bn, tm, tn, _ = tiles["f32"]
        cells = Counter(t for row in figures.ownership(version) for t in row)
        assert -1 not in cells, f"v{version}: an output nobody computes"
        assert len(cells) == bm * bn // (tm * tn) and set(cells.values()) == {tm * tn}, f"v{version}"


def test_the_versions_not_drawn_compute_the_outputs_of_the_version_named():
    """The figure's ninth panel: v6 as v5, v8-v10 as v7; every version drawn or named."""
    assert sorted([*figures.SHOWN, *figures.SAME_AS]) == sorted(TILES)
    for version, same in figures.SAME_AS.items():
        assert TILES[version]["f32"][:4] == TILES[same]["f32"][:4]
        assert figures.ownership(version) == figures.ownership(same), f"v{version} vs v{same}"


def test_the_roofs_come_from_the_timing_records_card():
    """The FFMA roof is the record's SMs × 128 lanes × 2 FLOPs × its maximum SM clock (66.9 TFLOP/s
    on the H100 of cuda_gpu_h100.json); the bandwidth roof is the card's datasheet figure."""
    name, r = figures.roofline_of()
    timed = json.loads((figures.RESULTS / name).read_text())
    gpu = timed["gpu"]
    assert r["peak_flops"] == gpu["sm_count"] * 128 * 2 * 1e6 * float(gpu["nvidia_smi"]["clocks.max.sm"].split()[0])
    h100 = figures.roofline(json.loads((figures.RESULTS / "cuda_gpu_h100.json").read_text()),
                            json.loads((figures.RESULTS / figures.STATIC).read_text()))
    assert h100["peak_flops"] / 1e12 == pytest.approx(66.9, abs=0.05) and h100["bandwidth"] == 3.35e12
    assert h100["ridge"] == pytest.approx(20, abs=0.1)


def test_each_point_is_a_timed_versions_intensity_at_the_timed_shape_and_lies_under_its_roof():
    timed = json.loads((figures.RESULTS / "cuda_gpu_h100.json").read_text())
    r = figures.roofline(timed, json.loads((figures.RESULTS / figures.STATIC).read_text()))
    points = {p["version"]: p for p in r["points"]}
    assert sorted(points) == sorted(int(row["line"][1:]) for row in timed["gemm"]["rows"] if row["line"][0] == "v")
    assert all(0 < p["of_roof"] < 1 for p in points.values()), points  # nothing runs above the roofs
    # v9 splits nothing at 4096³: its tile and bytes are v8's, and v5 to v9 ask the same 31.5 FLOP/B
    assert points[9]["slices"] == 1 and points[9]["requested_bytes"] == points[8]["requested_bytes"]
    assert {round(points[v]["flop_per_byte"], 1) for v in range(5, 10)} == {31.5}
    assert points[1]["flop_per_byte"] == pytest.approx(0.25, rel=1e-3)
    # bytes: a 128×128 tile asks (128 + 128)·4096 operands and writes its 128·128 outputs, 4 bytes each
    assert points[8]["requested_bytes"] == 32 * 32 * ((128 + 128) * 4096 + 128 * 128) * 4


def test_a_card_without_a_known_bandwidth_is_refused_in_one_line():
    timed = json.loads((figures.RESULTS / "cuda_gpu_h100.json").read_text())
    other = {**timed, "gpu": {**timed["gpu"], "device": "NVIDIA A100-SXM4-80GB"}}
    with pytest.raises(cli.UserError, match="A100.*BANDWIDTH"):
        figures.roofline(other, json.loads((figures.RESULTS / figures.STATIC).read_text()))


@pytest.mark.plot
def test_figures_script_draws_the_three_figures(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_script("cuda/figures.py", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in figures.NAMES:
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
    assert len(figures.NAMES) == 5 and "cuda_roofline.png" in figures.NAMES


def test_the_roofline_needs_a_timing_record(tmp_path):
    with pytest.raises(cli.UserError, match=r"no record of kind cuda_gpu_\{card\}\.json"):
        figures.roofline_of(tmp_path)


def test_figures_script_says_what_to_install_without_matplotlib(tmp_path):
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['cuda/figures.py', '--out', {str(tmp_path)!r}]; "
            "runpy.run_path('cuda/figures.py', run_name='__main__')")
    result = run_script("-c", code)
    assert result.returncode == 2 and "pip install matplotlib" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())
