"""The GPU machine's plan (.ci/gpu, .ci/gpu.py), checked without a GPU: the dry run of every step,
the checks it makes (each can fail), and the runner's budget, logs and archives."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from conftest import ROOT

pytestmark = pytest.mark.slow  # the GPU plan's dry run checks every command with a subprocess


def _load():
    spec = importlib.util.spec_from_file_location("gpu_plan", ROOT / ".ci" / "gpu.py")
    module = sys.modules["gpu_plan"] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


plan = _load()
OUT = plan.OUT


def gpu_script(*args: str) -> subprocess.CompletedProcess:
    """bash .ci/gpu ARGS with this interpreter first on PATH, as in an activated venv."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


@pytest.mark.slow
def test_dry_run_checks_every_step():
    result = gpu_script("--dry-run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    for name in (*plan.STEPS, "quick"):
        assert f"\n{name}: " in "\n" + result.stdout
    assert "FAIL" not in result.stdout and "dry run: every command checked" in result.stdout


def test_steps_fit_their_budgets_and_come_back_whole():
    for name, make in plan.STEPS.items():
        commands = make("h100")
        assert sum(c.estimate_s for c in commands) <= plan.STEP_BUDGET_S, name
        assert commands[0] is plan.BUILD, f"{name} must build first: a fresh machine holds nothing"
    assert sum(c.estimate_s for c in plan.step_quick("h100")) <= plan.QUICK_BUDGET_S
    assert list(plan.STEPS)[:5] == ["correctness", "gemm", "ptx", "triton", "train"]  # what the chapters need first


@pytest.mark.parametrize("command, says", [
    (plan.py("benchmark.py", "-m", "cuda", "--no-such-flag", estimate_s=1), "--no-such-flag is not among its options"),
    (plan.py("benchmark.py", "-m", "fortran", estimate_s=1), "refuses its arguments"),
    (plan.py("benchmark.py", "--kernel", "three", estimate_s=1), "refuses its arguments"),
    (plan.py("no_such_script.py", estimate_s=1), "no such script"),
    (plan.py("-m", "pytest", "-m", "no_such_marker", estimate_s=1), "collects no tests"),
    (plan.Command(["python", "benchmark.py"], 1, outputs=["/tmp/x.json"]), "plain file name"),  # outside {out}
    (plan.py("benchmark.py", "--json", f"{OUT}/a/b.json", estimate_s=1), "plain file name"),
    (plan.py("benchmark.py", "--json", f"{OUT}/a b.json", estimate_s=1), "plain file name"),
    (plan.py("-c", "print(", estimate_s=1), "never closed"),
])
def test_dry_run_check_catches_mistakes(command, says, tmp_path):
    with pytest.raises((ValueError, SyntaxError), match=says):
        plan.check(command, tmp_path)


def test_reading_what_no_earlier_command_wrote_is_caught(monkeypatch, capsys):
    monkeypatch.setitem(plan.STEPS, "broken", lambda tag: [plan.stamp(f"{plan.RESULTS}/gpu_{tag}_missing.json")])
    assert not plan.dry_run(["broken"])
    assert "which no earlier command of the step writes" in capsys.readouterr().out


@pytest.mark.parametrize("name, tag", [("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H200", "h200"),
                                       ("NVIDIA A100-SXM4-80GB", "a100"), ("Tesla V100-SXM2-16GB", "v100"),
                                       ("Some GPU", "gpu")])
def test_device_tag(name, tag):
    assert plan.device_tag(name) == tag


def test_a_step_runs_in_order_logs_and_packs_its_files(tmp_path, monkeypatch):
    repo = tmp_path / "repo"  # the commands run in the repository: a stand-in, so that nothing real is written
    (repo / "docs" / "results").mkdir(parents=True)
    monkeypatch.setattr(plan, "ROOT", repo)
    results = tmp_path / "out"
    write = "import sys; open(sys.argv[1], 'w').write('1'); print('first')"
    commands = [plan.py("-c", write, f"{OUT}/a.json", estimate_s=1),
                plan.py("-c", write, f"{plan.RESULTS}/gpu_x_record.json", estimate_s=1),
                plan.py("-c", "pass", f"{plan.RESULTS}/gpu_x_never_written.json", estimate_s=1),
                plan.Command(["python", "-c", "print('to a file')"], 1, stdout=f"{OUT}/b.txt",
                             outputs=[f"{OUT}/b.txt"]),
                plan.py("-c", "raise SystemExit(3)", estimate_s=1)]
    assert not plan.run_step("demo", commands, results, budget_s=120)  # the last command failed
    assert sorted(p.name for p in results.iterdir()) == ["demo.log", "demo.tar.gz"]
    log = (results / "demo.log").read_text()
    assert log.index("first") < log.index("exit status 3") and "demo: FAILED" in log
    with tarfile.open(results / "demo.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["extra/a.json", "extra/b.txt", "records/gpu_x_record.json"]
        assert tar.extractfile("extra/b.txt").read() == b"to a file\n"
    assert (repo / "docs" / "results" / "gpu_x_record.json").is_file()  # where the chapters read it


def test_a_step_stops_at_its_budget(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "ROOT", tmp_path)
    commands = [plan.py("-c", "import time; print('sleeping', flush=True); time.sleep(60)", estimate_s=1),
                plan.py("-c", "print('never')", estimate_s=1)]
    assert not plan.run_step("slow", commands, tmp_path, budget_s=8)
    log = (tmp_path / "slow.log").read_text()
    assert "sleeping" in log and "ran out" in log and "skipped" in log and "never" not in log.splitlines()


def test_running_a_step_without_a_gpu_is_one_clear_line(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks what a machine without a GPU says")
    result = gpu_script("correctness", "--out", str(tmp_path))
    assert result.returncode == 2 and "needs a GPU" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


def test_the_triton_step_has_its_place():
    source = (ROOT / ".ci" / "gpu.py").read_text()
    assert "def step_triton(" in source and '"triton": step_triton' in source
