"""cuda/bench_gpu.py and the modules of its parts (cuda/gpu_*.py) away from a GPU: what needs
none (reading Nsight Compute's CSV, the tables, the refusals, the versions it times)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import cli
from conftest import ROOT, load_script, run_script

bench_gpu = load_script("cuda/bench_gpu.py")  # tiles/ has a bench_gpu.py too
gpu, hand = load_script("cuda/gpu_timing.py"), load_script("cuda/gpu_hand_kernels.py")
tc, profiling, tables = (load_script(f"cuda/gpu_{m}.py") for m in ("tensor_cores", "profile", "tables"))

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
         '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'


def ncu_csv(tmp_path, kernels=("dense_gemm_v1_nt_f32", "dense_gemm_v2_nn_f32")):
    rows = ["==PROF== Connected to process 1", HEADER]
    for i, name in enumerate(kernels):
        for metric, value in zip(profiling.NCU_METRICS, ("1,000", "50", "160", "10", "0", "2", "1.5", "60", "8", "32")):
            rows.append(f'"{i}","1","python3","h","{name}","1","7","(256, 1, 1)","(16, 16, 1)","0","9.0",'
                        f'"Command line profiler metrics","{metric}","","{value}"')
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_ncu_csv_becomes_a_record_and_a_table(tmp_path):
    record = {**profiling.from_ncu(ncu_csv(tmp_path), "NVIDIA H200"), "shape": [2, 2, 2], "command": "c"}
    assert [k["kernel"] for k in record["kernels"]] == ["dense_gemm_v1_nt_f32", "dense_gemm_v2_nn_f32"]
    assert record["kernels"][0]["metrics"]["gpu__time_duration.sum"] == 1000.0  # "1,000" read as a number
    table = tables.ncu_table(record)
    # 160 sectors over 10 requests; 8 FFMA over B·I·O = 8; 1000 ns = 1 µs.
    assert "| dense_gemm_v1_nt_f32 | 1 | 32 | 50% | 16.0 | 0, 2 | 1.5% | 60% | 1.00 |" in table


def test_a_csv_without_kernels_is_a_clear_error(tmp_path):
    (tmp_path / "empty.csv").write_text("==PROF== nothing profiled\n")
    with pytest.raises(cli.UserError, match="no kernel rows"):
        profiling.from_ncu(tmp_path / "empty.csv", "NVIDIA H200")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusals of a machine without a GPU")
@pytest.mark.parametrize("args, message", [
    (["check"], "mode 'cuda' is not available here"),
    (["--ncu"], "no GPU here"),
    (["--from-ncu", "missing.csv", "--ncu-device", "X"], "no such file"),
    (["nonsense"], "name PARTs among"),
])
def test_refusals_without_a_gpu(args, message):
    result = run_script("cuda/bench_gpu.py", *args)
    assert result.returncode == 2 and message in result.stderr and "Traceback" not in result.stderr


def _header_with(tmp_path, entry: str) -> Path:
    """A copy of cuda/dense_kernels.h with one more entry in kVersionInfo."""
    text = (ROOT / "cuda" / "dense_kernels.h").read_text()
    start = text.index("constexpr VersionInfo kVersionInfo[] = {")
    end = text.index("};", start)
    (tmp_path / "dense_kernels.h").write_text(text[:end] + entry + "\n" + text[end:])
    return tmp_path / "dense_kernels.h"


def test_the_versions_compared_and_timed_follow_the_header(tmp_path, monkeypatch):
    """A version added to cuda/dense_kernels.h's kVersionInfo is compared with the emulation in
    each of its types and timed in float32 and bfloat16 with no list to edit here; one that the
    header does not list is not."""
    listed = re.findall(r"\{\s*(\d+)\s*,\s*\"([^\"]*)\"", (ROOT / "cuda" / "dense_kernels.h").read_text()
                        .split("kVersionInfo[] = {", 1)[1].split("};", 1)[0])
    assert gpu.versions("f32") == [int(v) for v, types in listed if v != "0" and "f32" in types.split()]
    assert gpu.versions("bf16") == [int(v) for v, types in listed if v != "0" and "bf16" in types.split()]
    assert 99 not in gpu.versions("f32")
    header = _header_with(tmp_path, '{99, "f32 bf16", "a version from the future"},')
    monkeypatch.setattr(gpu.catalog, "HEADER", header)
    assert gpu.versions("f32")[-1] == 99 and gpu.versions("bf16")[-1] == 99
    entries = gpu.exact_check.exact_entries()
    assert ("v99", 99, "f32") in entries and ("v99", 99, "bf16") in entries and ("v99", 99, "f64") not in entries
    assert {t for label, _, t in entries if label == "v0"} == set(gpu.catalog.DTYPES)


def test_kernel_n_times_version_n_alone_by_its_number(monkeypatch):
    """--kernel N: each timing part's list of versions is N's alone (none where N is not among
    them), and the goals are N's, never version 0's choice."""
    monkeypatch.setattr(gpu, "KERNEL", 33)
    assert gpu.only([0, *gpu.versions("bf16")]) == [33]
    assert gpu.only(gpu.chapter_versions()) == []
    monkeypatch.setattr(gpu, "KERNEL", 0)  # no version: the roof part times the roofs alone
    assert gpu.only(tc.roof_versions("bf16")) == [] and tc.roof_versions("bf16")
    monkeypatch.setattr(gpu, "KERNEL", None)
    assert gpu.only([0, 3, 33]) == [0, 3, 33]


@pytest.mark.parametrize("passed, units", [
    ({"order": ["v33", "v0", "v21", "candidate 2", "v3"],
      "units": {"v33": {"status": "SAME"}, "v0": {"status": "SAME"}, "v21": {"status": "FAULT"},
                "candidate 2": {"status": "SAME"}, "v3": {"status": "HANG"}}}, ["v33", "candidate 2"]),
    (None, None),
])
def test_the_profile_takes_every_version_and_candidate_or_what_the_exact_run_passed(passed, units):
    """ncu's profile covers the tensor-core versions and the candidates, not only chapter 3's;
    with an isolated exact run's record, only what it found SAME, in its order (never-run first)."""
    got = profiling.profile_units(passed)
    if units is not None:
        assert got == units
    else:
        assert sorted(got) == sorted([*(f"v{v}" for v in gpu.catalog.version_ids()),
                                      *(f"candidate {c.index}" for c in gpu.catalog.candidates())])
        assert {"v12", "v21", "v34", "v35", "candidate 0"} <= set(got)
        assert got.index("v35") < got.index("candidate 0") < got.index("v1")  # never-run ones first


def test_a_line_whose_call_fails_is_recorded_and_left_out_of_the_timing(capsys):
    """runnable() within one process: a line whose call raises is left out. (A sticky CUDA error
    would fail every later line too: versions never run on a GPU are timed one a process.)"""
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    ok, failed = gpu.runnable({"v1": lambda: 1, "v2": broken, "v3": lambda: 3})
    assert list(ok) == ["v1", "v3"] and failed == {"v2": "CUDA error: an illegal memory access was encountered"}
    assert "FAIL  v2: CUDA error" in capsys.readouterr().out


def test_the_record_is_written_after_each_measurement_so_a_stopped_run_keeps_it(tmp_path, monkeypatch):
    """main() writes the record whenever a part measures something: a run stopped in its second
    part leaves the first part's rows and what the second had measured."""
    monkeypatch.setattr(bench_gpu.modes, "available", lambda: dict.fromkeys(bench_gpu.modes.MODES))
    monkeypatch.setattr(bench_gpu.record_info, "record_header", lambda device, dtype: {"device": "test"})

    def gemm(rounds, out, save):
        out["rows"] = ["v1"]
        save()

    def goals(rounds, out, save):
        out["goals"] = {"forward": 1.0}
        save()
        raise KeyboardInterrupt  # as the plan's limit stops a part

    monkeypatch.setattr(hand, "gemm", gemm)
    monkeypatch.setattr(hand, "goals", goals)
    path = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        bench_gpu.main(["gemm", "goals", "--json", str(path)])
    assert json.loads(path.read_text()) == {"device": "test", "gemm": {"rows": ["v1"]},
                                            "goals": {"goals": {"forward": 1.0}}}
    assert not list(tmp_path.glob("*.tmp"))


def test_the_sigmoid_grad_versions_come_from_the_header():
    text = (ROOT / "cuda" / "dense_kernels.h").read_text()
    assert gpu.catalog_grad_versions() == int(re.search(r"kGradVersions = (\d+)", text).group(1))


@pytest.mark.parametrize("kernel, profiled", [("dense_gemm_v1_nt_f32", True), ("dense_gemm_v12_nn_f32", True),
                                              ("dense_gemm_v33_nt_bf16", True), ("dense_gemm_v34_nt_f32", True),
                                              ("dense_gemm_tune3_nt_f32", True), ("dense_gemm_v33_nt_f16", False),
                                              ("dense_gemm_v3_tn_f32", False), ("dense_gemm_v10_nt_f64", False),
                                              ("dense_sigmoid_grad_v1_f32", True), ("dense_sigmoid_grad_v3_f32", True),
                                              ("dense_bias_grad_v3_f32", True), ("dense_sigmoid_grad_v1_x4_f32", False),
                                              ("dense_splitk_reduce_f32", False)])
def test_ncu_profiles_every_versions_forward_and_grad_x_gemm_and_the_backward_kernels(kernel, profiled):
    pattern = profiling.NCU_KERNELS.removeprefix("regex:")
    assert bool(re.fullmatch(pattern, kernel)) == profiled


def test_ncu_reads_the_counters_the_emulator_is_set_beside():
    for metric in ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                   "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "smsp__inst_executed_op_shared_ld.sum",
                   "smsp__inst_executed_op_shared_st.sum", "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
                   "lts__throughput.avg.pct_of_peak_sustained_elapsed",
                   "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
                   "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"):
        assert metric in profiling.NCU_METRICS, metric


def test_an_elementwise_kernel_has_no_ffma_ratio_in_the_ncu_table(tmp_path):
    csv = ncu_csv(tmp_path, kernels=("dense_gemm_v1_nt_f32", "dense_sigmoid_grad_v2_f32"))
    table = tables.ncu_table({**profiling.from_ncu(csv, "NVIDIA H200"), "shape": [2, 2, 2], "command": "c"})
    assert "| dense_gemm_v1_nt_f32 |" in table and table.splitlines()[3].endswith("| 1.5% | 60% | – |")


def _ratio(speed: float) -> dict:
    return {"speed": speed, "ci": [speed - 0.1, speed + 0.1]}


def test_the_kernels_record_renders_as_the_chapters_would_show_it():
    """cuda_kernels_<card>.json (small, grad, bf16) through docs/render.py's kinds gpu_small,
    gpu_grad and gpu_bf16: every line, and what was not timed and why."""
    render = load_script("docs/render.py", "render_for_bench_gpu")
    row = {"forward_us": 100.0, "spread_us": 5.0, "gflops": 10.0, "of_cublas": _ratio(0.5), "of_reference": _ratio(0.6)}
    table_at = {"shape": [32, 4096, 4096], "rounds": 15, "tf32": False, "failed": {"v25": "cudaError 98"},
                "rows": [{"line": name, **row} for name in ("cuBLAS x·Wᵀ", "reference", "v12")]}
    record = {"device": "NVIDIA H200", "gpu": {"sm_count": 132}, "torch": "2.11", "dtype": "float32", "date": "d",
              "command": "python cuda/bench_gpu.py small grad bf16 --json docs/results/cuda_kernels_h200.json",
              "small": table_at,
              "grad": {"rounds": 15, "cols": 4096, "shapes": {"32": {"rows": 32, "failed": {}, "rel_errors": {},
                                                                     "lines": [
                  {"line": name, "us": 3.0, "spread_us": 0.1, "gb_per_s": 500.0, "of_torch": _ratio(1.2)}
                  for name in ("torch: sigmoid backward + sum", "sigmoid-grad v3")]}}},
              "bf16": {"tolerance": 0.01, "checked": {"v0": {"rel_error": 0.002, "ok": True},
                                                      "v21": {"error": "cudaError 700", "ok": False}},
                       "shapes": {"32×4096×4096": table_at}}}
    kinds = render.renderers()
    small, grad, bf16 = (kinds[k](record) for k in ("gpu_small", "gpu_grad", "gpu_bf16"))
    assert "| v12 | 100 (5) | 10 | 50.0% (40.0–60.0%) | 60.0% |" in small and "Not timed: v25 (cudaError 98)." in small
    assert "| 32 × 4096 | sigmoid-grad v3 | 3.0 (0.1) | 500 | 1.200 (1.100–1.300) |" in grad
    assert "bfloat16, forward only, B=32 I=4096 O=4096, 15 rounds." in bf16
    assert "Not timed (failed the float64 check, tolerance 0.01): v21 (cudaError 700)." in bf16
    assert all("NVIDIA H200 (132 SMs" in text for text in (small, grad, bf16))


@pytest.mark.slow  # in the slow selection, with the other checks of the cuda stage's sources
def test_bench_candidates_table_shows_each_candidates_shape_and_who_was_not_timed():
    """cuda/bench_gpu.py candidates: its table on a made-up record (the part itself needs a GPU)."""
    _sr = load_script("cuda/static_report.py")
    ratio = {"speed": 1.25, "ci": [1.2, 1.3]}
    row = {"forward_us": 100.0, "spread_us": 2.0, "gflops": 1.0, "of_reference": ratio, "of_version_0": ratio}
    record = {"device": "NVIDIA H100 80GB HBM3", "date": "2026-11-26", "command": "python cuda/bench_gpu.py candidates",
              "candidates": {"rounds": 3, "candidates": [list(s) for s in _sr.TUNE_CANDIDATES[:2]], "timed": [1],
                             "checked": [{"candidate": 0, "ok": False}, {"candidate": 1, "ok": True}],
                             "shapes": {"32×4096×4096": {"shape": [32, 4096, 4096], "rows": [
                                 {"line": "version 0", **row}, {"line": "candidate 1", **row}]}}}}
    text = tables.table(record)
    bm, bn, bk, wm, wn, tm, tn, minb = _sr.TUNE_CANDIDATES[1]
    assert f"| 32, 4096, 4096 | candidate 1 | {bm}×{bn}×{bk}, {wm}×{wn} ({tm}×{tn}), {minb} | 100 (2) |" in text
    assert "| 1.250 (1.200–1.300) | 1.250 (1.200–1.300) |" in text
    assert "Not timed (failed the float64 check): 0." in text
