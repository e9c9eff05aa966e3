"""The emulator's memory counters (cuda/counters.py, cuda/emulate/counters.cpp): planted patterns
with counts known by hand, sampling against the full grid, the comparison with Nsight Compute's
committed record kernel by kernel, and one line for every bad input."""

from __future__ import annotations

import json
import subprocess

import pytest

from conftest import ROOT, load_script, run_script

counters = load_script("cuda/counters.py")
pytestmark = pytest.mark.skipif(counters.unavailable_reason() is not None and not counters.built(),
                                reason=f"the counting build {counters.unavailable_reason()}")


def test_planted_patterns_give_the_counts_known_by_hand():
    coalesced = counters.count_planted("coalesced")
    assert coalesced.per_request("ld") == 4  # 32 lanes × 4 bytes, one 128-byte line
    column = counters.count_planted("column-major")
    assert column.per_request("ld") == 32  # a row (128 bytes) apart per lane: a sector each
    assert column.get("requests_pipe_lsu_mem_global_op_ld") == 1
    stride = counters.count_planted("stride-32")
    for kind in ("ld", "st"):  # one bank, 32 different words: 32 wavefronts, 31 conflicts
        assert stride.metrics[f"smsp__inst_executed_op_shared_{kind}.sum"] == 1
        assert stride.metrics[f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{kind}.sum"] == 32
        assert stride.metrics[f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{kind}.sum"] == 31
    broadcast = counters.count_planted("broadcast")
    assert broadcast.get("inst_executed_op_shared_ld") == 1 and broadcast.get("inst_executed_op_shared_st") == 1
    assert broadcast.get("bank_conflicts_pipe_lsu_mem_shared_op_ld") == 0


def test_wide_shared_accesses_are_split_into_the_hardwares_phases():
    # v5 reads Bs[kk][8·tx .. 8·tx+3] with 128-bit loads: in each quarter-warp, lanes tx and tx+4
    # hit the same four banks: 2 wavefronts per phase, 4 conflicts per request. Its As reads are
    # broadcasts. And v8 stores its transposed tile with lanes 2i and 2i+1 in one bank: 1 per store.
    v5 = counters.count_gemm(5, "nt", 128, 128, 64, sample=False)[0]
    assert v5.get("bank_conflicts_pipe_lsu_mem_shared_op_ld") == 4 * 16 * 8 * (64 // 8)  # 16 LDS.128 of Bs
    v8 = counters.count_gemm(8, "nt", 128, 128, 64, sample=False)[0]
    stores = v8.get("inst_executed_op_shared_st")
    assert stores == 8 * 8 * (64 // 8)  # 8 warps × (4 stores of A + 4 of B) × k-steps
    assert v8.get("bank_conflicts_pipe_lsu_mem_shared_op_st") == stores
    assert v8.get("bank_conflicts_pipe_lsu_mem_shared_op_ld") == 0


def test_scalar_shared_loads_are_merged_as_nvcc_merges_them():
    # v3's inner loop reads As[ty][kk] for 32 consecutive kk: nvcc makes 8 LDS.128 of them (the
    # static report's census), and 32 scalar loads of Bs[kk][tx]. Per warp and k-step: 40.
    v3 = counters.count_gemm(3, "nt", 32, 32, 64, sample=False)[0]
    assert v3.get("inst_executed_op_shared_ld") == 32 * 40 * (64 // 32)


def test_padding_the_transposed_tiles_removes_the_store_conflicts():
    # v10 is v8 with rows of BM + 4 words: lanes 2i and 2i+1 move 16 banks apart.
    v8, v10 = (counters.count_gemm(v, "nt", 256, 256, 64)[0] for v in (8, 10))
    assert v8.get("bank_conflicts_pipe_lsu_mem_shared_op_st") == v8.get("inst_executed_op_shared_st") > 0
    assert v10.get("bank_conflicts_pipe_lsu_mem_shared_op_st") == 0
    tune, = counters.count_gemm(counters.parse_kernel("tune0:nt", range(1, 13))[0], "nt", 256, 256, 64)[:1]
    assert tune.kernel == "dense_gemm_tune0_nt_f32" and tune.get("inst_executed_op_shared_ld") > 0


def test_the_backward_kernels_padded_column_reads_have_no_conflicts():
    # v2 reads a column of its 32×33 array of lane sums: 33 words a row put 32 lanes in 32 banks.
    grad, = counters.count_sigmoid_grad(2, 256, 64, sample=False)[:1]
    assert grad.get("inst_executed_op_shared_ld") > 0
    assert grad.get("bank_conflicts_pipe_lsu_mem_shared_op_ld") == 0
    assert grad.per_request("ld") == 4  # g and y, 32 neighbouring columns


@pytest.mark.parametrize("kernel", ["3:nt", "8:nt", "2:nn"])
def test_a_sample_of_blocks_scaled_equals_the_whole_grid(kernel):
    v, layout = counters.parse_kernel(kernel, range(1, 100))
    sampled = counters.count_gemm(v, layout, 640, 768, 32, sample=True)[0]
    full = counters.count_gemm(v, layout, 640, 768, 32, sample=False)[0]
    assert sampled.metrics["blocks_run"] < full.metrics["blocks_run"]
    for name in counters.METRICS[:10]:
        assert sampled.metrics[name] == pytest.approx(full.metrics[name], rel=0.02), name


@pytest.mark.slow
def test_the_counts_agree_with_nsight_compute_kernel_by_kernel(tmp_path):
    # All eleven kernels of the ncu record at its shape, 2048³ float32, as the chapter shows them.
    ncu = json.loads(counters.NCU_RECORD.read_text())
    kernels = [k["kernel"] for k in ncu["kernels"]]
    args = sorted({f"{int(k.split('_v')[1].split('_')[0])}:{k.split('_')[3]}" for k in kernels})
    out = tmp_path / "counts.json"
    result = run_script("cuda/counters.py", "--kernels", *args, "--json", str(out), timeout=600)
    assert result.returncode == 0, result.stderr
    rows = {r["kernel"]: r for r in counters.rows(json.loads(out.read_text()))}
    assert set(kernels) <= set(rows)
    for kernel in kernels:
        verdict = counters.agreement(rows[kernel])
        assert verdict["sectors"], (kernel, rows[kernel])
        for kind in ("ld", "st"):
            if (kernel, kind) in counters.KNOWN_DIFFERENCES:
                assert verdict[kind] is False, f"{kernel} {kind} now agrees: drop it from KNOWN_DIFFERENCES"
            else:
                assert verdict[kind], (kernel, kind, rows[kernel])


def test_the_committed_record_agrees_with_its_ncu_record():
    # The chapter's table (docs/results/counters_2048.json) passes the same comparison.
    record = json.loads((ROOT / "docs" / "results" / "counters_2048.json").read_text())
    assert record["shape"] == [2048, 2048, 2048] and record["dtype"] == "float32"
    compared = [r for r in counters.rows(record) if r["ncu_ld_sectors_per_request"] is not None]
    assert len(compared) == 11
    for row in compared:
        verdict = counters.agreement(row)
        assert verdict["sectors"], row
        for kind in ("ld", "st"):
            assert verdict[kind] is ((row["kernel"], kind) not in counters.KNOWN_DIFFERENCES), (row["kernel"], kind)


@pytest.mark.parametrize("args, message", [
    (["--kernels", "99:nt"], "no version 99"),
    (["--kernels", "8:xy"], "VERSION:LAYOUT"),
    (["--kernels", "grad:9"], "no sigmoid-grad version 9"),
    (["--kernels", "tune99:nt"], "no autotuning candidate 99"),
    (["--kernels", "tune0:nt", "--dtype", "float64"], "float32 only"),
    (["--shape", "200000", "200000", "200000"], "GiB of memory"),
    (["--json", "/nonexistent/folder/x.json"], "--json"),
    (["--compare", "/nonexistent.json"], "no such file"),
])
def test_bad_input_is_one_line_before_any_work(args, message):
    result = run_script("cuda/counters.py", *args, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert "building" not in result.stderr


def test_an_empty_shape_is_a_usage_error():
    # M, N or K of 0: an empty product has no requests to count; argparse's usage and one error line
    result = run_script("cuda/counters.py", "--shape", "0", "4", "4", timeout=60)
    assert result.returncode == 2 and "--shape: must be at least 1, got '0'" in result.stderr.splitlines()[-1]
    assert "Traceback" not in result.stderr and "building" not in result.stderr


def test_a_compiler_without_kernel_address_callbacks_is_refused_with_the_way_out(tmp_path, monkeypatch):
    fake = tmp_path / "c++"
    fake.write_text("#!/bin/sh\necho 'clang version 18.0.0'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("CXX", str(fake))
    assert "set CXX=g++" in counters.unavailable_reason()
    monkeypatch.setenv("CXX", str(tmp_path / "missing"))
    assert "not on the PATH" in counters.unavailable_reason()
    # (the build's name holds the compiler's: with CXX changed there is no build to fall back on)
    result = run_script("cuda/counters.py", "--kernels", "1:nt", env={"CXX": str(fake)}, timeout=60)
    assert result.returncode == 2 and "set CXX=g++" in result.stderr and "Traceback" not in result.stderr


def test_the_plain_emulation_is_not_instrumented():
    # grad_check.py cuda --emulate loads the plain build: no callback is compiled into it.
    emulated = load_script("cuda/emulated.py", "dense_cuda_emulated_plain")
    symbols = subprocess.run(["nm", "-D", str(emulated.build())], capture_output=True, text=True).stdout
    assert "emu_gemm" in symbols and "__asan" not in symbols and "cnt_" not in symbols
