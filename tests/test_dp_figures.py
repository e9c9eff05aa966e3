"""Chapter 6's figures: the ring's steps (parallel/dp/figures.py), traced from parallel/dp/simple.py
itself, and the bucket-overlap figure (parallel/dp/trace.py) carrying the command that drew it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import ROOT, run_script

sys.path.insert(0, str(ROOT / "docs"))
import records  # noqa: E402  (docs/records.py: reads the command a picture carries)

from parallel.dp import figures, simple  # noqa: E402

needs_matplotlib = pytest.mark.skipif(__import__("importlib").util.find_spec("matplotlib") is None,
                                      reason="matplotlib (optional) not installed")


@pytest.mark.parametrize("n", [2, 3, 4, 5])
def test_the_ring_figure_follows_the_short_rings_own_messages(n):
    """What the figure draws is what simple.ring_all_reduce sends: at reduce-scatter step s rank r
    sends chunk r − s, after n − 1 steps it holds chunk r + 1 complete, and in all it sends
    2(n − 1) chunks of N/n elements; at the end every rank holds every rank's contribution."""
    steps = figures.trace_ring(n)
    assert simple.dist is dist  # the simulated ranks' stand-in is gone again
    everyone = (1 << n) - 1
    for r, mine in enumerate(steps):
        assert len(mine) == 2 * (n - 1) + 1 and mine[-1].sends is None
        assert all(s.sends is not None for s in mine[:-1])  # one chunk sent per step: 2(n − 1) in all
        assert mine[-1].holds == [everyone] * n
        for s in range(n - 1):
            assert mine[s].sends == (r - s) % n
            assert mine[s].holds[(r - s) % n] != everyone  # a partial sum, still travelling
        assert mine[n - 1].holds[(r + 1) % n] == everyone  # reduce-scatter done: one chunk complete
        assert sum(h == everyone for h in mine[n - 1].holds) == 1
        for s in range(n - 1):  # the all-gather passes on complete chunks only
            assert mine[n - 1 + s].holds[mine[n - 1 + s].sends] == everyone


@pytest.mark.plot
@needs_matplotlib
def test_the_ring_figure_is_drawn_and_says_how(tmp_path):
    result = run_script("-m", "parallel.dp.figures", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    png = tmp_path / figures.NAME
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert records.picture_command(png) == f"python -m parallel.dp.figures --out {tmp_path}"


def test_the_ring_figure_says_what_to_install_without_matplotlib(tmp_path):
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['figures', '--out', {str(tmp_path)!r}]; "
            "runpy.run_module('parallel.dp.figures', run_name='__main__')")
    result = run_script("-c", code, timeout=120)
    assert result.returncode == 2 and "pip install matplotlib" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("args, says", [(["--ranks", "9"], "between 2 and 8"),
                                        (["--ranks", "1"], "between 2 and 8"),
                                        (["--out", "/no/such/folder"], "not a folder")])
def test_the_ring_figure_refuses_bad_arguments_in_one_line(tmp_path, args, says):
    result = run_script("-m", "parallel.dp.figures", "--out", str(tmp_path), *args, timeout=120)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.plot
@needs_matplotlib
def test_the_overlap_figure_carries_the_command_that_drew_it(tmp_path):
    """docs/records.py retakes a picture from the command inside it (tests/test_records.py)."""
    bucket = {"ready": 0.002, "start": 0.0025, "end": 0.004}
    rank = {"forward_end_s": 0.001, "backward_end_s": 0.003, "step_end_s": 0.0045, "buckets": [bucket]}
    record = {"benchmark": "trace", "overlap": True, "bucket_bytes": [4096], "bucket_kb": 4, "hidden": [8],
              "mode": "py", "data_parallel_ranks": 2, "backend": "gloo",
              "steps": [{"step": 2, "ranks": [rank, rank]}]}
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(record))
    png = tmp_path / "overlap.png"
    result = run_script("-m", "parallel.dp.trace", str(path), "--out", str(png), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    assert records.picture_command(Path(png)) == f"python -m parallel.dp.trace {path} --out {png}"
