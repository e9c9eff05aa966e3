"""Chapter 4's figures (cuda/figures.py): who computes what in each version's block, checked
against the kernels themselves, and the script's output."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections import Counter

import pytest

from conftest import ROOT, load_script, run_script

figures = load_script("cuda/figures.py")
TILES = figures.tiles()

# The kernels as the CPU emulation runs them (cuda/emulate/emulate.cpp, the launch code and the
# geometry of cuda/dense_kernels.h), with one change: every output is stored as the linear id of
# the thread that stores it instead of its value. The macro replaces the calls to epilogue() in
# the kernels' stores, after common.cuh has defined the function.
HARNESS = r"""
#include "emulate/cuda_emu.h"
#include "kernels/common.cuh"
#define epilogue(acc, bias, n, kind) \
  static_cast<acc_t<T>>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z))
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


@pytest.mark.plot
def test_figures_script_draws_both_figures(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_script("cuda/figures.py", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in ("cuda_gemm.png", "cuda_tiles.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name


def test_figures_script_says_what_to_install_without_matplotlib(tmp_path):
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['cuda/figures.py', '--out', {str(tmp_path)!r}]; "
            "runpy.run_path('cuda/figures.py', run_name='__main__')")
    result = run_script("-c", code)
    assert result.returncode == 2 and "pip install matplotlib" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())
