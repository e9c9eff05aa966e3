"""Write the measured tables into the Markdown chapters, from the JSON the scripts wrote.

A chapter marks where a table goes:

    <!-- table: docs/results/cpu_1024.json -->
    ...generated, do not edit...
    <!-- end table -->

Examples:
  python docs/render.py            # rewrite every table
  python docs/render.py --check    # exit 1 if a table is out of date (CI runs this)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MARK = re.compile(r"(<!-- (\w+): (\S+) -->\n)(.*?)(<!-- end \2 -->)", re.S)


def renderers() -> dict[str, Callable[[dict], str]]:
    """Marker kind -> function from a JSON record to Markdown. Stages add their own."""
    import benchmark
    from parallel import bench, trainer

    return {"table": benchmark.table, "roofline": benchmark.roofline_table, "run": trainer.table, **bench.RENDERERS}


def render(text: str) -> str:
    kinds = renderers()

    def fill(m: re.Match) -> str:
        head, kind, path = m.group(1), m.group(2), m.group(3)
        if kind not in kinds:
            raise SystemExit(f"unknown table kind {kind!r} in marker {head.strip()}")
        source = ROOT / path
        if not source.exists():
            raise SystemExit(f"{path} is named by a marker but does not exist; run the command that writes it")
        return head + kinds[kind](json.loads(source.read_text())) + "\n" + m.group(5)

    return MARK.sub(fill, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog=__doc__[__doc__.index("Examples:"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale")
    args = parser.parse_args(argv)
    stale = []
    for md in sorted([*ROOT.glob("**/README.md"), ROOT / "parallel" / "tensor_parallel.md"]):
        if "build" in md.relative_to(ROOT).parts:
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
    sys.exit(main())
