"""The GPU machine's work, in steps that each fit one command of a GPU lease.

A lease gives about 30 minutes in all, at most 10 per command, and brings back at most 8 files
(16 MiB each, at most two folders deep). So each step below stays within STEP_BUDGET_S (8
minutes: the rest of the 10 is for starting and copying), runs its commands one at a time, and
leaves two files in the folder --out names: <step>.log and <step>.tar.gz. The records are written
where the chapters read them, under docs/results/, by the commands docs/README.md lists; the
archive holds them under records/ and the rest (test report, machine, PTX diff) under extra/:
  tar -xzf gemm.tar.gz -C /tmp/gemm && cp /tmp/gemm/records/* docs/results/ && python docs/render.py
The steps, in the order the chapters need them:

  correctness  both GPU stages built; modes.available(); grad checks; pytest -m "gpu and not slow"
  gemm         chapter 4's GEMM versions: checked, timed at 4096³ (TF32 off), the goals, ncu's counters
  ptx          chapter 5: the hand edits against the compiler's PTX; what loading the PTX costs
  triton       chapter 3's stage on the GPU: its tests, then timed against cuBLAS + sigmoid and
               chapter 4's kernels (IEEE float32 and TF32 as separate lines)
  train        distributed.py -m cuda and -m ptx: one rank, then two ranks sharing the GPU (gloo);
               -m triton on one rank
  stages       every stage side by side on the GPU (benchmark.py -m all) at 4096³ and at B=32

Every step builds the GPU stages first (a no-op when the machine still holds the build) and
stamps its records with the machine: device, SM count, clocks, driver, torch, nvcc. --dry-run
checks, on any machine, every command line, flag and output path a step would use, and each
step's time estimate against its budget, running none of them.

Examples:
  bash .ci/gpu --list                          # the steps, their commands and time estimates
  bash .ci/gpu --dry-run                       # check every step here (no GPU needed)
  bash .ci/gpu --quick --out /tmp/gpu          # GPU: build, pytest -m "gpu and not slow", a grad check
  bash .ci/gpu correctness --out "$OUT"        # GPU: one step per command of a lease
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STEP_BUDGET_S = 8 * 60
QUICK_BUDGET_S = 5 * 60
MAX_FILES, MAX_BYTES = 8, 16 << 20      # what one lease command brings back
NAME = re.compile(r"^[A-Za-z0-9._-]+$")  # the only file names that come back
OUT = "{out}"                            # stands for the step's own folder in a command
RESULTS = "docs/results"                 # the records, where the chapters read them


@dataclass
class Command:
    argv: list[str]
    estimate_s: int                 # on an H100 (a guess until a GPU run replaces it)
    stdout: str | None = None       # a file under {out} for the command's standard output
    outputs: list[str] = field(default_factory=list)  # the files it writes under {out} or docs/results
    inputs: list[str] = field(default_factory=list)   # files there that earlier commands wrote

    def text(self) -> str:
        return shlex.join(self.argv) + (f" > {self.stdout}" if self.stdout else "")


def py(*args: str, estimate_s: int, reads: bool = False) -> Command:
    """``python args...``; its arguments under {out} or docs/results are files it writes (or, with
    reads=True, reads)."""
    argv = ["python", *args]
    files = [a.split("=", 1)[-1] for a in argv if a.split("=", 1)[-1].startswith((OUT + "/", RESULTS + "/"))]
    return Command(argv, estimate_s, outputs=[] if reads else files, inputs=files if reads else [])


BUILD = py("-c", 'import modes; print({m: modes.build(m) for m in ("cpp", "cuda", "ptx")})', estimate_s=90)
ENV = py(".ci/gpu.py", "--record-env", f"{OUT}/gpu_env.json", estimate_s=10)


def stamp(*paths: str) -> Command:
    return py(".ci/gpu.py", "--stamp", *paths, estimate_s=5, reads=True)


BIG = ["-b", "4096", "-i", "4096", "-o", "4096", "--device", "cuda"]


def step_correctness(tag: str) -> list[Command]:
    return [BUILD, ENV,
            py("-c", 'import modes; r = modes.available(); print(r); assert r["cuda"] is None and r["ptx"] is None, r',
               estimate_s=10),
            py("grad_check.py", "all", "--device", "cuda", "-b", "33", "-i", "65", "-o", "17", estimate_s=40),
            py("-m", "pytest", "-m", "gpu and not slow", "-q", "-ra", "-p", "no:cacheprovider",
               f"--junitxml={OUT}/pytest_gpu.xml", estimate_s=240)]


def step_gemm(tag: str) -> list[Command]:
    # Every version checked against float64, then timed at 4096³ (TF32 off), then the goals; then
    # Nsight Compute's counters per version. One record each (docs/results holds at most 25).
    timed = py("cuda/bench_gpu.py", "check", "gemm", "goals", "--json", f"{RESULTS}/cuda_gpu_{tag}.json",
               estimate_s=60)
    ncu = py("cuda/bench_gpu.py", "--ncu", "--json", f"{RESULTS}/ncu_gemm_{tag}.json", estimate_s=30)
    return [BUILD, ENV, timed, ncu]


def step_ptx(tag: str) -> list[Command]:
    edits = py("cuda/bench_gpu.py", "ptx", "--json", f"{RESULTS}/ptx_gpu_{tag}.json", estimate_s=40)
    load = py("ptx/load_cost.py", "--json", f"{RESULTS}/gpu_{tag}_ptx_load.json", estimate_s=90)
    regen = Command(["bash", "ptx/regen.sh"], 30, stdout=f"{OUT}/ptx_edits.diff", outputs=[f"{OUT}/ptx_edits.diff"])
    return [BUILD, ENV, regen, edits, load, stamp(load.outputs[0])]


def step_triton(tag: str) -> list[Command]:
    # The image's Triton (3.6.0, the release the chapter pins) compiles the kernels; nothing is installed.
    tests = py("-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "tests/test_triton.py", "tests/test_dense.py",
               "tests/test_edge_cases.py", "-k", "triton", f"--junitxml={OUT}/pytest_triton.xml", estimate_s=150)
    runs = [py("tiles/bench_gpu.py", *shape, "--json", f"{RESULTS}/triton_gpu_{tag}_{name}.json", estimate_s=90)
            for name, shape in (("4096", []), ("b32", ["-b", "32", "-i", "4096", "-o", "4096"]))]
    return [BUILD, ENV, tests, *runs, stamp(*(c.outputs[0] for c in runs))]


def step_train(tag: str) -> list[Command]:
    runs = []
    for mode in ("cuda", "ptx"):
        # One rank on the GPU (NCCL), then two ranks sharing it: NCCL refuses two ranks on one GPU,
        # so they use gloo, with the gradients staged through host memory.
        runs.append(py("distributed.py", "-m", mode, "--world-size", "1",
                       "--json", f"{RESULTS}/train_{mode}_{tag}_w1.json", estimate_s=60))
        runs.append(py("distributed.py", "-m", mode, "--world-size", "2", "--backend", "gloo",
                       "--json", f"{RESULTS}/train_{mode}_{tag}_w2.json", estimate_s=90))
    runs.append(py("distributed.py", "-m", "triton", "--world-size", "1",  # chapter 3's kernels, compiled
                   "--json", f"{RESULTS}/train_triton_{tag}_w1.json", estimate_s=60))
    return [BUILD, ENV, *runs, stamp(*(c.outputs[0] for c in runs))]


def step_stages(tag: str) -> list[Command]:
    every = py("benchmark.py", "-m", "all", *BIG, "--rounds", "20", "--compile", "--roofline",
               "--json", f"{RESULTS}/gpu_{tag}_4096.json", estimate_s=120)
    small = py("benchmark.py", "-m", "all", "-b", "32", "-i", "4096", "-o", "4096", "--device", "cuda",
               "--rounds", "50", "--json", f"{RESULTS}/gpu_{tag}_b32.json", estimate_s=60)
    return [BUILD, ENV, every, small, stamp(every.outputs[0], small.outputs[0])]


def step_quick(tag: str) -> list[Command]:
    return [BUILD, py("-m", "pytest", "-m", "gpu and not slow", "-q", "-ra", "-p", "no:cacheprovider",
                      f"--junitxml={OUT}/pytest_gpu.xml", estimate_s=150),
            py("grad_check.py", "cuda", "--device", "cuda", "-b", "33", "-i", "65", "-o", "17", estimate_s=20)]


STEPS: dict[str, Callable[[str], list[Command]]] = {
    "correctness": step_correctness, "gemm": step_gemm, "ptx": step_ptx, "triton": step_triton, "train": step_train,
    "stages": step_stages}


# ---------------------------------------------------------------------------------------
# Running a step
# ---------------------------------------------------------------------------------------
def device_tag(name: str) -> str:
    """h100, h200, a100...: the model in a device's name, for the records' file names."""
    found = re.search(r"\b([A-Z]{1,2}\d{2,4}[A-Z]?)\b", name)
    return found.group(1).lower() if found else "gpu"


def run_step(name: str, commands: list[Command], results: Path, budget_s: int) -> bool:
    """Run the commands in order within budget_s; pack what they wrote. True if all succeeded."""
    folder = results / name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    started, ok = time.monotonic(), True
    with open(results / f"{name}.log", "w") as log:
        def say(line: str) -> None:
            print(line, flush=True)
            log.write(line + "\n")
            log.flush()

        for c in commands:
            left = budget_s - (time.monotonic() - started)
            argv = [sys.executable if a == "python" else a.replace(OUT, str(folder)) for a in c.argv]
            if left < 5:
                say(f"== skipped, the step's {budget_s} s are spent: {c.text()}")
                ok = False
                continue
            say(f"== {c.text()}   ({time.monotonic() - started:.0f} s into the step)")
            stdout = open(c.stdout.replace(OUT, str(folder)), "w") if c.stdout else None
            proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE if stdout is None else stdout,
                                    stderr=subprocess.STDOUT, text=True, start_new_session=True)
            # The output goes to the log as it comes, from a thread, so that a command that falls
            # silent is still stopped on time.
            echo = threading.Thread(target=lambda p=proc: [say(line.rstrip("\n")) for line in p.stdout or ()])
            echo.start()
            try:
                proc.wait(timeout=left)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                say(f"== stopped: the step's {budget_s} s ran out")
            finally:
                echo.join()
                if stdout is not None:
                    stdout.close()
            if proc.returncode != 0:
                ok = False
                say(f"== exit status {proc.returncode}")
        say(f"== {name}: {'passed' if ok else 'FAILED'} in {time.monotonic() - started:.0f} s")
    records = [ROOT / f for c in commands for f in c.outputs if f.startswith(RESULTS + "/")]
    with tarfile.open(results / f"{name}.tar.gz", "w:gz") as tar:
        for f in records:
            if f.is_file():  # a command that failed wrote nothing: its error is in the log
                tar.add(f, arcname=f"records/{f.name}")
        for f in sorted(folder.iterdir()):
            tar.add(f, arcname=f"extra/{f.name}")
    shutil.rmtree(folder)
    for f in (results / f"{name}.log", results / f"{name}.tar.gz"):
        if f.stat().st_size > MAX_BYTES:
            print(f"warning: {f} is over {MAX_BYTES >> 20} MiB and will not come back from a lease", file=sys.stderr)
    return ok


# ---------------------------------------------------------------------------------------
# Checking a step without running it
# ---------------------------------------------------------------------------------------
_help: dict[str, str] = {}


def _script_help(script: str) -> str:
    if script not in _help:
        result = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise ValueError(f"{script} --help failed: {result.stderr.strip()[-500:]}")
        _help[script] = result.stdout
    return _help[script]


def check(c: Command, out: Path) -> None:
    """Raise ValueError if the command could not run as written: a missing script or module, a
    flag its --help does not list or its parser refuses, code that does not parse, tests that
    do not collect, an output outside {out} or with a name that would not come back."""
    for path in c.outputs:
        prefix = next((p for p in (OUT + "/", RESULTS + "/") if path.startswith(p)), None)
        rel = path.removeprefix(prefix or "")
        if prefix is None or "/" in rel or not NAME.match(rel):
            raise ValueError(f"output {path!r}: must be a plain file name under {OUT}/ or {RESULTS}/ "
                             "(letters, digits, . _ -)")
    argv = [a.replace(OUT, str(out)) for a in c.argv]
    if argv[0] == "bash":
        script = ROOT / argv[1]
        if not script.is_file() or subprocess.run(["bash", "-n", str(script)]).returncode != 0:
            raise ValueError(f"{argv[1]}: missing, or not valid bash")
        return
    if argv[0] != "python":
        raise ValueError(f"unexpected program {argv[0]!r}")
    if argv[1] == "-c":
        compile(argv[2], "<-c>", "exec")
        return
    if argv[1:3] == ["-m", "pytest"]:
        result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                                 *[a for a in argv[3:] if not a.startswith("--junitxml") and a != "-q"]],
                                cwd=ROOT, capture_output=True, text=True, timeout=300)
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
        if result.returncode != 0 or not collected or int(collected.group(1)) == 0:
            raise ValueError(f"pytest collects no tests for {shlex.join(argv[3:])}: {result.stdout[-300:]}")
        return
    script = argv[1]
    if not (ROOT / script).is_file():
        raise ValueError(f"{script}: no such script")
    usage = _script_help(script)
    for a in argv[2:]:
        flag = a.split("=", 1)[0]
        if flag.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", flag) and \
                not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage):
            raise ValueError(f"{script}: {flag} is not among its options")
    if script != ".ci/gpu.py":  # its own options act at once; the parser is checked above
        # The arguments, then --help: argparse checks each value (types, choices) as it reads
        # it, then stops at --help before the script does anything.
        result = subprocess.run([sys.executable, *argv[1:], "--help"], cwd=ROOT, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise ValueError(f"{script} refuses its arguments: {result.stderr.strip()[-300:]}")


def dry_run(names: list[str]) -> bool:
    out = Path("/tmp/gpu-dry-run/step")  # never written: --help runs stop before any output
    ok = True
    plans = [(n, STEPS[n]("h100"), STEP_BUDGET_S) for n in names] + ([("quick", step_quick("h100"), QUICK_BUDGET_S)]
                                                                      if names == list(STEPS) else [])
    for name, commands, budget in plans:
        estimate = sum(c.estimate_s for c in commands)
        print(f"{name}: {len(commands)} commands, about {estimate} s of its {budget} s")
        if estimate > budget:
            print(f"  FAIL: the estimates add up to more than the step's {budget} s")
            ok = False
        seen = set()
        for c in commands:
            try:
                check(c, out)
                dup, unwritten = set(c.outputs) & seen, set(c.inputs) - seen
                if dup:
                    raise ValueError(f"writes {sorted(dup)}, which an earlier command of the step wrote")
                if unwritten:
                    raise ValueError(f"reads {sorted(unwritten)}, which no earlier command of the step writes")
                seen |= set(c.outputs)
                print(f"  ok    {c.text()}")
            except (ValueError, SyntaxError, subprocess.TimeoutExpired) as e:
                print(f"  FAIL  {c.text()}\n        {e}")
                ok = False
    brought_back = 2 * len(names)  # <step>.log and <step>.tar.gz
    print(f"{'one call of all the steps above' if len(names) > 1 else 'the step'} leaves {brought_back} files"
          + (f": over the {MAX_FILES} a lease command brings back, run them in separate calls"
             if brought_back > MAX_FILES else ""))
    print("dry run: every command checked" if ok else "dry run: FAILED")
    return ok


# ---------------------------------------------------------------------------------------
# The records: the machine they ran on, and the GEMM table
# ---------------------------------------------------------------------------------------
def environment() -> dict:
    import benchmark  # the one description of a GPU, as every GPU record carries it

    return {**benchmark.describe_gpu(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bash .ci/gpu", description=__doc__.split("\n\n")[0],
                                     epilog=__doc__[__doc__.index("\n\n") + 2:],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("steps", nargs="*", metavar="STEP", help=f"any of: {', '.join(STEPS)} (in that order)")
    parser.add_argument("--out", metavar="DIR", help="where each step leaves <step>.log and <step>.tar.gz")
    parser.add_argument("--quick", action="store_true", help="build, pytest -m 'gpu and not slow', one grad check")
    parser.add_argument("--dry-run", action="store_true", help="check the steps' commands here; run nothing")
    parser.add_argument("--list", action="store_true", help="print the steps' commands and time estimates")
    inner = parser.add_argument_group("used by the steps themselves (GPU)")
    inner.add_argument("--record-env", metavar="PATH", help="write the machine's description as JSON")
    inner.add_argument("--stamp", nargs="+", metavar="JSON", help="add it to these records (key 'environment')")
    args = parser.parse_args(argv)
    unknown = [s for s in args.steps if s not in STEPS]
    if unknown:
        parser.error(f"unknown step {unknown[0]!r}; choose from {', '.join(STEPS)}")
    names = args.steps or list(STEPS)

    if args.record_env:
        Path(args.record_env).write_text(json.dumps(environment(), indent=1) + "\n")
        print(json.dumps(environment()))
        return 0
    if args.stamp:
        env = environment()
        for p in args.stamp:
            if Path(p).is_file():  # a benchmark that failed wrote nothing: its error is in the log
                rec = json.loads(Path(p).read_text())
                rec["environment"] = env
                Path(p).write_text(json.dumps(rec, indent=1) + "\n")
        return 0
    if args.list:
        for name in names + ["quick"]:
            commands = (STEPS.get(name) or step_quick)("TAG")
            print(f"{name} (about {sum(c.estimate_s for c in commands)} s, "
                  f"budget {QUICK_BUDGET_S if name == 'quick' else STEP_BUDGET_S} s):")
            for c in commands:
                print(f"  {c.text()}")
        return 0
    if args.dry_run:
        return 0 if dry_run(names) else 1

    if not args.out:
        parser.error("--out DIR is needed to run steps (or use --dry-run / --list)")
    import torch

    if not torch.cuda.is_available():
        parser.error("needs a GPU (torch.cuda.is_available() is False); --dry-run checks the steps without one")
    results = Path(args.out)
    results.mkdir(parents=True, exist_ok=True)
    tag = device_tag(torch.cuda.get_device_name())
    plan = [("quick", step_quick(tag), QUICK_BUDGET_S)] if args.quick else \
        [(n, STEPS[n](tag), STEP_BUDGET_S) for n in names]
    if 2 * len(plan) > MAX_FILES:
        print(f"note: {2 * len(plan)} files in {results}; a lease command brings back {MAX_FILES}", file=sys.stderr)
    failed = [n for n, commands, budget in plan if not run_step(n, commands, results, budget)]
    print(f"results in {results}: " + ", ".join(f"{n}.log {n}.tar.gz" for n, _, _ in plan))
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
