"""The command-line scripts, run as a user runs them."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import modes
from conftest import REASONS, run_script

SCRIPTS = ["grad_check.py", "benchmark.py"]


def _interpreted(mode: str) -> bool:
    return mode == "triton" and modes.stage(mode).INTERPRETED


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_has_examples(script):
    result = run_script(script, "--help")
    assert result.returncode == 0
    assert "Examples:" in result.stdout and f"python {script}" in result.stdout


def test_grad_check_all_passes_and_lists_unavailable_modes():
    """Every available mode passes its five checks at a shape no tile divides (B=5, I=7, O=3);
    every other mode is listed with the reason it is not."""
    result = run_script("grad_check.py", "all", "-b", "5", "-i", "7", "-o", "3")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout and "FAIL" not in result.stdout
    for mode, reason in REASONS.items():
        if reason is None:
            assert f"PASS  {mode:<6}  gradcheck float64" in result.stdout
            assert result.stdout.count(f"PASS  {mode:<6}") == 5, mode
        else:
            assert f"SKIP  {mode:<6}  {reason}" in result.stdout


def test_grad_check_no_bias_checks_two_gradients():
    result = run_script("grad_check.py", "py", "--no-bias", "-b", "3", "-i", "2", "-o", "4")
    assert result.returncode == 0
    assert "grad weight" in result.stdout and "grad bias" not in result.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_unknown_mode_is_a_usage_error(script):
    args = ["fortran"] if script == "grad_check.py" else ["-m", "fortran"]
    result = run_script(script, *args)
    assert result.returncode == 2 and "invalid choice: 'fortran'" in result.stderr


@pytest.mark.parametrize("script", SCRIPTS)
def test_unavailable_mode_exits_2_with_the_reason(script):
    missing = [m for m, r in REASONS.items() if r is not None]
    if not missing:
        pytest.skip("every mode is available here")
    args = [missing[0]] if script == "grad_check.py" else ["-m", missing[0]]
    result = run_script(script, *args)
    assert result.returncode == 2
    assert f"mode {missing[0]!r} is not available here: {REASONS[missing[0]]}" in result.stderr


def test_bad_sizes_are_usage_errors():
    result = run_script("benchmark.py", "-m", "py", "-b", "0")
    assert result.returncode == 2 and "at least 1" in result.stderr


def test_benchmark_json_record(tmp_path):
    path = tmp_path / "bench.json"
    result = run_script("benchmark.py", "-m", "all", "-b", "8", "-i", "16", "-o", "4", "--rounds", "3",
                        "--json", str(path))
    assert result.returncode == 0, result.stderr
    record = json.loads(path.read_text())
    # The conditions every record states: the machine, the threads and CPUs, the allocator.
    assert {"device", "cpu_model", "cpus", "os_kernel", "torch", "threads", "affinity", "malloc", "dtype", "shape",
            "date", "results"} <= record.keys()
    assert record["command"] == f"python benchmark.py -m all -b 8 -i 16 -o 4 --rounds 3 --json {path}"
    assert record["shape"] == {"batch": 8, "in": 16, "out": 4} and record["dtype"] == "float32"
    names = [r["mode"] for r in record["results"]]
    # Triton under its interpreter is no speed measurement: the benchmark leaves it out.
    timed = [m for m in modes.MODES if REASONS[m] is None and not _interpreted(m)]
    assert names == ["reference"] + timed
    for r in record["results"]:
        for key in ("forward_us", "backward_us", "forward_spread_us", "backward_spread_us", "ratio_to_reference"):
            assert r[key] >= 0, (r["mode"], key)
        assert r["forward_us"] > 0 and r["backward_us"] > 0
    assert record["results"][0]["ratio_to_reference"] == 1.0
    assert "| reference |" in result.stdout


@pytest.mark.plot
@pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None, reason="matplotlib (optional) not installed")
def test_benchmark_plot(tmp_path):
    png = tmp_path / "bench.png"
    result = run_script("benchmark.py", "-m", "py", "-b", "4", "-i", "4", "-o", "4", "--rounds", "2",
                        "--dtype", "float64", "--plot", str(png))
    assert result.returncode == 0, result.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_benchmark_compile_variant(tmp_path):
    path = tmp_path / "bench.json"
    result = run_script("benchmark.py", "-m", "py", "-b", "4", "-i", "8", "-o", "4", "--rounds", "2",
                        "--compile", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert [r["mode"] for r in json.loads(path.read_text())["results"]] == ["reference", "compile", "py"]


@pytest.mark.parametrize("how", ["python -m pytest", "pytest"])
def test_pytest_runs_from_the_root_both_ways(how):
    """The folder py/ must not shadow pytest's own module named py (see modes.py)."""
    # The pytest console script is a Python file next to the interpreter; running it with
    # that interpreter is what typing `pytest` does.
    script = Path(sys.executable).with_name("pytest")
    if how == "pytest" and not script.exists():
        pytest.skip(f"no pytest script next to {sys.executable}")
    runner = ["-m", "pytest"] if how == "python -m pytest" else [str(script)]
    result = run_script(*runner, "--collect-only", "-q", "tests/test_dense.py", timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "test_gradcheck_float64" in result.stdout


def test_benchmark_roofline_record(tmp_path):
    path = tmp_path / "roof.json"
    result = run_script("benchmark.py", "-m", "all", "-b", "16", "-i", "32", "-o", "8", "--rounds", "2",
                        "--roofline", "--peak-tflops", "1", "--peak-gbs", "10", "--json", str(path))
    assert result.returncode == 0, result.stderr
    rows = json.loads(path.read_text())["roofline"]
    compiled = [m for m in modes.MODES if REASONS[m] is None and m != "py" and not _interpreted(m)]
    assert len(rows) == 2 + 2 * len(compiled)
    for r in rows:
        assert r["time_us"] > 0 and r["achieved"] > 0 and r["unit"] in ("TFLOP/s", "GB/s")
        assert r["fraction_of_peak"] == pytest.approx(r["achieved"] / r["peak"])
    assert "| kernel | µs | achieved |" in result.stdout


def test_records_keep_the_command_as_typed(tmp_path):
    """record_info.command_line: a script by its path from the repository root, a module run with -m
    by its name, arguments quoted so that shlex.split gives them back (docs/records.py runs them)."""
    (tmp_path / "probe_module.py").write_text("import record_info\nprint(record_info.command_line())\n")
    env = {"PYTHONPATH": f"{tmp_path}:{Path(__file__).resolve().parent.parent}"}
    as_module = run_script("-m", "probe_module", "--json", "a b.json", env=env)
    assert as_module.stdout.strip() == "python -m probe_module --json 'a b.json'", as_module.stderr
    import record_info

    assert record_info.command_line([str(Path(record_info.__file__).parent / "cpp" / "overhead.py"), "-b", "1"]) \
        == "python cpp/overhead.py -b 1"


# ---------------------------------------------------------------------------
# bfloat16 and float16: grad_check.py --dtype, --error-table; benchmark.py --dtype
# ---------------------------------------------------------------------------

def _grad_check(capsys, *argv: str) -> tuple[int, str]:
    """grad_check.main in this process (no interpreter to start): (exit status, stdout)."""
    import grad_check

    code = grad_check.main(list(argv))
    return code, capsys.readouterr().out


def test_grad_check_all_in_bfloat16_judges_every_mode_that_takes_it(capsys):
    code, out = _grad_check(capsys, "all", "--dtype", "bfloat16", "-b", "5", "-i", "9", "-o", "3")
    assert code == 0, out
    for mode, reason in REASONS.items():
        if torch.bfloat16 not in modes.MODE_DTYPES[mode]:
            assert f"SKIP  {mode:<6}  does not take bfloat16: it takes float32 and float64; bfloat16 runs in " \
                   f"modes py, cpp, triton, cuda" in out
        elif reason is None:
            for name in ("output", "grad x", "grad weight", "grad bias"):
                assert re.search(rf"^PASS  {mode:<6}  {name} bfloat16 vs float64 truth +max \|err\| \S+, "
                                 rf"nn.Linear's \S+, ratio \d+\.\d\d \(allowed \S+: 4× \+ 2u·size\); "
                                 rf"\d\.\d\d of the bound$", out, re.M), (mode, name, out)
    assert "gradcheck" not in out  # no finite differences in 16 bits
    assert "all checks passed" in out and "bfloat16, cpu)" in out


def test_grad_check_refuses_a_single_mode_that_does_not_take_the_type(capsys):
    import cli
    import grad_check

    with pytest.raises(cli.UserError) as e:
        grad_check.main(["ptx", "--dtype", "bfloat16"])
    assert e.value.code == 2
    assert str(e.value) == ("mode 'ptx' does not take bfloat16: it takes float32 and float64; bfloat16 runs in "
                            "modes py, cpp, triton, cuda")


def test_grad_check_emulated_cuda_in_bfloat16_on_odd_shapes(capsys):
    """Every version built for bfloat16 checked, on partial tiles at every edge (the TMA versions at
    the next multiples of 8, as they say); the others skipped."""
    import grad_check

    emu = grad_check.load_emulation()
    if emu.unavailable_reason():
        pytest.skip(emu.unavailable_reason())
    code, out = _grad_check(capsys, "cuda", "--emulate", "--dtype", "bfloat16", "-b", "37", "-i", "70", "-o", "33")
    assert code == 0, out
    for v in emu.versions():
        if v in emu.versions(torch.bfloat16):
            assert len(re.findall(rf"^PASS  v{v} +\S.* bfloat16 vs float64 truth", out, re.M)) == 4, (v, out)
            # a TMA version, whose rows are whole 16 bytes, at the next multiples of 8: still partial tiles
            tma = (f"v{v}: takes its operands through TMA, whose rows are whole 16-byte multiples: "
                   "checked at B=40 in=72 out=40")
            assert (tma in out) == (emu.row_multiple(v, torch.bfloat16) == 8), (v, out)
        else:
            assert re.search(rf"^SKIP  v{v} +does not take bfloat16: built for float32", out, re.M), (v, out)
    assert 0 in emu.versions(torch.bfloat16) and "FAIL" not in out


def test_grad_check_judges_the_tensor_core_float32_versions_by_the_rule(capsys):
    """v25 (TF32) against a TF32 GEMM's error, which float32's rule would reject; v26 and v34
    (split-TF32) by float32's rule itself: none of them takes float64, so none is gradchecked."""
    import grad_check

    emu = grad_check.load_emulation()
    if emu.unavailable_reason():
        pytest.skip(emu.unavailable_reason())
    for v, says in ((25, "float32 in TF32 vs float64 truth"), (26, "float32 vs float64 truth"),
                    (34, "float32 vs float64 truth")):
        code, out = _grad_check(capsys, "cuda", "--emulate", "--kernel", str(v), "-b", "9", "-i", "200", "-o", "12")
        assert code == 0 and len(re.findall(rf"^PASS  v{v} +\S.* {says}", out, re.M)) == 4, out
        assert "gradcheck" not in out and ("TF32 nn.Linear's" in out) == (v == 25), out
    as_float32 = grad_check.low_precision_checks("v25", emu.dense(25), 9, 200, 12, "cpu", True, 0, torch.float32)
    assert not all(check.passed for check in as_float32)


def test_error_table_measures_every_variant_in_three_types():
    import grad_errors

    record = grad_errors.error_record(4, 9, 3)
    assert record["benchmark"] == "errors" and record["dtypes"] == ["float32", "bfloat16", "float16"]
    variants = list(dict.fromkeys(r["variant"] for r in record["results"]))
    assert variants[0] == "nn.Linear"
    assert [v for v in variants if v in modes.MODES] == [m for m in modes.MODES if REASONS[m] is None]
    for r in record["results"]:
        if "error" in r:
            continue
        assert set(r["errors"]) == {"output", "grad x", "grad weight", "grad bias"}
        assert all(0 <= e <= 1 for e in r["of_bound"].values()), r
        if r["variant"] == "nn.Linear":
            assert all(q == 1.0 or e == 0 for q, e in zip(r["ratio_to_linear"].values(), r["errors"].values()))
        if r["dtype"] != "float32":
            assert all(r["passed"].values()), r
    table = grad_errors.error_table(record)
    assert table.splitlines()[0].startswith("| variant | float32: output | gradients | bfloat16: output |")
    for v in variants:
        assert f"| {v} |" in table
    assert "| u, the unit roundoff | 6.0e-08 |  | 3.9e-03 |  | 4.9e-04 |  |" in table
    assert "B=4 I=9 O=3, seed 0" in table


@pytest.mark.slow
def test_error_table_script_writes_its_record(tmp_path):
    path = tmp_path / "errors.json"
    result = run_script("grad_check.py", "all", "--error-table", "-b", "3", "-i", "5", "-o", "2", "--json", str(path))
    assert result.returncode == 0, result.stderr[-2000:]
    record = json.loads(path.read_text())
    assert record["command"] == f"python grad_check.py all --error-table -b 3 -i 5 -o 2 --json {path}"
    assert record["shape"] == {"batch": 3, "in": 5, "out": 2} and "| nn.Linear |" in result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_benchmark_in_16_bits_times_every_cpu_mode_against_the_reference(tmp_path, dtype):
    path = tmp_path / "bench.json"
    result = run_script("benchmark.py", "-m", "all", "--dtype", dtype, "-b", "8", "-i", "16", "-o", "4",
                        "--rounds", "3", "--json", str(path))
    assert result.returncode == 0, result.stderr
    record = json.loads(path.read_text())
    assert record["dtype"] == dtype
    timed = [m for m in modes.MODES if REASONS[m] is None and not _interpreted(m)]
    assert [r["mode"] for r in record["results"]] == ["reference"] + timed
    assert f"does not take {dtype}" in result.stderr  # ptx
