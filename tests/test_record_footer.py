"""The line under every record's table (record_info.footer): written once, used by every script
whose records a chapter renders, and the same text for the committed records."""

from __future__ import annotations

import json

import pytest

import benchmark
import record_info
from conftest import ROOT, load_script

RESULTS = ROOT / "docs" / "results"
CPU = {"device": "cpu: Some CPU", "os_kernel": "Linux 6.1", "malloc": "retain (M_MMAP_THRESHOLD)", "torch": "2.13.0",
       "threads": 2, "dtype": "float32", "date": "2026-01-02T03:04:05+00:00", "command": "python benchmark.py"}
GPU = {"device": "NVIDIA H100", "os_kernel": "Linux 6.1", "malloc": "retain", "torch": "2.11.0", "threads": 16,
       "dtype": "float32", "date": "2026-01-02T03:04:05+00:00", "command": "python cuda/bench_gpu.py gemm",
       "gpu": {"sm_count": 132, "nvidia_smi": {"clocks.max.sm": "1980 MHz", "driver_version": "580.1"}}}


def test_a_cpu_record_names_its_conditions_and_threads():
    assert record_info.footer(CPU, "B=1 I=2 O=3", "20 rounds") == (
        "cpu: Some CPU, Linux 6.1, malloc retain, torch 2.13.0, 2 threads, float32, B=1 I=2 O=3, 20 rounds, "
        "2026-01-02T03:04:05+00:00: `python benchmark.py`")
    assert record_info.footer(CPU, day=True).endswith("float32, 2026-01-02: `python benchmark.py`")


def test_a_gpu_record_names_its_card_not_the_hosts_threads():
    assert record_info.footer(GPU, "TF32 off", card=True, sep="; ") == (
        "NVIDIA H100 (132 SMs, max SM clock 1980 MHz, driver 580.1), torch 2.11.0, float32, TF32 off; "
        "2026-01-02T03:04:05+00:00: `python cuda/bench_gpu.py gemm`")
    assert record_info.footer(GPU, tools=["Triton 3.6.0"]).startswith(
        "NVIDIA H100, torch 2.11.0, Triton 3.6.0, float32, ")


def test_a_record_without_its_command_is_a_key_error():
    """docs/render.py turns a KeyError into one line naming the marker."""
    with pytest.raises(KeyError):
        record_info.footer({k: v for k, v in CPU.items() if k != "command"})


def _renderers() -> list[tuple[str, object]]:
    """(committed record, the function a chapter renders it with), one per script that writes records."""
    cuda = load_script("cuda/gpu_tables.py")  # cuda/bench_gpu.py's records' tables
    tiles = load_script("tiles/bench_gpu.py")
    overhead = load_script("cpp/overhead.py")
    return [("cpu_1024.json", benchmark.table), ("cpu_sweep.json", benchmark.sweep_summary),
            ("cpu_sweep.json", benchmark.sweep_table), ("cpp_overhead.json", overhead.render),
            ("triton_gpu_h200_4096.json", tiles.table), ("cuda_gpu_h100.json", cuda.gemm_table),
            ("ptx_gpu_h100.json", cuda.ptx_table), ("ncu_gemm_h200.json", cuda.ncu_table)]


@pytest.mark.parametrize("index", range(8))
def test_every_table_ends_with_the_one_footer(index, monkeypatch):
    name, render = _renderers()[index]
    record = json.loads((RESULTS / name).read_text())
    monkeypatch.setattr(record_info, "footer", lambda record, *a, **k: "THE-FOOTER")
    assert "THE-FOOTER" in render(record), f"{render.__qualname__} writes its own footer"
    assert record["command"] not in render(record), f"{render.__qualname__} writes the command itself"
