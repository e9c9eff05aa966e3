"""Facts of the tensor-core kernels and records that chapter 5's prose rests on and that its numbers
(cuda/tensor_cores/page_numbers.py) cannot carry: what the split-TF32 arithmetic holds, which records'
verdicts agree, what the headers and the static report agree on, what gemm_choice.h runs by default.
"""

from __future__ import annotations

import json

import torch

from conftest import ROOT, load_script

RESULTS = ROOT / "docs" / "results"
numbers = load_script("cuda/tensor_cores/page_numbers.py")


def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def test_the_split_holds_an_operand_to_2_to_the_minus_22():
    """big = tf32(x), small = tf32(x − big): |x − big − small| ≤ 2⁻²²|x| and |small| ≤ 2⁻¹¹|x|, so
    small·small is at most 2⁻²² of x·y, and v25's one rounding is up to 2⁻¹¹ of the operand."""
    grad_check = load_script("grad_check.py")
    x = torch.randn(1 << 16, generator=torch.Generator().manual_seed(1)) * torch.logspace(-20, 20, 1 << 16)
    big = grad_check.tf32(x)
    small = grad_check.tf32(x - big)
    xd = x.double()
    assert ((big.double() - xd).abs() <= 2.0 ** -11 * xd.abs()).all()
    assert ((xd - big.double() - small.double()).abs() <= 2.0 ** -22 * xd.abs()).all()
    assert (small.double().abs() <= 2.0 ** -11 * xd.abs()).all()


def test_the_tf32_records_verdicts():
    """Plain TF32 fails at the largest K; v34 gives v26's bits; v26's ratio is its worse model's,
    the truncating one's at the largest K."""
    rec = _record("tf32_error_cpu.json")
    assert all(r.get("same_bits_as") == "v26" for r in rec["results"] if r["variant"] == "v34")
    e = numbers.gemm_errors(max(rec["shape"]["in"]))
    assert not e["tf32"]["passed"]
    v26 = e["v26"]
    assert v26["accumulation"] == "h100" and v26["ratio"] == max(numbers.v26_by(m) for m in ("exact", "h100"))


def test_the_bank_conflicts_are_the_same_requests_in_more_wavefronts():
    """v22 and v23 make the same ldmatrix requests; v23's take no excessive wavefronts, v22's all
    beyond 4 a request."""
    v22, v23 = numbers.counted(22), numbers.counted(23)
    requests = "smsp__inst_executed_op_ldsm.sum"
    ld, excess = "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum", "excessive_wavefronts_mem_shared_op_ld"
    assert v22[requests] == v23[requests]
    assert v23[excess] == 0 and v22[excess] == v22[ld] - 4 * v22[requests]


def test_the_headers_and_the_static_report_agree():
    """v24's shared memory is its stages of A and B tiles; v33's setmaxnreg split fits the SM's
    registers; v35's slices keep its blocks within two an SM and above one."""
    h = numbers.header_constants("v24_pipeline.cuh")
    assert numbers.static(24)["shared_bytes"] == h["kV24Stages"] * (h["kV24BM"] + h["kV24BN"]) * h["kV24BK"] * 2
    assert numbers.v33_registers() <= 65_536
    sms = numbers.static(35)["napkin"]["slices_at"]["sm_count"]
    assert sms < numbers.v35_blocks() <= 2 * sms


def test_the_defaults_run_no_tensor_core_version():
    """No tensor-core version has run on a GPU: bfloat16 and float16 default to ATen, and predict the
    same versions."""
    for dtype in ("kBF16", "kF16"):
        for shape in ("kFillsGpu", "kSmallBatch"):
            assert numbers.choices("kChoices")[shape, dtype] == ["kAten"]
            assert numbers.choices("kPredictedChoices")[shape, dtype] == \
                numbers.choices("kPredictedChoices")[shape, "kBF16"]
    defaults = [v for vs in numbers.choices("kChoices").values() for v in vs]
    assert not [v for v in defaults if v.isdigit() and int(v) >= 21], defaults
