"""Write the measured tables into the Markdown chapters, from the JSON the scripts wrote.

A chapter marks where a table goes:

    <!-- table: docs/results/cpu_1024.json -->
    ...generated, do not edit...
    <!-- end table -->

Kinds: table (benchmark.py), roofline (benchmark.py --roofline), sweep (benchmark.py --sweep),
run (distributed.py), allreduce, burst and step (distributed.py --bench), gpu_gemm, gpu_goals,
gpu_ptx and ncu (cuda/bench_gpu.py), triton_gpu (tiles/bench_gpu.py). Each record names the
command that wrote it. One more kind takes a folder, not a file:

    <!-- records: docs/results -->

lists every record there with its command, where it was taken and the chapters that show it
(docs/records.py: the same commands, run again).

Examples:
  python docs/render.py            # rewrite every table
  python docs/render.py --check    # exit 1 if a table is out of date (CI runs this)
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

MARK = re.compile(r"(<!-- (\w+): (\S+) -->\n)(.*?)(<!-- end \2 -->)", re.S)


def renderers() -> dict[str, Callable[[dict], str]]:
    """Marker kind -> function from a JSON record to Markdown. Stages add their own."""
    import benchmark
    import parallel

    return {"table": benchmark.table, "roofline": benchmark.roofline_table, "sweep": benchmark.sweep_table,
            **parallel.renderers(),
            "static": _script("cuda/static_report.py").table, "sass": _script("ptx/sass_report.py").table,
            "cpp_overhead": _script("cpp/overhead.py").render,
            "sweep_summary": benchmark.sweep_summary,
            "triton_static": _script("tiles/compiler_report.py").table,
            "gpu_gemm": _script("cuda/bench_gpu.py").gemm_table, "gpu_goals": _script("cuda/bench_gpu.py").goals_table,
            "gpu_ptx": _script("cuda/bench_gpu.py").ptx_table, "ncu": _script("cuda/bench_gpu.py").ncu_table,
            "triton_gpu": _script("tiles/bench_gpu.py").table}


def _script(path: str):
    """A script outside any package (cuda/, ptx/), loaded by file for its table function."""
    import importlib.util

    name = "render_" + path.removesuffix(".py").replace("/", "_")  # cuda/bench_gpu.py and tiles/bench_gpu.py
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look it up there
    spec.loader.exec_module(module)
    return module


def render(text: str) -> str:
    kinds = renderers()

    def fill(m: re.Match) -> str:
        head, kind, path = m.group(1), m.group(2), m.group(3)
        if kind == "records":  # a folder of records, listed from their own commands
            return head + _script("docs/records.py").table(ROOT / path) + "\n" + m.group(5)
        if kind not in kinds:
            raise SystemExit(f"unknown table kind {kind!r} in marker {head.strip()}")
        source = ROOT / path
        if not source.exists():
            raise SystemExit(f"{path} is named by a marker but does not exist; run the command that writes it")
        try:
            table = kinds[kind](json.loads(source.read_text()))
        except (KeyError, ValueError, TypeError) as e:  # a record of another kind, or without that part
            raise SystemExit(f"{path} cannot be shown as {kind!r} (marker {head.strip()}): {e!r}") from None
        return head + table + "\n" + m.group(5)

    return MARK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale")
    args = parser.parse_args(argv)
    stale = []
    for md in sorted(ROOT.glob("**/*.md")):  # the READMEs and the chapters beside them
        parts = md.relative_to(ROOT).parts
        if "build" in parts or any(p.startswith(".") for p in parts):  # build output, .venv-ci, .git
            continue
        old = md.read_text()
        new = render(old)
        if new != old:
            stale.append(md.relative_to(ROOT))
            if not args.check:
                md.write_text(new)
    for path in stale:
        print(f"{'stale' if args.check else 'updated'}: {path}")
    return 1 if (args.check and stale) else 0


if __name__ == "__main__":
    cli.run(main)
