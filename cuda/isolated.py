"""One process per GEMM version, each under a limit of its own: a fault or a hang costs that version alone.

An illegal address, a trap or a bad tensor map is sticky (every later CUDA call in the process
fails), and a wrong mbarrier protocol spins until something kills the process: a version never
run on a GPU must not share a process with anything else. So each version (and each autotuning
candidate) runs in a child process of its own, with a limit of its own, several side by side where
they only check (each has its own CUDA context), one at a time where they time. The record says,
per version, how it ended:

  SAME     every entry the same bits as the CPU emulation's (cuda/exact_check.py)
  DIFF     a difference (which entry, where, the two values)
  FAULT    a CUDA error (the launch's, or the synchronisation's: the error's words), or a signal
  HANG     still running at its limit: killed
  PASSED   (kernels) checked against float64 and timed
  FAILED   a check failed, or the child could not run (its last line says why)
  CLEAN    (sanitize) compute-sanitizer found nothing; ERRORS: it reported some (its first line)
  NOT RUN  the run's deadline came first (or, for kernels, its exact check did not pass)

Runs:
  exact     cuda/exact_check.py one --version V for every version and candidate (0 included),
            versions never run on a GPU first (the committed GPU records say which ran: --results)
  kernels   the tensor cores' roofs alone first (bench_gpu.py roof --kernel 0), then
            cuda/bench_gpu.py PARTS --kernel V for each version never timed on a GPU (in float32 or
            bfloat16, the types the parts take) whose exact
            check passed (--exact: that run's record), by its number, never through version 0;
            each version takes the parts that apply to it (its types, tensor cores or not)
  sanitize  compute-sanitizer --tool TOOL on cuda/exact_check.py one --version V, every version
            and candidate, never-run ones first (--never-run: those alone)

Examples:
  python cuda/isolated.py exact --json /tmp/exact.json
  python cuda/isolated.py kernels --parts goals small bf16 roof tf32 goals16 --exact /tmp/exact.json
  python cuda/isolated.py sanitize --tool racecheck --never-run --deadline 120
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

# isort: split
import json  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402

catalog = cli.load_file("cuda/catalog.py")

RESULTS = ROOT / "docs" / "results"
# What a child costs before its work, the limits' base. Measured on the 2-core development machine
# (2026-11-29, warm page cache): python with `import torch` 1.1-1.7 s; with the cpp stage's library
# loaded (modes.stage) 2.0-2.4 s. Doubled for 8 children starting side by side, plus 5 s for what
# cannot be measured without a GPU: the CUDA context, cuBLAS's handle, the stage's module loads.
START_S = 2 * 2.4 + 5
# Each child's limit, seconds: the start plus its work, with room. exact: at most 72 launches of
# shapes under 75×140×270 (each an allocation, a launch, a synchronisation, a copy back: about a
# millisecond) and their inputs made on the CPU; kernels: a version's parts at 4096³ and B = 32,
# a few seconds of GPU work (a 4096³ bfloat16 forward is ~0.2 ms, a float32 CUDA-core one ~3 ms,
# times rounds and lines); sanitize: compute-sanitizer slows the start (every module loaded is
# instrumented) and the kernels; not measured here (no GPU), so the longest of the three.
LIMITS = {"exact": round(START_S + 20), "kernels": round(START_S + 35), "sanitize": 90}
# What a child is expected to take (the plan's limits for the runs are built on it): the start
# plus its GPU work, estimated as above; a sanitized child's is a guess (not measured: no GPU here).
EXPECTED_S = {"exact": START_S + 2, "kernels": START_S + 8, "sanitize": 40.0}
JOBS = {"exact": 8, "kernels": 1, "sanitize": 8}  # side by side on the lease's 16 cores; timings alone
GRACE_S = 5  # SIGINT, then SIGKILL: a child blocked in a CUDA synchronisation never sees the SIGINT
MARGIN_S = 12  # the run ends this long before the plan's limit for its part (GPU_PART_LIMIT_S): > its grace
PART_LIMIT_ENV = "GPU_PART_LIMIT_S"  # set by .ci/gpu.py: the seconds this part may run
TOOLS = ("memcheck", "racecheck", "synccheck")
# Which of bench_gpu.py's timing parts apply to a version: by its types and whether it is one of
# chapter 3's CUDA-core versions (1 to kVersions) or a tensor-core one.
APPLIES: dict[str, Callable[[bool, bool, bool], bool]] = {
    "gemm": lambda f32, bf16, core: f32 and core,
    "goals": lambda f32, bf16, core: f32 and core,
    "small": lambda f32, bf16, core: f32 and not core,  # the CUDA-core ones' B = 32 is in goals
    "tf32": lambda f32, bf16, core: f32 and not core,
    "bf16": lambda f32, bf16, core: bf16 and core,  # v11, v12 in bfloat16 beside cuBLAS's
    "roof": lambda f32, bf16, core: bf16 and not core,
    "goals16": lambda f32, bf16, core: bf16,
}


@dataclass
class Unit:
    name: str                # "v33", "candidate 3"
    argv: list[str]
    limit_s: float


@dataclass
class Outcome:
    status: str
    seconds: float = 0.0
    detail: str = ""
    exit: int | None = None
    tail: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"status": self.status, "seconds": round(self.seconds, 1), "detail": self.detail, "exit": self.exit}


# ---------------------------------------------------------------------------------------
# Which versions a GPU has run: the committed records
# ---------------------------------------------------------------------------------------
def confirmed(results: Path | None = None) -> set[tuple[int, str]]:
    """(version, type) pairs a committed GPU record checked against float64 and found right: the
    "check" rows (ok) of records with a "gpu" description, in the record's type."""
    names = {"float32": "f32", "float64": "f64", "bfloat16": "bf16", "float16": "f16"}
    found = set()
    for path in sorted((results or RESULTS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except ValueError:
            continue
        if not isinstance(record, dict) or "gpu" not in record or not isinstance(record.get("check"), dict):
            continue
        dtype = names.get(record.get("dtype", "float32"), "f32")
        found |= {(row["version"], dtype) for row in record["check"].get("rows", []) if row.get("ok")}
    return found


def unit_entries() -> dict[str, list[tuple[int, str]]]:
    """Each unit's (version, type) entries: a version in each of its types; a candidate, float32."""
    out: dict[str, list[tuple[int, str]]] = {}
    for v in catalog.versions():
        out[f"v{v.id}"] = [(v.id, t) for t in v.dtypes]
    for c in catalog.candidates():
        out[f"candidate {c.index}"] = [(c.version, "f32")]
    return out


def never_run_first(results: Path | None = None) -> list[tuple[str, bool]]:
    """(unit, never run) for every unit, in the order they run: those no GPU record confirms in any
    type first, then those confirmed in some of their types only, then the confirmed ones; each
    group in the catalogue's order. Version 0 runs other versions: it counts as never run."""
    done = confirmed(results)
    ranked = []
    for name, entries in unit_entries().items():
        ran = sum(e in done for e in entries)
        rank = 0 if ran == 0 or name == "v0" else 1 if ran < len(entries) else 2
        ranked.append((rank, name))
    return [(name, rank < 2) for rank, name in sorted(ranked, key=lambda r: r[0])]


TIMED_TYPES = ("f32", "bf16")  # the types bench_gpu.py's timing parts take


def never_timed(results: Path | None = None) -> list[int]:
    """The versions (0 apart) with a type the timing parts take (TIMED_TYPES) that no GPU record
    confirms, in never_run_first's order: those the lease times."""
    done = confirmed(results)
    entries = unit_entries()
    return [int(name[1:]) for name, _ in never_run_first(results) if name.startswith("v") and name != "v0"
            and any(e not in done for e in entries[name] if e[1] in TIMED_TYPES)]


def parts_for(version: int, requested: list[str]) -> list[str]:
    """The timing parts of `requested` that apply to `version` (APPLIES)."""
    f32, bf16 = version in catalog.version_ids(dtype="f32"), version in catalog.version_ids(dtype="bf16")
    core = version in catalog.cuda_core_versions()
    return [p for p in requested if APPLIES[p](f32, bf16, core)]


def part_units(run: str) -> int:
    """How many children `run` starts as the GPU plan asks it: exact every version and candidate;
    kernels each version never timed (never_timed), at most (one whose exact check fails is not
    started); sanitize each never-run version and candidate but version 0 (--never-run)."""
    order = never_run_first()
    if run == "exact":
        return len(order)
    if run == "kernels":  # and the roofs' own process, first
        return len(never_timed()) + 1
    return len([name for name, never in order if never and name != "v0"])


def part_limit(run: str) -> tuple[int, str]:
    """(the plan's limit for `run`'s part, where it comes from): its children in waves of JOBS,
    each its expected seconds (EXPECTED_S, from the start measured here), one of them to its own
    limit (a hang), and the margin by which the run ends before the part's limit."""
    units, jobs = part_units(run), JOBS[run]
    waves = math.ceil(units / jobs)
    expected, own = EXPECTED_S[run], LIMITS[run]
    limit = math.ceil(waves * expected + (own - expected) + MARGIN_S)
    return limit, (f"{units} processes, {jobs} at a time: {waves} × {expected:.0f} s expected + one hung to its "
                   f"{own} s limit + {MARGIN_S} s to end before this limit")


# ---------------------------------------------------------------------------------------
# Running the children
# ---------------------------------------------------------------------------------------
def run_one(unit: Unit, limit_s: float, say: Callable[[str], None], keep: int = 40) -> tuple[int | None, list[str],
                                                                                              float]:
    """Run a unit's command under limit_s, its lines to say() prefixed with its name: (its exit
    status, None if stopped; its first and last `keep` lines, where a sanitizer's first report and
    the RESULT line are; seconds)."""
    started = time.monotonic()
    head: list[str] = []
    tail: list[str] = []
    try:
        proc = subprocess.Popen(unit.argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                errors="replace", start_new_session=True)
    except OSError as e:  # compute-sanitizer not on the PATH, say: this unit fails, the others run
        return 127, [f"{unit.argv[0]}: cannot start ({e.strerror or e})"], time.monotonic() - started

    def echo() -> None:
        for line in proc.stdout or ():
            (head if len(head) < keep else tail).append(line.rstrip("\n"))
            del tail[:-keep]
            say(f"[{unit.name}] {line.rstrip()}")
    reader = threading.Thread(target=echo)
    reader.start()
    # A process stuck in the driver may not die even on SIGKILL: the wait after it is bounded too.
    code = cli.wait_or_stop(proc, limit_s, GRACE_S, 4 * GRACE_S)
    reader.join(timeout=4 * GRACE_S)  # a pipe a surviving process still holds must not hold the run
    return code, head + tail, time.monotonic() - started


def _result(lines: list[str]) -> dict | None:
    """The child's last RESULT {json} line (cuda/exact_check.py one), or None."""
    for line in reversed(lines):
        if line.startswith("RESULT {"):
            try:
                return json.loads(line[len("RESULT "):])
            except ValueError:
                return None
    return None


def classify(kind: str, code: int | None, tail: list[str], cut: bool) -> tuple[str, str]:
    """(status, detail) of a child that ended with exit status `code` (None: stopped at its limit;
    `cut`: that limit was the run's deadline, not the unit's own)."""
    if code is None:
        return ("NOT RUN", "cut by the run's deadline") if cut else ("HANG", "still running at its limit: killed")
    result = _result(tail)
    cuda_error = next((line for line in tail if "CUDA error" in line or "cudaError" in line), "")
    if code < 0:
        name = signal.Signals(-code).name if -code in signal.Signals._value2member_map_ else str(-code)
        return "FAULT", f"killed by {name}" + (f": {cuda_error}" if cuda_error else "")
    if kind == "sanitize" and code == 9:  # compute-sanitizer's --error-exitcode
        report = next((line for line in tail if line.startswith("========= ") and "ERROR SUMMARY" not in line), "")
        return "ERRORS", report or "compute-sanitizer reported errors"
    if result is not None:
        status = result["status"]
        detail = (result.get("fault") if status == "FAULT" else
                  "; ".join(result.get("differences", [])[:2] + result.get("missing", [])[:2]))
        if kind == "sanitize" and status == "SAME":
            return "CLEAN", f"{result.get('compared', 0)} entries under the sanitizer, the same bits"
        return status, detail or f"{result.get('compared', 0)} entries, bit for bit"
    if cuda_error:
        return "FAULT", cuda_error
    if code == 0:
        return {"exact": "SAME", "kernels": "PASSED", "sanitize": "CLEAN"}[kind], ""
    return "FAILED", (tail[-1] if tail else f"exit {code}")  # it could not run (a usage error, a traceback)


def run_units(kind: str, units: list[Unit], jobs: int, deadline_s: float,
              say: Callable[[str], None] = print, on_done: Callable[[str, Outcome], None] | None = None
              ) -> dict[str, Outcome]:
    """Every unit in its own process, `jobs` at a time, in order, under its limit and the run's
    deadline: a unit is started only while its limit fits before the deadline (else NOT RUN)."""
    started = time.monotonic()
    outcomes: dict[str, Outcome] = {}
    lock = threading.Lock()

    def one(unit: Unit) -> None:
        left = deadline_s - (time.monotonic() - started)
        if left < min(unit.limit_s, START_S * 2):
            outcome = Outcome("NOT RUN", detail=f"{max(left, 0):.0f} s left of the run's {deadline_s:.0f} s")
        else:
            limit = min(unit.limit_s, left)
            code, tail, seconds = run_one(unit, limit, say)
            status, detail = classify(kind, code, tail, cut=code is None and limit < unit.limit_s)
            outcome = Outcome(status, seconds, detail, code, tail)
        with lock:
            outcomes[unit.name] = outcome
            say(f"{outcome.status:<8} {unit.name}: {outcome.detail}".rstrip(": "))
            if on_done:
                on_done(unit.name, outcome)
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(one, units))
    return {u.name: outcomes[u.name] for u in units}


# ---------------------------------------------------------------------------------------
# The three runs
# ---------------------------------------------------------------------------------------
def exact_units(order: list[tuple[str, bool]], limit_s: float, expected: str | None = None) -> list[Unit]:
    extra = ["--expected", expected] if expected else []
    return [Unit(name, [sys.executable, "cuda/exact_check.py", "one", "--version", name.replace(" ", ""), *extra],
                 limit_s) for name, _ in order]


def sanitize_units(order: list[tuple[str, bool]], tool: str, limit_s: float) -> list[Unit]:
    return [Unit(name, ["compute-sanitizer", "--tool", tool, "--error-exitcode", "9", sys.executable,
                        "cuda/exact_check.py", "one", "--version", name.replace(" ", "")], limit_s)
            for name, _ in order]


def timed_versions(exact_record: dict, new: list[int]) -> tuple[list[int], dict[str, str]]:
    """(the versions of `new` (never_timed) to time: those whose exact check was SAME; {unit: why
    not} for the others): a version is timed only if its own check passed, whatever the others' did."""
    chosen, skipped = [], {}
    for v in new:
        status = exact_record.get("units", {}).get(f"v{v}", {}).get("status", "NOT RUN")
        if status == "SAME":
            chosen.append(v)
        else:
            skipped[f"v{v}"] = f"its exact check was {status}"
    return chosen, skipped


ROOFS = "roofs"  # the unit that runs the tensor cores' roof loops alone (they never ran on a GPU either)


def roofs_unit(rounds: int, folder: Path, limit_s: float) -> Unit:
    """The roofs (cuda/tensor_cores/roof.cuh's mma.sync and wgmma loops) and cuBLAS in a process of
    their own, before any version's (bench_gpu.py roof --kernel 0: no version line): a fault of a
    roof is the roof's, not blamed on each tensor-core version that would time beside it."""
    return Unit(ROOFS, [sys.executable, "cuda/bench_gpu.py", "roof", "--kernel", "0", "--rounds", str(rounds),
                        "--json", str(folder / f"{ROOFS}.json")], limit_s)


def kernel_units(versions: list[int], requested: list[str], rounds: int, folder: Path, limit_s: float,
                 roofs_ran: bool = True) -> list[Unit]:
    """Each version's process, its parts those that apply (parts_for); without the roof part
    where the roofs did not pass alone (roofs_ran=False)."""
    units = []
    for v in versions:
        parts = [p for p in parts_for(v, requested) if roofs_ran or p != "roof"]
        if parts:
            units.append(Unit(f"v{v}", [sys.executable, "cuda/bench_gpu.py", *parts, "--kernel", str(v), "--rounds",
                                        str(rounds), "--json", str(folder / f"v{v}.json")], limit_s))
    return units


def _header() -> dict:
    """The record's header: the card and the command (record_info.record_header, on the GPU where
    there is one)."""
    import torch

    import record_info

    return record_info.record_header("cuda" if torch.cuda.is_available() else "cpu", torch.float32)


def deadline(asked: float | None, env: dict | None = None) -> float:
    """The run's seconds: --deadline, or what the plan gave the part (PART_LIMIT_ENV) less MARGIN_S,
    whichever is less; an hour when neither says."""
    env = os.environ if env is None else env
    given = [asked] if asked else []
    if env.get(PART_LIMIT_ENV):
        given.append(float(env[PART_LIMIT_ENV]) - MARGIN_S)
    return max(min(given), 1.0) if given else 3600.0


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__ or "")
    parser.add_argument("run", choices=("exact", "kernels", "sanitize"))
    parser.add_argument("--json", metavar="PATH", help="the record (written again after every version)")
    parser.add_argument("--deadline", type=cli.positive(float), metavar="S",
                        help=f"seconds for the whole run (default: the plan's limit for the part, {PART_LIMIT_ENV}, "
                             f"less {MARGIN_S} s)")
    parser.add_argument("--limit", type=cli.positive(float), metavar="S", help="each child's limit (default: "
                        + ", ".join(f"{k} {v} s" for k, v in LIMITS.items()) + ")")
    parser.add_argument("--jobs", type=cli.positive(int), help="children side by side (default: "
                        + ", ".join(f"{k} {v}" for k, v in JOBS.items()) + ")")
    parser.add_argument("--results", metavar="DIR", help="the committed records that say which versions a GPU ran "
                        "(default docs/results)")
    parser.add_argument("--expected", metavar="PATH", help="exact: the expected bits (cuda/exact_check.py's default)")
    parser.add_argument("--exact", metavar="PATH", help="kernels: the record of an exact run (which versions passed)")
    parser.add_argument("--parts", nargs="+", choices=list(APPLIES), default=list(APPLIES),
                        help="kernels: cuda/bench_gpu.py's timing parts, each where it applies")
    parser.add_argument("--rounds", type=cli.positive(int), default=10, help="kernels: rounds per timing")
    parser.add_argument("--tool", choices=TOOLS, default="memcheck", help="sanitize: compute-sanitizer's tool")
    parser.add_argument("--never-run", action="store_true", help="exact, sanitize: only the versions and candidates "
                        "never run on a GPU (version 0 apart: it runs the others)")
    args = parser.parse_args(argv)
    json_path = cli.check_output(args.json, "--json")
    if args.run == "kernels" and not args.exact:
        parser.error("kernels takes --exact PATH: a version is timed only if its own exact check passed")
    exact_record = cli.read_record(args.exact, "--exact", keys=("units",)) if args.exact else {}
    seconds = deadline(args.deadline)
    limit, jobs = args.limit or LIMITS[args.run], args.jobs or JOBS[args.run]
    order = never_run_first(Path(args.results) if args.results else None)
    if args.never_run:
        order = [(name, never) for name, never in order if never and name != "v0"]
    record = {**_header(), "run": args.run, "deadline_s": seconds, "limit_s": limit, "jobs": jobs,
              "never_run": [name for name, never in order if never], "order": [], "units": {}}
    folder = Path(tempfile.mkdtemp(prefix="isolated-"))
    first: list[Unit] = []  # kernels: the roofs alone, before the versions that time beside them
    if args.run == "exact":
        units = exact_units(order, limit, args.expected)
    elif args.run == "sanitize":
        record["tool"] = args.tool
        units = sanitize_units(order, args.tool, limit)
    else:
        versions, skipped = timed_versions(exact_record, never_timed(Path(args.results) if args.results else None))
        record["units"].update({name: {"status": "NOT RUN", "detail": why} for name, why in skipped.items()})
        record["parts"] = args.parts
        units = kernel_units(versions, args.parts, args.rounds, folder, limit)
        if any("roof" in u.argv for u in units):
            first = [roofs_unit(args.rounds, folder, limit)]
    record["order"] = [u.name for u in first + units]

    def save(name: str, outcome: Outcome) -> None:
        record["units"][name] = outcome.as_dict()
        fragment = folder / f"{name}.json"
        if args.run == "kernels" and fragment.exists():
            record["units"][name]["record"] = json.loads(fragment.read_text())
        if json_path is not None:
            tmp = json_path.with_name(json_path.name + ".tmp")
            cli.json_writer(record)(tmp)
            tmp.replace(json_path)
    print(f"{args.run}: {len(units)} processes, {jobs} at a time, each under {limit:.0f} s, within {seconds:.0f} s "
          f"(first those with a type no GPU has run: {', '.join(record['never_run']) or 'none'})", flush=True)
    started = time.monotonic()
    if first and run_units(args.run, first, 1, seconds, on_done=save)[ROOFS].status != "PASSED":
        units = kernel_units(versions, args.parts, args.rounds, folder, limit, roofs_ran=False)
        record["order"] = [ROOFS, *(u.name for u in units)]
    outcomes = run_units(args.run, units, jobs, seconds - (time.monotonic() - started), on_done=save)
    for name, outcome in outcomes.items():
        save(name, outcome)
    width = max((len(n) for n in record["units"]), default=4)
    lines = [f"{name:<{width}}  {u['status']:<8} {u.get('seconds', 0):5.0f} s  {u.get('detail', '')}"
             for name, u in record["units"].items()]
    bad = [n for n, u in record["units"].items() if u["status"] in ("DIFF", "FAULT", "HANG", "FAILED", "ERRORS")]
    lines.append(f"{args.run}: " + (f"FAILED: {', '.join(bad)}" if bad else "no version failed")
                 + f" ({sum(u['status'] == 'NOT RUN' for u in record['units'].values())} not run)")
    code = cli.publish("\n".join(lines), [(json_path, cli.json_writer(record))])
    return code or (1 if bad else 0)


if __name__ == "__main__":
    cli.run(main)
