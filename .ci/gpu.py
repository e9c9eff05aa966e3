"""The GPU machine's work: one plan of parts, each under its own time limit, all under one deadline.

A GPU lease is short: 15 minutes of device time in all (a start of a few minutes included), one
command at most 10 minutes, at most 8 files back from $OUT. So the plan comes in selections, one
command each, and every selection's limits add up to no more than its deadline:

  smoke    (5 min) the first call: build the stages; the float64 check of every GEMM version;
           grad_check.py on odd shapes; pytest -m "gpu and not slow"; NCCL's refusal of two ranks
  time     (8 min) the timings: every GEMM version, checked first, then the goals; the autotuning
           candidates; the PTX edits; what loading PTX costs; the Triton stage (checked first)
           against cuBLAS, IEEE and TF32
  explain  (8 min) Nsight Compute's counters for every version; compute-sanitizer's memcheck and
           racecheck
  train    (5 min) two ranks training on the one GPU over gloo, cuda and ptx stages
  default  (8 min) what runs when no selection is named: smoke, then the timings the chapters show

A part that fails, runs out of time or cannot run is FAILED in the summary table printed last,
and the exit status is 1; a part whose prerequisite failed does not run. Records are written
where the chapters cite them (docs/results/<name>.json; a card's records carry its name, e.g.
cuda_gpu_h100.json), so that their commands are the ones tests/test_records.py accepts; after
every part, those of the parts that passed are packed into $OUT/records.tar.gz (a failed part's
into failed-records.tar.gz). Also in $OUT: gpu.log (every part's output) and pytest-gpu.xml.
Back on the development machine, in the repository's root:
  tar -xzf records.tar.gz && python docs/render.py && git add docs/results

--dry-run checks, on any machine, every part of every selection: the script and its flags,
the tests it collects, its records (under docs/results/, written by its own command), its inputs
(none ignored by git unless an earlier part makes it), its exit status (no inline shell), and
the limits against the deadline.

Examples:
  bash .ci/gpu --list                        # the selections: parts, limits, totals, commands
  bash .ci/gpu --dry-run smoke               # check one selection here (no GPU needed)
  bash .ci/gpu smoke --out "$OUT"            # GPU: the first call of a lease
  bash .ci/gpu time --out "$OUT"             # GPU: the second
  bash .ci/gpu gemm ptx --out /tmp/gpu       # GPU: named parts (and the parts they need)
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import shlex
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = "docs/results"  # where the chapters read the records
OUT = "{out}"             # stands for the --out folder in a part's command and extras
TAG = "{tag}"             # stands for the card (h100, h200) in a part's command and records
MAX_FILES = 8             # what one command of a lease brings back
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # the only file names that come back
LOG, RECORDS, FAILED_RECORDS = "gpu.log", "records.tar.gz", "failed-records.tar.gz"
GRACE_S = 10              # after SIGINT, before SIGKILL: a JIT build killed outright leaves its lock file


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
    expect: int = 0                     # the exit status that means it did its job
    unless: Callable[[], str | None] | None = None  # why to skip it, decided when it is due

    def command(self, tag: str = TAG, out: str = OUT) -> list[str]:
        return [a.replace(TAG, tag).replace(OUT, out) for a in self.argv]

    def text(self, tag: str = TAG) -> str:
        return shlex.join(self.command(tag))


# ---------------------------------------------------------------------------------------
# What the parts depend on: the GEMM versions, the PTX stage's versions, cuda/bench_gpu.py's parts
# ---------------------------------------------------------------------------------------
def versions() -> list[int]:
    """The GEMM versions, 0 (automatic) to kVersions of cuda/dense_kernels.h, as cuda/emulated.py reads them."""
    name = "dense_cuda_emulated"  # the name grad_check.py and the tests load it under
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "cuda" / "emulated.py")
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return list(sys.modules[name].versions())


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


# ---------------------------------------------------------------------------------------
# The parts and the selections
# ---------------------------------------------------------------------------------------
def parts() -> dict[str, Part]:
    """Every part, in the order they run when selected together."""
    py = "python"
    k, k_why = ptx_deselection()
    xdist = ["-n", "8"] if importlib.util.find_spec("xdist") else []  # 8 processes share the GPU
    generated = "ptx/generated/dense_kernels.ptx"
    sanitize = ("python", "cuda/bench_gpu.py", "check", "--odd-only")  # the odd shapes: the sanitizer is slow
    listed = [
        Part("env", 10, (py, ".ci/gpu.py", "--env"), "the card, its driver and clocks, the tools' versions"),
        Part("build", 75, (py, ".ci/gpu.py", "--build", "cpp", "cuda", "ptx"),
             "the three compiled stages, built side by side; any failure fails the part"),
        Part("check", 25, (py, "cuda/bench_gpu.py", "check"), "every GEMM version against float64",
             needs=("build",)),
        Part("grad-check", 20, (py, "grad_check.py", "all", "--device", "cuda", "-b", "33", "-i", "65", "-o", "17"),
             "every stage's gradients on odd shapes", needs=("build",)),
        Part("pytest", 100, (py, "-m", "pytest", "-m", "gpu and not slow", *(["-k", k] if k else []), "-q", "-ra",
                             "-p", "no:cacheprovider", *xdist, f"--junitxml={OUT}/pytest-gpu.xml"),
             f"the GPU tests (slow multi-process ones apart); {k_why}", extras=(f"{OUT}/pytest-gpu.xml",),
             needs=("build",)),
        Part("nccl-refusal", 10, (py, "distributed.py", "-m", "cuda", "--world-size", "2", "--backend", "nccl",
                                  "--epochs", "1"),
             "two NCCL ranks on one GPU: refused in one line (exit 2) before the start", expect=2, needs=("build",)),
        Part("ptx-regen", 10, ("bash", "ptx/regen.sh"), "the compiler's own PTX, the baseline of the PTX edits",
             produces=(generated,)),
        Part("gemm", 75, (py, "cuda/bench_gpu.py", "check", "gemm", "goals", "--rounds", "15",
                          "--json", f"{RESULTS}/cuda_gpu_{TAG}.json"),
             "every version checked against float64, then timed at 4096³; the goals",
             records=(f"{RESULTS}/cuda_gpu_{TAG}.json",), needs=("build",)),
        Part("candidates", 40, (py, "cuda/bench_gpu.py", "candidates", "--rounds", "15",
                                "--json", f"{RESULTS}/cuda_candidates_{TAG}.json"),
             "the autotuning candidates, checked then timed", records=(f"{RESULTS}/cuda_candidates_{TAG}.json",),
             needs=("build",), unless=bench_gpu_lacks("candidates")),
        Part("ptx", 45, (py, "cuda/bench_gpu.py", "ptx", "--rounds", "10", "--json", f"{RESULTS}/ptx_gpu_{TAG}.json"),
             "the hand-edited PTX against the compiler's, alternating", records=(f"{RESULTS}/ptx_gpu_{TAG}.json",),
             inputs=(generated,), needs=("build", "ptx-regen")),
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
        Part("ncu", 180, (py, "cuda/bench_gpu.py", "--ncu", "--json", f"{RESULTS}/ncu_gemm_{TAG}.json"),
             "Nsight Compute's counters for every version's GEMMs", records=(f"{RESULTS}/ncu_gemm_{TAG}.json",),
             needs=("build",)),
        Part("memcheck", 90, ("compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", *sanitize),
             "out-of-bounds and misaligned accesses, every version", needs=("build",)),
        Part("racecheck", 90, ("compute-sanitizer", "--tool", "racecheck", "--error-exitcode", "9", *sanitize),
             "shared-memory races, every version", needs=("build",)),
        *[Part(f"train-{m}", 60, (py, "distributed.py", "-m", m, "--world-size", "2", "--backend", "gloo", "--epochs",
                                  "2", "--json", f"{RESULTS}/train_{m}_gpu_w2.json"),
               f"two ranks of the {m} stage sharing the GPU over gloo", records=(f"{RESULTS}/train_{m}_gpu_w2.json",),
               needs=("build",)) for m in ("cuda", "ptx")],
    ]
    return {p.name: p for p in listed}


SMOKE = ["env", "build", "check", "grad-check", "pytest", "nccl-refusal"]
CHAPTER_TIMINGS = ["ptx-regen", "gemm", "ptx", "triton-check", "triton-4096", "triton-b32"]
SELECTIONS: dict[str, list[str]] = {
    "smoke": SMOKE,
    "time": ["env", "build", "ptx-regen", "gemm", "candidates", "ptx", "load-cost", "triton-check", "triton-4096",
             "triton-b32"],
    "explain": ["env", "build", "ncu", "memcheck", "racecheck"],
    "train": ["env", "build", "train-cuda", "train-ptx"],
    "default": SMOKE + CHAPTER_TIMINGS,
}
# Seconds per selection, the machine's start not included: a first call within 5 minutes, any
# other within 8, under the lease's 10 minutes a command.
DEADLINES = {"smoke": 300, "time": 480, "explain": 480, "train": 300, "default": 480}
DEADLINE_S = 480  # for parts named one by one


def resolve(names: list[str], every: dict[str, Part]) -> tuple[list[Part], int]:
    """Selections or part names -> (the parts in plan order, with env and what they need; the deadline)."""
    if not names:
        names = ["default"]
    if len(names) == 1 and names[0] in SELECTIONS:
        return [every[n] for n in SELECTIONS[names[0]]], DEADLINES[names[0]]
    unknown = [n for n in names if n not in every]
    if unknown:
        raise ValueError(f"unknown part or selection {unknown[0]!r}: selections {', '.join(SELECTIONS)} "
                         f"(one at a time), parts {', '.join(every)}")
    wanted = {"env", *names}
    for name in reversed(list(every)):  # what a wanted part needs, transitively (needs point backwards)
        if name in wanted:
            wanted |= set(every[name].needs)
    return [p for n, p in every.items() if n in wanted], DEADLINE_S


# ---------------------------------------------------------------------------------------
# Running parts
# ---------------------------------------------------------------------------------------
@dataclass
class Outcome:
    part: str
    status: str           # passed, skipped: why / FAILED ..., TIMED OUT ..., NOT RUN: why
    seconds: float
    records: list[str]

    @property
    def ok(self) -> bool:
        return self.status == "passed" or self.status.startswith("skipped")


def device_tag(name: str) -> str:
    """h100, h200, a100...: the model in a device's name, for the records' file names."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return found.group(1).lower() if found else "gpu"


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
    try:
        proc.wait(timeout=limit_s)
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        code = None
        for sig, wait_s in ((signal.SIGINT, GRACE_S), (signal.SIGKILL, None)):  # Ctrl-C first: builds unlock
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
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


def run(selected: list[Part], out: Path, tag: str, deadline_s: float, env: dict | None = None, title: str = "") -> int:
    """Run the parts in order under their limits and the deadline; the summary table last.
    0 if every part passed (or was skipped with its reason), else 1."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    started = time.monotonic()
    outcomes: list[Outcome] = []
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
            not_passed = [n for n in part.needs if not any(o.part == n and o.status == "passed" for o in outcomes)]
            skip = part.unless() if part.unless else None
            if not_passed:
                outcomes.append(Outcome(part.name, f"NOT RUN: {', '.join(not_passed)} did not pass", 0, []))
            elif skip:
                outcomes.append(Outcome(part.name, f"skipped: {skip}", 0, []))
            elif left < min(part.limit_s, 5):
                why = f"NOT RUN: {max(left, 0):.0f} s left of the {deadline_s:.0f} s deadline"
                outcomes.append(Outcome(part.name, why, 0, []))
            else:
                limit = min(part.limit_s, left)
                records = [r.replace(TAG, tag) for r in part.records]
                before = {r: (ROOT / r).stat().st_mtime_ns if (ROOT / r).exists() else None for r in records}
                say(f"== {part.name} (limit {limit:.0f} s, {t0 - started:.0f} s in): {part.text(tag)}")
                say(f"   {part.why}")
                argv = [sys.executable if a == "python" else a for a in part.command(tag, str(out))]
                code = _run_one(argv, limit, env, say)
                written = [r for r in records if (ROOT / r).exists() and (ROOT / r).stat().st_mtime_ns != before[r]]
                status = ("passed" if code == part.expect else
                          f"TIMED OUT after {limit:.0f} s" if code is None else
                          f"FAILED (exit {code}" + (f", expected {part.expect})" if part.expect else ")"))
                outcomes.append(Outcome(part.name, status, time.monotonic() - t0, written))
                (packed if status == "passed" else failed_records).extend(written)
                _pack(out, RECORDS, packed)
                _pack(out, FAILED_RECORDS, failed_records)
            say(f"== {part.name}: {outcomes[-1].status}")
        total = time.monotonic() - started
        width = max(len(o.part) for o in outcomes) if outcomes else 4
        say("")
        say(f"{'part':<{width}}  {'seconds':>7}  status; records written")
        for o in outcomes:
            where = ("" if not o.records else "; " + ", ".join(o.records) +
                     ("" if o.status == "passed" else f" (in {FAILED_RECORDS}: the part did not pass)"))
            say(f"{o.part:<{width}}  {o.seconds:7.0f}  {o.status}{where}")
        bad = [o.part for o in outcomes if not o.ok]
        say(f"{'FAILED: ' + ', '.join(bad) if bad else 'every part passed'}, in {total:.0f} s of the "
            f"{deadline_s:.0f} s deadline; {len(packed)} record(s) in {out / RECORDS if packed else 'none packed'}")
    return 1 if bad else 0


# ---------------------------------------------------------------------------------------
# Helpers the parts call on the GPU machine: --env, --build
# ---------------------------------------------------------------------------------------
def describe_environment() -> int:
    """Print the card and the tools; 1 if torch sees no GPU."""
    import json

    sys.path.insert(0, str(ROOT))
    import torch

    import benchmark

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
    print(json.dumps(benchmark.describe_gpu(), indent=1))
    return 0


def build(stages: list[str]) -> int:
    """Build the stages side by side, each in its own process; 1 if any failed, naming it."""
    code = "import sys, modes; print(sys.argv[1], modes.build(sys.argv[1]), flush=True)"
    procs = {m: subprocess.Popen([sys.executable, "-c", code, m], cwd=ROOT, stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for m in stages}
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
# Checking the plan without running it
# ---------------------------------------------------------------------------------------
_help: dict[str, str] = {}
OUTPUT_FLAGS = ("--json", "--plot", "--out", "--trace")  # as docs/records.py reads a record's command


def _script_help(script: str) -> str:
    if script not in _help:
        result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise ValueError(f"{script} --help failed: {result.stderr.strip()[-500:]}")
        _help[script] = result.stdout
    return _help[script]


def _git_ignored(path: str) -> bool:
    """True if git ignores the path here (False where there is no git or no repository: a copy)."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=ROOT, capture_output=True).returncode == 0
    except OSError:
        return False


def plan_problems(selected: list[Part], deadline_s: int, tag: str = "h100") -> list[str]:
    """What is wrong with a selection as written, without running any command: limits over the
    deadline, inputs a fresh machine lacks, prerequisites that come later, records outside
    docs/results/ or not written by their own command, commands whose exit status hides a failure."""
    problems = []
    total = sum(p.limit_s for p in selected)
    if total > deadline_s:
        problems.append(f"the limits add up to {total} s, over the {deadline_s} s deadline: later parts would not run")
    earlier: set[str] = set()
    produced: set[str] = set()
    writers: dict[str, str] = {}
    for p in selected:
        for n in p.needs:
            if n not in earlier:
                problems.append(f"{p.name}: needs {n!r}, which does not run before it")
        for f in p.inputs:
            if f not in produced and (_git_ignored(f) or not (ROOT / f).exists()):
                problems.append(f"{p.name}: reads {f}, which git {'ignores' if _git_ignored(f) else 'does not hold'}"
                                " and no earlier part makes: a fresh machine lacks it")
        argv = p.command(tag)
        for r in (x.replace(TAG, tag) for x in p.records):
            name = r.removeprefix(RESULTS + "/")
            if not r.startswith(RESULTS + "/") or "/" in name or not NAME.match(name) or not name.endswith(".json"):
                problems.append(f"{p.name}: record {r!r} is not a plain docs/results/<name>.json, where the chapters "
                                "read records")
            elif not any(a == r and k > 0 and argv[k - 1] in OUTPUT_FLAGS for k, a in enumerate(argv)):
                problems.append(f"{p.name}: record {r} is not written by its command (after one of "
                                f"{', '.join(OUTPUT_FLAGS)}), so the command it keeps would not retake it")
            elif r in writers:
                problems.append(f"{p.name}: record {r} is written by {writers[r]} too")
            writers.setdefault(r, p.name)
        for e in p.extras:
            rel = e.removeprefix(OUT + "/")
            if not e.startswith(OUT + "/") or "/" in rel or not NAME.match(rel):
                problems.append(f"{p.name}: {e!r} must be a plain file name under {OUT}/ to come back")
        program = argv[0]
        if program in ("bash", "sh") and len(argv) > 1 and argv[1].startswith("-"):
            problems.append(f"{p.name}: inline shell ({program} {argv[1]} ...): pipes, '|| true' and background jobs "
                            "hide exit statuses; run a script file or a Python command")
        elif program in ("bash", "sh"):
            script = ROOT / argv[1] if len(argv) > 1 else None
            if script is None or not script.is_file():
                problems.append(f"{p.name}: {argv[1:2]} is no script file")
            elif not re.search(r"^set -[a-z]*e", script.read_text(), re.M):
                problems.append(f"{p.name}: {argv[1]} lacks 'set -e': a failing command inside would not fail it")
        elif program not in ("python", "compute-sanitizer"):
            problems.append(f"{p.name}: unexpected program {program!r}")
        produced |= set(p.produces)
        earlier.add(p.name)
    extras = sum(len(p.extras) for p in selected)
    if extras + 3 > MAX_FILES:  # + the log and the two archives
        problems.append(f"{extras + 3} files in --out: a lease command brings back {MAX_FILES}")
    return problems


def command_problems(p: Part, tag: str = "h100") -> list[str]:
    """What would stop a part's command at once: a missing script, a flag its --help does not
    list or its parser refuses, code that does not parse, tests that do not collect."""
    key = (p.name, *p.command(tag))
    if key not in _checked:  # a part in several selections is checked once
        _checked[key] = [f"{p.name}: {m}" for m in _command_problems(p.command(tag, "/tmp/gpu-dry-run"))]
    return _checked[key]


_checked: dict[tuple, list[str]] = {}


def _command_problems(argv: list[str]) -> list[str]:
    if argv[0] == "compute-sanitizer":
        argv = argv[argv.index("python"):]
    if argv[0] != "python":
        return []  # bash scripts: checked by plan_problems
    if argv[1] == "-c":
        compile(argv[2], "<-c>", "exec")
        return []
    if argv[1:3] == ["-m", "pytest"]:
        args = [a for a in argv[3:] if not a.startswith("--junitxml") and a != "-q"]  # -qq would hide the count
        if "-n" in args:  # pytest-xdist, where installed, runs tests; collecting needs none of it
            del args[args.index("-n"):args.index("-n") + 2]
        result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], cwd=ROOT,
                                capture_output=True, text=True, timeout=600)
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
        if result.returncode != 0 or not collected or int(collected.group(1)) == 0:
            return [f"pytest collects no tests for {shlex.join(args)}: {result.stdout[-300:]}"]
        return []
    script = argv[1]
    if not (ROOT / script).is_file():
        return [f"{script}: no such script"]
    usage = _script_help(script)
    for a in argv[2:]:
        flag = a.split("=", 1)[0]
        if flag.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", flag) and \
                not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage):
            return [f"{script}: {flag} is not among its options"]
    # The arguments, then --help: argparse checks each value (types, choices) as it reads it,
    # then stops at --help before the script does anything.
    result = subprocess.run([sys.executable, *argv[1:], "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=300)
    if result.returncode != 0:
        return [f"{script} refuses its arguments: {result.stderr.strip()[-300:]}"]
    return []


def dry_run(names: list[str]) -> bool:
    every = parts()
    ok = True
    for name in names or list(SELECTIONS):
        selected, deadline = resolve([name], every)
        print(f"{name}: {len(selected)} parts, limits {sum(p.limit_s for p in selected)} s of its {deadline} s")
        problems = plan_problems(selected, deadline)
        for p in selected:
            try:
                mine = command_problems(p)
            except (SyntaxError, ValueError, subprocess.TimeoutExpired) as e:
                mine = [f"{p.name}: {e}"]
            skip = p.unless() if p.unless else None
            print(f"  {'FAIL' if mine else 'ok  '}  {p.name:<13} {p.limit_s:4d} s  {p.text()}"
                  + (f"\n        would skip: {skip}" if skip else ""))
            problems += mine
        for problem in problems:
            print(f"  FAIL  {problem}")
        ok = ok and not problems
    print("dry run: every part checked" if ok else "dry run: FAILED")
    return ok


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(prog="bash .ci/gpu", description=doc.split("\n\n")[0],
                                     epilog=doc[doc.index("\n\n") + 2:],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", metavar="SELECTION|PART",
                        help=f"one selection ({', '.join(SELECTIONS)}; default: default) or part names")
    parser.add_argument("--out", metavar="DIR", help="where gpu.log, records.tar.gz and the test report go")
    parser.add_argument("--deadline", type=int, metavar="S",
                        help="seconds for all the parts (default: the selection's)")
    parser.add_argument("--dry-run", action="store_true", help="check the selections here; run nothing")
    parser.add_argument("--list", action="store_true", help="print the selections: parts, limits, commands")
    inner = parser.add_argument_group("run by the parts themselves on the GPU machine")
    inner.add_argument("--env", action="store_true", help="print the card and the tools")
    inner.add_argument("--build", nargs="+", metavar="STAGE", help="build these stages side by side")
    args = parser.parse_args(argv)

    if args.env:
        return describe_environment()
    if args.build:
        return build(args.build)
    every = parts()
    try:
        selected, deadline = resolve(args.names, every)
    except ValueError as e:
        parser.error(str(e))
    if args.list:
        for name in args.names or list(SELECTIONS):
            chosen, limit = resolve([name], every)
            print(f"{name}: {sum(p.limit_s for p in chosen)} s of limits, deadline {limit} s")
            for p in chosen:
                print(f"  {p.name:<13} {p.limit_s:4d} s  {p.text()}\n  {'':<13}         {p.why}")
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
    env = {"TORCH_CUDA_ARCH_LIST": os.environ.get("TORCH_CUDA_ARCH_LIST") or gpu[1]}
    title = (f"{' '.join(args.names) or 'default'} on {gpu[0]} (records tagged {device_tag(gpu[0])}, built for "
             f"{env['TORCH_CUDA_ARCH_LIST']}), deadline {deadline} s")
    return run(selected, out.resolve(), device_tag(gpu[0]), deadline, env, title)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        print("gpu: interrupted", file=sys.stderr)
        sys.exit(130)
