"""The GPU machine's plan (.ci/gpu, .ci/gpu.py), checked without a GPU: the selections against the
lease's limits, the dry run and each mistake it must catch, and the runner (exit status, summary
last, limits, deadline, records packed for the trip back) on parts that need no GPU."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import ROOT, fold, load_script

plan = load_script(".ci/gpu.py")
Part = plan.Part


def gpu_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """bash .ci/gpu ARGS with this interpreter first on PATH, as in an activated venv."""
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", **(env or {})}
    return subprocess.run(["bash", str(ROOT / ".ci" / "gpu"), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=900, env=env)


def selection(name: str) -> list:
    return plan.resolve([name], plan.parts())[0]


# ---------------------------------------------------------------------------------------
# The selections as written
# ---------------------------------------------------------------------------------------
def test_the_lease_is_one_call_of_at_most_9_minutes_and_a_second_only_if_it_ends_early():
    """The first call within 9 minutes, the second in what the lease has left after the start and
    the first; no command over 10 minutes; in each, the limits the deadline must hold leave more
    slack than the grace a stopped part takes; both build, so the second can start cold."""
    assert plan.DEADLINES == {"lease": 540, "second": plan.LEASE_S - plan.START_S - 540}
    assert plan.START_S + sum(plan.DEADLINES.values()) <= plan.LEASE_S == 15 * 60
    assert plan.lease_problems() == []
    for name in plan.SELECTIONS:
        chosen = selection(name)
        held = sum(p.limit_s for p in chosen if not p.tail)
        assert held + plan.GRACE_S < plan.DEADLINES[name] <= plan.COMMAND_S, name
        assert [p.name for p in chosen[:2]] == ["env", "build"], name  # a fresh machine holds no build
        assert plan.plan_problems(chosen, plan.DEADLINES[name]) == [], name
    assert "build-warm" not in plan.parts()


def test_the_ci_readme_says_what_the_plan_does():
    """.ci/README.md's section on .ci/gpu: how to see and check the plan and where the build's limit
    comes from; the lease selection's order of value; no README names a selection the plan does not
    have."""
    text = fold((ROOT / ".ci" / "README.md").read_text())
    assert "`bash .ci/gpu --list`" in text and "`bash .ci/gpu --dry-run lease`" in text
    assert f"[`{plan.BUILD_RECORD}`](../{plan.BUILD_RECORD})" in text
    assert [p.name for p in selection("lease")][1:] == ["build", "exact", "kernels", "memcheck", "racecheck",
                                                        "synccheck", "ncu"]
    for readme in (ROOT / "README.md", ROOT / ".ci" / "README.md"):
        named = set(re.findall(r"bash \.ci/gpu (?!--)([\w-]+)", fold(readme.read_text())))
        assert named <= set(plan.SELECTIONS) | set(plan.parts()), (readme, named)


def test_a_lease_that_cannot_fit_is_caught(monkeypatch):
    monkeypatch.setattr(plan, "DEADLINES", {"lease": 480, "explain": 480})  # the old smoke + time: over the lease
    assert any("exceed the lease's 900 s" in m for m in plan.lease_problems())
    monkeypatch.setattr(plan, "DEADLINES", {"lease": 700})
    assert any("over a command's 600 s" in m for m in plan.lease_problems())


def test_the_lease_holds_in_order_of_value_the_build_the_isolated_checks_the_timings_then_a_tail():
    """The build; every version's exact check, one a process; each new version's timings, one a
    process, gated by the exact record; then the sanitizers (synccheck too) and ncu, which the
    deadline cuts. The second call holds grad_check, NCCL's refusal and the rest."""
    lease = selection("lease")
    assert [p.name for p in lease] == ["env", "build", "exact", "kernels", "memcheck", "racecheck", "synccheck", "ncu"]
    assert [p.name for p in lease if p.tail] == ["memcheck", "racecheck", "synccheck", "ncu"]
    every = plan.parts()
    assert every["exact"].argv[:3] == ("python", "cuda/isolated.py", "exact")
    assert every["kernels"].argv[:3] == ("python", "cuda/isolated.py", "kernels") and "exact" in every["kernels"].after
    exact_record = every["exact"].records[0]
    assert every["kernels"].argv[every["kernels"].argv.index("--exact") + 1] == exact_record
    assert every["ncu"].argv[every["ncu"].argv.index("--passed") + 1] == exact_record
    for tool in ("memcheck", "racecheck", "synccheck"):
        assert every[tool].argv[:6] == ("python", "cuda/isolated.py", "sanitize", "--tool", tool, "--never-run")
    second = [p.name for p in selection("second")]
    assert second[:4] == ["env", "build", "grad-check", "nccl-refusal"]
    assert {"grad-check-bf16", "pytest", "gemm", "ptx-regen", "ptx"} <= set(second)
    pytest_part = every["pytest"]
    assert pytest_part.argv[pytest_part.argv.index("-m", 3) + 1] == "gpu and not slow"
    assert every["grad-check-bf16"].argv[-2:] == ("--dtype", "bfloat16")
    assert every["grad-check"].argv[:3] == ("python", "grad_check.py", "all")
    assert "--dtype" not in every["grad-check"].argv


def test_the_limits_come_from_measurements_and_say_so():
    """The isolated runs' limits from a child's start measured here and their children's count;
    grad-check's from Triton's compiles measured here; each part says where its number comes from."""
    iso = plan.isolated_module()
    every = plan.parts()
    assert iso.START_S == 2 * 2.4 + 5 and iso.MARGIN_S > plan.GRACE_S
    for run, name in (("exact", "exact"), ("kernels", "kernels"), ("sanitize", "memcheck")):
        limit, why = iso.part_limit(run)
        assert every[name].limit_s == limit and why in every[name].why
    waves = math.ceil(iso.part_units("exact") / iso.JOBS["exact"])
    assert every["exact"].limit_s == math.ceil(waves * iso.EXPECTED_S["exact"] + iso.LIMITS["exact"]
                                               - iso.EXPECTED_S["exact"] + iso.MARGIN_S)
    assert iso.part_units("exact") == len(iso.unit_entries())
    assert iso.part_units("kernels") == len(iso.never_timed()) + 1 == 15  # and the roofs' own process
    assert every["grad-check"].limit_s == math.ceil(2 * 8.4 + 2 * 6 * 0.125 + iso.START_S + plan.CHECKS_S)
    assert "Triton compiles (measured here" in every["grad-check"].why
    named = plan.resolve(["ncu"], plan.parts())[0]  # by name, the first call of another lease: a full build
    assert [p.name for p in named] == ["env", "build", "exact", "ncu"]


def test_timings_run_only_after_a_check_on_the_gpu():
    """Chapter 3's table checks its versions in the same process first (they ran on a GPU before),
    each new version is timed after its own exact check (cuda/isolated.py reads the exact record);
    the Triton timings run only once tiles/bench_gpu.py --smoke has checked every line on the GPU."""
    every = plan.parts()
    for p in every.values():
        if p.argv[1:2] == ("tiles/bench_gpu.py",) and "--json" in p.argv:
            assert any("--smoke" in every[n].argv for n in p.needs), p.name
        if p.argv[1:2] == ("cuda/bench_gpu.py",) and "gemm" in p.argv:
            assert p.argv.index("check") < p.argv.index("gemm"), p.name
    assert "exact" in every["kernels"].after and "exact" in every["ncu"].after


def test_the_tensor_core_measurements_run_in_the_lease_after_the_exact_comparison():
    """cuda/bench_gpu.py's roof, tf32 and goals16 join the kernels part's command and record (no
    record kind of their own), after every entry was compared with the emulation bit for bit; every
    part the command names is one bench_gpu.py has (its --help, which the dry run asks, would not say)."""
    kernels = plan.parts()["kernels"]
    named = kernels.argv[kernels.argv.index("--parts") + 1:kernels.argv.index("--rounds")]
    assert {"roof", "tf32", "goals16"} <= set(named)
    assert set(named) <= set(plan._constant(ROOT / "cuda" / "bench_gpu.py", "PARTS"))
    assert kernels.records == (f"{plan.RESULTS}/cuda_kernels_{plan.TAG}.json",) and "exact" in kernels.after
    lease = [p.name for p in selection("lease")]
    assert lease.index("exact") < lease.index("kernels") and plan.plan_problems(selection("lease"), 540) == []


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
def test_limits_that_cannot_fit_the_deadline_with_more_slack_than_the_grace_are_caught():
    """A part stopped at its limit takes up to GRACE_S more: the slack must exceed it. The tail's
    limits do not count (the deadline cuts it)."""
    lease = selection("lease")
    total = sum(p.limit_s for p in lease if not p.tail)
    assert any("over the" in m for m in plan.plan_problems(lease, total + plan.GRACE_S))
    assert not plan.plan_problems(lease, total + plan.GRACE_S + 1)


def test_a_tail_part_before_one_the_deadline_must_hold_is_caught():
    lease = selection("lease")
    moved = [lease[0], lease[1], lease[4], lease[2], lease[3]]  # memcheck before exact and kernels
    assert any("the tail comes last" in m for m in plan.plan_problems(moved, 600))


def test_an_ignored_input_that_no_earlier_part_makes_is_caught():
    lease = selection("second")
    without_regen = [p for p in lease if p.name != "ptx-regen"]
    problems = plan.plan_problems(without_regen, 480)
    assert any("ptx/generated/dense_kernels.ptx" in m and "a fresh machine lacks it" in m for m in problems), problems
    assert any("needs 'ptx-regen'" in m for m in problems)
    regen_last = without_regen + [p for p in lease if p.name == "ptx-regen"]
    assert any("a fresh machine lacks it" in m for m in plan.plan_problems(regen_last, 480))


def test_a_part_that_stands_for_another_meets_the_needs_on_it():
    warm, needing = Part("b-warm", 1, ("python", "-c", "pass"), "", stands_for="b"), \
        Part("x", 1, ("python", "-c", "pass"), "", needs=("b",))
    assert plan.plan_problems([warm, needing], 20) == []
    assert any("needs 'b'" in m for m in plan.plan_problems([needing, warm], 20))


def test_a_refusal_whose_words_are_gone_from_its_script_is_caught():
    every = plan.parts()
    assert every["nccl-refusal"].says and plan.plan_problems([every["env"], every["build"], every["nccl-refusal"]],
                                                             480) == []
    moved = Part("r", 1, ("python", "distributed.py", "--x"), "", says="words distributed.py never says")
    assert any("never says 'words distributed.py never says'" in m for m in plan.plan_problems([moved], 10))


# ---------------------------------------------------------------------------------------
# The build's limit: from its measurement
# ---------------------------------------------------------------------------------------
def _build_record(**seconds: dict[str, float]) -> dict:
    return {"arch": "9.0", "stages": {name: {"seconds": {k: {"cpu_s": v, "wall_s": v} for k, v in s.items()}}
                                      for name, s in seconds.items()}}


def test_the_build_takes_its_slowest_source_and_its_link_or_its_work_over_the_cores():
    record = _build_record(cuda={"cuda/units/tune.cu": 19.0, "cuda/binding.cpp": 25.0, "cuda/units/v1.cu": 3.0,
                                 "link": 2.0},
                           ptx={"ptx/loader.cpp": 17.0, "link": 1.0})
    assert plan.build_estimate(record, cores=16) == (27.0, "cuda: cuda/binding.cpp 25 s + link 2 s")
    seconds, how = plan.build_estimate(record, cores=1)  # one core: everything in turn
    assert seconds == 67.0 and how == "67 s of compiling over 1 cores"


def test_the_build_part_limit_comes_from_the_committed_measurement():
    record = json.loads((ROOT / plan.BUILD_RECORD).read_text())
    assert record["arch"] == plan.LEASE_ARCH and record["command"].startswith("python .ci/gpu.py --time-build")
    seconds, _ = plan.build_estimate(record)
    limit, why, problem = plan.build_limit()
    assert problem is None and limit == math.ceil(plan.BUILD_MARGIN * seconds + plan.BUILD_LOAD_S)
    assert plan.parts()["build"].limit_s == limit and plan.BUILD_RECORD in plan.parts()["build"].why
    assert set(record["stages"]) >= {"dense_cpp_ext", "dense_cuda_ext", "dense_ptx_ext", "emulation"}


def test_every_source_of_the_cuda_stage_is_in_the_measurement():
    """A unit added to the cuda stage (cuda/units/) fails this until the build is measured again:
    the limit would not know what it costs."""
    import modes

    sources = [s.as_posix() for s in modes.cuda_stage_sources()]
    assert plan.unmeasured_sources(sources) == [], (
        f"run: python .ci/gpu.py --time-build {plan.LEASE_ARCH} --json {plan.BUILD_RECORD}")
    assert plan.unmeasured_sources([*sources, "cuda/units/gemm_v99.cu"]) == ["cuda/units/gemm_v99.cu"]


def test_without_a_measurement_the_build_has_no_limit_to_trust(monkeypatch):
    limit, why, problem = plan.build_limit("docs/results/no_such_build.json")
    assert why == "no measurement" and "run python .ci/gpu.py --time-build 9.0" in problem
    monkeypatch.setattr(plan, "BUILD_RECORD", "docs/results/no_such_build.json")
    every = plan.parts()
    assert any("the build's limit has no measurement" in m for m in plan.plan_problems([every["build"]], 600))


def test_the_ninja_log_of_a_stage_is_read_per_source(tmp_path, monkeypatch):
    """--time-build runs each compile of a build.ninja on its own (as ninja would, from
    `ninja -t commands`), so that each source's seconds are its own."""
    import shutil

    if shutil.which("ninja") is None:
        pytest.skip("ninja is not installed")
    timing = plan.build_timing()  # .ci/build_timing.py, --time-build's job
    monkeypatch.setattr(timing, "ROOT", tmp_path)
    (tmp_path / "a.c").write_text("int a(void) { return 1; }\n")
    (tmp_path / "b.c").write_text("int b(void) { return 2; }\n")
    build = tmp_path / "build"
    build.mkdir()
    (build / "build.ninja").write_text(
        "rule compile\n  command = cc -c $in -o $out\nrule link\n  command = cc -shared $in -o $out\n"
        f"build a.o: compile {tmp_path}/a.c\nbuild b.o: compile {tmp_path}/b.c\nbuild ab.so: link a.o b.o\n")
    seconds = timing.ninja_one_at_a_time(build)
    assert list(seconds) == ["a.c", "b.c", "link"] and (build / "ab.so").is_file()
    assert all(s["cpu_s"] >= 0 and s["wall_s"] > 0 for s in seconds.values())


# ---------------------------------------------------------------------------------------
# What the plan reads without torch
# ---------------------------------------------------------------------------------------
def test_the_list_works_in_a_python_without_torch(tmp_path):
    """versions() reads cuda/dense_kernels.h as text (cuda/catalog.py): --list runs where torch
    cannot be imported, and names the lease's parts and limits."""
    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('torch is not installed here')\n")
    result = gpu_script("--list", env={"PYTHONPATH": str(tmp_path)})
    assert result.returncode == 0, result.stderr[-2000:]
    assert "lease: " in result.stdout and "of its 540 s deadline" in result.stdout and "Traceback" not in result.stderr
    listed = re.search(r"leaves out ptx items of versions \[([\d, ]+)\]", result.stdout)
    catalog = load_script("cuda/catalog.py", "catalog_for_the_plan_test")
    carried = plan._constant(ROOT / "tests" / "test_cuda.py", "PTX_VERSIONS")
    assert listed and [int(v) for v in listed.group(1).split(", ")] == [
        v.id for v in catalog.versions() if v.id not in carried]
    check = subprocess.run([sys.executable, "-c", "import torch"], env={**os.environ, "PYTHONPATH": str(tmp_path)},
                           capture_output=True, text=True)
    assert check.returncode != 0  # the stand-in did stand in


def test_the_grad_check_part_skips_until_grad_check_has_the_flag(tmp_path, monkeypatch):
    monkeypatch.setattr(plan, "ROOT", tmp_path)
    (tmp_path / "grad_check.py").write_text("p.add_argument('--device')\n")
    assert "grad_check.py has no --dtype option yet" in plan.script_lacks("grad_check.py", "--dtype")()
    (tmp_path / "grad_check.py").write_text("p.add_argument('--device')\np.add_argument('--dtype', choices=[])\n")
    assert plan.script_lacks("grad_check.py", "--dtype")() is None


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
    assert not plan.plan_problems([Part("s", 1, ("bash", "ptx/regen.sh"), "")], 20)


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
    argv = next(p for p in selection("second") if "pytest" in p.argv).command()

    def collect(*args: str) -> set[str]:
        got = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                             cwd=ROOT, capture_output=True, text=True, timeout=600)
        return {line for line in got.stdout.splitlines() if "::" in line}

    k = argv[argv.index("-k") + 1]
    with ThreadPoolExecutor(3) as pool:  # three collections of the whole suite, side by side
        kept, every_gpu, slow = pool.map(lambda a: collect(*a), [("-m", "gpu and not slow", "-k", k), ("-m", "gpu"),
                                                                 ("-m", "slow")])
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
    # the chapter that shows the records the runner tests write (a record no chapter shows is packed apart)
    (root / "README.md").write_text("docs/results/good_h100.json docs/results/bad_h100.json docs/results/one.json "
                                    "docs/results/old.json docs/results/cuda_gpu_h100.json\n")
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


def test_a_record_of_a_kind_no_chapter_shows_is_packed_apart(repo, capsys):
    """records.tar.gz holds only records a chapter shows, by name or by kind (another card's
    record of a kind shown): unpacked, they keep tests/test_records.py green."""
    root, out = repo
    (root / "docs" / "results" / "cuda_gpu_h100.json").write_text('{"device": "NVIDIA H100 80GB HBM3"}')

    def card_record(name: str) -> tuple[str, ...]:
        return ("python", "-c", f"open('docs/results/{name}', 'w').write('{{\"device\": \"NVIDIA H200\"}}')")

    parts = [Part("same-kind", 20, card_record("cuda_gpu_{tag}.json"), "",
                  records=("docs/results/cuda_gpu_{tag}.json",)),
             Part("new-kind", 20, card_record("brand_new_{tag}.json"), "",
                  records=("docs/results/brand_new_{tag}.json",))]
    assert plan.run(parts, out, "h200", 100) == 0
    with tarfile.open(out / "records.tar.gz") as tar:
        assert tar.getnames() == ["docs/results/cuda_gpu_h200.json"]
    with tarfile.open(out / "new-records.tar.gz") as tar:
        assert tar.getnames() == ["docs/results/brand_new_h200.json"]
    text = capsys.readouterr().out
    assert "brand_new_h200.json (in new-records.tar.gz: no chapter shows its kind)" in text
    assert text.strip().splitlines()[-1].endswith("1 record(s) in " + str(out / "records.tar.gz")
                                                  + ", 1 in " + str(out / "new-records.tar.gz"))


def test_a_missing_program_is_one_line_and_the_rest_still_run(repo, capsys):
    root, out = repo
    parts = [Part("sanitizer", 20, ("no-such-sanitizer", "--tool", "memcheck"), ""),
             Part("next", 20, ("python", "-c", "print('ran')"), "")]
    assert plan.run(parts, out, "h100", 100) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert "ran" in lines and "Traceback" not in "\n".join(lines)
    assert "FAILED: no-such-sanitizer is not on the PATH" in next(x for x in lines if x.startswith("sanitizer "))
    assert lines[-1].startswith("FAILED: sanitizer, in ")


def test_a_refusal_counts_only_with_its_words(repo, capsys):
    """Exit status 2 is also argparse's for any usage error: the refusal must say its own words."""
    root, out = repo
    says = "needs one GPU per rank"
    parts = [Part("right", 20, ("python", "-c", f"import sys; print('x: {says}: 2 ranks'); sys.exit(2)"), "",
                  expect=2, says=says),
             Part("wrong", 20, ("python", "-c", "import sys; print('x: error: bad flag'); sys.exit(2)"), "",
                  expect=2, says=says)]
    assert plan.run(parts, out, "h100", 100) == 1
    table = {line.split()[0]: line for line in capsys.readouterr().out.strip().splitlines()[-3:-1]}
    assert "passed" in table["right"]
    assert f"FAILED (exit 2, but its output lacks {says!r})" in table["wrong"]


def test_a_second_call_on_a_fresh_machine_is_refused_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(plan, "ROOT", tmp_path)
    assert plan.not_built(["cpp", "cuda", "emulation"]) == ["cpp", "cuda"]
    assert plan.build(["cpp", "cuda"], warm=True) == 1
    assert "not built on this machine: cpp, cuda" in capsys.readouterr().err
    for m in ("cpp", "cuda"):
        (tmp_path / "build" / "jit" / f"dense_{m}_ext").mkdir(parents=True)
        (tmp_path / "build" / "jit" / f"dense_{m}_ext" / f"dense_{m}_ext.so").write_bytes(b"")
    assert plan.not_built(["cpp", "cuda", "emulation"]) == []


@pytest.mark.slow  # seconds of real waiting on children and limits
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


def test_one_versions_failed_exact_check_does_not_cancel_the_others_timings(repo, capsys):
    """The exact part fails (one version differed) but writes its record: the timing part, which
    reads that record and times each version whose own check passed, still runs; a part that needs
    the failed one to have passed does not."""
    root, out = repo
    exact = Part("exact", 20, ("python", "-c", "import sys; open('docs/results/one.json', 'w').write('{}'); "
                               "print('DIFF v33'); sys.exit(1)"), "", records=("docs/results/one.json",))
    timing = Part("kernels", 20, ("python", "-c", "print('timing the versions that passed')"), "", after=("exact",))
    needing = Part("strict", 20, ("python", "-c", "print('never')"), "", needs=("exact",))
    assert plan.run([exact, timing, needing], out, "h100", 100) == 1
    text = capsys.readouterr().out
    assert "timing the versions that passed" in text and "never" not in text
    table = {line.split()[0]: line for line in text.strip().splitlines()[-4:-1]}
    assert "passed" in table["kernels"] and "FAILED (exit 1)" in table["exact"]
    assert "NOT RUN: exact did not pass" in table["strict"]
    skipped_exact = Part("exact", 20, ("python", "-c", "pass"), "", unless=lambda: "not here")
    assert plan.run([skipped_exact, timing], out, "h100", 100) == 1  # never started: nothing to read
    assert "NOT RUN: exact did not pass or did not run" in capsys.readouterr().out


@pytest.mark.slow  # seconds of real waiting on children and limits
def test_a_part_the_deadline_cuts_is_not_run_and_does_not_fail_the_call(repo, capsys, monkeypatch):
    """The deadline, not its own limit, stops the first part, and leaves the second no time: both
    NOT RUN, the call passes; what the first wrote is packed with the passed records."""
    root, out = repo
    monkeypatch.setattr(plan, "MIN_START_S", 1)
    parts = [Part("first", 30, ("python", "-c", "import time; open('docs/results/one.json', 'w').write('{}'); "
                                "print('wrote', flush=True); time.sleep(60)"), "", records=("docs/results/one.json",),
                  tail=True),
             Part("second", 30, ("python", "-c", "print('never')"), "", tail=True)]
    assert plan.run(parts, out, "h100", 2) == 0
    text = capsys.readouterr().out
    assert "NOT RUN: the deadline stopped it after 2 s" in text
    assert "NOT RUN: the deadline (0 s left of its 2 s)" in text
    assert "never" not in text and text.strip().splitlines()[-1].startswith("every part passed")
    with tarfile.open(out / "records.tar.gz") as tar:
        assert tar.getnames() == ["docs/results/one.json"]


def test_each_part_is_told_its_limit_so_an_isolated_run_ends_before_it(repo, capsys):
    root, out = repo
    say = f"import os; print('limit', os.environ['{plan.PART_LIMIT_ENV}'])"
    parts = [Part("a", 30, ("python", "-c", say), ""), Part("b", 300, ("python", "-c", say), "")]
    assert plan.run(parts, out, "h100", 100) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "limit 30" in lines and any(re.fullmatch(r"limit (9\d|100)", line) for line in lines)


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
    result = gpu_script("lease", "--out", str(tmp_path))
    assert result.returncode == 2 and "needs a GPU" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


@pytest.mark.slow  # subprocesses that import torch
def test_mistakes_on_the_command_line_are_one_line_and_a_non_zero_status(tmp_path):
    unknown = gpu_script("everything", "--out", str(tmp_path))
    assert unknown.returncode == 2 and "unknown part or selection 'everything'" in unknown.stderr
    short = gpu_script("lease", "--deadline", "60", "--out", str(tmp_path))
    assert short.returncode == 2 and "over the 60 s deadline" in short.stderr
    named = gpu_script("ptx", "--list")  # a part named alone brings what it needs
    assert named.returncode == 0
    assert [line.split()[0] for line in named.stdout.splitlines()[1::2]] == ["env", "build", "ptx-regen", "ptx"]
