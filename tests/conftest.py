"""Shared test parameters: which (mode, device) pairs exist, and which of them run here."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

import cli
import modes

ROOT = Path(__file__).resolve().parent.parent
REASONS = modes.available()
GPU = torch.cuda.is_available()
NO_GPU = (f"needs a CUDA build of torch and a GPU; this torch is {torch.__version__}" if torch.version.cuda is None
          else f"needs a GPU: torch {torch.__version__} is a CUDA build, but torch.cuda.is_available() is False")

# py and cpp run on both devices (cpp through ATen on CUDA); cuda and ptx only on a GPU.
# triton runs one way per process: compiled on CUDA tensors where there is a GPU, else
# through Triton's interpreter on CPU tensors (tiles/dense.py).
DEVICES = {"py": ("cpu", "cuda"), "cpp": ("cpu", "cuda"), "triton": ("cuda",) if GPU else ("cpu",),
           "cuda": ("cuda",), "ptx": ("cuda",)}


def _param(mode: str, device: str):
    marks = []
    if device == "cuda":
        marks += [pytest.mark.gpu, pytest.mark.skipif(not GPU, reason=NO_GPU)]
    if REASONS[mode] is not None:
        marks.append(pytest.mark.skip(reason=f"mode {mode}: {REASONS[mode]}"))
    return pytest.param(mode, device, marks=marks, id=f"{mode}-{device}")


MODE_DEVICE = [_param(m, d) for m in modes.MODES for d in DEVICES[m]]


def load_script(path: str, name: str | None = None) -> ModuleType:
    """A script outside any package (cuda/, ptx/, tiles/, docs/), loaded by file once per run
    through cli.load_file, under the name every loader gives that file (cli.module_name), so that
    a test and the scripts share one module; ``name`` gives a test a copy of its own."""
    return cli.load_file(path, name)


def assert_compiled_step_matches(layer, step, compiled, x: torch.Tensor) -> None:
    """One step eager and one compiled, from zeroed gradients: the same loss and gradients.
    Leaves the layer's gradients zeroed."""
    layer.zero_grad()
    eager_loss = step(x)
    eager_loss.backward()
    eager_grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    compiled_loss = compiled(x)
    compiled_loss.backward()
    torch.testing.assert_close(compiled_loss, eager_loss)
    for p, g in zip(layer.parameters(), eager_grads):
        torch.testing.assert_close(p.grad, g)
    layer.zero_grad()


def run_script(*args: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a repository script the way a user would, from the repository root."""
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


# Chapters' text as the tests read it: whitespace folded, counts as the pages write them


def fold(text: str) -> str:
    return " ".join(text.split())



def exercise(page: Path, number: int, part: str) -> str:
    """Exercise `number` of a chapter, its question (part "question") or its answer, folded."""
    section = page.read_text().split("## Exercises", 1)[1].split("## Answers", 1)
    body = section[0] if part == "question" else section[1]
    found = re.search(rf"^{number}\. (.*?)(?=^\d\. |\Z)", body, re.S | re.M)
    return fold(found.group(1))


def repository_copy(tmp_path: Path) -> Path:
    """The working tree copied (sources only), where an exercise's edit is made and its command run."""
    copy = tmp_path / "repo"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(".git", ".venv*", "build", ".pytest_cache",
                                                              ".ruff_cache", "__pycache__"))
    return copy


def all_reduce_case(numel: int, dtype: torch.dtype, op: str, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Inside a rank: this rank's input for an all-reduce test (seeded by rank and size), and
    what dist.all_reduce makes of it (divided by the world size for op="avg")."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(7919 * dist.get_rank() + numel)
    t = (torch.randn(numel, generator=g) * scale).to(dtype)
    expected = t.clone()
    dist.all_reduce(expected)
    if op == "avg":
        expected /= dist.get_world_size()
    return t, expected


def world_sizes(*sizes: int, quick: int = 2) -> list:
    """Parametrize a multi-process test over world sizes: up to ``quick`` ranks in the quick suite,
    the larger ones (slower: more processes than this machine has cores) under the slow marker."""
    return [pytest.param(n, marks=[] if n <= quick else [pytest.mark.slow], id=str(n)) for n in sizes]


# ---------------------------------------------------------------------------
# Building ahead: the libraries the tests load, compiled in a background process while the first
# tests run, so that on 2 cores a whole run does not wait for each build in turn. Each build is
# made once however many processes ask (torch's lock for the cpp extension, cli.build_lock for
# the emulation's libraries): a test that needs one waits for it instead of building it again.
# Only the builds the selected tests need are made (prebuild_steps), and none for one test file.
# DENSE_NO_PREBUILD=1 turns this off.
# ---------------------------------------------------------------------------
PREBUILD = """
import sys
import cli
def step(name, fn):
    print(name, flush=True)
    try:
        fn()
    except Exception as e:  # the tests that need it will say why, in their own words
        print(f"{name} failed: {e}", flush=True)
    print(f"{name} done", flush=True)
import modes
wanted = sys.argv[1:]
if "cpp" in wanted and modes.available()["cpp"] is None:
    step("cpp", lambda: modes.build("cpp"))
emulated = cli.load_file("cuda/emulated.py")
if "emulation" in wanted and emulated.unavailable_reason() is None:
    step("emulation", emulated.build)
counters = cli.load_file("cuda/counters.py")
if "counters" in wanted and counters.unavailable_reason() is None:
    step("counters", counters.build)
"""
# Each build, and what shows that a selected test needs it: a test parametrized by stage (a "mode"
# that names one) needs its own stage's build alone (the cpp extension for "cpp"); any other test, what its module
# names (a module that names the cpp stage, cuda/emulated.py or cuda/counters.py may load it).
PREBUILD_NEEDS = {"cpp": re.compile(r"\bcpp\b"), "emulation": re.compile(r"\bemulated\b"),
                  "counters": re.compile(r"\bcounters\b")}
_prebuild: tuple[subprocess.Popen, Path] | None = None


def prebuild_steps(items: list[pytest.Item]) -> list[str]:
    """The builds worth starting ahead for these tests, in PREBUILD's order: none for one test
    file (its tests wait for a build either way), else those some selected test needs."""
    if len({item.path for item in items}) < 2:
        return []
    sources: dict[Path, str] = {}
    needed: set[str] = set()
    for item in items:
        callspec = getattr(item, "callspec", None)
        mode = callspec.params.get("mode") if callspec else None
        if mode in modes.MODES:
            needed |= {"cpp"} if mode == "cpp" else set()
            continue
        if item.path not in sources:
            sources[item.path] = item.path.read_text()
        needed |= {step for step, names in PREBUILD_NEEDS.items() if names.search(sources[item.path])}
    return [step for step in PREBUILD_NEEDS if step in needed]


def pytest_collection_finish(session: pytest.Session) -> None:
    global _prebuild
    if os.environ.get("DENSE_NO_PREBUILD") or session.config.option.collectonly:
        return
    steps = prebuild_steps(session.items)
    if not steps:
        return
    log = ROOT / "build" / "prebuild.log"
    log.parent.mkdir(exist_ok=True)
    with open(log, "w") as out:
        process = subprocess.Popen([sys.executable, "-c", PREBUILD, *steps], cwd=ROOT, stdout=out,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # Ctrl-C: the tests' alone
    _prebuild = (process, log)


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A build still running when the tests end is stopped, unless it is the cpp extension's,
    which torch guards with a lock file that a killed build would leave behind (the next build
    would wait on it for ever): that one is left to finish."""
    if _prebuild is None or _prebuild[0].poll() is not None:
        return
    process, log = _prebuild
    lines = log.read_text().splitlines()
    if lines and lines[-1] == "cpp":
        process.wait()
    else:
        process.terminate()
        process.wait()
