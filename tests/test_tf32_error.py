"""Split-TF32's error against float32's (cuda/tensor_cores/tf32_error.py): the committed record
says what the tensor-core chapter claims, its table shows it, and the rule it is judged by can fail."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

import grad_check
from conftest import ROOT, load_script, run_script

tf32_error = load_script("cuda/tensor_cores/tf32_error.py")
RECORD = ROOT / "docs" / "results" / "tf32_error_cpu.json"


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(RECORD.read_text())


def results(record: dict, variant: str, tensor: str | None = None) -> list[dict]:
    return [r for r in record["results"] if r["variant"] == variant and (tensor is None or r["tensor"] == tensor)]


def test_the_record_covers_every_variant_and_tensor_up_to_4096(record):
    ks = record["shape"]["in"]
    assert max(ks) == 4096 and len(ks) >= 4
    for variant in ("float32", "tf32", "v25", "v26", "v34"):
        for tensor in tf32_error.TENSORS:
            assert sorted(r["in"] for r in results(record, variant, tensor)) == sorted(ks), (variant, tensor)
    assert sorted(r["in"] for r in results(record, "split")) == sorted(ks)  # the GEMM only
    assert "not a GPU's" in record["model"] and record["command"].endswith("--json docs/results/tf32_error_cpu.json")


@pytest.mark.parametrize("variant", ["v26", "v34"])
def test_the_split_versions_pass_float32s_rule_at_every_size_when_the_sum_rounds(record, variant):
    """Under the exact sum (rounded once per mma) the split passes float32's rule at every K;
    under the H100's truncating sum it fails from K = 1024; the verdict is the worse model's."""
    mine = [r for r in results(record, variant, tf32_error.GEMM)]
    assert mine and all(r["error_by_accumulation"]["exact"] <= r["allowed"] for r in mine)
    for r in mine:
        worse = max(r["error_by_accumulation"], key=r["error_by_accumulation"].get)
        assert r["accumulation"] == worse and r["error"] == r["error_by_accumulation"][worse]
        assert r["passed"] == (r["error"] <= r["allowed"])
    assert [r["passed"] for r in sorted(mine, key=lambda r: r["in"])] == [True, True, False, False]


def test_plain_tf32_is_far_above_float32_and_fails_its_rule_at_4096(record):
    for variant in ("v25", "tf32"):
        (gemm,) = [r for r in results(record, variant, tf32_error.GEMM) if r["in"] == 4096]
        assert gemm["ratio"] > 100 and not gemm["passed"], gemm
        assert not any(r["passed"] for r in results(record, variant) if r["in"] == 4096)
    # ... and v25 is what a TF32 GEMM is: TF32's rule (u = 2^-11, against TF32Linear) accepts it everywhere
    assert all(r["tf32_rule"]["passed"] for r in results(record, "v25"))


def test_each_verdict_is_the_rules_arithmetic_on_the_recorded_errors(record):
    u = record["rule"]["float32_unit_roundoff"]
    assert u == 2.0**-24 and record["rule"]["factor"] == 4 and record["rule"]["floor_unit_roundoffs"] == 2
    for r in record["results"]:
        assert r["allowed"] >= 4 * r["float32_error"]  # plus 2u of the largest size
        assert r["ratio"] == pytest.approx(r["error"] / r["float32_error"])
        if r["tensor"] == tf32_error.GEMM:
            assert r["passed"] == (r["error"] <= r["allowed"]), r


def test_a_broken_split_fails_the_rule_the_split_passes():
    """Split-TF32 computed in Python from grad_check.tf32's parts, summed exactly: with its three
    products it passes float32's rule at K = 4096; without the small·big product (or big·small)
    it does not, by far: the measurement can fail."""
    (x, w, _), _ = grad_check.draw(32, 4096, 32, False, torch.float32, seed=1)
    exact = x.double() @ w.double().t()
    size = x.double().abs() @ w.double().abs().t()
    float32 = F.linear(x, w)
    whole = grad_check.judge(tf32_error.split_gemm(x, w), float32, exact, torch.float32, size=size)
    assert whole.passed, whole.detail()
    for drop in ("small·big", "big·small"):
        broken = grad_check.judge(tf32_error.split_gemm(x, w, drop=drop), float32, exact, torch.float32, size=size)
        assert not broken.passed and broken.ratio > 100, (drop, broken.detail())
    with pytest.raises(ValueError, match="drop must be one of"):
        tf32_error.split_gemm(x, w, drop="small·small")


@pytest.fixture(scope="module")
def recomputed() -> list[dict]:
    """The forward GEMM recomputed now through the emulator at B = O = 32, K = 64, 128 and 256: v26
    and v34 each the worse of their runs under the two accumulation models (seconds)."""
    emu = tf32_error.emulation()
    results = []
    for k in (64, 128, 256):
        (x, w, _), _ = grad_check.draw(32, k, 32, True, torch.float32, seed=0)
        results += tf32_error.measure_gemm(emu, x, w, versions=(26, 34))
    return results


@pytest.mark.parametrize("variant", ["v26", "v34"])
def test_the_split_versions_pass_float32s_rule_recomputed_at_small_k(recomputed, variant):
    """The record's verdict on the kernels as they are now, not as they were when it was taken: a
    change to v26 or v34 that breaks the split (one of its three products dropped, say) fails here."""
    mine = [r for r in recomputed if r["variant"] == variant]
    assert len(mine) == 3 and all(r["passed"] for r in mine), [(r["in"], r["ratio"], r["accumulation"]) for r in mine]
    # each the worse of the two models, and the split's own products well inside float32's error
    assert all(r["error"] == max(r["error_by_accumulation"].values()) for r in mine)
    split = [r for r in recomputed if r["variant"] == "split"]
    assert all(r["passed"] and r["ratio"] < 1 for r in split)


def test_the_table_shows_the_record(record):
    text = tf32_error.table(record)
    for k in record["shape"]["in"]:
        assert f"\n| {k} | " in text
    (v26,) = [r for r in results(record, "v26", tf32_error.GEMM) if r["in"] == 4096]
    assert f"{v26['error']:.1e} ({tf32_error.times(v26['ratio'])}, fails)" in text
    (v25,) = [r for r in results(record, "v25", tf32_error.GEMM) if r["in"] == 4096]
    assert f"{v25['error']:.1e} ({tf32_error.times(v25['ratio'])}, fails)" in text
    assert "| v26: split-TF32, mma.sync | passes" in text and "| v25: TF32, mma.sync | fails" in text
    assert "not a GPU's" in text and text.rstrip().endswith(f"`{record['command']}`")


def test_the_script_writes_a_record_with_its_own_command(tmp_path):
    out = tmp_path / "tf32.json"
    result = run_script("cuda/tensor_cores/tf32_error.py", "-i", "16", "32", "-b", "16", "-o", "8", "--json", str(out),
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    rec = json.loads(out.read_text())
    assert rec["benchmark"] == "tf32_error" and rec["command"].endswith(f"--json {out}")
    assert rec["shape"] == {"batch": 16, "out": 8, "in": [16, 32]}
    assert {(r["variant"], r["tensor"]) for r in rec["results"]} >= {("v34", t) for t in tf32_error.TENSORS}
    assert tf32_error.table(rec) in result.stdout


@pytest.mark.parametrize("args, says", [
    (["-i", "30"], "-i 30: not a multiple of 4"),
    (["-b", "6"], "-b 6: not a multiple of 4"),
    (["-i", "65536", "-b", "1024"], "times the defaults' work"),
    (["--json", "/no/such/folder/x.json"], "does not exist"),
])
def test_mistakes_are_one_line(args, says):
    result = run_script("cuda/tensor_cores/tf32_error.py", *args, timeout=120)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
