"""cuda/bench_gpu.py away from a GPU: the parts that need none (reading Nsight Compute's CSV, the
tables, the refusals, the versions it times)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

import cli
from conftest import ROOT, load_script, run_script

bench_gpu = load_script("cuda/bench_gpu.py", "bench_gpu_cuda")  # tiles/ has a bench_gpu.py too

HEADER = '"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",' \
         '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"'


def ncu_csv(tmp_path, kernels=("dense_gemm_v1_nt_f32", "dense_gemm_v2_nn_f32")):
    rows = ["==PROF== Connected to process 1", HEADER]
    for i, name in enumerate(kernels):
        for metric, value in zip(bench_gpu.NCU_METRICS, ("1,000", "50", "160", "10", "0", "2", "1.5", "60", "8", "32")):
            rows.append(f'"{i}","1","python3","h","{name}","1","7","(256, 1, 1)","(16, 16, 1)","0","9.0",'
                        f'"Command line profiler metrics","{metric}","","{value}"')
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join(rows) + "\n")
    return path


def test_ncu_csv_becomes_a_record_and_a_table(tmp_path):
    record = {**bench_gpu.from_ncu(ncu_csv(tmp_path), "NVIDIA H200"), "shape": [2, 2, 2], "command": "c"}
    assert [k["kernel"] for k in record["kernels"]] == ["dense_gemm_v1_nt_f32", "dense_gemm_v2_nn_f32"]
    assert record["kernels"][0]["metrics"]["gpu__time_duration.sum"] == 1000.0  # "1,000" read as a number
    table = bench_gpu.ncu_table(record)
    # 160 sectors over 10 requests; 8 FFMA over B·I·O = 8; 1000 ns = 1 µs.
    assert "| dense_gemm_v1_nt_f32 | 1 | 32 | 50% | 16.0 | 0, 2 | 1.5% | 60% | 1.00 |" in table


def test_a_csv_without_kernels_is_a_clear_error(tmp_path):
    (tmp_path / "empty.csv").write_text("==PROF== nothing profiled\n")
    with pytest.raises(cli.UserError, match="no kernel rows"):
        bench_gpu.from_ncu(tmp_path / "empty.csv", "NVIDIA H200")


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
    assert bench_gpu._versions("f32") == [int(v) for v, types in listed if v != "0" and "f32" in types.split()]
    assert bench_gpu._versions("bf16") == [int(v) for v, types in listed if v != "0" and "bf16" in types.split()]
    assert 99 not in bench_gpu._versions("f32")
    header = _header_with(tmp_path, '{99, "f32 bf16", "a version from the future"},')
    monkeypatch.setattr(bench_gpu.catalog, "HEADER", header)
    assert bench_gpu._versions("f32")[-1] == 99 and bench_gpu._versions("bf16")[-1] == 99
    entries = bench_gpu.exact_entries()
    assert ("v99", 99, "f32") in entries and ("v99", 99, "bf16") in entries and ("v99", 99, "f64") not in entries
    assert {t for label, _, t in entries if label == "v0"} == set(bench_gpu.catalog.DTYPES)


def test_every_candidate_is_compared_in_float32():
    entries = bench_gpu.exact_entries()
    candidates = [(label, v) for label, v, t in entries if label.startswith("candidate")]
    assert candidates == [(f"candidate {c.index}", c.version) for c in bench_gpu.catalog.candidates()]
    assert all(t == "f32" for label, _, t in entries if label.startswith("candidate"))


# ---------------------------------------------------------------------------------------
# The exact comparison, away from a GPU: the emulation stands in for the GPU
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def emulation():
    emulated = load_script("cuda/emulated.py", "dense_cuda_emulated")
    if emulated.unavailable_reason():
        pytest.skip(emulated.unavailable_reason())
    return bench_gpu._emu_gemm()


def _tma(version: int, dtype: str) -> bool:
    return bench_gpu._row_multiple()(version, bench_gpu.TORCH_DTYPES[dtype]) > 1


def test_the_exact_comparison_finds_the_same_bits_where_they_are(emulation, monkeypatch):
    """Every entry, the TMA versions on the shape whose rows are whole 16 bytes only."""
    monkeypatch.setattr(bench_gpu, "EXACT_SHAPES", ((5, 3, 7), (8, 16, 24)))
    result = bench_gpu.exact(gpu_gemm=emulation, emu_gemm=emulation)
    assert result["failed"] == 0 and result["mismatches"] == []
    entries = bench_gpu.exact_entries()
    tma = [(label, dtype) for label, v, dtype in entries if _tma(v, dtype)]
    assert {label for label, _ in tma} == {"v32", "v33", "v34", "v35"}
    # each entry in nt, nn and tn, on both shapes or (TMA) on the aligned one
    assert result["compared"] == 3 * (2 * len(entries) - len(tma))
    assert result["aligned_only"] == {f"{label} {dtype}": 4 if dtype == "f32" else 8 for label, dtype in tma}
    summary = bench_gpu.exact_summary({"exact": result})
    assert summary == (f"exact: {result['compared']} of {result['compared']} GEMMs the same bits on the GPU as in the "
                       "CPU emulation (integers, M, N, K in [[5, 3, 7], [8, 16, 24]]; the 7 TMA entries only on those "
                       "whose every dimension is a multiple of 4 or 8)")


def test_a_difference_or_a_failed_launch_names_where_and_the_rest_still_run(emulation, monkeypatch, capsys):
    monkeypatch.setattr(bench_gpu, "EXACT_SHAPES", ((5, 3, 7), (33, 17, 65), (8, 16, 24)))

    def planted(version, layout, a, b, m, n, k):
        c = emulation(version, layout, a, b, m, n, k)
        if version == 3 and a.dtype == torch.float64 and layout == "nn" and m == 33:
            c[4, 2] += 1  # one element one off
        if version == 5 and a.dtype == torch.float32 and layout == "tn" and m == 5:
            raise RuntimeError("the launch failed with cudaError 719")
        if version == 34 and layout == "nt":  # split-TF32 on wgmma, through TMA: its last element
            c[-1, -1] = -c[-1, -1] if c[-1, -1] != 0 else 1
        return c

    result = bench_gpu.exact(gpu_gemm=planted, emu_gemm=emulation)
    tma = sum(_tma(v, dtype) for _, v, dtype in bench_gpu.exact_entries())
    assert result["failed"] == 3 and result["compared"] == 3 * (3 * len(bench_gpu.exact_entries()) - 2 * tma)
    assert result["mismatches"][0].startswith("v3 f64 nn M=33 N=17 K=65: first at [4, 2]: ")
    assert result["mismatches"][1] == "v5 f32 tn M=5 N=3 K=7: failed: the launch failed with cudaError 719"
    assert result["mismatches"][2].startswith("v34 f32 nt M=8 N=16 K=24: first at [7, 15]: ")
    out = capsys.readouterr().out
    assert "FAIL  v3 f64: v3 f64 nn M=33 N=17 K=65: first at [4, 2]" in out and "SAME  v12 f32:" in out
    assert "SAME  v33 bf16:" in out and "SAME  v25 f32:" in out and "SAME  v26 f32:" in out


def test_an_entry_that_takes_none_of_the_shapes_is_a_mismatch(emulation, monkeypatch):
    """Odd shapes only: the TMA versions would go unchecked, which must not pass as agreement."""
    monkeypatch.setattr(bench_gpu, "EXACT_SHAPES", ((5, 3, 7),))
    monkeypatch.setattr(bench_gpu, "exact_entries", lambda: [("v33", 33, "bf16"), ("v24", 24, "bf16")])
    result = bench_gpu.exact(gpu_gemm=emulation, emu_gemm=emulation)
    assert result["failed"] == 1 and result["compared"] == 3
    assert result["mismatches"] == ["v33 bf16: none of the shapes is a multiple of 8 in every dimension, as it needs"]


def test_the_exact_shapes_give_the_tma_versions_partial_tiles(emulation):
    """Each TMA version (32-35, rows of whole 16 bytes) takes the shapes that are multiples of 8 in
    every dimension, and they still leave partial tiles: M and N not multiples of the 64-row and
    128-column tiles, K not a multiple of 64-wide k-steps, a batch under 32 (v35's), and K long
    enough for 5 k-steps, more than the 4 stages of v32's and v33's rings."""
    aligned = [s for s in bench_gpu.EXACT_SHAPES if all(d % 8 == 0 for d in s)]
    odd = [s for s in bench_gpu.EXACT_SHAPES if s not in aligned]
    assert len(aligned) >= 3 and odd and all(any(d % 2 for d in s) for s in odd)
    assert any(m % 64 and n % 128 and k % 64 for m, n, k in aligned)
    assert any(m < 32 for m, _, _ in aligned) and max(k for _, _, k in aligned) > 4 * 64
    for label, v, dtype in bench_gpu.exact_entries():
        shapes = bench_gpu.exact_shapes(v, dtype, bench_gpu._row_multiple())
        assert shapes == (aligned if _tma(v, dtype) else list(bench_gpu.EXACT_SHAPES)), label


def test_the_exact_inputs_are_exact_in_tf32_and_leave_split_tf32_nothing_small(emulation):
    """cvt.rna.tf32 (the emulation's, held to the PTX ISA's rounding by tests/test_instructions.py)
    leaves -2..2 unchanged: v25's rounding changes nothing, and split-TF32's a − tf32(a) is 0."""
    import ctypes

    emulated = load_script("cuda/emulated.py", "dense_cuda_emulated")
    lib = emulated.library()
    lib.emu_cvt_rna_tf32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    values = torch.arange(-2, 3, dtype=torch.float32)
    bits = torch.empty(5, dtype=torch.int32)
    lib.emu_cvt_rna_tf32(values.data_ptr(), bits.data_ptr(), 5)
    assert torch.equal(bits.view(torch.float32), values) and torch.equal(values - bits.view(torch.float32),
                                                                         torch.zeros(5))


def test_the_exact_inputs_make_every_sum_exact():
    """Integers from -2 to 2: a K-long dot product is an integer of at most 4·K, which float32's
    24 bits hold for K up to 2^22, and bfloat16 and float16 hold every input exactly."""
    a = bench_gpu.integer_operands((64, 257), torch.Generator().manual_seed(0))
    assert set(a.unique().tolist()) == {-2.0, -1.0, 0.0, 1.0, 2.0}
    for dtype in (torch.bfloat16, torch.float16):
        assert torch.equal(a.to(dtype).float(), a)
    assert max(k for _, _, k in bench_gpu.EXACT_SHAPES) * 4 < 2 ** 24


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_first_difference_compares_bits(dtype):
    a = torch.zeros(3, 4, dtype=dtype)
    assert bench_gpu.first_difference(a, a.clone()) is None
    b = a.clone()
    b[2, 1] = -0.0  # equal as numbers, not as bits
    assert bench_gpu.first_difference(b, a).startswith("first at [2, 1]: -0.0 against the emulation's 0.0")
    assert "against the emulation's" in bench_gpu.first_difference(a, torch.zeros(4, 3, dtype=dtype))


def test_a_line_whose_call_fails_is_recorded_and_left_out_of_the_timing(capsys):
    def broken():
        raise RuntimeError("CUDA error: an illegal memory access was encountered\nmore")

    ok, failed = bench_gpu.runnable({"v1": lambda: 1, "v2": broken, "v3": lambda: 3})
    assert list(ok) == ["v1", "v3"] and failed == {"v2": "CUDA error: an illegal memory access was encountered"}
    assert "FAIL  v2: CUDA error" in capsys.readouterr().out


def test_the_record_is_written_after_each_measurement_so_a_stopped_run_keeps_it(tmp_path, monkeypatch):
    """main() writes the record whenever a part measures something: a run stopped in its second
    part leaves the first part's rows and what the second had measured."""
    monkeypatch.setattr(bench_gpu.modes, "available", lambda: dict.fromkeys(bench_gpu.modes.MODES))
    monkeypatch.setattr(bench_gpu.benchmark, "record_header", lambda device, dtype: {"device": "test"})

    def gemm(rounds, out, save):
        out["rows"] = ["v1"]
        save()

    def goals(rounds, out, save):
        out["goals"] = {"forward": 1.0}
        save()
        raise KeyboardInterrupt  # as the plan's limit stops a part

    monkeypatch.setattr(bench_gpu, "gemm", gemm)
    monkeypatch.setattr(bench_gpu, "goals", goals)
    path = tmp_path / "r.json"
    with pytest.raises(KeyboardInterrupt):
        bench_gpu.main(["gemm", "goals", "--json", str(path)])
    assert json.loads(path.read_text()) == {"device": "test", "gemm": {"rows": ["v1"]},
                                            "goals": {"goals": {"forward": 1.0}}}
    assert not list(tmp_path.glob("*.tmp"))


def test_the_sigmoid_grad_versions_come_from_the_header():
    text = (ROOT / "cuda" / "dense_kernels.h").read_text()
    assert bench_gpu.catalog_grad_versions() == int(re.search(r"kGradVersions = (\d+)", text).group(1))


@pytest.mark.parametrize("kernel, profiled", [("dense_gemm_v1_nt_f32", True), ("dense_gemm_v12_nn_f32", True),
                                              ("dense_gemm_v3_tn_f32", False), ("dense_gemm_v10_nt_f64", False),
                                              ("dense_sigmoid_grad_v1_f32", True), ("dense_sigmoid_grad_v3_f32", True),
                                              ("dense_bias_grad_v3_f32", True), ("dense_sigmoid_grad_v1_x4_f32", False),
                                              ("dense_splitk_reduce_f32", False)])
def test_ncu_profiles_every_versions_forward_and_grad_x_gemm_and_the_backward_kernels(kernel, profiled):
    pattern = bench_gpu.NCU_KERNELS.removeprefix("regex:")
    assert bool(re.fullmatch(pattern, kernel)) == profiled


def test_ncu_reads_the_counters_the_emulator_is_set_beside():
    for metric in ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                   "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum", "smsp__inst_executed_op_shared_ld.sum",
                   "smsp__inst_executed_op_shared_st.sum", "l1tex__throughput.avg.pct_of_peak_sustained_elapsed",
                   "lts__throughput.avg.pct_of_peak_sustained_elapsed",
                   "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum",
                   "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum"):
        assert metric in bench_gpu.NCU_METRICS, metric


def test_an_elementwise_kernel_has_no_ffma_ratio_in_the_ncu_table(tmp_path):
    csv = ncu_csv(tmp_path, kernels=("dense_gemm_v1_nt_f32", "dense_sigmoid_grad_v2_f32"))
    table = bench_gpu.ncu_table({**bench_gpu.from_ncu(csv, "NVIDIA H200"), "shape": [2, 2, 2], "command": "c"})
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
