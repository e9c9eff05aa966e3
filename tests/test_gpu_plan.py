"""The GPU machine's plan (.ci/gpu, .ci/gpu.py), checked without a GPU: the selections against the
lease's limits, the dry run and each mistake it must catch, and the runner (exit status, summary
last, limits, deadline, records packed for the trip back) on parts that need no GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from conftest import ROOT


def _load():
    spec = importlib.util.spec_from_file_location("gpu_plan", ROOT / ".ci" / "gpu.py")
    module = sys.modules["gpu_plan"] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


plan = _load()
Part = plan.Part
LEASE_COMMAND_S = 600  # one command of a lease at most; the first call within 5 minutes, any other within 8


def gpu_script(*args: str) -> subprocess.CompletedProcess:
    """bash .ci/gpu ARGS with this interpreter first on PATH, as in an activated venv."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)


def selection(name: str) -> list:
    return plan.resolve([name], plan.parts())[0]


# ---------------------------------------------------------------------------------------
# The selections as written
# ---------------------------------------------------------------------------------------
def test_every_selection_fits_the_lease_and_passes_the_static_checks():
    assert plan.DEADLINES["smoke"] <= 5 * 60 and plan.DEADLINES["default"] <= 8 * 60
    for name in plan.SELECTIONS:
        chosen = selection(name)
        assert sum(p.limit_s for p in chosen) <= plan.DEADLINES[name] < LEASE_COMMAND_S, name
        assert [p.name for p in chosen[:2]] == ["env", "build"], f"{name}: a fresh machine holds no build"
        assert plan.plan_problems(chosen, plan.DEADLINES[name]) == [], name


def test_the_smoke_selection_checks_before_anything_is_timed():
    smoke = selection("smoke")
    assert not any(p.records for p in smoke)
    pytest_part = next(p for p in smoke if "pytest" in p.argv)
    assert pytest_part.argv[pytest_part.argv.index("-m", 3) + 1] == "gpu and not slow"
    assert any(p.argv[1:3] == ("cuda/bench_gpu.py", "check") for p in smoke)


def test_timings_run_only_after_a_check_on_the_gpu():
    """The GEMM timings check every version in the same process first; the Triton timings run
    only once tiles/bench_gpu.py --smoke has checked every line on the GPU."""
    every = plan.parts()
    for name in plan.SELECTIONS:
        for p in selection(name):
            if p.argv[1:2] == ("tiles/bench_gpu.py",) and "--json" in p.argv:
                assert any("--smoke" in every[n].argv for n in p.needs), p.name
            if p.argv[1:2] == ("cuda/bench_gpu.py",) and "gemm" in p.argv:
                assert p.argv.index("check") < p.argv.index("gemm"), p.name


def test_every_gpu_record_a_chapter_shows_is_retaken_under_its_name():
    """The plan writes each committed GPU record at the path the chapters cite (on that card)."""
    written = {r.replace(plan.TAG, tag).removeprefix("docs/results/")
               for p in plan.parts().values() for r in p.records for tag in ("h100", "h200")}
    gpu_records = [p.name for p in (ROOT / "docs" / "results").glob("*.json") if "gpu" in json.loads(p.read_text())]
    assert gpu_records and not set(gpu_records) - written, sorted(set(gpu_records) - written)


@pytest.mark.parametrize("name, tag", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla V100-SXM2-16GB", "v100"),
                                       ("Some GPU", "gpu")])
def test_device_tag(name, tag):
    assert plan.device_tag(name) == tag


# ---------------------------------------------------------------------------------------
# The mistakes the dry run catches
# ---------------------------------------------------------------------------------------
def test_limits_that_cannot_fit_the_deadline_are_caught():
    smoke = selection("smoke")
    total = sum(p.limit_s for p in smoke)
    assert any("over the" in m for m in plan.plan_problems(smoke, total - 1))
    assert not plan.plan_problems(smoke, total)


def test_an_ignored_input_that_no_earlier_part_makes_is_caught():
    time_parts = selection("time")
    without_regen = [p for p in time_parts if p.name != "ptx-regen"]
    problems = plan.plan_problems(without_regen, 480)
    assert any("ptx/generated/dense_kernels.ptx" in m and "a fresh machine lacks it" in m for m in problems), problems
    assert any("needs 'ptx-regen'" in m for m in problems)
    regen_last = without_regen + [p for p in time_parts if p.name == "ptx-regen"]
    assert any("a fresh machine lacks it" in m for m in plan.plan_problems(regen_last, 480))


@pytest.mark.parametrize("record, json_path, says", [
    ("/tmp/x.json", "/tmp/x.json", "not a plain docs/results/<name>.json"),
    ("docs/results/sub/x.json", "docs/results/sub/x.json", "not a plain docs/results/<name>.json"),
    ("docs/results/x.json", "docs/results/y.json", "not written by its command"),
])
def test_a_record_outside_docs_results_or_not_written_by_its_command_is_caught(record, json_path, says):
    part = Part("r", 1, ("python", "benchmark.py", "--json", json_path), "", records=(record,))
    assert any(says in m for m in plan.plan_problems([part], 10))


@pytest.mark.parametrize("argv, says", [
    (("bash", "-c", "make | tail -5"), "inline shell"),
    (("bash", "-c", "a & b & wait"), "inline shell"),
    (("sh", "-c", "make || true"), "inline shell"),
    (("perl", "x.pl"), "unexpected program"),
])
def test_a_command_that_could_hide_a_failure_is_caught(argv, says):
    assert any(says in m for m in plan.plan_problems([Part("x", 1, argv, "")], 10))


def test_a_script_without_set_e_is_caught(tmp_path):
    script = tmp_path / "s.sh"
    script.write_text("#!/usr/bin/env bash\nfalse\necho done\n")
    assert any("lacks 'set -e'" in m for m in plan.plan_problems([Part("s", 1, ("bash", str(script)), "")], 10))
    assert not plan.plan_problems([Part("s", 1, ("bash", "ptx/regen.sh"), "")], 10)


@pytest.mark.slow  # subprocesses that import torch
@pytest.mark.parametrize("argv, says", [
    (("python", "benchmark.py", "-m", "cuda", "--no-such-flag"), "--no-such-flag is not among its options"),
    (("python", "benchmark.py", "-m", "fortran"), "refuses its arguments"),
    (("python", "no_such_script.py"), "no such script"),
    (("python", "-m", "pytest", "-m", "no_such_marker"), "collects no tests"),
])
def test_a_command_that_would_stop_at_once_is_caught(argv, says):
    assert any(says in m for m in plan.command_problems(Part("x", 1, argv, "")))


@pytest.mark.slow
def test_the_dry_run_checks_every_selection():
    result = gpu_script("--dry-run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for name in plan.SELECTIONS:
        assert f"\n{name}: " in "\n" + result.stdout
    assert "FAIL" not in result.stdout and "dry run: every part checked" in result.stdout


@pytest.mark.slow
def test_the_gpu_tests_leave_out_slow_ones_and_items_the_ptx_stage_cannot_run():
    """pytest -m gpu would take in the slow multi-process tests; and tests/test_cuda.py's items
    that cross the ptx stage with a version it does not carry would each only skip."""
    argv = next(p for p in selection("smoke") if "pytest" in p.argv).command()

    def collect(*args: str) -> set[str]:
        got = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        return {line for line in got.stdout.splitlines() if "::" in line}

    k = argv[argv.index("-k") + 1]
    kept, every_gpu, slow = collect("-m", "gpu and not slow", "-k", k), collect("-m", "gpu"), collect("-m", "slow")
    assert kept and not kept & slow
    carried = plan._constant(ROOT / "tests" / "test_cuda.py", "PTX_VERSIONS")
    would_skip = {t for t in every_gpu - slow if t.startswith("tests/test_cuda.py::")
                  and (m := re.search(r"[-\[](\d+)-ptx\]$", t)) and int(m.group(1)) not in carried}
    assert would_skip and every_gpu - slow - kept == would_skip


# ---------------------------------------------------------------------------------------
# The runner, on parts that need no GPU
# ---------------------------------------------------------------------------------------
@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A stand-in repository: the parts run in it and write their records under its docs/results."""
    root = tmp_path / "repo"
    (root / "docs" / "results").mkdir(parents=True)
    (root / "cuda").mkdir()
    monkeypatch.setattr(plan, "ROOT", root)
    out = tmp_path / "out"
    out.mkdir()
    return root, out


def write(name: str, code: int = 0) -> tuple[str, ...]:
    return ("python", "-c", f"import sys; open('docs/results/{name}', 'w').write('{{}}'); print('wrote {name}'); "
                            f"sys.exit({code})")


def test_a_failed_part_fails_the_run_and_the_summary_comes_last(repo, capsys):
    root, out = repo
    parts = [Part("good", 20, write("good_{tag}.json"), "", records=("docs/results/good_{tag}.json",)),
             Part("bad", 20, write("bad_{tag}.json", 3), "", records=("docs/results/bad_{tag}.json",)),
             Part("after-bad", 20, ("python", "-c", "print('never')"), "", needs=("bad",)),
             Part("refusal", 20, ("python", "-c", "raise SystemExit(2)"), "", expect=2),
             Part("hook", 20, ("python", "-c", "print('never')"), "", unless=lambda: "no such part yet")]
    assert plan.run(parts, out, "h100", 100) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("FAILED: bad, after-bad, in ") and "never" not in lines
    table = {line.split()[0]: line for line in lines[-6:-1]}
    assert "passed; docs/results/good_h100.json" in table["good"]
    assert "FAILED (exit 3); docs/results/bad_h100.json (in failed-records.tar.gz" in table["bad"]
    assert "NOT RUN: bad did not pass" in table["after-bad"]
    assert "passed" in table["refusal"] and "skipped: no such part yet" in table["hook"]
    with tarfile.open(out / "records.tar.gz") as tar:  # unpacked at the repository's root
        assert tar.getnames() == ["docs/results/good_h100.json"]
    with tarfile.open(out / "failed-records.tar.gz") as tar:
        assert tar.getnames() == ["docs/results/bad_h100.json"]
    log = (out / "gpu.log").read_text()
    assert log.index("wrote good_h100.json") < log.index("== bad: FAILED (exit 3)")
    assert sorted(p.name for p in out.iterdir()) == ["failed-records.tar.gz", "gpu.log", "records.tar.gz"]


def test_a_run_where_every_part_passes_exits_0(repo, capsys):
    root, out = repo
    (root / "docs" / "results" / "old.json").write_text("{}")  # committed before: not written by this run
    parts = [Part("one", 20, write("one.json"), "", records=("docs/results/one.json",)),
             Part("two", 20, ("python", "-c", "pass"), "", records=("docs/results/old.json",))]
    assert plan.run(parts, out, "h100", 100) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("every part passed")
    with tarfile.open(out / "records.tar.gz") as tar:
        assert tar.getnames() == ["docs/results/one.json"]


def test_a_part_stops_at_its_limit_and_the_next_one_runs(repo, capsys, monkeypatch):
    root, out = repo
    monkeypatch.setattr(plan, "GRACE_S", 1)
    deaf = "import signal, time; signal.signal(signal.SIGINT, signal.SIG_IGN); print('sleeping', flush=True); " \
           "time.sleep(60)"  # ignores Ctrl-C: killed after the grace
    parts = [Part("slow", 2, ("python", "-c", deaf), ""), Part("next", 20, ("python", "-c", "print('ran')"), "")]
    started = time.monotonic()
    assert plan.run(parts, out, "h100", 100) == 1
    assert time.monotonic() - started < 30
    text = capsys.readouterr().out
    assert "sleeping" in text and "TIMED OUT after 2 s" in text and "ran" in text
    assert "FAILED: slow," in text.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_deadline_leaves_later_parts_not_run(repo, capsys):
    root, out = repo
    parts = [Part("first", 30, ("python", "-c", "import time; time.sleep(60)"), ""),
             Part("second", 30, ("python", "-c", "print('never')"), "")]
    assert plan.run(parts, out, "h100", 6) == 1
    text = capsys.readouterr().out
    assert "TIMED OUT after 6 s" in text and "NOT RUN: 0 s left of the 6 s deadline" in text


def test_the_candidates_hook_runs_once_cuda_bench_gpu_has_that_part(repo):
    root, _ = repo
    (root / "cuda" / "bench_gpu.py").write_text('PARTS = ("check", "gemm")\n')
    assert "has no part 'candidates' yet" in plan.bench_gpu_lacks("candidates")()
    (root / "cuda" / "bench_gpu.py").write_text('PARTS = ("check", "gemm", "candidates")\n')
    assert plan.bench_gpu_lacks("candidates")() is None


@pytest.mark.slow  # subprocesses that import torch
def test_a_failed_build_fails_the_build_part(capsys):
    assert plan.build(["py", "nosuchstage"]) == 1
    text = capsys.readouterr()
    assert "-- py: exit 0" in text.out and "-- nosuchstage: exit 1" in text.out
    assert "build failed: nosuchstage" in text.err


def test_without_a_gpu_running_is_one_clear_line(tmp_path):
    if plan.gpu_identity() is not None:
        pytest.skip("checks what a machine without a GPU says")
    result = gpu_script("smoke", "--out", str(tmp_path))
    assert result.returncode == 2 and "needs a GPU" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow  # subprocesses that import torch
def test_mistakes_on_the_command_line_are_one_line_and_a_non_zero_status(tmp_path):
    unknown = gpu_script("everything", "--out", str(tmp_path))
    assert unknown.returncode == 2 and "unknown part or selection 'everything'" in unknown.stderr
    short = gpu_script("smoke", "--deadline", "60", "--out", str(tmp_path))
    assert short.returncode == 2 and "over the 60 s deadline" in short.stderr
    named = gpu_script("ptx", "--list")  # a part named alone brings what it needs
    assert named.returncode == 0
    assert [line.split()[0] for line in named.stdout.splitlines()[1::2]] == ["env", "build", "ptx-regen", "ptx"]
