"""A user's mistakes, made as a user makes them: checked before the work, one line, no traceback."""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
import torch
from mnist_files import make_mnist, write_idx

import benchmark
import cli
import distributed
import grad_check
import timing
from conftest import REASONS, ROOT, run_script
from parallel.common import data as data_mod
from parallel.common.checkpoint import CheckpointError, save_checkpoint
from parallel.common.training import Config, check_resume
from parallel.dp.trainer import train

pytestmark = pytest.mark.slow  # every script against every user mistake: a subprocess each

SCRIPTS = ["benchmark.py", "grad_check.py", "distributed.py", "docs/render.py"]
TINY = ["-m", "py", "-b", "4", "-i", "4", "-o", "4", "--rounds", "2"]


def no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr[-3000:]


def run_with(code: str, *argv: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``code`` (which may patch a module), then a script's main under cli.run, as a user's
    command line would: ``argv[0]`` is the script."""
    script = argv[0]
    module = Path(script).stem
    prog = textwrap.dedent(code) + textwrap.dedent(f"""
        import sys, cli, {module}
        sys.argv = {list(argv)!r}
        cli.run({module}.main)
    """)
    return subprocess.run([sys.executable, "-c", prog], cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def no_matplotlib(tmp_path) -> dict:
    """An environment in which `import matplotlib` fails, whether or not it is installed."""
    fake = tmp_path / "fake_site" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    return {"PYTHONPATH": str(fake.parent)}


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in (root ignores permissions: /sys then)."""
    if os.geteuid() != 0:
        folder = tmp_path / "readonly"
        folder.mkdir()
        folder.chmod(0o500)
        return folder
    try:
        fd, probe = tempfile.mkstemp(dir="/sys")
    except OSError:
        return Path("/sys")
    os.close(fd)
    os.unlink(probe)
    pytest.skip("no folder here refuses root's writes")


# ---------------------------------------------------------------------------
# Outputs and optional dependencies, checked before the work starts
# ---------------------------------------------------------------------------

OUTPUTS = [("benchmark.py", TINY, "--json"), ("benchmark.py", TINY, "--plot"),
           ("grad_check.py", ["all", "--error-table", "-b", "2", "-i", "3", "-o", "2"], "--json"),
           ("distributed.py", ["--epochs", "1"], "--json"), ("distributed.py", ["--epochs", "1"], "--plot"),
           ("distributed.py", ["--epochs", "1"], "--checkpoint")]


@pytest.mark.parametrize("script, extra, flag", OUTPUTS, ids=[f"{s}{f}" for s, _, f in OUTPUTS])
@pytest.mark.parametrize("where", ["directory", "missing folder", "unwritable"])
def test_bad_output_paths_are_refused_before_any_work(tmp_path, script, extra, flag, where):
    path = {"directory": tmp_path, "missing folder": tmp_path / "absent" / "out.x",
            "unwritable": None}[where]
    if path is None:
        path = unwritable_folder(tmp_path) / "out.x"
    started = time.monotonic()
    result = run_script(script, *extra, flag, str(path), timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    expected = {"directory": "is a directory", "missing folder": "does not exist", "unwritable": "cannot write"}
    assert f"{flag} {path}" in result.stderr and expected[where] in result.stderr
    no_traceback(result)
    assert "| reference |" not in result.stdout and "epoch" not in result.stdout  # no work was done
    assert not list(tmp_path.glob("**/*.probe")), "the writability probe was left behind"
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("script, extra", [("benchmark.py", TINY), ("distributed.py", ["--epochs", "1"])])
def test_plot_without_matplotlib_is_refused_before_any_work(tmp_path, no_matplotlib, script, extra):
    result = run_script(script, *extra, "--plot", str(tmp_path / "p.png"), env=no_matplotlib, timeout=120)
    assert result.returncode == 2 and "--plot needs matplotlib" in result.stderr, result.stderr[-2000:]
    no_traceback(result)
    assert "epoch" not in result.stdout and "| reference |" not in result.stdout


def test_a_write_that_fails_at_the_end_costs_no_printed_result(tmp_path):
    patch = """
        import cli
        def failing(record, indent=2):
            def write(path):
                raise OSError(28, "No space left on device")
            return write
        cli.json_writer = failing
    """
    result = run_with(patch, "benchmark.py", *TINY, "--json", str(tmp_path / "b.json"))
    assert result.returncode == 1
    assert "| reference |" in result.stdout  # the table first
    assert "could not write" in result.stderr and "No space left on device" in result.stderr
    no_traceback(result)


def test_checkpoint_onto_a_directory_leaves_no_temporary_file(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    target = tmp_path / "ckpt.pt"
    target.mkdir()
    with pytest.raises(CheckpointError, match="cannot write the checkpoint"):
        save_checkpoint(str(target), model.state_dict(), opt.state_dict(), 1, [], {}, Config())
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


# ---------------------------------------------------------------------------
# distributed.py: numbers and --resume checked in the parent, before any rank starts
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("flag, value", [
    ("--timeout", "0"), ("--timeout", "-5"), ("--timeout", "nan"), ("--timeout", "inf"),
    ("--lr", "nan"), ("--lr", "inf"), ("--lr", "0"), ("--lr", "-1e-3"),
    ("--epochs", "0"), ("--batch-size", "-1"), ("--world-size", "0"), ("--bucket-kb", "0"),
    ("--seed", "-1"), ("--seed", "99999999999"), ("--batch-size", "1.5"),
])
def test_numeric_nonsense_is_a_usage_error(capsys, flag, value):
    with pytest.raises(SystemExit) as exit_:
        distributed.build_parser().parse_args([flag, value])
    assert exit_.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("backend, platform", [("nccl", "linux"), ("gloo", "darwin")])
def test_the_cpu_benchmark_refuses_what_it_cannot_read(monkeypatch, backend, platform):
    """--bench cpu reads gloo's threads from /proc: on NCCL, or off Linux, a clear error before any rank starts."""
    from parallel.common.training import Config

    monkeypatch.setattr(distributed.sys, "platform", platform)
    args = distributed.build_parser().parse_args(["--bench", "cpu", "--world-size", "2"])
    with pytest.raises(cli.UserError, match="gloo backend on Linux only"):
        distributed.check_before_launch(args, Config(backend=backend, device="cuda" if backend == "nccl" else "cpu"), 2)


def test_the_burst_benchmark_refuses_nccl():
    """--bench burst times CPU tensors: on NCCL, a clear error before any rank starts."""
    from parallel.common.training import Config

    args = distributed.build_parser().parse_args(["--bench", "burst", "--world-size", "2"])
    with pytest.raises(cli.UserError, match="gloo backend only"):
        distributed.check_before_launch(args, Config(backend="nccl", device="cuda"), 2)


@pytest.mark.parametrize("bench", ["allreduce", "cpu", "burst"])
def test_the_benchmarks_build_the_cpp_loop_first_or_say_why_not(monkeypatch, capsys, bench):
    """Without a compiler the benchmark runs without the C++ loop and says so; a build that
    fails is one clear error, before any rank starts."""
    import modes
    from parallel.collectives import cpp_loop
    from parallel.common.training import Config

    args = distributed.build_parser().parse_args(["--bench", bench, "--world-size", "2"])
    monkeypatch.setattr(cpp_loop, "unavailable", lambda: "needs a C++ compiler (test)")
    distributed.check_before_launch(args, Config(), 2)
    assert f"--bench {bench} runs without the C++ loop: needs a C++ compiler (test)" in capsys.readouterr().err

    def broken() -> str:
        raise modes.BuildError("building the dense_collectives extension failed; the compiler said: (test)")
    monkeypatch.setattr(cpp_loop, "unavailable", lambda: None)
    monkeypatch.setattr(cpp_loop, "build", broken)
    with pytest.raises(cli.UserError, match="C\\+\\+ loop could not be built.*compiler said"):
        distributed.check_before_launch(args, Config(), 2)


def test_numeric_nonsense_starts_no_rank():
    result = run_script("distributed.py", "--lr", "nan", timeout=60)
    assert result.returncode == 2 and "--lr" in result.stderr and "finite" in result.stderr
    assert "epoch" not in result.stdout
    no_traceback(result)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    path = str(tmp_path_factory.mktemp("ckpt") / "ckpt.pt")
    train(Config(world_size=1, checkpoint=path, epochs=1, hidden=(8,), train_limit=256, batch_size=64))
    return path


@pytest.mark.parametrize("change, message", [
    ({"seed": 1}, "--seed 0 but this run has --seed 1"),
    ({"batch_size": 32}, "--batch-size 64 but this run has --batch-size 32"),
])
def test_resume_with_another_data_order_is_refused(checkpoint, change, message):
    config = Config(world_size=1, checkpoint=checkpoint, resume=True, epochs=2, hidden=(8,), batch_size=64,
                    train_limit=256)
    check_resume(config)  # the same flags: accepted
    with pytest.raises(CheckpointError, match=message):
        check_resume(Config(**{**config.__dict__, **change}))


def test_resume_with_another_seed_fails_in_the_parent(checkpoint):
    result = run_script("distributed.py", "--checkpoint", checkpoint, "--resume", "--epochs", "2", "--hidden", "8",
                        "--batch-size", "64", "--seed", "3", timeout=120)
    assert result.returncode == 1, result.stderr[-2000:]
    assert "--seed 0 but this run has --seed 3" in result.stderr
    assert "rank" not in result.stderr and "epoch" not in result.stdout  # no rank was started
    no_traceback(result)


def test_bench_with_one_rank_has_nothing_to_measure():
    result = run_script("distributed.py", "--bench", "allreduce", "--world-size", "1", timeout=60)
    assert result.returncode == 2 and "nothing to measure" in result.stderr
    no_traceback(result)


# ---------------------------------------------------------------------------
# MNIST files that hold nothing, or labels that are not digits
# ---------------------------------------------------------------------------

def test_idx_with_zero_images_names_the_file(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "train-images-idx3-ubyte", torch.zeros(0, 6, 5))
    write_idx(tmp_path / "train-labels-idx1-ubyte", torch.zeros(0))
    assert data_mod.read_idx(tmp_path / "train-images-idx3-ubyte").shape == (0, 6, 5)
    with pytest.raises(data_mod.DataError, match=r"train-images-idx3-ubyte holds zero images"):
        data_mod.mnist(tmp_path)


@pytest.mark.parametrize("label", [10, 255])
def test_a_label_that_is_not_a_digit_names_the_file(tmp_path, label):
    make_mnist(tmp_path)
    labels = torch.zeros(40)
    labels[7] = label
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", labels)
    with pytest.raises(data_mod.DataError, match=rf"t10k-labels-idx1-ubyte: label {label} at index 7 is not a digit"):
        data_mod.mnist(tmp_path)


def test_mnist_always_has_ten_classes(tmp_path):
    make_mnist(tmp_path)
    write_idx(tmp_path / "train-labels-idx1-ubyte", torch.zeros(120))  # only zeros: still 10 classes
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", torch.zeros(40))
    assert data_mod.mnist(tmp_path).classes == 10


# ---------------------------------------------------------------------------
# Ctrl-C, a closed pipe, sizes that do not fit, a stage that does not build, slow gradchecks
# ---------------------------------------------------------------------------

def _ctrl_c_as_in_a_terminal() -> None:
    """In the child, before Python starts: SIGINT at its default. A shell that starts pytest in the
    background (`pytest &`, nohup, some CI runners) leaves SIGINT ignored; children inherit that,
    Python then installs no KeyboardInterrupt handler, and the test would time out."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("when", ["while importing", "while timing"])
def test_ctrl_c_is_one_line_and_exit_130(when):
    proc = subprocess.Popen([sys.executable, "benchmark.py", "-m", "py", "-b", "64", "-i", "64", "-o", "64",
                             "--rounds", "100000"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        if when == "while timing":
            for line in proc.stderr:  # wait until the timing has started
                if line.startswith("timing"):
                    break
        time.sleep(1)  # while importing: torch takes longer than this to import
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    # 130 from cli.run; during the imports Python ends itself by SIGINT, which a shell reports as 130 too
    assert proc.returncode in (130, -signal.SIGINT), err
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.slow
def test_ctrl_c_in_a_terminal_stops_every_rank_without_a_traceback():
    """A terminal sends SIGINT to the whole process group: the launcher and every rank."""
    proc = subprocess.Popen([sys.executable, "distributed.py", "-m", "py", "--epochs", "1000"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_ctrl_c_as_in_a_terminal)
    try:
        for line in proc.stdout:
            if line.startswith("epoch"):
                break
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "interrupted" in err and "Traceback" not in err


@pytest.mark.parametrize("args", [["grad_check.py", "py"], ["benchmark.py", *TINY]])
def test_a_closed_pipe_ends_quietly(tmp_path, args):
    extra = ["--json", str(tmp_path / "b.json")] if args[0] == "benchmark.py" else []
    proc = subprocess.Popen([sys.executable, *args, *extra], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone before the first line, as `| head -0` would be
    err = proc.stderr.read()
    proc.wait(timeout=300)
    assert proc.returncode == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err and "Exception ignored" not in err
    if extra:
        assert json.loads((tmp_path / "b.json").read_text())["results"]  # the file was written before the table


@pytest.mark.parametrize("script, args", [
    ("benchmark.py", ["-m", "py", "-b", "1000000", "-i", "1000000", "-o", "1000000"]),
    ("grad_check.py", ["py", "-b", "1000000", "-i", "1000000", "-o", "1000000", "--fast-gradcheck"]),
])
def test_sizes_that_cannot_fit_are_refused_before_allocating(script, args):
    started = time.monotonic()
    result = run_script(script, *args, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "GiB" in result.stderr and "smaller sizes" in result.stderr
    no_traceback(result)
    assert time.monotonic() - started < 60


def test_an_allocation_that_fails_anyway_is_one_line():
    patch = """
        import benchmark
        import record_info
        import timing
        def run(*a, **k):
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes")
        benchmark.run = run
    """
    result = run_with(patch, "benchmark.py", *TINY)
    assert result.returncode == 1 and "out of memory" in result.stderr and "smaller sizes" in result.stderr
    no_traceback(result)


BROKEN_CPP = """
    import modes
    real = modes.stage
    def stage(mode):
        if mode == "cpp":
            raise RuntimeError("building dense_cpp_ext failed:\\ncpp/dense.cpp:1:1: error: compiler said no")
        return real(mode)
    modes.stage = stage
"""


@pytest.mark.skipif(REASONS["cpp"] is not None, reason=f"mode cpp: {REASONS['cpp']}")
@pytest.mark.parametrize("argv, line", [
    (["grad_check.py", "all"], "FAIL  cpp     load the stage"),
    (["benchmark.py", "-m", "all", "-b", "4", "-i", "4", "-o", "4", "--rounds", "2"], "FAIL  cpp: could not load"),
    (["distributed.py", "-m", "cpp", "--epochs", "1"], "mode 'cpp' could not be loaded"),
])
def test_a_stage_that_fails_to_build_is_a_line_with_the_compilers_message(argv, line):
    result = run_with(BROKEN_CPP, *argv)
    assert result.returncode == 1
    output = result.stdout + result.stderr
    assert line in output and "compiler said no" in output, output[-2000:]
    no_traceback(result)
    if argv[0] != "distributed.py":
        assert "py" in result.stdout  # the other modes still ran


@pytest.mark.parametrize("argv, message", [
    (["grad_check.py", "py", "--json", "/tmp/errors.json"], "--json goes with --error-table"),
    (["grad_check.py", "all", "--error-table", "--dtype", "bfloat16"],
     "--error-table measures float32, bfloat16 and float16 itself"),
    (["grad_check.py", "py", "--error-table"], "--error-table measures every mode: give the mode as all"),
    (["grad_check.py", "all", "--error-table", "--no-bias"], "--error-table measures a layer with a bias"),
    (["grad_check.py", "cuda", "--emulate", "--kernel", "3", "--dtype", "bfloat16"],
     "--kernel 3 does not take bfloat16; the versions that do: 0, 11, 12"),
    (["grad_check.py", "ptx", "--dtype", "float16"], "mode 'ptx' does not take float16: it takes float32 and float64"),
    (["benchmark.py", "-m", "ptx", "--dtype", "bfloat16"], "mode 'ptx' does not take bfloat16: it takes float32 and"),
    (["grad_check.py", "py", "--dtype", "int8"], "invalid choice: 'int8'"),
    (["grad_check.py", "py", "--dtype", "float16", "--fast-gradcheck"], "there is no gradcheck in float16"),
    (["benchmark.py", "--dtype", "int8"], "invalid choice: 'int8'"),
])
def test_a_type_or_table_flag_given_wrongly_is_one_line(argv, message):
    started = time.monotonic()
    result = run_script(*argv, timeout=120)
    assert result.returncode == 2, result.stderr[-2000:]
    assert message in result.stderr.strip().splitlines()[-1]  # after argparse's usage, where it prints one
    no_traceback(result)
    assert "PASS" not in result.stdout and time.monotonic() - started < 60


def test_a_gradcheck_of_minutes_is_refused_with_smaller_sizes_suggested():
    result = run_script("grad_check.py", "py", "-b", "1024", "-i", "1024", "-o", "1024", timeout=60)
    assert result.returncode == 2 and "min" in result.stderr and "smaller sizes" in result.stderr
    assert "--fast-gradcheck" in result.stderr
    no_traceback(result)


def test_gradcheck_cost_grows_with_inputs_times_outputs():
    small, _ = grad_check.gradcheck_cost(8, 16, 12)
    assert small < grad_check.GRADCHECK_WARN_S  # the defaults run without a warning
    warned, _ = grad_check.gradcheck_cost(64, 128, 32)  # an example in --help: warned, not refused
    assert warned < grad_check.GRADCHECK_MAX_S
    big, nbytes = grad_check.gradcheck_cost(256, 256, 256)
    assert big > grad_check.GRADCHECK_MAX_S and nbytes == 8 * 2 * (256 * 256 * 2 + 256) * 256 * 256
    fast, fast_bytes = grad_check.gradcheck_cost(256, 256, 256, fast=True)
    assert fast < grad_check.GRADCHECK_WARN_S and fast_bytes < nbytes / 1000


def test_fast_gradcheck_runs_where_the_full_one_is_refused():
    result = run_script("grad_check.py", "py", "-b", "256", "-i", "256", "-o", "256", "--fast-gradcheck", timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS  py      gradcheck (fast) float64" in result.stdout


# ---------------------------------------------------------------------------
# --help examples never overwrite a tracked file (tests/test_records.py: the committed records)
# ---------------------------------------------------------------------------

OUTPUT_FLAGS = ("--json", "--plot", "--checkpoint", "--trace", "--out")


def help_examples(*invocation: str) -> list[list[str]]:
    result = run_script(*invocation, "--help")
    assert result.returncode == 0, result.stderr
    # The usage line shows the command as typed (python -m for a module, which has no other way to run).
    typed = " ".join(("python", *invocation) if invocation[0] == "-m" else (Path(invocation[0]).name, *invocation[1:]))
    assert result.stdout.startswith(f"usage: {typed} "), result.stdout.splitlines()[0]
    text = result.stdout
    examples = text[text.index("Examples:"):].replace("\\\n", " ")
    commands = []
    for line in examples.splitlines()[1:]:
        line = line.split("#")[0].strip()
        if line.startswith(("python ", "torchrun ")):
            commands.append(shlex.split(line))
    return commands


# Every script and subcommand that has --help: the commands of the chapters and docs/README.md.
INVOCATIONS = [(s,) for s in SCRIPTS] + [
    ("docs/records.py",), ("cuda/figures.py",), ("cuda/emulated.py",), ("tiles/compiler_report.py",),
    ("tiles/bench_gpu.py",), ("cuda/tensor_cores/figures.py",), ("cuda/tensor_cores/tf32_error.py",),
    ("-m", "parallel.collectives.ionice"), ("-m", "parallel.collectives.repeat"),
    ("-m", "parallel.collectives.figures"),
    ("cpp/overhead.py",), ("cuda/static_report.py",), ("ptx/sass_report.py",),
    *[("-m", "parallel.collectives.costmodel", c) for c in ("fit", "show", "plot", "predict")],
    *[("-m", "parallel.tp.report", c) for c in ("bytes", "shards", "timeline")], ("-m", "parallel.dp.trace"),
    ("-m", "parallel.dp.simple")]


@pytest.mark.parametrize("invocation", INVOCATIONS, ids=" ".join)
def test_help_examples_never_write_a_tracked_file(invocation):
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if tracked.returncode != 0:
        pytest.skip("not a git checkout")
    tracked_files = set(tracked.stdout.splitlines())
    commands = help_examples(*invocation)
    script = " ".join(invocation)
    # at least one example runs what this --help is about (a subcommand's, that subcommand)
    assert any(argv[1:1 + len(invocation)] == list(invocation) for argv in commands), f"{script} --help: no example"
    for argv in commands:
        outputs = [argv[k + 1] for k, a in enumerate(argv[:-1]) if a in OUTPUT_FLAGS]
        for out in outputs:
            rel = os.path.relpath(Path(ROOT, out).resolve(), ROOT) if not out.startswith("~") else out
            assert rel not in tracked_files, f"{script} --help example writes the tracked file {out}"
            assert not rel.startswith("docs/results"), f"{script} --help example writes into docs/results: {out}"


# ---------------------------------------------------------------------------
# Honest statistics
# ---------------------------------------------------------------------------

def test_collective_warm_up_makes_exactly_the_calls_asked_for():
    # With number given, every rank must make the same calls whatever its clock says: a rank
    # that cut its warm-up short (the calls took over a second) would desynchronise the
    # others' messages. 0.6 s per call: a warm-up cut at one second would stop after the second of three.
    counts = {}
    for name, seconds in (("fast", 0.0), ("slow", 0.6)):
        calls = counts[name] = []
        timing.measure({name: lambda c=calls, s=seconds: (c.append(1), time.sleep(s))}, rounds=1, warmup=3,
                          number=1)
    assert len(counts["slow"]) == len(counts["fast"]) >= 3 + 1


def test_sync_runs_right_before_each_samples_timed_calls():
    # The distributed benchmarks pass dist.barrier: the ranks must start the timed calls
    # together, so nothing (Timer.timeit's two untimed calls, say) may run between the two.
    seen = []
    stats = timing.measure({"a": lambda: seen.append("a"), "b": lambda: seen.append("b")}, rounds=3,
                              warmup=1, number=2, order="shuffle", sync=lambda: seen.append("sync"))
    timed = seen[2:]  # after one warm-up call of each
    assert len(timed) == 3 * 2 * 3  # rounds × variants × (sync + 2 calls)
    groups = [timed[i: i + 3] for i in range(0, len(timed), 3)]
    assert all(g[0] == "sync" and g[1] == g[2] != "sync" for g in groups)
    assert all(len(s.samples) == 3 for s in stats.values())


def test_shuffled_rounds_vary_each_variants_neighbour_and_agree_across_processes():
    def run() -> list[str]:
        seen = []
        timing.measure({k: (lambda k=k: seen.append(k)) for k in "abcd"}, rounds=12, warmup=0, number=1,
                          order="shuffle")
        return [k for i, k in enumerate(seen) if i == 0 or seen[i - 1] != k]  # one entry per call group

    first = run()
    assert first == run()  # the same order in every process: ranks make the same calls
    before_a = {first[i - 1] for i in range(1, len(first)) if first[i] == "a"}
    assert len(before_a) > 1  # rotation would always put "d" before "a"
    with pytest.raises(ValueError, match="order"):
        timing.measure({"a": lambda: None}, rounds=1, order="random")


def test_median_interval_matches_the_binomial_tables():
    values = list(range(1, 11))
    assert timing.median_ci(values) == (2, 9)          # n = 10: ranks 2 and 9 (97.9%)
    assert timing.median_ci(list(range(1, 7))) == (1, 6)  # n = 6: the extremes (96.9%)
    assert timing.median_ci(list(range(1, 6))) is None    # n = 5: no 95% interval exists


def test_median_interval_covers_the_true_median():
    rng = random.Random(0)
    trials, covered = 2000, 0
    for _ in range(trials):
        sample = [rng.expovariate(1.0) for _ in range(15)]  # skewed; true median ln 2
        lo, hi = timing.median_ci(sample)
        covered += lo <= 0.6931471805599453 <= hi
    assert covered / trials >= 0.94


def test_paired_ratio_verdicts():
    ref = [10.0] * 12
    assert timing.paired_ratio([9.0] * 12, ref)["verdict"] == "faster"
    assert timing.paired_ratio([11.0] * 12, ref)["verdict"] == "slower"
    mixed = timing.paired_ratio([9.0, 11.0] * 6, ref)
    assert mixed["verdict"] == "no significant difference" and mixed["ci"] == [0.9, 1.1]
    assert timing.paired_ratio([9.0] * 3, ref[:3])["verdict"] == "too few rounds for an interval"


def test_benchmark_record_is_consistent_with_its_samples(tmp_path):
    path = tmp_path / "b.json"
    result = run_script("benchmark.py", "-m", "py", "-b", "8", "-i", "16", "-o", "8", "--rounds", "8",
                        "--json", str(path), "--threads", "1")
    assert result.returncode == 0, result.stderr
    record = json.loads(path.read_text())
    assert record["threads"] == 1 and record["rounds"] == 8
    ref = record["results"][0]["samples_us"]["fwd+bwd"]
    for r in record["results"]:
        mine = r["samples_us"]["fwd+bwd"]
        assert len(mine) == 8 and r["fwd_bwd_us"] == pytest.approx(statistics.median(mine))
        again = timing.paired_ratio(mine, ref)
        assert r["ratio_to_reference"] == pytest.approx(again["ratio"]) and r["ratio_ci"] == again["ci"]
        assert r["verdict"] in result.stdout or r["mode"] == "reference"
    assert "fwd+bwd / reference (95% CI)" in result.stdout


def test_benchmark_inputs_keep_the_sigmoid_out_of_saturation():
    """Unscaled weights put subnormal numbers into the backward GEMMs at large I (slow for a
    reason that has nothing to do with the code compared); the inputs have nn.Linear's scale."""
    (x, w, b), _ = benchmark.inputs(256, 4096, 256, "cpu", torch.float32, 0)
    z = torch.nn.functional.linear(x, w, b).detach()
    assert 0.8 < z.std().item() < 1.2
    y = torch.sigmoid(z)
    assert (y * (1 - y)).min().item() > torch.finfo(torch.float32).tiny  # no subnormal gradients


def test_rounds_auto_adds_rounds_within_the_budget():
    started = time.monotonic()
    record = benchmark.run(["reference", "py"], 4, 4, 4, rounds=6, auto=True, ci_target=1e-9, budget_s=5.0)
    # The target cannot be met: rounds were added until the budget (counted from the first
    # round; 6 rounds take about 0.4 s) ran out, and not much beyond it.
    assert record["rounds"] > 6
    assert time.monotonic() - started < 60


def test_old_records_still_render():
    old = {"device": "cpu: x", "torch": "2.13.0", "threads": 2, "dtype": "float32", "rounds": 20,
           "shape": {"batch": 1, "in": 2, "out": 3}, "date": "d", "command": "python benchmark.py",
           "results": [{"mode": "reference", "forward_us": 1.0, "backward_us": 2.0, "forward_spread_us": 0.1,
                        "backward_spread_us": 0.2, "forward_gflops": 1.0, "backward_gflops": 1.0,
                        "ratio_to_reference": 1.0}]}
    assert "| reference | 1.0 (0.1) | 2.0 (0.2) | – |" in benchmark.table(old)


def test_sweep_record_table_and_goals():
    record = benchmark.run_sweep(["reference", "py"], [(1, 64, 64), (2, 8, 4)], "cpu", torch.float32,
                                 min_rounds=6, ci_target=0.5, budget_s=1.0)
    assert [(p["batch"], p["in"], p["out"]) for p in record["points"]] == [(1, 64, 64), (2, 8, 4)]
    for p in record["points"]:
        assert p["rounds"] >= 6 and p["ratios"]["py"]["ci"] is not None
        assert -1 < p["elementwise_share"] < 1
    assert record["points"][0]["goals"] == []  # the py stage has no speed goal at small batch
    text = benchmark.sweep_table(record)
    assert "| 1 | 64 | 64 |" in text and "| goal | points met |" in text

    replicated = benchmark.run_sweep(["reference", "py"], [(2, 8, 4)], "cpu", torch.float32,
                                     min_rounds=6, ci_target=0.5, budget_s=1.0, replicates=3)
    point = replicated["points"][0]
    assert replicated["replicates"] == point["replicates"] == 3 and point["rounds"] >= 6
    assert len(point["ratios"]["py"]["replicate_ratios"]) == 3 and point["ratios"]["py"]["ci"] is not None
    assert "over 3 replicates" in benchmark.sweep_table(replicated)
    # Replicates in fresh processes (as --sweep runs them): the same record, made by the children.
    spawned = benchmark.run_sweep(["reference", "py"], [(2, 8, 4)], "cpu", torch.float32,
                                  min_rounds=4, ci_target=0.5, budget_s=1.0, replicates=2, processes=True)
    assert spawned["replicate_in"] == "a fresh process each"
    assert len(spawned["points"][0]["ratios"]["py"]["replicate_ratios"]) == 2 and spawned["points"][0]["rounds"] >= 6


def test_replicated_ratio_widens_with_disagreeing_replicates():
    ref = [[10.0] * 20] * 4
    agree = timing.replicated_ratio([[9.0 + 0.01 * k for k in range(20)]] * 4, ref)
    assert agree["verdict"] == "faster" and agree["ci"][1] < 0.92
    # Each replicate alone is tight, but they disagree: the interval must cover them, not the rounds.
    apart = timing.replicated_ratio([[9.0] * 20, [11.5] * 20, [9.2] * 20, [11.0] * 20], ref)
    assert apart["replicate_ratios"] == pytest.approx([0.9, 1.15, 0.92, 1.1])
    assert apart["ci"][0] <= 0.92 and apart["ci"][1] >= 1.1 and apart["verdict"] == "no significant difference"
    # One replicate: the order statistics of its rounds, as paired_ratio gives.
    assert timing.replicated_ratio([[9.0] * 12], [[10.0] * 12])["ci"] == [0.9, 0.9]


def test_set_malloc_is_recorded():
    # In a child process: "retain" cannot be undone, and the test process keeps glibc's defaults.
    code = ("import record_info, timing, torch; print(record_info.record_header('cpu', torch.float32)['malloc']); "
            "print(timing.set_malloc('retain')); print(record_info.record_header('cpu', torch.float32)['malloc'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    before, done, recorded = result.stdout.split("\n")[:3]
    assert before == "default" and recorded == done
    assert done.startswith("retain (glibc") or done.startswith("default (")  # glibc, or it says why not


def test_replicates_only_with_sweep():
    result = run_script("benchmark.py", "--replicates", "3", timeout=60)
    assert result.returncode == 2 and "--replicates applies to --sweep" in result.stderr


@pytest.mark.plot
def test_sweep_and_training_plots(tmp_path):
    pytest.importorskip("matplotlib", reason="matplotlib (optional) not installed")
    from parallel.common.runs import plot as training_plot

    record = benchmark.run_sweep(["reference", "py"], [(1, 8, 8), (4, 8, 8)], "cpu", torch.float32,
                                 min_rounds=6, ci_target=0.5, budget_s=0.5)
    benchmark.sweep_plot(record, tmp_path / "sweep.png")
    run = {"epochs": [{"epoch": 1, "loss": 1.0, "accuracy": 0.5}, {"epoch": 2, "loss": 0.5, "accuracy": 0.7}],
           "final_accuracy": 0.7, "world_size": 2, "backend": "gloo", "config": {"data": "synthetic", "mode": "py"}}
    training_plot(run, tmp_path / "run.png")
    for name in ("sweep.png", "run.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_sets_its_own_shapes():
    result = run_script("benchmark.py", "--sweep", "-b", "4", timeout=60)
    assert result.returncode == 2 and "--sweep sets the shapes" in result.stderr


def test_cli_positive_rejects_nonsense():
    parse = cli.positive(float)
    assert parse("0.5") == 0.5
    for bad in ("0", "-1", "nan", "inf", "x"):
        with pytest.raises(Exception, match="finite|number"):
            parse(bad)


# ---------------------------------------------------------------------------
# The report scripts of chapters 3 to 7 share the same checks: outputs before any work, one line
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ("-m", "parallel.collectives.costmodel", "fit", "--world-sizes", "2", "--json", "{missing}/fit.json"),
    ("-m", "parallel.collectives.costmodel", "predict", "--compute-ms", "1", "--optimizer-ms", "0.1",
     "--json", "{missing}/p.json"),
    ("-m", "parallel.collectives.costmodel", "predict", "--validate", "{missing}/zero.json"),
    ("-m", "parallel.collectives.costmodel", "plot", "{missing}/allreduce.json", "--out", "{tmp}/m.png"),
    ("-m", "parallel.collectives.ionice", "--json", "{missing}/ionice.json"),
    ("-m", "parallel.tp.report", "bytes", "--json", "{missing}/bytes.json"),
    ("-m", "parallel.tp.report", "shards", "--out", "{missing}/s.png"),
    ("-m", "parallel.dp.trace", "{missing}/trace.json", "--out", "{tmp}/t.png"),
    ("-m", "parallel.dp.trace", "{tmp}/trace.json", "--out", "{missing}/t.png"),
    ("-m", "parallel.collectives.costmodel", "show", "--fit", "{missing}/fit.json"),
    ("cuda/static_report.py", "--json", "{tmp}"),
    ("ptx/sass_report.py", "--json", "{missing}/s.json"),
], ids=["fit-json", "predict-json", "predict-validate", "plot-record", "ionice-json", "bytes-json", "shards-out",
        "trace-record", "trace-out", "show-fit", "static-json-dir", "sass-json"])
def test_report_scripts_refuse_bad_paths_before_any_work(tmp_path, args):
    from conftest import run_script

    args = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in args]
    result = run_script(*args, timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "does not exist" in lines[0] or "is a directory" in lines[0] or "no such" in lines[0], lines[0]


def test_publish_writes_first_prints_then_reports_a_failed_write(tmp_path, capsys):
    import cli

    def failing(path):
        raise OSError(28, "No space left on device")

    good = tmp_path / "r.json"
    assert cli.publish("| the table |", [(good, cli.json_writer({"a": 1})), (None, failing)]) == 0
    assert json.loads(good.read_text()) == {"a": 1} and "| the table |" in capsys.readouterr().out
    assert cli.publish("| the table |", [(tmp_path / "s.json", failing)]) == 1
    out, err = capsys.readouterr()
    assert "| the table |" in out and f"{cli._prog()}: could not write" in err and "No space left" in err


# ---------------------------------------------------------------------------
# Records read from files, figure formats, the number of ranks, the predictor's numbers
# ---------------------------------------------------------------------------

def test_a_record_that_is_not_the_one_asked_for_is_one_line(tmp_path):
    files = {"corrupt.json": "{bad", "list.json": "[1, 2]", "allreduce.json": json.dumps({"benchmark": "allreduce"}),
             "zero.json": json.dumps({"benchmark": "zero"})}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    expected = {"corrupt.json": "not a JSON record (Expecting",
                "list.json": "not a JSON record (expected an object, got list",
                "allreduce.json": "a record of kind 'allreduce'; this needs a record of kind 'zero', written by w",
                "zero.json": "the record lacks results", "absent.json": "no such file"}
    for name, message in expected.items():
        with pytest.raises(cli.UserError, match="^--x .*" + name + ": " + message.replace("(", r"\(")):
            cli.read_record(str(tmp_path / name), "--x", "zero", "w", keys=("results",))
    with pytest.raises(cli.UserError, match="cannot read it"):
        cli.read_record(str(tmp_path), "--x")
    assert cli.read_record(str(tmp_path / "zero.json"), "--x", "zero") == {"benchmark": "zero"}


@pytest.mark.plot
def test_a_figure_name_matplotlib_cannot_write_is_refused_before_any_work(tmp_path):
    pytest.importorskip("matplotlib", reason="the plot extra is not installed")
    for name in ("run.txt", "run"):
        with pytest.raises(cli.UserError, match="matplotlib cannot write"):
            cli.check_plot(str(tmp_path / name), "--plot")
    assert cli.check_plot(str(tmp_path / "run.svg")) == tmp_path / "run.svg"
    started = time.monotonic()
    result = run_script("distributed.py", "-m", "py", "--epochs", "1", "--plot", str(tmp_path / "run.txt"),
                        timeout=120)
    assert result.returncode == 2 and "matplotlib cannot write .txt files" in result.stderr, result.stderr[-2000:]
    no_traceback(result)
    assert "epoch" not in result.stdout and time.monotonic() - started < 60


def test_more_local_ranks_than_memory_can_start_are_refused_before_any_starts():
    from parallel.common.launch import launch

    started = time.monotonic()
    with pytest.raises(cli.UserError, match="100000 local ranks need about .* use fewer ranks"):
        launch(print, 100_000)
    result = run_script("distributed.py", "-m", "py", "--world-size", "100000", timeout=120)
    assert result.returncode == 2 and "use fewer ranks (--world-size)" in result.stderr, result.stderr[-2000:]
    no_traceback(result)
    assert time.monotonic() - started < 60


@pytest.mark.parametrize("args, message", [
    (["predict", "--compute-ms", "12"], "--optimizer-ms is needed (or a --validate record to take it from)"),
    (["predict"], "--compute-ms and --optimizer-ms are needed"),
    (["predict", "--compute-ms", "12", "--optimizer-ms", "20"], "it must be smaller"),
    (["predict", "--compute-ms", "0", "--optimizer-ms", "0"], "must be a finite number > 0, got '0'"),
    (["predict", "--compute-ms", "nan", "--optimizer-ms", "1"], "must be a finite number > 0, got 'nan'"),
    (["predict", "--compute-ms", "12", "--optimizer-ms", "2", "--gpu-compute-ms", "-1"], "got '-1'"),
    (["predict", "--compute-ms", "12", "--optimizer-ms", "2", "--hidden", "64,0"], "every width must be at least 1"),
    (["predict", "--compute-ms", "12", "--optimizer-ms", "2", "--batch-per-rank", "0"], "must be at least 1"),
    (["predict", "--validate", "docs/results/allreduce_gloo_w2.json"], "this needs a record of kind 'zero'"),
    (["predict", "--validate", "{tmp}/no_variants.json"], "no step time for compute only, adam step alone, dp, zero"),
    (["plot", "docs/results/zero_gloo_w2.json", "--out", "{tmp}/m.png"], "this needs a record of kind 'allreduce'"),
    (["fit", "--rounds", "0"], "must be at least 1, got '0'"),
    (["fit", "--world-sizes", "2,2"], "each world size once"),
    (["predict", "--compute-ms", "12", "--optimizer-ms", "2", "--fit", "docs/results/zero_gloo_w2.json"],
     "this needs a record of kind 'alphabeta'"),
    (["show", "--fit", "{tmp}/no_variants.json"], "this needs a record of kind 'alphabeta'"),
], ids=["no-optimizer", "neither", "optimizer-over-compute", "zero", "nan", "negative-gpu", "zero-width",
        "zero-batch", "validate-allreduce", "validate-damaged", "plot-zero", "fit-rounds", "fit-twice",
        "predict-fit-kind", "show-fit-kind"])
def test_the_cost_models_commands_refuse_nonsense_in_one_line(tmp_path, args, message):
    (tmp_path / "no_variants.json").write_text(json.dumps(
        {"benchmark": "zero", "results": [], "world_size": 2, "parameters": 1, "hidden": [1], "batch_per_rank": 1}))
    args = [a.format(tmp=tmp_path) for a in args]
    result = run_script("-m", "parallel.collectives.costmodel", *args, timeout=60)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    no_traceback(result)
    assert message in result.stderr.strip().splitlines()[-1]  # argparse's usage lines may come first


@pytest.mark.parametrize("size", ["0", "1", "-1"])
def test_ionice_asks_for_two_ranks_or_more_in_the_same_words(size):
    result = run_script("-m", "parallel.collectives.ionice", "--world-size", size, timeout=60)
    assert result.returncode == 2 and "--world-size must be at least 2 (a collective needs a peer)" in result.stderr



def test_nccl_with_more_ranks_than_gpus_is_refused_before_the_start(monkeypatch):
    """NCCL allows one rank per GPU; two ranks on one GPU must get a clear error, not NCCL's."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    args = distributed.build_parser().parse_args(["-m", "cuda", "--world-size", "2", "--backend", "nccl"])
    with pytest.raises(cli.UserError, match=r"one GPU per rank: 2 ranks on this machine, 1 GPU\(s\); use --backend "):
        distributed.resolve(args, 2)
