"""The GPU plan's checks without a GPU (.ci/gpu.py --dry-run, and its refusals before a run): the
limits against the deadline and the lease, inputs a fresh machine lacks, prerequisites in order,
records where the chapters read them, exit statuses no shell hides, and each command's script,
flags and tests as its --help and pytest's collection see them.

Every function takes the plan (the module .ci/gpu.py) and reads its constants and parts at call
time, so that what the plan says is what is checked.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

_help: dict[str, str] = {}
OUTPUT_FLAGS = ("--json", "--plot", "--out", "--trace")  # as docs/records.py reads a record's command


def _script_help(plan: ModuleType, script: str) -> str:
    if script not in _help:
        result = subprocess.run([sys.executable, script, "--help"], cwd=plan.ROOT, capture_output=True, text=True,
                                timeout=300)
        if result.returncode != 0:
            raise ValueError(f"{script} --help failed: {result.stderr.strip()[-500:]}")
        _help[script] = result.stdout
    return _help[script]


def _git_ignored(plan: ModuleType, path: str) -> bool:
    """True if git ignores the path here (False where there is no git or no repository: a copy)."""
    try:
        return subprocess.run(["git", "check-ignore", "-q", path], cwd=plan.ROOT, capture_output=True).returncode == 0
    except OSError:
        return False


def plan_problems(plan: ModuleType, selected: list, deadline_s: int, tag: str = "h100") -> list[str]:
    """What is wrong with a selection as written, without running any command: limits over the
    deadline, inputs a fresh machine lacks, prerequisites that come later, records outside
    docs/results/ or not written by their own command, commands whose exit status hides a failure."""
    problems = []
    total = sum(p.limit_s for p in selected if not p.tail)
    if deadline_s - total <= plan.GRACE_S:
        problems.append(f"the limits add up to {total} s, over the {deadline_s} s deadline less the "
                        f"{plan.GRACE_S} s of grace a stopped part may take: later parts would not run")
    tails = [p.name for p in selected if p.tail]
    if tails and any(not p.tail for p in selected[[p.name for p in selected].index(tails[0]):]):
        problems.append(f"a part the deadline may cut ({tails[0]}) runs before one it may not: the tail comes last")
    earlier: set[str] = set()
    produced: set[str] = set()
    writers: dict[str, str] = {}
    for p in selected:
        if p.name == "build":
            _, _, problem = plan.build_limit()
            problems += [f"build: {problem}"] if problem else []
        if p.says:
            script = p.argv[1] if p.argv[0] == "python" and len(p.argv) > 1 else ""
            if not (plan.ROOT / script).is_file() or p.says not in (plan.ROOT / script).read_text():
                problems.append(f"{p.name}: {script or p.argv[0]} never says {p.says!r}, the words it must say")
        for n in p.needs + p.after:
            if n not in earlier:
                problems.append(f"{p.name}: needs {n!r}, which does not run before it")
        for f in p.inputs:
            if f not in produced and (_git_ignored(plan, f) or not (plan.ROOT / f).exists()):
                held = "ignores" if _git_ignored(plan, f) else "does not hold"
                problems.append(f"{p.name}: reads {f}, which git {held} and no earlier part makes: a fresh machine "
                                "lacks it")
        argv = p.command(tag)
        for r in (x.replace(plan.TAG, tag) for x in p.records):
            name = r.removeprefix(plan.RESULTS + "/")
            if (not r.startswith(plan.RESULTS + "/") or "/" in name or not plan.NAME.match(name)
                    or not name.endswith(".json")):
                problems.append(f"{p.name}: record {r!r} is not a plain docs/results/<name>.json, where the chapters "
                                "read records")
            elif not any(a == r and k > 0 and argv[k - 1] in OUTPUT_FLAGS for k, a in enumerate(argv)):
                problems.append(f"{p.name}: record {r} is not written by its command (after one of "
                                f"{', '.join(OUTPUT_FLAGS)}), so the command it keeps would not retake it")
            elif r in writers:
                problems.append(f"{p.name}: record {r} is written by {writers[r]} too")
            writers.setdefault(r, p.name)
        for e in p.extras:
            rel = e.removeprefix(plan.OUT + "/")
            if not e.startswith(plan.OUT + "/") or "/" in rel or not plan.NAME.match(rel):
                problems.append(f"{p.name}: {e!r} must be a plain file name under {plan.OUT}/ to come back")
        program = argv[0]
        if program in ("bash", "sh") and len(argv) > 1 and argv[1].startswith("-"):
            problems.append(f"{p.name}: inline shell ({program} {argv[1]} ...): pipes, '|| true' and background jobs "
                            "hide exit statuses; run a script file or a Python command")
        elif program in ("bash", "sh"):
            script = plan.ROOT / argv[1] if len(argv) > 1 else None
            if script is None or not script.is_file():
                problems.append(f"{p.name}: {argv[1:2]} is no script file")
            elif not re.search(r"^set -[a-z]*e", script.read_text(), re.M):
                problems.append(f"{p.name}: {argv[1]} lacks 'set -e': a failing command inside would not fail it")
        elif program not in ("python", "compute-sanitizer"):
            problems.append(f"{p.name}: unexpected program {program!r}")
        produced |= set(p.produces)
        earlier |= {p.name, p.stands_for} - {""}
    extras = sum(len(p.extras) for p in selected)
    if extras + 3 > plan.MAX_FILES:  # + the log and the two archives
        problems.append(f"{extras + 3} files in --out: a lease command brings back {plan.MAX_FILES}")
    return problems


def command_problems(plan: ModuleType, p, tag: str = "h100") -> list[str]:
    """What would stop a part's command at once: a missing script, a flag its --help does not
    list or its parser refuses, code that does not parse, tests that do not collect."""
    key = (p.name, *p.command(tag))
    if key not in _checked:  # a part in several selections is checked once
        _checked[key] = [f"{p.name}: {m}" for m in _command_problems(plan, p.command(tag, "/tmp/gpu-dry-run"))]
    return _checked[key]


_checked: dict[tuple, list[str]] = {}


def _prefetch(plan: ModuleType, p) -> None:
    """command_problems(p) computed ahead (dry_run reports it, and any exception, in order)."""
    try:
        command_problems(plan, p)
    except (SyntaxError, ValueError, subprocess.TimeoutExpired):
        pass


def _command_problems(plan: ModuleType, argv: list[str]) -> list[str]:
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
        result = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", *args], cwd=plan.ROOT,
                                capture_output=True, text=True, timeout=600)
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", result.stdout)
        if result.returncode != 0 or not collected or int(collected.group(1)) == 0:
            return [f"pytest collects no tests for {shlex.join(args)}: {result.stdout[-300:]}"]
        return []
    script = argv[1]
    if not (plan.ROOT / script).is_file():
        return [f"{script}: no such script"]
    usage = _script_help(plan, script)
    for a in argv[2:]:
        flag = a.split("=", 1)[0]
        if flag.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", flag) and \
                not re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", usage):
            return [f"{script}: {flag} is not among its options"]
    # The arguments, then --help: argparse checks each value (types, choices) as it reads it,
    # then stops at --help before the script does anything.
    result = subprocess.run([sys.executable, *argv[1:], "--help"], cwd=plan.ROOT, capture_output=True, text=True,
                            timeout=300)
    if result.returncode != 0:
        return [f"{script} refuses its arguments: {result.stderr.strip()[-300:]}"]
    return []


def lease_problems(plan: ModuleType) -> list[str]:
    """What does not fit the lease: the selections' deadlines after the start, a command's limit."""
    problems = []
    if plan.START_S + sum(plan.DEADLINES.values()) > plan.LEASE_S:
        deadlines = sum(plan.DEADLINES.values())
        problems.append(f"the start ({plan.START_S} s) and the selections' deadlines ({deadlines} s) exceed "
                        f"the lease's {plan.LEASE_S} s")
    problems += [f"{s}: its deadline {d} s is over a command's {plan.COMMAND_S} s" for s, d in plan.DEADLINES.items()
                 if d > plan.COMMAND_S]
    return problems


def dry_run(plan: ModuleType, names: list[str]) -> bool:
    every = plan.parts()
    problems = lease_problems(plan)
    try:
        missing = plan.unmeasured_sources(plan.stage_sources())
    except (ValueError, subprocess.TimeoutExpired) as e:
        missing = [f"? ({e})"]
    if missing:
        problems.append(f"build: {plan.BUILD_RECORD} does not time {', '.join(missing)}: its limit does not know them; "
                        f"run python .ci/gpu.py --time-build {plan.LEASE_ARCH} --json {plan.BUILD_RECORD}")
    for problem in problems:
        print(f"FAIL  {problem}")
    ok = not problems
    # each check starts a Python (a script's --help, pytest's collection): side by side, one a core
    checked = {p.name: p for name in names or list(plan.SELECTIONS) for p in plan.resolve([name], every)[0]}
    checked |= {} if names else {n: every[n] for n in by_name(plan, every)}  # a part in several selections: once
    with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
        list(pool.map(lambda p: _prefetch(plan, p), checked.values()))
    for name in names or list(plan.SELECTIONS):
        selected, deadline = plan.resolve([name], every)
        print(f"{name}: {len(selected)} parts, {budget(plan, selected, deadline)}")
        problems = plan_problems(plan, selected, deadline)
        for p in selected:
            try:
                mine = command_problems(plan, p)
            except (SyntaxError, ValueError, subprocess.TimeoutExpired) as e:
                mine = [f"{p.name}: {e}"]
            skip = p.unless() if p.unless else None
            if skip and mine:  # what it waits for is not there yet: it will skip, saying why
                skip, mine = f"{skip} (its command cannot run yet: {mine[0]})", []
            print(f"  {'FAIL' if mine else 'ok  '}  {p.name:<15} {p.limit_s:4d} s{' tail' if p.tail else '     '}  "
                  f"{p.text()}"
                  + (f"\n        would skip: {skip}" if skip else ""))
            problems += mine
        for problem in problems:
            print(f"  FAIL  {problem}")
        ok = ok and not problems
    if not names:  # the parts that run by name, each with what it needs, as the first call of a lease
        print(f"run by name ({plan.DEADLINE_S} s each, with the parts they need):")
        for name in by_name(plan, every):
            selected, deadline = plan.resolve([name], every)
            problems = plan_problems(plan, selected, deadline)
            try:
                problems += command_problems(plan, every[name])
            except (SyntaxError, ValueError, subprocess.TimeoutExpired) as e:
                problems.append(f"{name}: {e}")
            skip = every[name].unless() if every[name].unless else None
            if skip and problems:
                skip, problems = f"{skip} (its command cannot run yet: {problems[0]})", []
            print(f"  {'FAIL' if problems else 'ok  '}  {name:<15} {sum(p.limit_s for p in selected):4d} s  "
                  f"{' '.join(p.name for p in selected)}" + (f"\n        would skip: {skip}" if skip else ""))
            for problem in problems:
                print(f"  FAIL  {problem}")
            ok = ok and not problems
    print("dry run: every part checked" if ok else "dry run: FAILED")
    return ok


def calls(plan: ModuleType) -> dict[str, str]:
    """What each selection is, for --list."""
    return {"lease": "the first call", "second": f"the second call, only if the first ends early: {plan.LEASE_S} s of "
            f"lease - {plan.START_S} s to start - {plan.FIRST_CALL_S} s of first call"}


def by_name(plan: ModuleType, every: dict) -> list[str]:
    """The parts that no selection holds: they run by name."""
    held = {n for s in plan.SELECTIONS.values() for n in s}
    held |= {every[n].stands_for for n in held}
    return [n for n in every if n not in held]


def budget(plan: ModuleType, selected: list, deadline_s: int) -> str:
    """One line: the limits that must fit, the tail the deadline cuts, the slack against the grace."""
    held = sum(p.limit_s for p in selected if not p.tail)
    tail = sum(p.limit_s for p in selected if p.tail)
    cut = f"; a tail of {tail} s of limits that the deadline cuts" if tail else ""
    return (f"limits {held} s of its {deadline_s} s deadline ({deadline_s / 60:g} minutes), {deadline_s - held} s of "
            f"slack against {plan.GRACE_S} s of grace{cut}")


def listing(plan: ModuleType, names: list[str], every: dict) -> str:
    """--list: each selection (or the parts named) with its parts, limits and commands; with no
    names, also the parts that no selection holds, which run by name."""
    lines = []
    for name in names or list(plan.SELECTIONS):
        chosen, limit = plan.resolve([name], every)
        call = f" ({calls(plan)[name]})" if name in calls(plan) else ""
        lines.append(f"{name}: {budget(plan, chosen, limit)}{call}")
        for p in chosen:
            lines.append(f"  {p.name:<15} {p.limit_s:4d} s{' tail' if p.tail else '     '}  {p.text()}\n"
                         f"  {'':<15}              {p.why}")
    if not names:
        lines.append(f"run by name, with the parts they need (the first call of a lease, {plan.DEADLINE_S} s):")
        for n in by_name(plan, every):
            lines.append(f"  {n:<15} {every[n].limit_s:4d} s  {every[n].why}")
        each = " + ".join(f"{plan.DEADLINES[s]} s {s}" for s in plan.SELECTIONS)
        total = plan.START_S + sum(plan.DEADLINES.values())
        lines.append(f"a lease: {plan.START_S} s to start (assumed) + {each} = {total} s of its {plan.LEASE_S} s")
    return "\n".join(lines)
