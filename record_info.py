"""What every record and figure says about how it was made: the machine and device it was
measured on (``describe_device``, ``describe_machine``, ``describe_gpu``), when and by which
command (``provenance``, ``command_line``: docs/records.py runs it again), a timing record's
first fields (``record_header``), the line under its tables (``footer``), and figures saved with
their command in the file (``save_figure``; ``pyplot`` without a display); and for the chapters'
number markers, a committed record read once (``committed``), a source's literal constants read
without running it (``source_constants``) or found by a pattern (``source_match``), and counts
written as the pages write them (``sci``, ``in_words``)."""

from __future__ import annotations

import ast
import datetime
import functools
import json
import os
import platform
import re
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

import cli
import timing

RESULTS = cli.ROOT / "docs" / "results"
SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


@functools.cache
def committed(name: str) -> dict:
    """The committed record docs/results/NAME, read once per process."""
    return json.loads((RESULTS / name).read_text())


@functools.cache
def source_constants(path: str) -> dict[str, object]:
    """The module-level literal constants of the Python file ``path`` (from the repository's root),
    read without running it: ``RTOL, ATOL = 1e-4, 1e-5`` gives both; a value that is not a literal
    (an expression of torch's) is left out."""
    found = {}
    for node in ast.parse((cli.ROOT / path).read_text()).body:
        if not isinstance(node, ast.Assign) or len(node.targets) != 1:
            continue
        target, value = node.targets[0], node.value
        pairs = (list(zip(target.elts, value.elts)) if isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple)
                 else [(target, value)])
        for name, literal in pairs:
            if isinstance(name, ast.Name):
                try:
                    found[name.id] = ast.literal_eval(literal)
                except ValueError:
                    pass
    return found


def source_match(path: str, pattern: str) -> str:
    """The first group of ``pattern`` (a multi-line regular expression) in the file ``path``
    (from the repository's root): a constant written in C++, a pin in requirements.txt."""
    m = re.search(pattern, (cli.ROOT / path).read_text(), re.M)
    if m is None:
        raise ValueError(f"{path} has no match for {pattern!r}")
    return m[1]


def in_words(n: int) -> str:
    """A small count as the prose writes it: 2 -> "two"."""
    return ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"][n]


def sci(x: float, digits: int = 2) -> str:
    """4.295e9 -> "4.3·10⁹" (``digits`` significant figures), as the chapters write counts."""
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}·10{str(int(exponent)).translate(SUPERSCRIPT)}"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def describe_device(device: str) -> str:
    if device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu: " + cpu_model()


def describe_machine() -> dict:
    """What every record says about the machine it was taken on, whatever the device: the host's
    CPU model, its logical CPU count and the operating system's kernel (scheduling, page faults
    and the cost of waking a thread all depend on it)."""
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "os_kernel": f"{platform.system()} {platform.release()}"}


def describe_gpu() -> dict:
    """What a GPU record says about the card and its software: name, SM count, memory, the
    clocks and driver as nvidia-smi reads them at that moment, torch, its CUDA and nvcc."""
    import shutil
    import subprocess

    p = torch.cuda.get_device_properties(0)
    env: dict = {"device": p.name, "sm_count": p.multi_processor_count,
                 "compute_capability": f"{p.major}.{p.minor}", "memory_gib": round(p.total_memory / 2**30, 1),
                 "l2_mib": round(p.L2_cache_size / 2**20, 1), "torch": torch.__version__, "cuda": torch.version.cuda,
                 "tf32_matmul": torch.backends.cuda.matmul.allow_tf32}
    query = "driver_version,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,power.draw,temperature.gpu,pstate"
    smi = shutil.which("nvidia-smi")
    if smi:
        got = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True)
        values = got.stdout.strip().splitlines()[0].split(", ") if got.returncode == 0 and got.stdout.strip() else []
        env["nvidia_smi"] = dict(zip(query.split(","), values)) if values else got.stderr.strip()[-200:]
    nvcc = shutil.which("nvcc")
    if nvcc:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout
        env["nvcc"] = (re.findall(r"release [\d.]+, V[\d.]+", version) or ["?"])[0]
    return env


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as typed from the repository root: ``python script.py ARGS`` or, for a module
    run with -m, ``python -m package.module ARGS`` (``argv`` given: always a script). Records
    keep it so that it can be run again (docs/records.py reads it back with shlex.split)."""
    import shlex

    # This process's own command: a module run with -m has a __spec__ on __main__, a script none.
    spec = getattr(sys.modules.get("__main__"), "__spec__", None) if argv is None else None
    argv = list(sys.argv if argv is None else argv)
    if spec is not None and spec.name not in (None, "__main__"):
        head = ["python", "-m", spec.name.removesuffix(".__main__")]
    else:
        script = Path(argv[0]).resolve() if argv and argv[0] else None
        root = Path(__file__).resolve().parent
        head = ["python", script.relative_to(root).as_posix() if script and script.is_relative_to(root)
                else (argv[0] if argv else "?")]
    return shlex.join([*head, *argv[1:]]) if argv[1:] else " ".join(head)


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    """fig.savefig, with the command that drew it in the file (PNG text chunk "Command", SVG
    description): docs/render.py lists every picture with it, and docs/records.py redraws it."""
    key = "Description" if Path(path).suffix.lower() == ".svg" else "Command"
    fig.savefig(path, dpi=dpi, metadata={key: command_line()} if Path(path).suffix.lower() in (".png", ".svg")
                else None)



def provenance() -> dict:
    """When a record was taken and the command that takes it again (docs/records.py runs it)."""
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command_line()}


def record_header(device: str, dtype: torch.dtype) -> dict:
    """The fields every timing record of a single process starts with: what was measured on,
    under which conditions (threads, the CPUs pinned, the allocator), when, and the command;
    on a GPU also the card and its software (describe_gpu)."""
    return {
        "device": describe_device(device),
        **describe_machine(),
        "malloc": timing.MALLOC,  # set_malloc's choice at the time of writing
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "dtype": str(dtype).removeprefix("torch."),
        **provenance(),
        **({"gpu": describe_gpu()} if device.startswith("cuda") and torch.cuda.is_available() else {}),
    }


def footer(record: dict, *details: str, tools: Sequence[str] = (), card: bool = False, sep: str = ", ",
           day: bool = False) -> str:
    """The line under every record's table: where it was measured, with what, ``details`` (the
    shape, the rounds...), when, and the command that wrote it, to run it again.

    A CPU record names its OS kernel, allocator and threads, which move CPU timings; a GPU
    record does not, and with card=True names the card's SMs, clock and driver (its "gpu"
    description) instead. ``tools`` follow torch (e.g. "Triton 3.6.0"); ``sep`` goes before the
    date; day=True shows the day without the time. A key the record lacks raises KeyError
    (docs/render.py turns it into one line); "torch" and "dtype" are optional."""
    cpu = record["device"].startswith("cpu")
    where = record["device"] + (conditions(record) if cpu else "")
    if card:
        g = record.get("gpu", {})
        smi = g.get("nvidia_smi") if isinstance(g.get("nvidia_smi"), dict) else {}
        where += (f" ({g.get('sm_count', '?')} SMs, max SM clock {smi.get('clocks.max.sm', '?')}, "
                  f"driver {smi.get('driver_version', '?')})")
    parts = [where, *([f"torch {record['torch']}"] if "torch" in record else []), *tools,
             *([f"{record['threads']} threads"] if cpu and "threads" in record else []),
             *([record["dtype"]] if "dtype" in record else []), *details]
    date = record.get("date", "")
    return ", ".join(parts) + f"{sep}{date[:10] if day else date}: `{record['command']}`"



def conditions(record: dict) -> str:
    """The operating system's kernel and the allocator of a record, for a table's footer ("" where
    not recorded). ("kernel" in a benchmark record is the GEMM version of the cuda and ptx modes.)"""
    parts = [record[k] for k in ("os_kernel",) if record.get(k)]
    if record.get("malloc"):
        parts.append("malloc " + record["malloc"].split(" ")[0])
    return "".join(", " + p for p in parts)


def pyplot():
    """matplotlib.pyplot without a display; matplotlib is an optional extra (cli.need_matplotlib
    checks it before the work starts)."""
    cli.need_matplotlib()
    import matplotlib.pyplot as plt

    return plt

