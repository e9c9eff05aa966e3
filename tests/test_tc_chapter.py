"""The tensor-core chapter (cuda/tensor_cores/README.md) against what backs each of its numbers.

Every figure the prose states is recomputed here from its source: the records (the static report,
the counters, the TF32 error measurement, chapter 3's timings), the kernels' headers (roof.cuh,
the tiles and registers), cuda/gemm_choice.h and cuda/bench_gpu.py's goals. A changed record or
kernel then fails here instead of leaving the page wrong. The exercises' answers are what their
commands print (the slow ones on a copy of the repository, edited as the exercise says).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import ROOT, exercise, fold, load_script, repository_copy, sci

PAGE = ROOT / "cuda" / "tensor_cores" / "README.md"
RESULTS = ROOT / "docs" / "results"
MMA_4096 = 4096 ** 3 // (16 * 8 * 16)  # m16n8k16's at 4096³
SM_MACS = 2048  # bfloat16 multiply-adds a clock an SM on Hopper's tensor cores (roof.cuh)
ISSUE_GHZ = 1.98  # chapter 3's arithmetic: the H100's maximum SM clock
TENSOR_GHZ = 1.83  # the tensor cores' clock by the datasheet (989.4 TFLOP/s), the predictions' here
CHAPTER_4_RATIOS = (1.1, 1.4)  # v7's and v8's measured time over their issue bound (checked below)


def _page() -> str:
    return fold(PAGE.read_text())


def _entry(title: str) -> str:
    """The worklog entry whose heading starts '#### {title}', up to the next heading."""
    text = PAGE.read_text()
    start = text.index(f"\n#### {title}")
    end = re.search(r"\n#{2,4} ", text[start + 1:])
    return fold(text[start:start + 1 + end.start()])


def _record(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def _static(version: int, dtype: str = "bf16") -> dict:
    """The sm_90a record of a version's nt kernel (cuda_static_sm90.json's "kernels")."""
    (k,) = [k for k in _record("cuda_static_sm90.json")["kernels"]
            if k["version"] == version and k["dtype"] == dtype and k["layout"] == "nt"]
    return k


def _counted(version: int) -> dict:
    """A version's bfloat16 forward in the counters' record at 4096³, the shape of its chapter's table."""
    return {k["kernel"]: k["metrics"] for k in _record("counters.json")["kernels"] if k["shape"] == [4096] * 3}[
        f"dense_gemm_v{version}_nt_bf16"]


def _issue_bound(k: dict, bits: str = "16") -> tuple[float, float]:
    """Instructions per mma in the main loop, with and without the partial tiles' path (about 4
    instructions per scalar global load, chapter 3's rule)."""
    loop = k["inner_loop"]
    return loop["instructions"] / loop["mma"], (loop["instructions"] - 4 * loop["ldg"].get(bits, 0)) / loop["mma"]


# ---------------------------------------------------------------------------------------
# The page's shape: every version an entry, a prediction, and no timing yet
# ---------------------------------------------------------------------------------------
ENTRIES = {21: "v21 ·", 22: "v22 ·", 23: "v23 ·", 24: "v24 ·", 25: "v25 and v26 ·", 26: "v25 and v26 ·",
           31: "v31 ·", 32: "v32 ·", 33: "v33 ·", 34: "v34 ·", 35: "v35 ·"}


def test_every_tensor_core_version_has_an_entry_with_code_and_a_prediction():
    catalog = load_script("cuda/catalog.py")
    assert sorted(ENTRIES) == [v.id for v in catalog.versions() if v.id >= 21]
    for v, title in ENTRIES.items():
        entry = _entry(title)
        assert "<!-- code: cuda/tensor_cores/" in entry and "*Predicted" in entry, v
        assert re.search(r"\*Measured:\* not yet timed \(record `cuda_kernels_\{card\}\.json`, parts? `", entry), v


def test_no_timing_is_claimed_until_the_lease_brings_its_record():
    """The page says "not yet timed" and shows no GPU marker: true only while no tensor-core timing
    is committed. When the lease's record lands, this fails until the page shows it."""
    kernels = sorted(RESULTS.glob("cuda_kernels_*.json"))
    assert not kernels, f"{[p.name for p in kernels]} committed: show it (gpu_roof, gpu_tf32, gpu_goals16 markers)"
    assert not re.search(r"<!-- gpu_(roof|tf32|goals16):", PAGE.read_text())


def test_the_page_shows_every_figure_the_script_draws():
    figures = load_script("cuda/tensor_cores/figures.py")
    for name in figures.NAMES:
        assert f"(../../docs/figures/{name})" in PAGE.read_text(), name
        assert (ROOT / "docs" / "figures" / name).is_file(), name


def test_the_tests_the_page_names_exist():
    """Each test the page names is a test of the emulator's instructions (tests/test_instructions.py,
    tests/test_hopper.py), as the page says."""
    sources = {f: (ROOT / "tests" / f).read_text() for f in ("test_instructions.py", "test_hopper.py")}
    named = set(re.findall(r"`(test_\w+)(?:\[[^\]]*\])?`", PAGE.read_text()))
    assert len(named) >= 15
    for name in named:
        assert any(f"def {name}(" in text for text in sources.values()), name
    for plant, where in (("mma A rows and columns swapped", "test_instructions.py"),
                         ("ldmatrix .trans ignored", "test_instructions.py"),
                         ("accumulator table", "test_hopper.py"), ('"swizzle"', "test_hopper.py")):
        assert plant in sources[where], plant


# ---------------------------------------------------------------------------------------
# The idea: FLOPs per instruction, the peaks, the roofs' predictions
# ---------------------------------------------------------------------------------------
def test_the_ideas_numbers():
    said = _page()
    roof = fold(re.sub(r"\n\s*//", " ", (ROOT / "cuda" / "tensor_cores" / "roof.cuh").read_text()))  # its comments
    assert 32 * 2 == 64 and 2 * 16 * 8 * 16 == 4096
    assert "A warp's FFMA is 64 FLOPs" in said and "4,096 FLOPs in one warp instruction" in said
    assert 2 * SM_MACS == 4096 and 4096 / (128 * 2) == 16 and "132 SMs × 4,096 FLOP a clock at 1.83 GHz" in roof
    assert round(132 * 4096 * 1.83e9 / 1e12, 1) == 989.4 and "989.4 TFLOP/s" in roof
    assert "4,096 bfloat16 FLOPs a clock on its tensor cores, 16 times the 256 of its 128 FFMA lanes: 989.4" in said
    # chapter 3's float32 peak: 132 SMs × 128 lanes × 2 FLOPs at 1.98 GHz
    assert round(132 * 128 * 2 * 1.98e9 / 1e12, 1) == 66.9
    assert "66.9 TFLOP/s (132 SMs × 128 lanes × 2 FLOPs × 1.98 GHz)" in fold((ROOT / "cuda" / "README.md").read_text())
    assert "against chapter 3's 66.9 at 1.98 GHz" in said
    assert 64 * 256 * 16 // (16 * 8 * 16) == 128 and "up to 64×256×16, 128 times the work" in said
    assert "Predicted: 900-990 TFLOP/s" in roof and "predicted about half the wgmma roof, 450-550" in roof
    assert "900-990 TFLOP/s for `wgmma` on an H100" in said and "between a third and two thirds" in said
    # the fragments: 8 of A, 4 of B, 4 of C a lane
    assert (16 * 16 // 32, 16 * 8 // 32, 16 * 8 // 32) == (8, 4, 4) and "8 elements of A, 4 of B and 4 of C" in said


def test_part_1s_unit_of_account():
    """At the predicted roof an SM completes one m16n8k16 (2,048 multiply-adds) every 2 clocks, with
    half of Hopper's 2,048 a clock; its 4 sub-partitions issue 8 instructions in that time, and
    shared memory serves 2 wavefronts."""
    said = _page()
    clocks = (16 * 8 * 16) / (SM_MACS / 2)
    assert clocks == 2 and 4 * clocks == 8 and 1 * clocks == 2
    assert "one m16n8k16 every 2 clocks (1,024 of the 2,048 multiply-adds)" in said
    assert "may spend 8 issue slots and 2 wavefronts per mma" in said
    assert f"the forward at 4096³, {MMA_4096:,} mma's" in said


def test_chapter_3s_kernels_ran_at_1_1_to_1_4_times_their_issue_bound():
    """v7 and v8, timed on the H100: their time over chapter 3's issue bound (loop instructions,
    less 4 per scalar global load of the partial tiles' path, per FFMA, at 4 FFMA a clock an SM)."""
    kernels = {k["name"]: k for k in _record("cuda_static_sm90.json")["kernels"]}
    timed = {r["line"]: r["forward_us"] for r in _record("cuda_gpu_h100.json")["gemm"]["rows"]}
    ffma_ms = 4096 ** 3 / 32 / (132 * 4 * ISSUE_GHZ * 1e9) * 1e3
    ratios = []
    for v in (7, 8):
        loop = kernels[f"dense_gemm_v{v}_nt_f32"]["inner_loop"]
        bound_ms = (loop["instructions"] - 4 * loop["ldg"].get("32", 0)) / loop["fma"] * ffma_ms
        ratios.append(round(timed[f"v{v}"] / 1e3 / bound_ms, 1))
    assert tuple(ratios) == CHAPTER_4_RATIOS
    assert "chapter 3's kernels ran at 1.1 to 1.4 times such bounds" in _entry("v23 ·")


# ---------------------------------------------------------------------------------------
# Part 1: each prediction from the static and counted figures
# ---------------------------------------------------------------------------------------
def test_v21_prediction():
    k, c = _static(21), _counted(21)
    loop = k["inner_loop"]
    assert (loop["instructions"], loop["mma"], loop["ldg"]) == (88, 1, {"16": 12})
    assert round(8 / 88, 2) == 0.09
    entry = _entry("v21 ·")
    assert ("at most 0.09 of the `mma.sync` roof: the loop issues 88 instructions per mma, 12 of them 2-byte "
            "loads") in entry
    requests = c["l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"]
    sectors = c["l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum"] / requests
    assert f"{sci(requests)} load requests of {sectors:.0f} sectors" in entry


def _wavefronts(v: int) -> dict[str, float]:
    c = _counted(v)
    return {"ld": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"],
            "st": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum"],
            "ldgsts": c["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum"],
            "ldsm": c["smsp__inst_executed_op_ldsm.sum"], "x_ld": c["excessive_wavefronts_mem_shared_op_ld"]}


def test_the_bank_conflict_story_is_the_records_counts_at_4096():
    v22, v23 = _wavefronts(22), _wavefronts(23)
    assert v22["ldsm"] == v23["ldsm"] and v22["ld"] / v22["ldsm"] == 32 and v23["ld"] / v23["ldsm"] == 4
    assert v23["x_ld"] == 0 and v22["x_ld"] == v22["ld"] - 4 * v22["ldsm"]
    said = _entry("v23 ·")
    assert (f"The same {sci(v22['ldsm'])} `ldmatrix` requests take {sci(v22['ld'])} wavefronts in v22, 32 each, "
            f"and {sci(v23['ld'])} in v23, 4 each: 8 per matrix against 1") in said
    # per mma: 16 from ldmatrix and 1 from staging in v22, 2 and 1 in v23
    assert ((v22["ld"] + v22["st"]) / MMA_4096, (v23["ld"] + v23["st"]) / MMA_4096) == (17, 3)
    assert "16 per mma, plus 1 for staging: 17 where the roof allows 2" in _entry("v22 ·")
    assert round(2 / 17, 2) == 0.12 and "at most 0.12 of the roof" in _entry("v22 ·")
    # what the swizzle costs: registers and a block per SM
    s22, s23 = _static(22), _static(23)
    assert (s22["registers"], s23["registers"], s22["blocks_per_sm"], s23["blocks_per_sm"]) == (64, 72, 8, 7)
    assert "The swizzle costs 8 registers (72) and a block per SM (7)" in said


def test_v23_prediction():
    with_path, without = _issue_bound(_static(23))
    assert _static(23)["inner_loop"]["instructions"] == 468 and _static(23)["inner_loop"]["ldg"]["16"] == 32
    low, high = round(8 / with_path, 2), round(8 / without, 2)
    assert (low, high) == (0.55, 0.75) and round(2 / 3, 2) == 0.67
    lo, hi = min(0.67, low) / CHAPTER_4_RATIOS[1], min(0.67, high) / CHAPTER_4_RATIOS[0]
    assert (round(lo, 1), round(hi, 1)) == (0.4, 0.6)
    said = _entry("v23 ·")
    assert ("*Predicted:* 0.4-0.6 of the roof: 3 wavefronts per mma allow 0.67, the loop's 468 instructions for "
            "32 mma's (340 without the partial tiles' 32 two-byte loads, at 4 instructions each) 0.55-0.75") in said


def test_v24_prediction():
    w, k = _wavefronts(24), _static(24)
    assert (w["ld"] / MMA_4096, w["ldgsts"] / MMA_4096) == (1.5, 0.5)
    said = _entry("v24 ·")
    assert f"(counted: {sci(w['ld'])} and {sci(w['ldgsts'])}): 2, all of shared memory at the roof" in said
    assert k["inner_loop"]["instructions"] == 353 and k["inner_loop"]["mma"] == 32
    _, without = _issue_bound(k)
    assert round(without) == 9 and round(8 / without, 2) == 0.89
    assert (round(8 / without / CHAPTER_4_RATIOS[1], 2), round(8 / without / CHAPTER_4_RATIOS[0], 2)) == (0.63, 0.81)
    assert ("353 instructions for 32 mma's, 9 per mma without the partial tiles' path, which full tiles skip: at "
            "most 0.89, and 0.63-0.81 at chapter 3's 1.1 to 1.4") in said
    assert "*Predicted:* 0.6-0.8 of the roof, short of the goal of 0.85" in said
    # the header's own account of the block: 8 warps of 64×32, 3 stages, 48 KiB
    header = (ROOT / "cuda" / "tensor_cores" / "v24_pipeline.cuh").read_text()
    assert "kV24BK = 32, kV24Stages = 3, kV24Threads = 256" in header and k["shared_bytes"] == 3 * (8 + 8) * 1024


# ---------------------------------------------------------------------------------------
# TF32 and split-TF32: the record's numbers, the split's arithmetic, the predictions
# ---------------------------------------------------------------------------------------
def _gemm_errors(k: int) -> dict[str, dict]:
    return {r["variant"]: r for r in _record("tf32_error_cpu.json")["results"]
            if r["in"] == k and r["tensor"] == "forward GEMM"}


def test_the_tf32_figures_are_the_records():
    rec = _record("tf32_error_cpu.json")
    ks = rec["shape"]["in"]
    assert max(ks) == 4096
    assert all(r.get("same_bits_as") == "v26" for r in rec["results"] if r["variant"] == "v34")
    e = _gemm_errors(4096)
    said = _page()
    assert not e["tf32"]["passed"] and f"float32's rule by {e['tf32']['ratio']:.0f}× at K = 4096" in said
    # the two accumulation models: rounded once per mma (exact) and cut toward zero (h100)
    exact, cut = (e["v26"]["error_by_accumulation"][m] / e["v26"]["float32_error"] for m in ("exact", "h100"))
    assert e["v26"]["accumulation"] == "h100" and e["v26"]["ratio"] == pytest.approx(cut)
    assert f"{exact:.2f} times torch's CPU float32" in said and f"by {cut:.0f}× at K = 4096" in said
    v8 = e["v26"]["error_by_accumulation"]["exact"] / e["v8"]["error"]
    assert f"but {v8:.2f} times chapter 3's v8" in said
    assert f"its products give {e['split']['ratio']:.2f} times float32's error" in said
    fails_from = min(k for k in rec["shape"]["in"] if not _gemm_errors(k)["v26"]["passed"])
    assert f"it fails from K = {fails_from}" in said
    # the accumulator's roundings at K = 4096: three per mma, an mma per k-step of 8
    assert 3 * 4096 // 8 == 1536 and "1,536 times at K = 4096" in said
    assert "round once to float32" in rec["model"] and "truncate" in rec["model"]
    # the lease's prediction: the truncating model's error over v8's (cuBLAS summing as v8 does)
    assert round(e["v26"]["error"] / e["v8"]["error"]) == 12 and "≈ 12× if they truncate" in said


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
    said = _page()
    assert "by up to 2⁻¹¹ of it" in said and "together x to 2⁻²² of itself" in said
    assert "small_x·small_y, at most 2⁻²² of x·y" in said


def _cublas_f32_tflops() -> float:
    (row,) = [r for r in _record("cuda_gpu_h100.json")["gemm"]["rows"] if r["line"] == "cuBLAS x·Wᵀ"]
    return row["gflops"] / 1e3


def _of_cublas_f32(flop_per_sm_clock: float, ratio: float = CHAPTER_4_RATIOS[1]) -> float:
    return flop_per_sm_clock * 132 * TENSOR_GHZ * 1e9 / 1e12 / ratio / _cublas_f32_tflops()


def test_v25_and_v26_predictions():
    said = _entry("v25 and v26 ·")
    assert round(_cublas_f32_tflops(), 1) == 48.7 and "(48.7 TFLOP/s at 4096³, chapter 3's record)" in said
    v25, v26 = _static(25, "f32"), _static(26, "f32")
    assert (v25["inner_loop"]["instructions"], v25["inner_loop"]["mma"]) == (677, 32)
    assert (v26["inner_loop"]["instructions"], v26["inner_loop"]["mma"]) == (1429, 96)
    assert (v26["registers"], v26["blocks_per_sm"]) == (200, 1)
    useful = 32 * 2 * 16 * 8 * 8  # a warp's 32 m16n8k8 (v26: 96, three for each product)
    speeds = {}
    for name, k in (("v25", v25), ("v26", v26)):
        loop = k["inner_loop"]
        speeds[name] = [_of_cublas_f32(4 * useful / n) for n in (loop["instructions"],
                                                                 loop["instructions"] - 4 * loop["ldg"]["32"])]
    assert [round(s, 1) for s in speeds["v25"]] == [1.4, 1.6]
    assert all(0.6 < s < 0.7 for s in speeds["v26"])
    assert "v25 1.4-1.6 times its speed (677 instructions for 32 mma's of 2,048 FLOPs, 581 without" in said
    assert "v26 about 0.65 (1,429 for 96; 200 registers, one block per SM)" in said


# ---------------------------------------------------------------------------------------
# Part 2
# ---------------------------------------------------------------------------------------
def test_v31_and_v32_predictions():
    tensor_clocks = 4 * 64 * 128 * 16 / SM_MACS
    stage = (64 + 128) * 64 * 2
    assert tensor_clocks == 256 and stage == 24 * 1024 and 2 * stage / 128 == 384
    assert round(tensor_clocks / 384, 2) == 0.67
    k = _static(31)
    with_path, without = _issue_bound(k)
    assert k["inner_loop"]["instructions"] == 497
    assert (round(tensor_clocks / (with_path * k["inner_loop"]["mma"]), 2),
            round(tensor_clocks / (without * k["inner_loop"]["mma"]), 2)) == (0.52, 0.69)
    said = _entry("v31 ·")
    assert "four wgmma's are 256 clocks of tensor work" in said and "24 KiB of reads: 384 clocks, at most 0.67" in said
    assert "The loop's 497 instructions (369 without the partial tiles' path) allow 0.52-0.69" in said
    assert 497 - 4 * k["inner_loop"]["ldg"]["16"] == 369
    v32 = _static(32)
    assert v32["blocks_per_sm"] == 2 and "two blocks per SM" in _entry("v32 ·")
    assert f"({v32['dynamic_shared_bytes']:,} bytes each)" in _entry("v32 ·")
    header = (ROOT / "cuda" / "tensor_cores" / "v32_tma.cuh").read_text()
    assert "kV32Stages = 4" in header and "parity (i / 4) % 2" in _entry("v32 ·")


def test_v33_prediction_and_registers():
    header = (ROOT / "cuda" / "tensor_cores" / "v33_warp_specialized.cuh").read_text()
    assert "setmaxnreg_dec<40>()" in header and "setmaxnreg_inc<232>()" in header
    assert "kV33BM = 128, kV33BN = 256, kV33Stages = 4" in header
    k = _static(33)
    assert k["threads"] == 384 and k["blocks_per_sm"] == 1
    said = _entry("v33 ·")
    assert 128 * 40 + 256 * 232 == 64_512 and "128 × 40 + 256 × 232 = 64,512 of the SM's 65,536 registers" in said
    stage = (128 + 256) * 64 * 2
    reads = 2 * (64 + 256) * 64 * 2
    clocks = 2 * 4 * 64 * 256 * 16 / SM_MACS
    assert (stage, reads, clocks) == (48 * 1024, 80 * 1024, 1024) and (stage + reads) / clocks == 128
    assert "4 stages of 48 KiB" in said and "48 KiB by TMA and 80 KiB of reads" in said
    assert "1,024 clocks of tensor work" in said and "128 bytes a clock, all of it" in said
    # per multiply-add: v24's 2 wavefronts of 128 bytes per mma, v33's 128 KiB per k-step
    assert (stage + reads) / (clocks * SM_MACS) == 0.5 * (2 * 128) / (16 * 8 * 16)


def test_v34_prediction():
    k = _static(34, "f32")
    assert k["inner_loop"]["mma"] == 12 and k["blocks_per_sm"] == 1
    header = (ROOT / "cuda" / "tensor_cores" / "v34_split_tf32_wgmma.cuh").read_text()
    assert "kV34BM = 64, kV34BN = 128, kV34BK = 32" in header
    tensor = 12 * 64 * 128 * 8 / (SM_MACS / 2)  # TF32 at half bfloat16's multiply-adds
    elements = (64 + 128) * 32 // 128
    assert tensor == 768 and elements == 48
    clocks = [tensor + elements * c for c in (10, 25)]
    assert [round(c, -1) for c in clocks] == [1250, 1970]
    flops = 2 * 64 * 128 * 32  # a k-step's useful FLOPs, one block an SM
    speeds = [round(_of_cublas_f32(flops / c), 1) for c in clocks]
    assert speeds == [1.5, 0.9]
    said = _entry("v34 ·")
    assert "*Predicted* (1.83 GHz): 0.9-1.5 times cuBLAS float32's speed" in said
    assert "1,250-1,970 clocks a step" in said
    assert f"one block per SM: {k['dynamic_shared_bytes']:,} bytes of shared memory" in said
    assert "12 wgmma's per k-step of 32 take 768 clocks" in said and "48 elements a thread" in said


def test_v35_w_read_bound_and_slices():
    k = _static(35)
    slices = k["napkin"]["slices"]
    at = k["napkin"]["slices_at"]
    assert (at["batch"], at["in"], at["out"], at["sm_count"]) == (32, 4096, 4096, 132)
    blocks = (4096 // 64) * (32 // 32) * slices
    assert (slices, blocks) == (4, 256) and 2 * 132 > blocks > 132  # about two a SM
    said = _entry("v35 ·")
    assert f"(4 slices: 256 blocks for the {2 * 132} places of 132 SMs)" in said
    w_bytes = 4096 * 4096 * 2
    assert w_bytes == 32 * 2 ** 20 and round(w_bytes / 3.35e12 * 1e6, 1) == 10.0
    assert "32 MiB of bfloat16: 10.0 µs at the H100's 3.35 TB/s" in said and round(w_bytes / 4.8e12 * 1e6, 1) == 7.0
    assert "7.0 µs at the H200's 4.8" in said
    assert slices * 32 * 4096 * 4 == 2 * 2 ** 20 and "2 MiB of partials" in said
    small = _record("cuda_gpu_h100.json")["goals"]["goals"]["forward, B=32"]
    f32_bound_us = 4096 * 4096 * 4 / 3.35e12 * 1e6
    assert f"the reference took {small['reference_us']:.0f} µs here" in said
    assert f"{small['reference_us'] / f32_bound_us:.1f} times its W-read bound" in said


# ---------------------------------------------------------------------------------------
# What the stage runs; what the lease measures
# ---------------------------------------------------------------------------------------
def test_the_stage_runs_what_gemm_choice_h_lists():
    """The page's account of version 0: the predicted choices as gemm_choice.h lists them, and the
    defaults naming no tensor-core version (none has run on a GPU)."""
    text = (ROOT / "cuda" / "gemm_choice.h").read_text()

    def table(name: str) -> dict:
        block = text[text.index(f"constexpr Choice {name}[] = {{"):]
        by: dict = {}
        for shape, dtype, version in re.findall(r"\{(k\w+), (k\w+), (\w+)\}", block[:block.index("};")]):
            by.setdefault((shape, dtype), []).append(version)
        return by

    predicted, defaults = table("kPredictedChoices"), table("kChoices")
    for dtype in ("kBF16", "kF16"):
        assert predicted["kFillsGpu", dtype] == ["33", "24"] and predicted["kSmallBatch", dtype] == ["35", "12"]
        assert defaults["kFillsGpu", dtype] == defaults["kSmallBatch", dtype] == ["kAten"]
    assert defaults["kFillsGpu", "kF32"] == ["8"] and defaults["kSmallBatch", "kF32"] == ["9"]
    said = _page()
    assert "on sm_90a v33 where tiles fill the GPU, v35 for a small batch; elsewhere v24, and chapter 3's v12" in said
    assert "runs ATen's GEMM and elementwise ops by default" in said and "float32 stays on v8 and v9" in said


def test_the_lease_table_states_bench_gpus_goals_and_parts():
    bench = load_script("cuda/gpu_tensor_cores.py")
    assert bench.ROOF_GOALS == {"v24": ("mma.sync", 0.85)} and bench.TF32_SPEED_GOALS == {"v34": 1.5}
    assert bench.GOALS16 == {"forward": 1.0, "fwd+bwd": 0.90, "forward, B=32": 1.0}
    assert set(bench.TF32_ERROR_GOALS.values()) == {2.0}
    said = _page()
    for row in ("| v24 / `mma.sync` roof | ≥ 0.85 | 0.6-0.8 |",
                "| bfloat16 forward / (cuBLAS bf16 + bias + sigmoid) | ≥ 1.0 | 1.0-1.2 (v33) |",
                "| bfloat16 forward + backward / reference | ≥ 0.90 | 0.9-1.1 |",
                "| bfloat16 forward at B = 32 / reference | ≥ 1.0 | ≥ 1.5 (v35), 1.3-1.8 × the W-read bound |",
                "| split-TF32 forward / cuBLAS float32 reference, error ≤ 2× | ≥ 1.5 | 0.9-1.5 (v34); error ≈ 0.5× if "
                "the tensor cores round and cuBLAS sums as v8 does, ≈ 12× if they truncate |"):
        assert row in said, row
    plan = load_script(".ci/gpu.py")
    parts = plan.parts()
    assert {"exact", "kernels"} <= set(plan.SELECTIONS["lease"])
    assert {"bf16", "roof", "tf32", "goals16"} <= set(parts["kernels"].argv)
    assert parts["kernels"].records == ("docs/results/cuda_kernels_{tag}.json",)
    # part 1's best against cuBLAS bfloat16; the reference's separate sigmoid beside its GEMM
    lo, hi = 0.6 * 0.5 / 0.8, 0.8 * 0.5 / 0.7
    assert (round(lo, 1), round(hi, 1)) == (0.4, 0.6)
    assert "part 1's best makes 0.4-0.6 of cuBLAS bfloat16's speed" in said
    assert round(2 * 4096 ** 3 / 700e12 * 1e6) == 196 and round(2 * 4096 * 4096 * 2 / 3.35e12 * 1e6) == 20
    assert round(2 * 4096 * 4096 * 2 / 4.8e12 * 1e6) == 14
    assert "32 MiB read and 32 MiB written: 20 µs at an H100's 3.35 TB/s (14 µs at an H200's 4.8)" in said
    assert "a GEMM that takes 196 µs if it runs at an assumed 700 TFLOP/s" in said


# ---------------------------------------------------------------------------------------
# The exercises' answers
# ---------------------------------------------------------------------------------------


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert text.count(old) == 1, old
    path.write_text(text.replace(old, new))


def _commands(question: str) -> list[list[str]]:
    """The question's commands (`python ...`), as argument lists after "python"."""
    return [shlex.split(c)[1:] for c in re.findall(r"`(python [^`]+)`", question)]


def test_answer_3_is_the_descriptor_the_emulator_decodes():
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    question, answer = exercise(PAGE, 3, "question"), exercise(PAGE, 3, "answer")
    assert "smem_desc(As + 64, 16, 1024, kSwizzle128B)" in question
    header = (ROOT / "cuda" / "tensor_cores" / "v31_wgmma.cuh").read_text()
    assert "smem_desc(As + kk * 2, 16, 1024, kSwizzle128B)" in header  # K-major A: kk = 32, its third k-step
    value = (64 >> 4) | (16 >> 4) << 16 | (1024 >> 4) << 32 | 1 << 62
    assert answer.startswith(f"`{value:#018x}`:")
    code = re.search(r'`python -c "(.*?)"`', question).group(1).replace("VALUE", hex(value))
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"It prints `{result.stdout.strip()}`" in answer


needs_counters = pytest.mark.skipif(load_script("cuda/counters.py").unavailable_reason() is not None,
                                    reason="the counting build needs GCC's g++")


@needs_counters
@pytest.mark.slow
def test_answer_1_is_what_the_counters_count_with_the_weaker_swizzle(tmp_path):
    question, answer = exercise(PAGE, 1, "question"), exercise(PAGE, 1, "answer")
    counters, check = _commands(question)
    copy = repository_copy(tmp_path)
    _edit(copy / "cuda" / "tensor_cores" / "v22_v23_ldmatrix.cuh", "(c / 8) ^ (r % 8)", "(c / 8) ^ (r % 4)")
    out = tmp_path / "after.json"
    result = subprocess.run([sys.executable, *counters, "--json", str(out)], cwd=copy, capture_output=True,
                            text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    m = {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}["dense_gemm_v23_nt_bf16"]
    requests = m["smsp__inst_executed_op_ldsm.sum"]
    wavefronts = m["l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum"]
    assert wavefronts / requests == 8 and m["excessive_wavefronts_mem_shared_op_ld"] == wavefronts / 2
    assert answer.startswith("8 a request, 2 per matrix")
    assert f"({sci(wavefronts)} wavefronts for {requests:,.0f} requests, half of them excessive)" in answer
    passed = subprocess.run([sys.executable, *check], cwd=copy, capture_output=True, text=True, timeout=900)
    assert passed.returncode == 0 and "`grad_check.py` still passes" in answer, passed.stdout[-2000:]


@pytest.mark.slow
def test_answer_2_is_what_a_wrong_fragment_table_fails(tmp_path):
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    question, answer = exercise(PAGE, 2, "question"), exercise(PAGE, 2, "answer")
    copy = repository_copy(tmp_path)
    planted = "{g + 8 * (i >> 2), 2 * t + (i & 1) + 8 * ((i >> 1) & 1)}"
    assert f"`{planted}`" in question
    header = copy / "cuda" / "emulate" / "warp_matrix.h"
    assert f"return {planted};  // planted" in header.read_text()  # the planted line the question quotes
    _edit(header, "  return {g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >> 2)};\n",
          f"  return {planted};\n")
    tests, check = _commands(question)
    assert tests[:2] == ["-m", "pytest"]
    ran = subprocess.run([sys.executable, *tests, "-p", "no:cacheprovider"], cwd=copy, capture_output=True,
                         text=True, timeout=900)
    failed = re.findall(r"^FAILED (\S+)", ran.stdout, re.M)
    assert len(failed) == 5 and answer.startswith("Five tests"), ran.stdout[-3000:]
    assert "tests/test_instructions.py::test_fragment_tables_are_the_ptx_isas[m16n8k16.A]" in failed
    assert sum("test_mma_computes_a_times_b_plus_c_through_the_ptx_tables" in f for f in failed) == 4
    result = subprocess.run([sys.executable, *check], cwd=copy, capture_output=True, text=True, timeout=900)
    assert result.returncode != 0
    fails = re.findall(r"^FAIL\s+(v\d+)\s", result.stdout, re.M)
    for v in ("v21", "v22", "v23", "v24"):
        assert fails.count(v) == 4, (v, fails)  # the output and the three gradients
    assert not {f for f in fails if f not in ("v0", "v21", "v22", "v23", "v24")}
    assert "fails v21 to v24 in every output and gradient" in answer


def test_the_page_fits_its_budget_and_states_its_reading_time_once():
    render = load_script("docs/render.py")
    assert "cuda/tensor_cores/README.md" in render.CHAPTERS
    assert render.prose_words(PAGE.read_text()) <= render.budget("cuda/tensor_cores/README.md")
    assert render.reading_minutes(PAGE) == 30
