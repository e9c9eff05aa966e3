"""Every command a chapter shows in a ```bash block runs as written, and leaves tracked files alone.

The quick commands run here; pytest commands are collected (an empty selection would fail the
reader with exit status 5). What needs a GPU, a second machine or minutes is listed in LONG or
skipped with the reason, and run by hand before a change lands.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
from pathlib import Path

import pytest

from cli import cuda_tool
from conftest import GPU, REASONS, ROOT

pytestmark = pytest.mark.slow  # every chapter's commands: builds, training runs, compilers

CHAPTERS = ["README.md", "py/README.md", "cpp/README.md", "cuda/README.md", "ptx/README.md",
            "cuda/tensor_cores/README.md", "tiles/README.md", "parallel/dp/README.md", "parallel/collectives/README.md",
            "parallel/tp/README.md", "docs/README.md"]  # the reading order (tests/test_order.py)

# Commands that are not run here, and why (a pattern matched against the command).
NOT_HERE = [
    (r"^python -m venv |^\. \.venv|pip install", "installs packages"),
    (r"^torchrun --nnodes 2", "needs two machines"),
    (r"records\.py --run", "retakes the committed records (minutes; writes tracked files on purpose)"),
    (r"^python docs/render\.py$", "rewrites the chapters' tables (render.py --check runs in CI)"),
    (r"--bench allreduce", "minutes of timing; run by hand"),
    (r"costmodel fit", "a minute of timing on 2, 3 and 4 ranks; run by hand"),
    (r"^python -m pytest -m slow$|^python -m pytest$", "the test suites themselves"),
]


def commands() -> list:
    params = []
    for chapter in CHAPTERS:
        text = (ROOT / chapter).read_text()
        for block in re.findall(r"^```bash\n(.*?)^```", text, re.S | re.M):
            for raw in block.replace("\\\n", " ").splitlines():
                command, _, comment = raw.partition("  #")
                command = command.strip()
                if not command or command.startswith("#"):
                    continue
                params.append(pytest.param(chapter, command, comment.strip(), id=f"{chapter}: {command[:60]}"))
    return params


def _skip_reason(command: str, comment: str) -> str | None:
    for pattern, why in NOT_HERE:
        if re.search(pattern, command):
            return why
    gpu_only = "--device cuda" in command or re.match(r"GPU( only)?:", comment) or "bench_gpu.py" in command
    if gpu_only and not GPU:
        return "needs a GPU"
    if ("figures" in command or "--plot" in command) and importlib.util.find_spec("matplotlib") is None:
        return "needs matplotlib (optional)"
    if ("triton" in command or "tiles/" in command) and REASONS["triton"] is not None:
        return f"mode triton: {REASONS['triton']}"
    if re.search(r"\bnvcc\b|static_report|sass_report|regen\.sh|compiler_report", command) and not cuda_tool("nvcc"):
        return "needs nvcc (python -m pip install -r requirements-cuda.txt)"
    for path in re.findall(r"--fit (\S+)", command):
        if not Path(path).exists():
            return f"reads {path}, which the chapter's fit command (run by hand) writes"
    if re.search(r"--sass|sass_report", command) and not (cuda_tool("cuobjdump") and cuda_tool("nvdisasm")):
        return "needs cuobjdump and nvdisasm (python -m pip install -r requirements-cuda.txt)"
    return None


def _tracked_state() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                          text=True).stdout


@pytest.mark.parametrize("chapter, command, comment", commands())
def test_a_chapters_command_runs_as_written(chapter, command, comment):
    why = _skip_reason(command, comment)
    if why:
        pytest.skip(why)
    if command.startswith("python -m pytest"):
        command += " --collect-only -q -p no:cacheprovider"  # the selection exists; the suite runs it
    before = _tracked_state()
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, f"{chapter}: {command}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    assert _tracked_state() == before, f"{chapter}: {command} changed tracked files"


def test_every_chapter_has_commands_to_run():
    chapters = {p.values[0] for p in commands()}
    assert chapters == set(CHAPTERS)
