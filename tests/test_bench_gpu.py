"""cuda/bench_gpu.py away from a GPU: the parts that need none (reading Nsight Compute's CSV, the
tables, the refusals, the versions it times)."""

from __future__ import annotations

import re
import sys

import pytest
import torch

import cli
from conftest import load_script, run_script

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


def test_the_versions_timed_are_those_of_the_header(tmp_path, monkeypatch):
    """A version added to cuda/dense_kernels.h's kVersions is checked and timed with no list to edit."""
    bench_gpu._versions()  # loads cuda/emulated.py
    emulated = sys.modules["dense_cuda_emulated"]
    (tmp_path / "dense_kernels.h").write_text("constexpr int kVersions = 12;\n")
    monkeypatch.setattr(emulated, "HERE", tmp_path)
    assert bench_gpu._versions() == list(range(1, 13))


@pytest.mark.parametrize("kernel, profiled", [("dense_gemm_v1_nt_f32", True), ("dense_gemm_v12_nn_f32", True),
                                              ("dense_gemm_v3_tn_f32", False), ("dense_gemm_v10_nt_f64", False)])
def test_ncu_profiles_every_versions_forward_and_grad_x_gemm(kernel, profiled):
    pattern = bench_gpu.NCU_KERNELS.removeprefix("regex:")
    assert bool(re.search(pattern, kernel)) == profiled
