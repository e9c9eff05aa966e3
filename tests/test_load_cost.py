"""ptx/load_cost.py: fresh processes per case (cold, warm, disabled), medians, the record.

The measurement runs for real: main() starts its probes, one process each, empties and reuses
the compute cache, and takes the medians. Only the GPU's parts are stood in for: the probe's
code (PROBE, which builds the stage and times its first call), by a stand-in that plays the
driver's compute cache from the environment it is given, and the GPU's name and driver. (The
one-line error without a GPU: tests/test_static.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import modes
import record_info
from conftest import load_script

HEADER = {"device": "NVIDIA H100", "os_kernel": "Linux 6.1", "malloc": "retain", "torch": "2.11.0", "threads": 16,
          "dtype": "float32", "date": "2026-01-02T03:04:05+00:00", "command": "python ptx/load_cost.py --repeats 3",
          "gpu": {"sm_count": 132, "nvidia_smi": {"clocks.max.sm": "1980 MHz", "driver_version": "580.1"}}}

# The stand-in probe. Like the driver, it compiles (slow first call) unless the cache folder
# holds this stage's code, and writes it there unless CUDA_CACHE_DISABLE=1. It reports a first
# call of BASE + SPREAD[k] ms (later calls 0.25 + SPREAD[k] / 8) on the k-th process that saw
# the same stage and case, so that of three processes only the median gives BASE + 3 (and 0.625;
# exact in binary), and it logs its process id and the case it saw. It prints a line before its
# result, as torch's warnings may.
STAND_IN = r"""
import json, os, sys
from pathlib import Path
mode = sys.argv[1]
cache = Path(os.environ["CUDA_CACHE_PATH"])
disabled = os.environ.get("CUDA_CACHE_DISABLE") == "1"
code = cache / f"{mode}.bin"
case = "disabled" if disabled else "warm" if code.exists() else "cold"
if not disabled and not code.exists():
    code.write_bytes(b"\0" * {"ptx": 4096, "cuda": 1024}[mode])
log = Path(os.environ["STAND_IN_LOG"])
seen = log.read_text().splitlines() if log.exists() else []
k = sum(line.split()[1:] == [mode, case] for line in seen)
with log.open("a") as f:
    f.write(f"{os.getpid()} {mode} {case}\n")
BASE = {"ptx": {"cold": 500.0, "warm": 40.0, "disabled": 480.0}, "cuda": {"cold": 60.0, "warm": 20.0, "disabled": 55.0}}
SPREAD = [9.0, 3.0, 0.0, 100.0]
print("a warning on stdout")
print(json.dumps({"first_ms": BASE[mode][case] + SPREAD[k], "next_ms": 0.25 + SPREAD[k] / 8}))
"""

# The medians (BASE + 3) and the bytes the cache holds after a cold and a warm start.
WANT = [{"mode": mode, "case": case, "first_ms": first + 3.0, "next_ms": 0.625, "runs": 3, "cache_bytes": size}
        for mode, size, cases in (("ptx", 4096, {"cold": 500.0, "warm": 40.0, "disabled": 480.0}),
                                  ("cuda", 1024, {"cold": 60.0, "warm": 20.0, "disabled": 55.0}))
        for case, first in cases.items()]


@pytest.fixture
def cost(monkeypatch, tmp_path):
    """ptx/load_cost.py with the stand-in probe, on a machine that seems to have a GPU."""
    cost = load_script("ptx/load_cost.py")
    monkeypatch.setattr(cost, "PROBE", STAND_IN)
    monkeypatch.setenv("STAND_IN_LOG", str(tmp_path / "probes.log"))
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "1")  # the user's setting: each case sets its own
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(modes, "build", lambda mode: None)
    monkeypatch.setattr(cost, "driver_version", lambda: 13000)
    monkeypatch.setattr(record_info, "record_header", lambda device, dtype: HEADER)
    return cost


def test_each_case_in_fresh_processes_and_the_record_of_their_medians(cost, tmp_path, capsys):
    assert cost.main(["--repeats", "3", "--json", str(tmp_path / "r.json")]) == 0
    # every probe a process of its own; every cold start found an empty cache
    probes = [line.split() for line in (tmp_path / "probes.log").read_text().splitlines()]
    assert len({pid for pid, _, _ in probes}) == len(probes) == 18
    assert [(mode, case) for _, mode, case in probes] == [
        (mode, case) for mode in ("ptx", "cuda") for _ in range(3) for case in ("cold", "warm", "disabled")]
    record = json.loads((tmp_path / "r.json").read_text())
    assert record == {**HEADER, "benchmark": "ptx_load_cost", "driver": "13.0", "results": WANT}
    out = capsys.readouterr().out.strip().splitlines()
    assert "| ptx | cold | 503.0 | 0.625 |" in out and "| cuda | warm | 23.0 | 0.625 |" in out
    assert out[-1] == ("NVIDIA H100 (132 SMs, max SM clock 1980 MHz, driver 580.1), torch 2.11.0, CUDA driver API "
                       "13.0, float32, median of 3 fresh processes each, 2026-01-02T03:04:05+00:00: "
                       "`python ptx/load_cost.py --repeats 3`")


def test_a_failed_probe_stops_the_measurement_with_its_error(cost, monkeypatch, tmp_path):
    monkeypatch.setattr(cost, "PROBE", "import sys; sys.exit('the stage did not build')")
    with pytest.raises(SystemExit, match="the ptx stage's probe failed:\nthe stage did not build"):
        cost.main(["--repeats", "1", "--json", str(tmp_path / "r.json")])
    assert not Path(tmp_path / "r.json").exists()
