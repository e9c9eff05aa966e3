"""ptx/load_cost.py's record: benchmark.py's header and footer, like every other timing record.

The timing itself needs a GPU (tests/test_static.py checks the one-line error without one);
here the GPU's parts are stood in for, so that what main() writes can be checked anywhere."""

from __future__ import annotations

import json

import torch

import benchmark
import modes
from conftest import load_script

HEADER = {"device": "NVIDIA H100", "os_kernel": "Linux 6.1", "malloc": "retain", "torch": "2.11.0", "threads": 16,
          "dtype": "float32", "date": "2026-01-02T03:04:05+00:00", "command": "python ptx/load_cost.py --repeats 2",
          "gpu": {"sm_count": 132, "nvidia_smi": {"clocks.max.sm": "1980 MHz", "driver_version": "580.1"}}}
ROWS = [{"mode": m, "case": c, "first_ms": 1.0, "next_ms": 0.02, "runs": 2, "cache_bytes": 0}
        for m in ("ptx", "cuda") for c in ("cold", "warm", "disabled")]


def test_the_record_has_the_shared_header_and_its_table_the_shared_footer(monkeypatch, tmp_path, capsys):
    cost = load_script("ptx/load_cost.py")
    headers = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(modes, "build", lambda mode: None)
    monkeypatch.setattr(cost, "driver_version", lambda: 13000)
    monkeypatch.setattr(cost, "measure", lambda repeats: ROWS)
    monkeypatch.setattr(benchmark, "record_header", lambda device, dtype: headers.append((device, dtype)) or HEADER)
    assert cost.main(["--repeats", "2", "--json", str(tmp_path / "r.json")]) == 0
    record = json.loads((tmp_path / "r.json").read_text())
    assert headers == [("cuda", torch.float32)]
    assert record == {**HEADER, "benchmark": "ptx_load_cost", "driver": "13.0", "results": ROWS}
    footer = capsys.readouterr().out.strip().splitlines()[-1]
    assert footer == ("NVIDIA H100 (132 SMs, max SM clock 1980 MHz, driver 580.1), torch 2.11.0, CUDA driver API "
                      "13.0, float32, median of 2 fresh processes each, 2026-01-02T03:04:05+00:00: "
                      "`python ptx/load_cost.py --repeats 2`")
    monkeypatch.setattr(benchmark, "footer", lambda record, *a, **k: "THE-FOOTER")
    assert cost.table(record).endswith("\nTHE-FOOTER"), "load_cost.table writes its own footer"
