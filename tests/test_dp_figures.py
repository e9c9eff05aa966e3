"""Chapter 7's figures and table: the ring's steps (parallel/dp/figures.py), traced from
parallel/dp/simple.py itself; the bucket-overlap figure (parallel/dp/trace.py) carrying the command
that drew it; the step benchmark against DDP (parallel/dp/bench.py) with its paired interval."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch.distributed as dist

from conftest import load_script, run_script
from parallel.dp import figures, simple

records = load_script("docs/records.py")  # reads the command a picture carries

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


# ---------------------------------------------------------------------------
# The step benchmark's table: our training step against DDP's
# ---------------------------------------------------------------------------

def test_the_step_table_gives_each_ratio_its_interval_and_verdict():
    from parallel.dp.bench import step_table

    def row(variant: str, ratio: float, ci: list[float] | None, verdict: str) -> dict:
        return {"variant": variant, "step_us": 1000 * ratio, "spread_us": 50.0, "ratio_to_ddp": ratio,
                "ratio_ci": ci, "verdict": verdict}

    record = {"ci_level": 0.95, "hidden": [8], "mode": "py", "parameters": 100, "global_batch": 16, "bucket_kb": 4,
              "world_size": 2, "backend": "gloo", "threads_per_rank": 1, "device": "cpu: test", "torch": "x",
              "date": "d", "command": "c",
              "results": [row("ddp", 1.0, [1.0, 1.0], "no significant difference"),
                          row("all_reduce, overlap", 1.2, [1.1, 1.3], "slower"),
                          row("all_reduce, no overlap", 0.98, None, "too few rounds for an interval")]}
    text = step_table(record)
    assert "| ddp | 1000 (50) | 1.000 | (the reference) |" in text
    assert "| all_reduce, overlap | 1200 (50) | 1.200 (1.100–1.300) | slower |" in text
    assert "| all_reduce, no overlap | 980 (50) | 0.980 | too few rounds for an interval |" in text
    for r in record["results"]:  # a record without intervals still renders
        del r["ratio_ci"], r["verdict"]
    assert "| all_reduce, overlap | 1200 (50) | 1.200 | – |" in step_table(record)


@pytest.mark.slow
def test_the_step_benchmark_times_ours_against_ddp_with_an_interval(tmp_path):
    out = tmp_path / "step.json"
    result = run_script("distributed.py", "--bench", "step", "--hidden", "16", "--batch-size", "16", "--bucket-kb",
                        "1", "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    rows = {r["variant"]: r for r in record["results"]}
    assert set(rows) == {"ddp", "all_reduce, overlap", "all_reduce, no overlap"}
    assert rows["ddp"]["ratio_to_ddp"] == 1.0
    for r in rows.values():
        lo, hi = r["ratio_ci"]
        assert lo <= r["ratio_to_ddp"] <= hi and r["step_us"] > 0
        assert r["verdict"] in ("faster", "slower", "no significant difference")
    assert "| verdict |" in result.stdout and str(out) in record["command"]
