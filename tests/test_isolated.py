"""cuda/isolated.py away from a GPU: children that end each way a GPU version can (the same bits,
a difference, a sticky CUDA error, a crash, a hang, a deadline) are each recorded as such and cost
that child alone; which versions a GPU has run comes from the committed records; a version is timed
only if its own exact check passed, by its number; the sanitizers cover every never-run kernel."""

from __future__ import annotations

import json
import sys
import time

import pytest

from conftest import ROOT, load_script

iso = load_script("cuda/isolated.py")


def child(code: str, name: str, limit_s: float = 20) -> object:
    return iso.Unit(name, [sys.executable, "-c", code], limit_s)


SAME = 'import json; print("RESULT " + json.dumps({"status": "SAME", "compared": 3, "differences": [], "missing": []}))'
DIFF = ('import json, sys; print("RESULT " + json.dumps({"status": "DIFF", "compared": 3, "differences": '
        '["v3 f64 nn M=33 N=17 K=65: first at [4, 2]: 1.0 against the expected 2.0"], "missing": []})); sys.exit(1)')
FAULT = ('import json, sys; print("RESULT " + json.dumps({"status": "FAULT", "compared": 1, "differences": [], '
         '"missing": [], "fault": "v33 bf16 nt M=72 N=40 K=136: CUDA error: an illegal memory access was '
         'encountered"})); sys.exit(3)')
TRACEBACK = 'import sys; print("RuntimeError: CUDA error: unspecified launch failure"); sys.exit(1)'
CRASH = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
HANG = ("import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('spinning', flush=True); "
        "time.sleep(60)")


@pytest.mark.slow  # seconds of real waiting on children and limits
def test_each_way_a_child_ends_is_recorded_as_such_and_costs_that_child_alone(monkeypatch):
    """Side by side, as the lease runs them: the fault, the crash and the hang do not stop the
    others, and each says which and how."""
    monkeypatch.setattr(iso, "GRACE_S", 0.5)  # the hung child ignores SIGINT, as one in a CUDA wait does
    lines = []
    units = [child(FAULT, "v33"), child(HANG, "v32", limit_s=1.5), child(CRASH, "v34"), child(SAME, "v3"),
             child(DIFF, "v5"), child(TRACEBACK, "v21"), child(SAME, "candidate 0")]
    started = time.monotonic()
    got = iso.run_units("exact", units, jobs=4, deadline_s=60, say=lines.append)
    assert time.monotonic() - started < 15
    status = {name: (o.status, o.detail) for name, o in got.items()}
    assert status["v33"] == ("FAULT", "v33 bf16 nt M=72 N=40 K=136: CUDA error: an illegal memory access was "
                                      "encountered")
    assert status["v32"] == ("HANG", "still running at its limit: killed")
    assert status["v34"] == ("FAULT", "killed by SIGSEGV")
    assert status["v3"] == ("SAME", "3 entries, bit for bit") and status["candidate 0"][0] == "SAME"
    assert status["v5"] == ("DIFF", "v3 f64 nn M=33 N=17 K=65: first at [4, 2]: 1.0 against the expected 2.0")
    assert status["v21"] == ("FAULT", "RuntimeError: CUDA error: unspecified launch failure")
    assert "[v32] spinning" in lines and list(got) == [u.name for u in units]


@pytest.mark.slow  # seconds of real waiting on children and limits
def test_a_child_the_deadline_does_not_reach_is_not_run_and_one_it_stops_is_not_a_hang(monkeypatch):
    monkeypatch.setattr(iso, "GRACE_S", 0.5)
    monkeypatch.setattr(iso, "START_S", 0.2)
    units = [child(HANG, "v31", limit_s=30), child(SAME, "v3")]
    got = iso.run_units("kernels", units, jobs=1, deadline_s=1.5, say=lambda s: None)
    assert (got["v31"].status, got["v31"].detail) == ("NOT RUN", "cut by the run's deadline")
    assert got["v3"].status == "NOT RUN" and "left of the run's 2 s" in got["v3"].detail


@pytest.mark.parametrize("kind, code, tail, status", [
    ("kernels", 0, ["PASS  bfloat16 v33"], "PASSED"),
    ("kernels", 1, ["FAIL  bfloat16 v33: {'rel_error': 0.5, 'ok': False} (not timed)"], "FAILED"),
    ("sanitize", 9, ["========= Invalid __global__ write of size 4 bytes", "========= ERROR SUMMARY: 1 error"],
     "ERRORS"),
    ("sanitize", 0, ['RESULT {"status": "SAME", "compared": 3}'], "CLEAN"),
    ("exact", 2, ["exact_check.py: no GPU here"], "FAILED"),
])
def test_the_other_endings_are_named(kind, code, tail, status):
    assert iso.classify(kind, code, tail, cut=False)[0] == status


def test_the_committed_records_say_v1_to_v9_ran_in_float32_only():
    """What the brief of the lease says today: only chapter 3's v1-v9 in float32 have a GPU's check."""
    assert iso.confirmed() == {(v, "f32") for v in range(1, 10)}


def test_never_run_versions_go_first(tmp_path):
    """Nothing confirmed: the catalogue's order, version 0 first. v1-v9 confirmed in float32: every
    version with no confirmed type before them (their float64 never ran: still never run)."""
    every = [name for name, _ in iso.never_run_first(tmp_path)]
    assert every[:3] == ["v0", "v1", "v2"] and all(never for _, never in iso.never_run_first(tmp_path))
    (tmp_path / "cuda_gpu_h100.json").write_text(json.dumps({"gpu": {}, "dtype": "float32", "check": {"rows": [
        {"version": v, "ok": True} for v in range(1, 10)] + [{"version": 10, "ok": False}]}}))
    order = iso.never_run_first(tmp_path)
    names = [name for name, _ in order]
    assert names.index("v35") < names.index("candidate 7") < names.index("v1")
    assert names[:3] == ["v0", "v10", "v11"] and dict(order)["v1"] is True
    (tmp_path / "cuda_gpu_h100.json").write_text(json.dumps({"gpu": {}, "dtype": "float32", "check": {"rows": [
        {"version": 2, "ok": True}]}}))
    (tmp_path / "cuda_gpu_h200.json").write_text(json.dumps({"gpu": {}, "dtype": "float64", "check": {"rows": [
        {"version": 2, "ok": True}]}}))
    order = iso.never_run_first(tmp_path)
    assert order[-1] == ("v2", False) and iso.confirmed(tmp_path) == {(2, "f32"), (2, "f64")}


def test_a_version_is_timed_only_if_its_own_exact_check_passed():
    """One DIFF, one FAULT, one HANG among the never-run versions: the others are still timed, each
    by its number in a process of its own; never version 0."""
    new = iso.never_timed()
    assert new[:3] == [10, 11, 12] and 0 not in new and {21, 25, 33, 34, 35} <= set(new) and 3 not in new
    record = {"units": {f"v{v}": {"status": "SAME"} for v in new}}
    record["units"].update({"v21": {"status": "FAULT"}, "v33": {"status": "DIFF"}, "v10": {"status": "HANG"}})
    del record["units"]["v35"]  # the deadline came first
    chosen, skipped = iso.timed_versions(record, new)
    assert chosen == [v for v in new if v not in (10, 21, 33, 35)]
    assert skipped == {"v10": "its exact check was HANG", "v21": "its exact check was FAULT",
                       "v33": "its exact check was DIFF", "v35": "its exact check was NOT RUN"}
    units = iso.kernel_units(chosen, list(iso.APPLIES), 10, ROOT, 45)
    assert [u.name for u in units] == [f"v{v}" for v in chosen]
    for u, v in zip(units, chosen):
        assert u.argv[u.argv.index("--kernel") + 1] == str(v) and u.argv[1] == "cuda/bench_gpu.py"


@pytest.mark.parametrize("version, parts", [(10, ["goals"]), (11, ["goals", "bf16", "goals16"]),
                                            (25, ["small", "tf32"]), (34, ["small", "tf32"]),
                                            (33, ["roof", "goals16"]), (21, ["roof", "goals16"])])
def test_each_version_takes_the_timing_parts_that_apply_to_it(version, parts):
    assert iso.parts_for(version, ["goals", "small", "bf16", "roof", "tf32", "goals16"]) == parts
    assert iso.parts_for(version, ["gemm"]) == (["gemm"] if version in (10, 11) else [])


def test_the_sanitizers_cover_every_never_run_version_and_candidate_first():
    """memcheck, racecheck and synccheck over every version and candidate (the tensor-core ones and
    the candidates too, not chapter 3's alone), the never-run ones first, each in its own process."""
    order = iso.never_run_first()
    for tool in iso.TOOLS:
        units = iso.sanitize_units(order, tool, 90)
        assert [u.name for u in units] == [name for name, _ in order]
        assert {"v12", "v21", "v26", "v33", "v34", "v35", "candidate 0", "candidate 7"} <= {u.name for u in units}
        assert units[0].argv[:3] == ["compute-sanitizer", "--tool", tool] and "--version" in units[0].argv
    assert set(iso.TOOLS) == {"memcheck", "racecheck", "synccheck"}
    names = [name for name, _ in order]
    assert max(names.index(f"v{v}") for v in (10, 21, 35)) < min(names.index(f"v{v}") for v in range(1, 10))


def test_the_run_ends_before_the_plans_limit_for_its_part():
    assert iso.deadline(None, {iso.PART_LIMIT_ENV: "78"}) == 78 - iso.MARGIN_S
    assert iso.deadline(30, {iso.PART_LIMIT_ENV: "78"}) == 30 and iso.deadline(None, {}) == 3600
    assert iso.MARGIN_S > iso.GRACE_S


def test_kernels_refuses_to_run_without_an_exact_record(capsys):
    with pytest.raises(SystemExit) as stopped:
        iso.main(["kernels"])
    assert stopped.value.code == 2 and "only if its own exact check passed" in capsys.readouterr().err


def test_the_record_says_which_version_ended_how_and_is_written_as_they_end(tmp_path, monkeypatch, capsys):
    """main(): each version's ending in the record, in the order they ran, never-run first; the
    exit status 1 names the versions that failed; a version the deadline did not reach is NOT RUN."""
    monkeypatch.setattr(iso, "_header", lambda: {"device": "test"})
    monkeypatch.setattr(iso, "exact_units", lambda order, limit, expected=None: [
        child(SAME, "v33"), child(FAULT, "v34"), child(SAME, "v3")])
    path = tmp_path / "exact.json"
    assert iso.main(["exact", "--json", str(path), "--jobs", "2"]) == 1
    record = json.loads(path.read_text())
    assert record["order"] == ["v33", "v34", "v3"] and record["never_run"][0] == "v0"
    assert {n: u["status"] for n, u in record["units"].items()} == {"v33": "SAME", "v34": "FAULT", "v3": "SAME"}
    assert "CUDA error: an illegal memory access" in record["units"]["v34"]["detail"]
    assert capsys.readouterr().out.strip().splitlines()[-1] == "exact: FAILED: v34 (0 not run)"
    assert not list(tmp_path.glob("*.tmp"))


def test_a_child_that_cannot_start_fails_alone():
    units = [iso.Unit("v21", ["no-such-compute-sanitizer", "--tool", "memcheck"], 20), child(SAME, "v22")]
    got = iso.run_units("sanitize", units, jobs=2, deadline_s=60, say=lambda s: None)
    assert (got["v21"].status, got["v21"].detail) == ("FAILED", "no-such-compute-sanitizer: cannot start (No such "
                                                                 "file or directory)")
    assert got["v22"].status == "CLEAN"


def test_a_sanitizers_first_report_is_named_however_long_its_output():
    """compute-sanitizer prints its first error early and much after it: the record names that one."""
    report = ("import sys; print('========= Invalid __global__ read of size 16 bytes at dense_gemm_v33_nt_bf16'); "
              "[print(f'=========     at {i}') for i in range(300)]; print('========= ERROR SUMMARY: 9 errors'); "
              "sys.exit(9)")
    got = iso.run_units("sanitize", [child(report, "v33")], jobs=1, deadline_s=60, say=lambda s: None)
    assert (got["v33"].status, got["v33"].detail) == (
        "ERRORS", "========= Invalid __global__ read of size 16 bytes at dense_gemm_v33_nt_bf16")


@pytest.mark.parametrize("roofs, status, roof_part", [(CRASH, "FAULT", False), ("print('PASS  roof')", "PASSED", True)])
def test_the_roofs_run_alone_first_and_a_faulting_roof_is_not_blamed_on_the_versions(tmp_path, monkeypatch, roofs,
                                                                                      status, roof_part):
    """The roof loops never ran on a GPU either: their own process comes first; where it fails, the
    tensor-core versions are still timed, without the roof part (not each recorded as a fault)."""
    monkeypatch.setattr(iso, "_header", lambda: {"device": "test"})
    monkeypatch.setattr(iso, "roofs_unit", lambda rounds, folder, limit: child(roofs, iso.ROOFS))
    asked = []

    def units(versions, requested, rounds, folder, limit, roofs_ran=True):
        asked.append(roofs_ran)
        return [iso.Unit("v33", [sys.executable, "-c", "import sys; print(sys.argv[1:])",
                                 *[p for p in iso.parts_for(33, requested) if roofs_ran or p != "roof"]], limit)]
    monkeypatch.setattr(iso, "kernel_units", units)
    exact = tmp_path / "exact.json"
    exact.write_text(json.dumps({"units": {"v33": {"status": "SAME"}}}))
    path = tmp_path / "kernels.json"
    assert iso.main(["kernels", "--exact", str(exact), "--json", str(path)]) == (1 if status == "FAULT" else 0)
    record = json.loads(path.read_text())
    assert record["order"] == [iso.ROOFS, "v33"] and record["units"][iso.ROOFS]["status"] == status
    assert record["units"]["v33"]["status"] == "PASSED" and asked == ([True, False] if status == "FAULT" else [True])


def test_the_roofs_process_times_the_roofs_alone():
    unit = iso.roofs_unit(10, ROOT, 45)
    assert unit.argv[1:5] == ["cuda/bench_gpu.py", "roof", "--kernel", "0"] and unit.name == iso.ROOFS
