"""Chapter 3 (cuda/README.md) beside what backs it. The numbers in its sentences are written from the
records by docs/render.py (cuda/page_numbers.py), so re-measuring rewrites them; what stays here:
each version's entry carries its code and, once timed, its marked time; the records' facts that the
chapter states in words (halved, a third, twice, every one, none); the counts the chapter quotes
from a command no committed record keeps; and its exercises' answers against what their commands
print."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from conftest import ROOT, exercise, fold, load_script, repository_copy
from record_info import sci

CUDA_CHAPTER = ROOT / "cuda" / "README.md"
pn = load_script("cuda/page_numbers.py")
nt = pn.nt


def _entry(version: int) -> str:
    """Worklog entry '#### vN · ...' of chapter 3, as written (markers and excerpts included)."""
    text = CUDA_CHAPTER.read_text()
    start = text.index(f"\n#### v{version} · ")
    return text[start:start + 1 + re.search(r"\n#{2,4} ", text[start + 1:]).start()]


def test_every_version_has_its_code_and_once_timed_its_time_from_the_record():
    versions = load_script("cuda/catalog.py").cuda_core_versions()
    timed = {r["line"] for r in pn.timing()["gemm"]["rows"]}
    for v in versions:
        entry = _entry(v)
        assert "<!-- code: cuda/kernels/" in entry, f"v{v}"
        for name in (f"cuda_v{v}_us", f"cuda_v{v}_of_cublas"):
            assert (f"<!-- n {name} -->" in entry) == (f"v{v}" in timed), (f"v{v}", name)
    text = CUDA_CHAPTER.read_text()
    backward = text[text.index("### The backward's kernel"):text.index("## The code, in the order")]
    for v in (1, 2, 3):
        assert f"<!-- code: cuda/kernels/sigmoid_grad.cuh#grad-v{v} -->" in backward


def test_what_the_worklog_says_in_words_holds_on_the_timing_and_static_records():
    assert 1.9 < pn.us(5) / pn.us(6) < 2.0  # v6: "twice v5"
    check = pn.timing()["check"]
    assert not check["failed"] and all(r["ok"] for r in check["rows"])  # "v1-v9 passed"
    # the goals' third row is version 0 at B = 32, which float32 gives to v9
    assert "{kSmallBatch, kF32, 9}" in (ROOT / "cuda" / "gemm_choice.h").read_text()
    static = pn.static()
    blocks = {v: static[nt(v)]["blocks_per_sm"] for v in (4, 5, 6, 8)}
    assert blocks == {4: 1, 5: 1, 6: 2, 8: 2} and static["dense_gemm_v9_nn_f32"]["blocks_per_sm"] == 1
    assert len({round(static[nt(v)]["napkin"]["flop_per_byte"], 1) for v in (5, 6, 7, 8)}) == 1  # "v5 to v8 share"
    assert (pn.loop(7)["bar"], pn.loop(8)["bar"]) == (2, 1)  # one barrier per k-step instead of two
    assert pn.static()[nt(12)]["napkin"]["slices"] == pn.v12_slicing()["slices"]
    assert static[nt(12)]["blocks_per_sm"] == 4  # "all resident at once"
    sr = load_script("cuda/static_report.py")
    assert sr.splitk_slices(4096, 4096, 4096, 128, 128, pn.sm_count()) == 1  # "at 4096³ one"
    # "none spills but v4's `nt` float32 kernel on sm_80"
    archs = pn.committed("cuda_static_sm90.json")["archs"]
    spills = {(arch, name): (e["spill_stores"], e["spill_loads"]) for arch, figures in archs.items()
              for name, e in figures["entries"].items() if e["spill_stores"] or e["spill_loads"]}
    assert sorted(archs) == ["sm_80", "sm_90a"] and spills == {("sm_80", nt(4)): (8, 8)}


def test_what_the_worklog_says_in_words_holds_on_the_counts_at_4096():
    c = pn.c
    assert c(3, pn.X_LD) == 0 and c(7, pn.X_LD) == 0  # none excessive
    assert c(4, pn.LD_REQ) / c(3, pn.LD_REQ) == pytest.approx(0.5, rel=0.01)  # halved
    assert c(5, pn.LD_REQ) / c(4, pn.LD_REQ) == pytest.approx(0.5, rel=0.01)  # halved again
    assert c(5, pn.X_LD) / c(5, pn.WF_LD) == pytest.approx(1 / 3)  # a third of them excessive
    assert c(6, pn.X_ST) == c(6, pn.SHARED_ST)  # one excessive wavefront per store
    counted = pn.counted(4096)
    assert counted[nt(7)] == counted[nt(8)] == counted[nt(9)]  # "v7's counts, every one"; v9: "v8's"
    assert c(8, pn.X_ST) > 0 and c(10, pn.X_ST) == 0  # "→ 0"
    for v in (1, 2, 3):  # the backward's kernels: no excessive wavefront
        k = counted[f"dense_sigmoid_grad_v{v}_f32"]
        assert k[pn.X_LD] == k[pn.X_ST] == 0


def test_what_the_bandwidth_and_bank_conflict_paragraphs_say_in_words_holds_on_the_records():
    p = pn.roofline()
    assert round(100 * p[1]["dram_share"]) == round(100 * p[2]["dram_share"])  # "v1 and v2 ... 60%"
    kernels = pn.ncu_record()["kernels"]
    assert max(k["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] for k in kernels) < 2
    assert pn.ncu_record()["device"] == "NVIDIA H200"
    c = pn.counted(2048)
    # v5, v6: 4 excessive a load of Bs (256 blocks × 8 warps × 256 k-steps × 16 loads of Bs)
    assert c[nt(5)][pn.X_LD] == c[nt(6)][pn.X_LD] == 4 * 256 * 8 * 256 * 16
    assert {c[nt(v)][pn.X_ST] for v in range(6, 10)} == {c[nt(6)][pn.SHARED_ST]}  # from v6 on, one a store
    assert c[nt(12)][pn.X_ST] == c[nt(12)][pn.SHARED_ST]  # v12 keeps one a store
    assert all(c[nt(v)][pn.X_ST] == 0 for v in (3, 4, 5))  # "where the addresses make none"


# ---------------------------------------------------------------------------------------
# Counts the chapter quotes from a command no committed record keeps: counted again here
# ---------------------------------------------------------------------------------------
def _counters_record(tmp_path, *args: str) -> dict[str, dict]:
    out = tmp_path / "counts.json"
    result = subprocess.run([sys.executable, "cuda/counters.py", *args, "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}


needs_counters = pytest.mark.skipif(load_script("cuda/counters.py").unavailable_reason() is not None,
                                    reason="the counting build needs GCC's g++")


@needs_counters
@pytest.mark.slow
def test_ldgsts_of_v8s_backward_products_at_4096(tmp_path):
    c = _counters_record(tmp_path, "--shape", "4096", "4096", "4096", "--kernels", "8:nn", "8:tn")
    req = "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"
    sec = "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"
    nn, tn = c["dense_gemm_v8_nn_f32"], c["dense_gemm_v8_tn_f32"]
    assert nn[sec] / nn[req] == tn[sec] / tn[req] == 16
    assert nn["excessive_wavefronts_mem_shared_op_ldgsts"] == tn["excessive_wavefronts_mem_shared_op_ldgsts"] == 0
    said = fold(CUDA_CHAPTER.read_text())
    assert f"{nn[req]:,.0f}" in said and f"{tn[req]:,.0f}" in said


@needs_counters
@pytest.mark.slow
def test_v12_against_v9_counted_at_b32(tmp_path):
    c = _counters_record(tmp_path, "--shape", "32", "4096", "4096", "--kernels", "9:nt", "12:nt", "--sm-count", "132")
    v9, v12 = c[nt(9)], c[nt(12)]
    assert v9[pn.LD_REQ] == v12[pn.LD_REQ]  # W once, and x once per tile, in both
    assert f"{sci(v9[pn.WF_LD], 3)} → {sci(v12[pn.WF_LD], 3)}" in fold(_entry(12))
    assert v12[pn.X_ST] == v12[pn.SHARED_ST]  # one excessive wavefront per transposing store


# ---------------------------------------------------------------------------------------
# The exercises: each edit made in a copy of the repository, the command run as written there
# ---------------------------------------------------------------------------------------
def test_answer_3_is_what_the_slices_command_prints():
    question = exercise(CUDA_CHAPTER, 3, "question")
    command = re.search(r"`(python cuda/emulated.py --slices [\d ]+)`", question).group(1)
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    got = [int(x) for x in re.findall(r"SMs: (\d+)", result.stdout)]
    assert exercise(CUDA_CHAPTER, 3, "answer").startswith(f"{got[0]}, {got[1]}, {got[2]} and {got[3]}.")
    assert got == [1, 1, 4, 5]


@pytest.mark.slow
def test_answer_2_is_what_the_emulation_prints(tmp_path):
    question = exercise(CUDA_CHAPTER, 2, "question")
    line = re.search(r"add `([^`]+)` after", question).group(1)
    copy = repository_copy(tmp_path)
    kernel = copy / "cuda" / "kernels" / "v3_smem.cuh"
    source = kernel.read_text()
    anchor = "  const int64_t m = int64_t(blockIdx.y) * S + ty, n = int64_t(blockIdx.x) * S + tx;\n"
    assert source.count(anchor) == 1, "the exercise's line that computes m and n"
    kernel.write_text(source.replace(anchor, anchor + f"  {line}\n"))
    command = re.search(r"run `(python grad_check.py [^`]+)`", question).group(1)
    result = subprocess.run([sys.executable, *command.split()[1:]], cwd=copy, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode != 0 and "FAIL" in result.stdout, result.stdout[-3000:]
    printed = re.search(r"on stderr `([^`]+)`", exercise(CUDA_CHAPTER, 2, "answer")).group(1)
    assert printed in fold(result.stderr), result.stderr[-3000:]


@needs_counters
@pytest.mark.slow
def test_answer_4_is_what_the_counters_count_without_the_padding(tmp_path):
    question = exercise(CUDA_CHAPTER, 4, "question")
    command = re.search(r"`(python cuda/counters.py [^`]+)`", question).group(1).split()[1:]
    copy = repository_copy(tmp_path)
    source = copy / "cuda" / "kernels" / "sigmoid_grad.cuh"
    assert source.read_text().count("kGradCols + 1") == 3  # "in its three places"
    source.write_text(source.read_text().replace("kGradCols + 1", "kGradCols"))
    counts = {}
    for where, name in ((ROOT, "before"), (copy, "after")):
        out = tmp_path / f"{name}.json"
        result = subprocess.run([sys.executable, *command, "--json", str(out)], cwd=where, capture_output=True,
                                text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-3000:]
        counts[name] = {k["kernel"]: k["metrics"] for k in json.loads(out.read_text())["kernels"]}
    x, loads = "excessive_wavefronts_mem_shared_op_ld", "smsp__inst_executed_op_shared_ld.sum"
    answer = exercise(CUDA_CHAPTER, 4, "answer")
    for v in (1, 2, 3):
        assert counts["before"][f"dense_sigmoid_grad_v{v}_f32"][x] == 0
    assert counts["after"]["dense_sigmoid_grad_v1_f32"] == counts["before"]["dense_sigmoid_grad_v1_f32"]
    for v in (2, 3):
        after = counts["after"][f"dense_sigmoid_grad_v{v}_f32"]
        assert after[x] == 31 * after[loads]
        assert f"{after[x]:,.0f} for v{v}'s {after[loads]:,.0f}" in answer, (v, after[x], after[loads])
