"""--time-build's job: every stage the GPU plan's build part builds, built from scratch for one GPU
architecture, one compiler at a time, each source's CPU seconds and the link's; the plan's build
limit (.ci/gpu.py build_limit) is made from the record this writes.

Run through .ci/gpu.py (the record's command):
  python .ci/gpu.py --time-build 9.0a --json docs/results/build_sm90a.json
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import cli  # noqa: E402

_NINJA_BUILD = re.compile(r"^build (\S+): (\w+) (.+)$", re.M)


def _timed(command: str | list[str], cwd: Path) -> dict[str, float]:
    """Run one compiler command; its wall seconds and the CPU seconds of it and everything it ran
    (nvcc's cicc and ptxas included): what it costs on a core of its own, whatever else the
    machine is doing."""
    import resource

    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    got = subprocess.run(command, cwd=cwd, shell=isinstance(command, str), capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if got.returncode != 0:
        raise cli.UserError(f"--time-build: a compiler failed in {cwd}: {got.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(time.monotonic() - t0, 2), "cpu_s": round(cpu, 2)}


def ninja_one_at_a_time(build_dir: Path) -> dict[str, dict[str, float]]:
    """Compile every source of the build.ninja in `build_dir`, one at a time, then link: each
    command as ninja would run it (ninja -t commands), timed by _timed. {source relative to the
    repository, or "link": seconds}."""
    seconds = {}
    edges = _NINJA_BUILD.findall((build_dir / "build.ninja").read_text())
    for target, rule, inputs in sorted(edges, key=lambda e: e[1] == "link"):  # the link last
        if rule == "phony":
            continue
        command = subprocess.run(["ninja", "-t", "commands", "-s", target], cwd=build_dir, capture_output=True,
                                 text=True, check=True).stdout.strip()
        source = Path(inputs.split()[0])
        key = "link" if rule == "link" else (source.relative_to(ROOT).as_posix() if source.is_relative_to(ROOT)
                                              else str(source))
        print(f"  {key}...", file=sys.stderr, flush=True)
        seconds[key] = _timed(command, build_dir)
    return seconds


def time_build(arch: str) -> dict:
    """Build what the build part builds, from scratch, in folders of their own under
    build/time-build/, with each stage's own flags (the loader's: modes.load_extension writes the
    build.ninja) for GPU architecture `arch`, one compiler at a time: each source's seconds and
    the link's (ninja_one_at_a_time), and the CPU emulation's library (one c++ command)."""
    import shutil

    from torch.utils import cpp_extension

    os.environ.update({"TORCH_CUDA_ARCH_LIST": arch, "DENSE_FORCE_JIT": "1"})
    import torch

    import modes
    import record_info

    if torch.version.cuda is None:
        raise cli.UserError(f"--time-build needs a CUDA build of torch (this one is {torch.__version__}) and nvcc")
    scratch = ROOT / "build" / "time-build"
    shutil.rmtree(scratch, ignore_errors=True)
    original_build, original_ninja = modes.jit_build, cpp_extension._run_ninja_build
    stages: dict[str, dict] = {}

    def fresh(name, sources, build_dir, *rest):  # the loader's own call, into a folder of its own
        where = scratch / name
        where.mkdir(parents=True)
        cpp_extension._run_ninja_build = lambda directory, verbose, error_prefix: stages.__setitem__(
            name, {"seconds": ninja_one_at_a_time(Path(directory))})
        original_build(name, sources, where, *rest)

    load = os.getloadavg()[0]
    modes.jit_build = fresh
    try:
        for mode in ("cpp", "cuda", "ptx"):
            print(f"building the {mode} stage from scratch, one compiler at a time...", file=sys.stderr, flush=True)
            modes.build(mode)
    finally:
        modes.jit_build, cpp_extension._run_ninja_build = original_build, original_ninja
    emulated = cli.load_file("cuda/emulated.py")
    print("building the CPU emulation's library...", file=sys.stderr, flush=True)
    command = [os.environ.get("CXX", "c++"), *emulated.CXX_FLAGS, "cuda/emulate/emulate.cpp", "-o",
               str(scratch / "libdense_emu.so")]
    stages["emulation"] = {"seconds": {"cuda/emulate/emulate.cpp": _timed(command, ROOT)}}
    nvcc = subprocess.run([str(modes.cuda_build().home / "bin" / "nvcc"), "--version"], capture_output=True,
                          text=True).stdout
    return {"device": record_info.describe_device("cpu"), **record_info.describe_machine(), "torch": torch.__version__,
            "nvcc": (re.findall(r"release [\d.]+, V[\d.]+", nvcc) or ["?"])[0], "arch": arch,
            "load_average": [round(load, 2), round(os.getloadavg()[0], 2)],
            "cuda_stage_sources": [s.as_posix() for s in modes.cuda_stage_sources()],
            "stages": stages, **record_info.provenance()}
