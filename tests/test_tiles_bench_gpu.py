"""tiles/bench_gpu.py away from a GPU: a line whose call fails is recorded and the others timed."""

from __future__ import annotations

import importlib.util

import pytest

import benchmark
from conftest import load_script

bench = load_script("tiles/bench_gpu.py")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton (optional) is not installed")
def test_a_line_whose_call_fails_is_recorded_and_the_others_are_timed(monkeypatch):
    def broken(x, w, b):
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    lines = {"reference": (benchmark.reference, False), "broken": (broken, False)}
    monkeypatch.setattr(bench, "variants", lambda dtype: (dict(lines), {}))
    record = bench.run(4, 8, 4, bench.torch.float32, rounds=2, device="cpu")
    assert [r["line"] for r in record["results"]] == ["reference"]
    assert record["skipped"] == {"broken": "failed: CUDA error: an illegal memory access was encountered"}
    assert "Not timed: broken (failed: CUDA error" in bench.table(record)
