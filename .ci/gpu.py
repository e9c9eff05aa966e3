"""The GPU machine's work: one plan of parts, each under its own time limit, all under one deadline.

A GPU lease is short: 15 minutes of device time in all, the machine's start (a few minutes)
included, one command at most 10 minutes, at most 8 files back from $OUT. So the lease is one
call of at most 9 minutes that holds, in order of value:

  lease    (9 min, the first call) the build of every stage; every GEMM entry against the CPU
           emulation's committed bits, one version a process under a limit of its own, several
           side by side (cuda/isolated.py exact: a fault or a hang costs that version alone, and
           the record says which and how); then each version never timed on a GPU, by its number
           and only if its own exact check passed, one a process (cuda/isolated.py kernels); then,
           as a tail that the deadline cuts, compute-sanitizer's memcheck, racecheck and synccheck
           on every never-run version and candidate, and Nsight Compute's counters
  second   (3 min, only if the first ends early; it can start cold: it builds) grad_check.py on
           odd shapes, NCCL's refusal of two ranks; as a tail, grad_check in bfloat16, the GPU
           tests, chapter 3's table retaken, the PTX edits

A tail part is cut by the deadline, not by its own limit: what it did not reach is NOT RUN, which
does not fail the call. The other parts' limits add up to less than the deadline by more than the
grace a stopped part gets (GRACE_S).

Every other part (the Triton stage's timings, the autotuning candidates, what loading PTX costs,
two ranks training on the GPU) is run by name, as the first call of another lease:
  bash .ci/gpu triton-4096 triton-b32 --out "$OUT"   (the parts they need come with them)

The build part's limit comes from a measurement (--time-build, the record docs/results/
build_sm90a.json): each source of each stage compiled alone, for sm_90a; on the lease's 16 cores
they compile side by side, so the build takes about its slowest source and the link; the
limit is that, doubled, plus the time to load the stages. The isolated runs' limits come from a
child's start measured here (cuda/isolated.py's START_S) and their work's estimate, in waves of
children side by side, one of them hung to its own limit; grad-check's from Triton's compiles
measured here (TRITON_COMPILE_S). --list says each one's sum.

A part that fails, runs out of time or cannot run is FAILED in the summary table printed last,
and the exit status is 1; a part whose prerequisite failed does not run. Records are written
where the chapters cite them (docs/results/<name>.json; a card's records carry its name, e.g.
cuda_gpu_h100.json), so that their commands are the ones tests/test_records.py accepts. Every
timing part writes its record after each measurement. After every part, the records of the parts
that passed are packed into $OUT/records.tar.gz, those of a kind no chapter shows yet into
new-records.tar.gz, and those of a part that did not pass (what it measured before it stopped)
into failed-records.tar.gz; a part the deadline stopped packs what it measured with the others
(its record is whole as far as it got). Also in $OUT: gpu.log (every part's output) and
pytest-gpu.xml.
Back on the development machine, in the repository's root:
  tar -xzf records.tar.gz && python docs/render.py && git add docs/results

--dry-run checks, on any machine, every part of every selection: the script and its flags,
the tests it collects, its records (under docs/results/, written by its own command), its inputs
(none ignored by git unless an earlier part makes it), its exit status (no inline shell), the
build's measurement (one for every source of the cuda stage), and the limits against the
deadlines and the lease.

Examples:
  bash .ci/gpu --list                        # the selections: parts, limits, totals, commands
  bash .ci/gpu --dry-run lease               # check one selection here (no GPU needed)
  bash .ci/gpu lease --out "$OUT"            # GPU: the first call of a lease
  bash .ci/gpu second --out "$OUT"           # GPU: the second, only if the first ended early
  bash .ci/gpu gemm ptx --out /tmp/gpu       # GPU: named parts (and the parts they need)
  python .ci/gpu.py --time-build 9.0a --json /tmp/build.json   # CUDA torch and nvcc, no GPU: time the build
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # cli.py and the catalog of versions; nothing here imports torch at load
    sys.path.insert(0, str(ROOT))
import cli  # noqa: E402

RESULTS = "docs/results"  # where the chapters read the records
OUT = "{out}"             # stands for the --out folder in a part's command and extras
TAG = "{tag}"             # stands for the card (h100, h200) in a part's command and records
MAX_FILES = 8             # what one command of a lease brings back
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # the only file names that come back
LOG, RECORDS, FAILED_RECORDS = "gpu.log", "records.tar.gz", "failed-records.tar.gz"
NEW_RECORDS = "new-records.tar.gz"  # of a kind no chapter shows: tests/test_records.py would refuse them
GRACE_S = 10              # after SIGINT, before SIGKILL: a JIT build killed outright leaves its lock file

# The lease: device time in all, the machine's start (assumed: "a few minutes", never timed from
# here), the first call, and what a second call has if the first used all of its deadline.
LEASE_S = 15 * 60
START_S = 3 * 60
FIRST_CALL_S = 9 * 60
SECOND_CALL_S = LEASE_S - START_S - FIRST_CALL_S
COMMAND_S = 10 * 60       # one command of a lease at most
LEASE_CORES = 16
LEASE_ARCH = "9.0a"       # the cards lent (H100, H200), as lease_arch builds them: what the build is measured for
BUILD_RECORD = f"{RESULTS}/build_sm{LEASE_ARCH.replace('.', '')}.json"
BUILD_MARGIN = 2.0        # the lease's CPUs are not the ones measured, and ~25 compilers share its 16 cores
BUILD_LOAD_S = 20         # after the link: each stage's process imports torch and loads its library
# A cold start of torch: the CUDA build maps 2.95 GiB of libraries and touches ~0.65 GiB of them
# (resident after `import torch`, measured on the CUDA torch here), 7 s at 100 MB/s from a cold
# disk; then the driver's first initialisation and the tools' --version (nvcc, ncu,
# compute-sanitizer, nvidia-smi), seconds each when cold.
ENV_S = 40
# grad_check.py all on the GPU compiles the Triton stage's kernels on a cold cache: in float32 its
# forward autotuned over 6 configurations in float64 (gradcheck) and in float32, and two backward
# kernels in each; in bfloat16, 6 and 2. Measured here (tiles/compiler_report.py's compile for
# sm_90, one process, 2026-11-29): float64's 8 compiles 3.6 s, float32's 8 4.8 s (1.3 s of it the
# first compile's imports), bfloat16's 8 2.3 s. Doubled (other CPUs, a cold disk), plus the
# autotuner's timing (do_bench: 25 ms of warm-up and 100 ms of repeats, 6 configurations a key),
# a child's start (isolated.START_S) and the checks themselves (seconds: gradcheck's thousands of
# launches of every stage).
TRITON_COMPILE_S = {"float32": 3.6 + 4.8, "bfloat16": 2.3}
TRITON_KEYS = {"float32": 2, "bfloat16": 1}  # the autotuner's keys a run times: 6 configurations each
CHECKS_S = 10


@dataclass(frozen=True)
class Part:
    name: str
    limit_s: int
    argv: tuple[str, ...]               # "python" is this interpreter; {out} the --out folder; {tag} the card
    why: str                            # one line for --list and the log
    records: tuple[str, ...] = ()       # docs/results/... it writes, to be committed
    extras: tuple[str, ...] = ()        # {out}/... it writes besides (test reports)
    inputs: tuple[str, ...] = ()        # files of the repository it reads that git may not hold
    produces: tuple[str, ...] = ()      # files of the repository it writes for later parts
    needs: tuple[str, ...] = ()         # parts that must have passed before it runs
    after: tuple[str, ...] = ()         # parts that must have run before it, passed or not (it reads their record)
    expect: int = 0                     # the exit status that means it did its job
    unless: Callable[[], str | None] | None = None  # why to skip it, decided when it is due
    says: str = ""                      # what its output must hold besides the exit status (a refusal's words)
    stands_for: str = ""                # another part whose place it takes: it meets the needs on that one
    tail: bool = False                  # cut by the deadline: not counted against it; NOT RUN if not reached

    def command(self, tag: str = TAG, out: str = OUT) -> list[str]:
        return [a.replace(TAG, tag).replace(OUT, out) for a in self.argv]

    def text(self, tag: str = TAG) -> str:
        return shlex.join(self.command(tag))


# ---------------------------------------------------------------------------------------
# What the parts depend on: the GEMM versions, the PTX stage's versions, cuda/bench_gpu.py's parts
# ---------------------------------------------------------------------------------------
def versions() -> list[int]:
    """The GEMM versions, 0 (automatic) first, as cuda/dense_kernels.h's kVersionInfo lists them
    (cuda/catalog.py reads the header as text: no torch, any Python)."""
    return [v.id for v in cli.load_file("cuda/catalog.py").versions()]


def _constant(path: Path, name: str) -> object | None:
    """A module-level constant of a Python file, read without importing it (None if absent)."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            try:
                return ast.literal_eval(node.value)
            except ValueError:
                return None
    return None


def ptx_deselection(test_file: Path = ROOT / "tests" / "test_cuda.py") -> tuple[str | None, str]:
    """(a pytest -k expression, why) for the GPU test run.

    tests/test_cuda.py crosses every GEMM version with both GPU stages; the PTX stage carries only
    the versions in its PTX_VERSIONS, so each other (version, ptx) item would only skip at run
    time. They are left out at collection instead, by their ids' tail "-<v>-ptx]" or "[<v>-ptx]",
    so that a GPU run reports skips that mean something. (None, why) when there is nothing to leave out."""
    carried = _constant(test_file, "PTX_VERSIONS")
    if not carried:
        return None, f"{test_file.name} has no PTX_VERSIONS: no ptx item is left out"
    others = [v for v in versions() if v not in carried]
    if not others:
        return None, f"the PTX stage carries every GEMM version {tuple(carried)}"
    terms = " or ".join(f"{edge}{v}-ptx]" for v in others for edge in "-[")
    return f"not ({terms})", (f"leaves out ptx items of versions {others}: the PTX stage carries {tuple(carried)} "
                              f"only ({test_file.name}'s PTX_VERSIONS)")


def bench_gpu_lacks(part: str) -> Callable[[], str | None]:
    """A part's `unless`: why to skip it while cuda/bench_gpu.py has no PART of that name yet."""
    def reason() -> str | None:
        parts = _constant(ROOT / "cuda" / "bench_gpu.py", "PARTS") or ()
        return None if part in parts else f"cuda/bench_gpu.py has no part {part!r} yet (its PARTS: {', '.join(parts)})"
    return reason


def script_lacks(script: str, flag: str) -> Callable[[], str | None]:
    """A part's `unless`: why to skip it while `script` has no option `flag` (an add_argument call
    that names it, read without running the script: its --help imports torch)."""
    def reason() -> str | None:
        tree = ast.parse((ROOT / script).read_text())
        named = any(isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument"
                    and any(isinstance(a, ast.Constant) and a.value == flag for a in node.args)
                    for node in ast.walk(tree))
        return None if named else f"{script} has no {flag} option yet (python {script} --help does not list it)"
    return reason


def isolated_module():
    """cuda/isolated.py (no torch at load): its children's limits and which versions ran on a GPU."""
    return cli.load_file("cuda/isolated.py")


def grad_check_limit(dtype: str) -> tuple[int, str]:
    """grad-check's limit: Triton's cold compiles (TRITON_COMPILE_S, measured here) doubled, the
    autotuner's timing of 6 configurations a key, a child's start, the checks."""
    compile_s, keys = TRITON_COMPILE_S[dtype], TRITON_KEYS[dtype]
    tune_s = keys * 6 * 0.125
    start = isolated_module().START_S
    limit = math.ceil(2 * compile_s + tune_s + start + CHECKS_S)
    return limit, (f"2 × {compile_s:.1f} s of Triton compiles (measured here for sm_90) + {tune_s:.1f} s autotuning "
                   f"+ {start:.0f} s start + {CHECKS_S} s checks")


# ---------------------------------------------------------------------------------------
# The build's limit, from its measurement
# ---------------------------------------------------------------------------------------
def build_estimate(record: dict, cores: int = LEASE_CORES) -> tuple[float, str]:
    """(seconds, how): the build part's time on `cores` cores from a --time-build record (each
    source's CPU seconds, compiled alone), the stages' sources compiled side by side. A stage
    takes at least its slowest source plus its link; all of them, their total over the cores."""
    paths = []
    total = 0.0
    for name, stage in record["stages"].items():
        seconds = {source: s["cpu_s"] for source, s in stage["seconds"].items()}
        link = seconds.pop("link", 0.0)
        slowest = max(seconds, key=seconds.get)
        paths.append((seconds[slowest] + link, f"{name}: {slowest} {seconds[slowest]:.0f} s"
                                               + (f" + link {link:.0f} s" if link else "")))
        total += sum(seconds.values()) + link
    longest, how = max(paths)
    if total / cores > longest:
        return total / cores, f"{total:.0f} s of compiling over {cores} cores"
    return longest, how


def build_limit(path: str | None = None) -> tuple[int, str, str | None]:
    """(the build part's limit, how it was derived, a problem or None) from the record at `path`
    (BUILD_RECORD by default): BUILD_MARGIN times the estimate, plus BUILD_LOAD_S."""
    path = path or BUILD_RECORD
    try:
        record = json.loads((ROOT / path).read_text())
        seconds, how = build_estimate(record)
    except (OSError, ValueError, KeyError, TypeError) as e:
        return 300, "no measurement", (f"the build's limit has no measurement ({path}: {e!r}): run "
                                       f"python .ci/gpu.py --time-build {LEASE_ARCH} --json {path}")
    limit = math.ceil(BUILD_MARGIN * seconds + BUILD_LOAD_S)
    why = (f"{BUILD_MARGIN:g} × {seconds:.0f} s ({how}, measured one at a time on {record.get('cpus', '?')} CPUs, "
           f"{path}) + {BUILD_LOAD_S} s to load")
    problem = (None if record.get("arch") == LEASE_ARCH else
               f"{path} measured arch {record.get('arch')}, not {LEASE_ARCH}")
    return limit, why, problem


def unmeasured_sources(sources: list[str], path: str | None = None) -> list[str]:
    """The cuda stage's sources (modes.cuda_stage_sources()) that the build's record (BUILD_RECORD
    by default) does not time: a unit added since it was measured, whose cost the limit does not know."""
    path = path or BUILD_RECORD
    try:
        record = json.loads((ROOT / path).read_text())
        timed = {s for stage in record["stages"].values() for s in stage["seconds"]}
    except (OSError, ValueError, KeyError, TypeError):
        timed = set()
    return [s for s in sources if s not in timed]


def stage_sources() -> list[str]:
    """modes.cuda_stage_sources(), from a process that imports torch (this one need not)."""
    code = "import json, modes; print(json.dumps([p.as_posix() for p in modes.cuda_stage_sources()]))"
    got = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    if got.returncode != 0:
        raise ValueError(f"modes.cuda_stage_sources() failed: {got.stderr.strip()[-300:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------
# The parts and the selections
# ---------------------------------------------------------------------------------------
def parts() -> dict[str, Part]:
    """Every part, in the order they run when selected together."""
    py = "python"
    k, k_why = ptx_deselection()
    xdist = ["-n", "8"] if importlib.util.find_spec("xdist") else []  # 8 processes share the GPU
    generated = "ptx/generated/dense_kernels.ptx"
    odd = ("--device", "cuda", "-b", "33", "-i", "65", "-o", "17")
    stages = ("cpp", "cuda", "ptx", "emulation")
    limit, limit_why, _ = build_limit()
    exact_record = f"{RESULTS}/cuda_exact_{TAG}.json"
    exact_s, exact_why = isolated_module().part_limit("exact")
    kernels_s, kernels_why = isolated_module().part_limit("kernels")
    sanitize_s, sanitize_why = isolated_module().part_limit("sanitize")
    grad_s, grad_why = grad_check_limit("float32")
    grad16_s, grad16_why = grad_check_limit("bfloat16")
    refusal = "--backend nccl needs one GPU per rank"  # distributed.py's words, before any rank starts
    listed = [
        Part("env", ENV_S, (py, ".ci/gpu.py", "--env"), "the card, its driver and clocks, the tools' versions"),
        Part("build", limit, (py, ".ci/gpu.py", "--build", *stages),
             f"the compiled stages and the CPU emulation, side by side; limit {limit_why}"),
        Part("exact", exact_s, (py, "cuda/isolated.py", "exact", "--json", exact_record),
             "every GEMM entry against the emulation's committed bits (cuda/exact_expected.json), one version a "
             f"process, never-run ones first; limit {exact_why}",
             records=(exact_record,), produces=(exact_record,), needs=("build",)),
        Part("kernels", kernels_s, (py, "cuda/isolated.py", "kernels", "--parts", "goals", "small", "bf16", "roof",
                                    "tf32", "goals16", "--rounds", "10", "--exact", exact_record,
                                    "--json", f"{RESULTS}/cuda_kernels_{TAG}.json"),
             "each version never timed on a GPU whose own exact check passed, by its number, one a process: its "
             "goals (float32 on the CUDA cores; bfloat16), TF32's error and speed, the tensor cores' roofs beside "
             f"it; limit {kernels_why}",
             records=(f"{RESULTS}/cuda_kernels_{TAG}.json",), inputs=(exact_record,), needs=("build",),
             after=("exact",)),
        *[Part(tool, sanitize_s, (py, "cuda/isolated.py", "sanitize", "--tool", tool, "--never-run"),
               f"compute-sanitizer's {tool} on every never-run version and candidate, one a process; limit "
               f"{sanitize_why} (cut by the deadline)", needs=("build",), tail=True)
          for tool in ("memcheck", "racecheck", "synccheck")],
        Part("ncu", 90, (py, "cuda/bench_gpu.py", "--ncu", "--passed", exact_record,
                         "--json", f"{RESULTS}/ncu_gemm_{TAG}.json"),
             "Nsight Compute's counters for every version and candidate the exact run passed (never-run first) and "
             "the backward's elementwise kernels; limit not measured (no GPU here; ncu replays each of some 40 "
             "kernels for its counters), cut by the deadline",
             records=(f"{RESULTS}/ncu_gemm_{TAG}.json",), inputs=(exact_record,), needs=("build",), after=("exact",),
             tail=True),
        # The second call: what the first leaves out, when it ends early.
        Part("grad-check", grad_s, (py, "grad_check.py", "all", *odd),
             f"every stage's gradients on odd shapes, float32; limit {grad_why}", needs=("build",)),
        Part("nccl-refusal", 15, (py, "distributed.py", "-m", "cuda", "--world-size", "2", "--backend", "nccl",
                                  "--epochs", "1"),
             f"two NCCL ranks on one GPU: refused in one line (exit 2, {refusal!r}) before the start", expect=2,
             says=refusal, needs=("build",)),
        Part("grad-check-bf16", grad16_s, (py, "grad_check.py", "all", *odd, "--dtype", "bfloat16"),
             f"the same in bfloat16, for the stages that take it; limit {grad16_why}", needs=("build",),
             unless=script_lacks("grad_check.py", "--dtype"), tail=True),
        Part("pytest", 100, (py, "-m", "pytest", "-m", "gpu and not slow", *(["-k", k] if k else []), "-q", "-ra",
                             "-p", "no:cacheprovider", *xdist, f"--junitxml={OUT}/pytest-gpu.xml"),
             f"the GPU tests (slow multi-process ones apart); {k_why}", extras=(f"{OUT}/pytest-gpu.xml",),
             needs=("build",), tail=True),
        Part("gemm", 60, (py, "cuda/bench_gpu.py", "check", "gemm", "goals", "--rounds", "15",
                          "--json", f"{RESULTS}/cuda_gpu_{TAG}.json"),
             "chapter 3's versions checked against float64, then timed at 4096³; the goals",
             records=(f"{RESULTS}/cuda_gpu_{TAG}.json",), needs=("build",), tail=True),
        Part("ptx-regen", 10, ("bash", "ptx/regen.sh"), "the compiler's own PTX, the baseline of the PTX edits",
             produces=(generated,), tail=True),
        Part("ptx", 45, (py, "cuda/bench_gpu.py", "ptx", "--rounds", "10", "--json", f"{RESULTS}/ptx_gpu_{TAG}.json"),
             "the hand-edited PTX against the compiler's, alternating", records=(f"{RESULTS}/ptx_gpu_{TAG}.json",),
             inputs=(generated,), needs=("build", "ptx-regen"), tail=True),
        Part("candidates", 40, (py, "cuda/bench_gpu.py", "candidates", "--rounds", "15",
                                "--json", f"{RESULTS}/cuda_candidates_{TAG}.json"),
             "the autotuning candidates, checked then timed", records=(f"{RESULTS}/cuda_candidates_{TAG}.json",),
             needs=("build",), unless=bench_gpu_lacks("candidates")),
        Part("load-cost", 60, (py, "ptx/load_cost.py", "--repeats", "2", "--json", f"{RESULTS}/ptx_load_{TAG}.json"),
             "what loading the PTX costs, in fresh processes", records=(f"{RESULTS}/ptx_load_{TAG}.json",),
             needs=("build",)),
        Part("triton-check", 35, (py, "tiles/bench_gpu.py", "--smoke"),
             "every line of the Triton timing once, checked against the reference, before any is timed"),
        Part("triton-4096", 50, (py, "tiles/bench_gpu.py", "--rounds", "10",
                                 "--json", f"{RESULTS}/triton_gpu_{TAG}_4096.json"),
             "the Triton stage against cuBLAS, IEEE and TF32, at 4096³",
             records=(f"{RESULTS}/triton_gpu_{TAG}_4096.json",), needs=("triton-check",)),
        Part("triton-b32", 25, (py, "tiles/bench_gpu.py", "-b", "32", "--rounds", "20",
                                "--json", f"{RESULTS}/triton_gpu_{TAG}_b32.json"),
             "the same at B = 32", records=(f"{RESULTS}/triton_gpu_{TAG}_b32.json",), needs=("triton-check",)),
        *[Part(f"train-{m}", 60, (py, "distributed.py", "-m", m, "--world-size", "2", "--backend", "gloo", "--epochs",
                                  "2", "--json", f"{RESULTS}/train_{m}_gpu_w2.json"),
               f"two ranks of the {m} stage sharing the GPU over gloo", records=(f"{RESULTS}/train_{m}_gpu_w2.json",),
               needs=("build",)) for m in ("cuda", "ptx")],
    ]
    return {p.name: p for p in listed}


# In order of value: the build, each version's exact check, each new version's timings; then the
# tail the deadline cuts (the sanitizers on the never-run kernels, ncu). The second call holds what
# the first leaves out, and builds (on a fresh machine from scratch, on the first's in seconds).
SELECTIONS: dict[str, list[str]] = {
    "lease": ["env", "build", "exact", "kernels", "memcheck", "racecheck", "synccheck", "ncu"],
    "second": ["env", "build", "grad-check", "nccl-refusal", "grad-check-bf16", "pytest", "gemm", "ptx-regen", "ptx"],
}
DEADLINES = {"lease": FIRST_CALL_S, "second": SECOND_CALL_S}
DEFAULT = "lease"          # what runs when no selection is named
DEADLINE_S = FIRST_CALL_S  # for parts named one by one: the first call of a lease of their own


def resolve(names: list[str], every: dict[str, Part]) -> tuple[list[Part], int]:
    """Selections or part names -> (the parts in plan order, with env and what they need; the deadline)."""
    if not names:
        names = [DEFAULT]
    if len(names) == 1 and names[0] in SELECTIONS:
        return [every[n] for n in SELECTIONS[names[0]]], DEADLINES[names[0]]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"unknown part or selection {unknown[0]!r}: selections {', '.join(SELECTIONS)} "
                         f"(one at a time), parts {', '.join(every)}")
    wanted = {"env", *names}
    standing_in = {every[n].stands_for for n in names}
    for name in reversed(list(every)):  # what a wanted part needs, transitively (needs point backwards)
        if name in wanted:
            wanted |= set(every[name].needs + every[name].after) - standing_in
    return [p for n, p in every.items() if n in wanted], DEADLINE_S


# ---------------------------------------------------------------------------------------
# Running parts
# ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    part: str
    status: str           # passed, skipped: why, NOT RUN: the deadline... / FAILED ..., TIMED OUT ..., NOT RUN: why
    seconds: float
    records: list[str]

    @property
    def ok(self) -> bool:
        """Passed, skipped with its reason, or not run (or stopped) by the call's deadline: the
        deadline cuts the tail of a plan by design; a part that fails or hangs to its own limit does not."""
        return self.status == "passed" or self.status.startswith(("skipped", CUT))


MIN_START_S = 5  # a part is started only with this long left (or its whole limit, if shorter)
CUT = "NOT RUN: the deadline"  # a part the deadline did not reach, or stopped before its own limit
PART_LIMIT_ENV = "GPU_PART_LIMIT_S"  # the seconds a part may run, in its environment (cuda/isolated.py reads it)


def device_tag(name: str) -> str:
    """h100, h200, a100...: the model in a device's name, for the records' file names (the rule
    docs/records.py reads them back by); "gpu" where the name holds none."""
    return records_module().card_tag(name) or "gpu"


def gpu_identity() -> tuple[str, str] | None:
    """(the first GPU's name, its compute capability) as nvidia-smi reports them; None without one."""
    try:
        got = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = got.stdout.strip().splitlines()
    if got.returncode != 0 or not lines or ", " not in lines[0]:
        return None
    name, cap = lines[0].rsplit(", ", 1)
    return name.strip(), cap.strip()


def _run_one(argv: list[str], limit_s: float, env: dict, say: Callable[[str], None]) -> int | None:
    """Run argv in the repository under limit_s, its output to say(); its exit status, None if stopped."""
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            errors="replace", start_new_session=True)
    # Output is read by a thread, so that a part that falls silent is still stopped on time.
    echo = threading.Thread(target=lambda: [say(line.rstrip("\n")) for line in proc.stdout or ()])
    echo.start()
    code = cli.wait_or_stop(proc, limit_s, GRACE_S)
    echo.join()
    return code


def _pack(out: Path, name: str, records: list[str]) -> None:
    """records (paths under the repository) into out/name as docs/results/..., for tar -x at the root."""
    path = out / name
    if not records:
        path.unlink(missing_ok=True)
        return
    with tarfile.open(path.with_suffix(".tmp"), "w:gz") as tar:
        for r in records:
            tar.add(ROOT / r, arcname=r)
    path.with_suffix(".tmp").replace(path)  # a kill mid-write leaves the previous archive whole


def records_module():
    """docs/records.py (no torch): which records the chapters show, by name or by kind."""
    return cli.load_file("docs/records.py")


def shown_by_a_chapter(records: list[str]) -> tuple[list[str], list[str]]:
    """(the records a chapter shows, by name or by kind, the others): unpacked, the others would
    fail tests/test_records.py until a chapter shows them."""
    rec = records_module()
    cited = rec.citations(ROOT)
    shown = [r for r in records if rec.shown_in(Path(r).name, cited, ROOT / Path(r).parent)]
    return shown, [r for r in records if r not in shown]


def _cannot_start(argv: list[str]) -> str | None:
    import shutil

    if argv[0] == sys.executable or shutil.which(argv[0]):
        return None
    return f"FAILED: {argv[0]} is not on the PATH"


def run(selected: list[Part], out: Path, tag: str, deadline_s: float, env: dict | None = None, title: str = "") -> int:
    """Run the parts in order under their limits and the deadline; the summary table last.
    0 if every part passed (or was skipped with its reason), else 1."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.monotonic()
    outcomes: list[Outcome] = []
    passed: set[str] = set()  # names of the parts that passed, and of the parts they stand for
    ran: set[str] = set()     # names of the parts that were started, however they ended
    packed: list[str] = []
    failed_records: list[str] = []
    with open(out / LOG, "a") as log:
        def say(line: str) -> None:
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()

        if title:
            say(f"== {title}")
        for part in selected:
            t0 = time.monotonic()
            left = deadline_s - (t0 - started)
            not_passed = [n for n in part.needs if n not in passed]
            # a part that reads another's record (the exact run's, which says per version what passed)
            # runs whenever that one ran, passed or failed: one version's failure must not cancel the rest
            not_passed += [n for n in part.after if n not in ran]
            skip = part.unless() if part.unless else None
            argv = [sys.executable if a == "python" else a for a in part.command(tag, str(out))]
            if not_passed:
                outcomes.append(Outcome(part.name, f"NOT RUN: {', '.join(not_passed)} did not pass"
                                        + (" or did not run" if part.after else ""), 0, []))
            elif skip:
                outcomes.append(Outcome(part.name, f"skipped: {skip}", 0, []))
            elif left < min(part.limit_s, MIN_START_S):
                why = f"{CUT} ({max(left, 0):.0f} s left of its {deadline_s:.0f} s)"
                outcomes.append(Outcome(part.name, why, 0, []))
            elif _cannot_start(argv):
                outcomes.append(Outcome(part.name, _cannot_start(argv) or "", 0, []))
            else:
                limit = min(part.limit_s, left)
                records = [r.replace(TAG, tag) for r in part.records]
                before = {r: (ROOT / r).stat().st_mtime_ns if (ROOT / r).exists() else None for r in records}
                say(f"== {part.name} (limit {limit:.0f} s, {t0 - started:.0f} s in): {part.text(tag)}")
                say(f"   {part.why}")
                heard: list[str] = []

                def hear(line: str, heard: list[str] = heard) -> None:
                    heard.append(line)
                    say(line)
                code = _run_one(argv, limit, {**env, PART_LIMIT_ENV: f"{limit:.0f}"}, hear)
                ran.add(part.name)
                written = [r for r in records if (ROOT / r).exists() and (ROOT / r).stat().st_mtime_ns != before[r]]
                silent = part.says and not any(part.says in line for line in heard)
                status = ("passed" if code == part.expect and not silent else
                          f"{CUT} stopped it after {limit:.0f} s" if code is None and limit < part.limit_s else
                          f"TIMED OUT after {limit:.0f} s" if code is None else
                          f"FAILED (exit {code}, but its output lacks {part.says!r})" if code == part.expect else
                          f"FAILED (exit {code}" + (f", expected {part.expect})" if part.expect else ")"))
                outcomes.append(Outcome(part.name, status, time.monotonic() - t0, written))
                # a record is written after every measurement: one the deadline stopped holds what it measured
                (packed if status == "passed" or status.startswith(CUT) else failed_records).extend(written)
                if status == "passed":
                    passed.update({part.name, part.stands_for} - {""})
                shown, new = shown_by_a_chapter(packed)
                _pack(out, RECORDS, shown)
                _pack(out, NEW_RECORDS, new)
                _pack(out, FAILED_RECORDS, failed_records)
            say(f"== {part.name}: {outcomes[-1].status}")
        total = time.monotonic() - started
        shown, new = shown_by_a_chapter(packed)
        width = max(len(o.part) for o in outcomes) if outcomes else 4
        say("")
        say(f"{'part':<{width}}  {'seconds':>7}  status; records written")
        for o in outcomes:
            where = ("" if not o.records else "; " + ", ".join(
                r + ("" if o.status != "passed" or r in shown else f" (in {NEW_RECORDS}: no chapter shows its kind)")
                for r in o.records)
                + ("" if o.status == "passed" else f" (in {FAILED_RECORDS}: the part did not pass)"))
            say(f"{o.part:<{width}}  {o.seconds:7.0f}  {o.status}{where}")
        bad = [o.part for o in outcomes if not o.ok]
        say(f"{'FAILED: ' + ', '.join(bad) if bad else 'every part passed'}, in {total:.0f} s of the "
            f"{deadline_s:.0f} s deadline; {len(shown)} record(s) in {out / RECORDS if shown else 'none packed'}"
            + (f", {len(new)} in {out / NEW_RECORDS}" if new else ""))
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------
# Helpers the parts call on the GPU machine: --env, --build
# ---------------------------------------------------------------------------------------
def describe_environment() -> int:
    """Print the card and the tools; 1 if torch sees no GPU."""
    sys.path.insert(0, str(ROOT))
    import torch

    import record_info

    for tool in ("nvcc", "ncu", "compute-sanitizer"):
        try:
            got = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60)
            print(f"{tool}: {(got.stdout.strip().splitlines() or ['?'])[-1]}")
        except (OSError, subprocess.TimeoutExpired) as e:
            print(f"{tool}: not usable ({e})")
    triton = importlib.util.find_spec("triton")
    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"triton {'installed' if triton else 'missing'}, pytest-xdist "
          f"{'installed' if importlib.util.find_spec('xdist') else 'missing'}; GEMM versions {versions()}")
    if not torch.cuda.is_available():
        print("torch.cuda.is_available() is False", file=sys.stderr)
        return 1
    print(json.dumps(record_info.describe_gpu(), indent=1))
    return 0


EMULATION = "emulation"  # the CPU emulation's library (cuda/emulated.py), built beside the stages
_BUILD_ONE = {
    EMULATION: "import cli; print('emulation', cli.load_file('cuda/emulated.py').build(), "
               "flush=True)",
}
_BUILD_STAGE = "import sys, modes; print(sys.argv[1], modes.build(sys.argv[1]), flush=True)"


def not_built(stages: list[str], root: Path | None = None) -> list[str]:
    """The stages with no library in their JIT build folder (build/jit/dense_<mode>_ext/): on a
    machine that has not built them, a build would start from scratch."""
    root = root or ROOT
    return [m for m in stages if m != EMULATION and not list((root / "build" / "jit" / f"dense_{m}_ext").glob("*.so"))]


def build(stages: list[str], warm: bool = False) -> int:
    """Build the stages side by side, each in its own process; 1 if any failed, naming it. With
    warm=True, 1 at once where a stage was never built here (a second call on a fresh machine)."""
    if warm and not_built(stages):
        print(f"not built on this machine: {', '.join(not_built(stages))}; --warm is for the second call on the "
              "machine the first call built them on (a fresh machine needs the build part)", file=sys.stderr)
        return 1
    procs = {m: subprocess.Popen([sys.executable, "-c", _BUILD_ONE.get(m, _BUILD_STAGE), m], cwd=ROOT,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for m in stages}
    failed = []
    for m, proc in procs.items():
        output, _ = proc.communicate()
        print(f"-- {m}: exit {proc.returncode}\n{output.rstrip()}", flush=True)
        if proc.returncode != 0:
            failed.append(m)
    if failed:
        print(f"build failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


# ---------------------------------------------------------------------------------------
# Measuring the build: --time-build (.ci/build_timing.py)
# ---------------------------------------------------------------------------------------
def lease_arch(compute_cap: str) -> str:
    """The architecture a lease builds for, from nvidia-smi's compute capability: "9.0" is built as
    "9.0a", the code of the Hopper-only instructions (wgmma, TMA) that v31-v35 need."""
    return compute_cap + "a" if compute_cap == "9.0" else compute_cap


def build_timing():
    """.ci/build_timing.py: --time-build's job, the build compiled one source at a time and timed."""
    return cli.load_file(".ci/build_timing.py")


# ---------------------------------------------------------------------------------------
# Checking the plan without running it (.ci/plan_check.py)
# ---------------------------------------------------------------------------------------
def _checks():
    return cli.load_file(".ci/plan_check.py")


def _plan():
    return sys.modules[__name__]


def plan_problems(selected: list[Part], deadline_s: int, tag: str = "h100") -> list[str]:
    """What is wrong with a selection as written, without running any command (plan_check's)."""
    return _checks().plan_problems(_plan(), selected, deadline_s, tag)


def command_problems(p: Part, tag: str = "h100") -> list[str]:
    """What would stop a part's command at once (plan_check's)."""
    return _checks().command_problems(_plan(), p, tag)


def lease_problems() -> list[str]:
    """What does not fit the lease (plan_check's)."""
    return _checks().lease_problems(_plan())


def dry_run(names: list[str]) -> bool:
    return _checks().dry_run(_plan(), names)


def listing(names: list[str], every: dict[str, Part]) -> str:
    """--list: the selections or the parts named, with limits and commands (plan_check's)."""
    return _checks().listing(_plan(), names, every)


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="bash .ci/gpu", description=doc.split("\n\n")[0],
                                     epilog=doc[doc.index("\n\n") + 2:],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="SELECTION|PART",
                        help=f"one selection ({', '.join(SELECTIONS)}; default: {DEFAULT}) or part names")
    parser.add_argument("--out", metavar="DIR", help="where gpu.log, records.tar.gz and the test report go")
    parser.add_argument("--deadline", type=int, metavar="S",
                        help="seconds for all the parts (default: the selection's)")
    parser.add_argument("--dry-run", action="store_true", help="check the selections here; run nothing")
    parser.add_argument("--list", action="store_true", help="print the selections: parts, limits, commands")
    inner = parser.add_argument_group("run by the parts themselves on the GPU machine")
    inner.add_argument("--env", action="store_true", help="print the card and the tools")
    inner.add_argument("--build", nargs="+", metavar="STAGE",
                       help=f"build these stages (and {EMULATION}: the CPU emulation's library) side by side")
    inner.add_argument("--warm", action="store_true", help="with --build: refuse at once where a stage was never "
                       "built on this machine")
    measure = parser.add_argument_group("run on a machine with a CUDA torch and nvcc (no GPU needed)")
    measure.add_argument("--time-build", metavar="ARCH", help="build every stage from scratch for this GPU "
                         "architecture (e.g. 9.0), one compiler at a time, and write each source's seconds (--json)")
    measure.add_argument("--json", metavar="PATH", help="with --time-build: where the record goes")
    args = parser.parse_args(argv)
    if args.warm and not args.build:
        parser.error("--warm goes with --build")
    if args.json and not args.time_build:
        parser.error("--json goes with --time-build")

    if args.env:
        return describe_environment()
    if args.build:
        return build(args.build, args.warm)
    if args.time_build:
        json_path = cli.check_output(args.json, "--json")
        record = build_timing().time_build(args.time_build)
        seconds, how = build_estimate(record)
        lines = [f"{stage}: " + ", ".join(f"{Path(k).name} {v['cpu_s']:.1f}" for k, v in
                                          sorted(s["seconds"].items(), key=lambda kv: -kv[1]["cpu_s"]))
                 for stage, s in record["stages"].items()]
        lines.append(f"CPU seconds per source, one at a time; on {LEASE_CORES} cores: {seconds:.0f} s ({how})")
        return cli.publish("\n".join(lines), [(json_path, cli.json_writer(record))])
    every = parts()
    try:
        selected, deadline = resolve(args.names, every)
    except ValueError as e:
        parser.error(str(e))
    if args.list:
        print(listing(args.names, every))
        return 0
    if args.dry_run:
        return 0 if dry_run(args.names) else 1
    deadline = args.deadline or deadline
    problems = plan_problems(selected, deadline)
    if problems:
        parser.error("; ".join(problems))
    if not args.out:
        parser.error("--out DIR is needed to run parts (or use --dry-run / --list)")
    gpu = gpu_identity()
    if gpu is None:
        parser.error("needs a GPU: nvidia-smi found none; --dry-run checks the plan without one")
    out = Path(args.out)
    if not out.is_dir():
        parser.error(f"--out {out}: no such folder")
    # Built for this card alone (half the nvcc time of the default list), by every part alike:
    # the architectures are part of the build's flags, so a part with others would build again.
    env = {"TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST") or lease_arch(gpu[1])}
    title = (f"{' '.join(args.names) or DEFAULT} on {gpu[0]} (records tagged {device_tag(gpu[0])}, built for "
             f"{env['TORCH_CUDA_ARCH_LIST']}), deadline {deadline} s")
    return run(selected, out.resolve(), device_tag(gpu[0]), deadline, env, title)


if __name__ == "__main__":
    cli.run(main)
