"""Chapter 3's thread-hierarchy figure (cuda/figures.py, cuda_hierarchy.png): the grid and block it
draws are the launch the host side makes, gemm_geometry in cuda/dense_kernels.h, compiled here."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import ROOT, load_script

figures = load_script("cuda/figures.py")
SHAPES = [figures.HIERARCHY_SHAPE, (65, 33, 7), (1, 1, 1), (4096, 4096, 4096)]
HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include "dense_kernels.h"
int main(int argc, char** argv) {
  for (int i = 1; i + 3 < argc; i += 4) {
    const int v = std::atoi(argv[i]);
    const long m = std::atol(argv[i + 1]), n = std::atol(argv[i + 2]), k = std::atol(argv[i + 3]);
    const dense_kernels::Geometry g = dense_kernels::gemm_geometry(v, 4, m, n, k, 132);
    std::printf("%u %u %u %u %u %u\n", g.grid.x, g.grid.y, g.grid.z, g.block.x, g.block.y, g.block.z);
  }
  return 0;
}
"""


@pytest.fixture(scope="module")
def geometry(tmp_path_factory) -> dict[tuple[int, tuple[int, int, int]], tuple[tuple[int, ...], tuple[int, ...]]]:
    """gemm_geometry's (grid, block) per (version, shape), float32, from the header itself."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        pytest.skip("needs a C++ compiler (none found as $CXX or c++)")
    exe = tmp_path_factory.mktemp("geometry") / "geometry"
    build = subprocess.run([cxx, "-std=c++17", "-O0", f"-I{ROOT / 'cuda'}", "-x", "c++", "-", "-o", str(exe)],
                           input=HARNESS, capture_output=True, text=True, timeout=120)
    assert build.returncode == 0, build.stderr[-3000:]
    cases = [(v, s) for v in (1, 2, 3) for s in SHAPES]
    run = subprocess.run([str(exe), *(str(x) for v, s in cases for x in (v, *s))], capture_output=True, text=True,
                         timeout=60)
    assert run.returncode == 0, run.stderr[-3000:]
    out = {}
    for case, line in zip(cases, run.stdout.splitlines(), strict=True):
        numbers = tuple(map(int, line.split()))
        out[case] = numbers[:3], numbers[3:]
    return out


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES)
def test_the_drawn_launch_is_gemm_geometrys(geometry, version, shape):
    drawn = figures.launch(version, *shape)
    assert (drawn["grid"], drawn["block"]) == geometry[version, shape]
    assert drawn["threads"] == drawn["block"][0] * drawn["block"][1] == 32 * drawn["warps"]


def test_v1s_grid_covers_c_with_its_tile_and_x_runs_along_m():
    m, n, k = figures.HIERARCHY_SHAPE
    g = figures.launch(1, m, n, k)
    (gx, gy, _), (bm, bn) = g["grid"], g["tile"]
    assert (gx * bm, gy * bn) == (m, n)  # the drawn shape is whole tiles: no partial block to explain
    assert g["block"][0] == bm and g["blocks_per_sm"] == figures.SM_WARPS // g["warps"]


def test_only_the_one_output_per_thread_versions_are_drawn():
    with pytest.raises(ValueError):
        figures.launch(4, 64, 64, 8)
