"""Write the generated parts of the Markdown chapters: tables from JSON records, code from the source.

A chapter marks where a table goes:

    <!-- table: docs/results/cpu_1024.json -->
    ...generated, do not edit...
    <!-- end table -->

Kinds: table (benchmark.py), roofline (benchmark.py --roofline), sweep (benchmark.py --sweep),
run (distributed.py), allreduce, burst and step (distributed.py --bench), gpu_gemm, gpu_goals,
gpu_small, gpu_grad, gpu_bf16, gpu_ptx and ncu (cuda/bench_gpu.py's records, rendered by
cuda/gpu_tables.py), triton_gpu (tiles/bench_gpu.py).
Each record names the command that wrote it. A GPU record's name carries its card
(cuda_gpu_h100.json); a marker that
writes "{card}" in its place shows the newest record of that kind, whichever card took it, and
names it under the table:

    <!-- gpu_gemm: docs/results/cuda_gpu_{card}.json -->

Three kinds read no record:

    <!-- records: docs/results -->          every record there with its command, where it was
                                             taken and the chapters that show it (docs/records.py)
    <!-- code: py/dense.py#dense -->        an excerpt of the source, as a fenced block
    <!-- minutes: chapters -->              a table's last column: each row's linked chapter's
                                             "About N minutes to read"

An excerpt names a file (from the repository root) and, after '#', a region of it: lines between
`# region NAME` and `# endregion` (`// region NAME` and `// endregion` in C++, CUDA and PTX),
whole comment lines that change no code, or in Python a function or class by name
(`DenseFunction.backward`; a region of the same name wins). Marker lines inside an excerpt are
left out; the block's language follows the file's suffix.

A number in a sentence is marked where it stands, by name, and written from its record:

    v4 is only <!-- n cuda_v4_over_v3 -->11%<!-- /n --> faster than v3

The names and what each computes (from a record, or from a kernel's source) live beside the
chapter, in its page_numbers.py (PAGE_NUMBERS lists them); re-measuring and rendering rewrites
them, and --check flags a page whose numbers are stale.

--words counts each Markdown file's prose (words outside fenced code blocks and HTML comments)
against its budget.

Examples:
  python docs/render.py            # rewrite every generated part
  python docs/render.py --check    # exit 1 if anything is out of date (CI runs this)
  python docs/render.py --words    # prose words per Markdown file, against the budgets
"""

from __future__ import annotations

import ast
import json
import re
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import cli  # noqa: E402

MARK = re.compile(r"(<!-- (\w+): (\S+) -->\n)(.*?)(<!-- end \2 -->)", re.S)
NUMBER = re.compile(r"<!-- n (\w+) -->(.*?)<!-- /n -->", re.S)
# The modules whose NUMBERS (name -> function giving the text) the number markers name.
PAGE_NUMBERS = ["docs/page_numbers.py", "py/page_numbers.py", "cpp/page_numbers.py", "cuda/page_numbers.py",
                "ptx/page_numbers.py", "cuda/tensor_cores/page_numbers.py", "tiles/page_numbers.py",
                "parallel/page_numbers.py", "parallel/collectives/page_numbers.py"]
CARD = "{card}"  # in a marker's record name: any card's record of that kind, the newest shown (docs/records.py)

# The fenced block's language, by the source's suffix.
LANGUAGES = {".py": "python", ".cpp": "cpp", ".cc": "cpp", ".h": "cpp", ".hpp": "cpp", ".cu": "cuda",
             ".cuh": "cuda", ".ptx": "ptx", ".sh": "bash"}
# A region marker is a whole comment line; anything else on it would be code that a marker hides.
REGION = re.compile(r"^\s*(?:#|//)\s*(region|endregion)\b[ \t]*(\S*)[ \t]*$")

# Prose budgets in words (outside fenced code): every Markdown file together, and each chapter.
BUDGET_ALL = 34_000
BUDGET_CHAPTER = 5_000
BUDGET_EXCEPTIONS = {"parallel/collectives/README.md": 6_000, "cuda/README.md": 6_000,
                     "cuda/tensor_cores/README.md": 5_000}
CHAPTERS = ["py/README.md", "cpp/README.md", "tiles/README.md", "cuda/README.md", "cuda/tensor_cores/README.md",
            "ptx/README.md", "parallel/dp/README.md", "parallel/collectives/README.md", "parallel/tp/README.md"]
# A chapter states its reading time once, in this form (line breaks allowed between the words).
READING_TIME = re.compile(r"\bAbout\s+(\d+)\s+minutes\s+to\s+read\b")


def renderers() -> dict[str, Callable[[dict], str]]:
    """Marker kind -> function from a JSON record to Markdown. Stages add their own."""
    import benchmark
    import grad_errors
    import parallel

    static, gpu = cli.load_file("cuda/static_tables.py"), cli.load_file("cuda/gpu_tables.py")
    counters = cli.load_file("cuda/counters.py")
    return {"table": benchmark.table, "errors": grad_errors.error_table, "roofline": benchmark.roofline_table,
            "sweep": benchmark.sweep_table, "sweep_summary": benchmark.sweep_summary,
            **parallel.renderers(),
            "static": static.chapter_table, "tensor_static": static.tensor_core_table,
            "sass": cli.load_file("ptx/sass_report.py").table,
            "cpp_overhead": cli.load_file("cpp/overhead.py").render,
            "triton_static": cli.load_file("tiles/compiler_report.py").table,
            "gpu_gemm": gpu.gemm_table, "gpu_goals": gpu.goals_table, "gpu_ptx": gpu.ptx_table, "ncu": gpu.ncu_table,
            "gpu_small": gpu.small_table, "gpu_grad": gpu.grad_table, "gpu_bf16": gpu.bf16_table,
            "gpu_roof": gpu.roof_table, "gpu_tf32": gpu.tf32_table, "gpu_goals16": gpu.goals16_table,
            "counters": counters.chapter_table, "counters_tc": counters.tensor_core_table,
            "tf32_error": cli.load_file("cuda/tensor_cores/tf32_error.py").table,
            "triton_gpu": cli.load_file("tiles/bench_gpu.py").table}


def numbers() -> dict[str, Callable[[], str]]:
    """Number marker name -> function that writes it, from every module in PAGE_NUMBERS."""
    found: dict[str, Callable[[], str]] = {}
    for path in PAGE_NUMBERS:
        for name, fn in cli.load_file(path).NUMBERS.items():
            if name in found:
                raise cli.UserError(f"number {name!r} is named twice ({path} and another of {PAGE_NUMBERS})")
            found[name] = fn
    return found


def fill_numbers(text: str, known: dict[str, Callable[[], str]]) -> str:
    """The text with every number marker's value written afresh."""
    def fill(m: re.Match) -> str:
        name = m.group(1)
        if name not in known:
            raise cli.UserError(f"number marker {name!r} is defined in none of {', '.join(PAGE_NUMBERS)}")
        try:
            value = known[name]()
        except (OSError, KeyError, ValueError, TypeError, IndexError, ZeroDivisionError) as e:
            raise cli.UserError(f"number {name!r} cannot be computed: {e!r}") from None
        return f"<!-- n {name} -->{value}<!-- /n -->"
    return NUMBER.sub(fill, text)


# ---------------------------------------------------------------------------------------
# Code excerpts
# ---------------------------------------------------------------------------------------
def regions(lines: list[str], path: str) -> dict[str, tuple[int, int]]:
    """Region name -> (first, last) line index of its body, markers excluded. Regions may nest;
    `endregion` closes the innermost (and must repeat its name if it gives one)."""
    found: dict[str, tuple[int, int]] = {}
    open_: list[tuple[str, int]] = []
    for i, line in enumerate(lines):
        m = REGION.match(line)
        if not m:
            continue
        kind, name = m.groups()
        if kind == "region":
            if not name:
                raise cli.UserError(f"{path}:{i + 1}: a region needs a name")
            if name in found or any(name == n for n, _ in open_):
                raise cli.UserError(f"{path}:{i + 1}: region {name!r} is defined twice")
            open_.append((name, i))
        else:
            if not open_:
                raise cli.UserError(f"{path}:{i + 1}: endregion without a region")
            opened, start = open_.pop()
            if name and name != opened:
                raise cli.UserError(f"{path}:{i + 1}: endregion {name!r} closes region {opened!r}")
            found[opened] = (start + 1, i - 1)
    if open_:
        name, start = open_[-1]
        raise cli.UserError(f"{path}:{start + 1}: region {name!r} has no endregion")
    return found


def _python_definition(source: str, name: str) -> tuple[int, int] | None:
    """(first, last) line index of a function or class ``name`` (dotted: ``Class.method``),
    decorators included; None if there is none."""
    body = ast.parse(source).body
    node = None
    for part in name.split("."):
        node = next((n for n in body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        body = node.body
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return first - 1, node.end_lineno - 1


def excerpt(spec: str, root: Path = ROOT) -> str:
    """The fenced block for ``path#name``: the region (or Python definition) as it is in the file."""
    path, sep, name = spec.partition("#")
    if not sep or not name:
        raise cli.UserError(f"code marker {spec!r} names no region: write {path}#NAME")
    source = root / path
    if not source.is_file():
        raise cli.UserError(f"code marker {spec!r}: {path} does not exist")
    text = source.read_text()
    lines = text.splitlines()
    found = regions(lines, path)
    span = found.get(name)
    if span is None and source.suffix == ".py":
        try:
            span = _python_definition(text, name)
        except SyntaxError as e:
            raise cli.UserError(f"code marker {spec!r}: {path} does not parse: {e}") from None
    if span is None:
        what = "region or function" if source.suffix == ".py" else "region"
        known = ", ".join(sorted(found)) or "none"
        raise cli.UserError(f"code marker {spec!r}: {path} has no {what} {name!r} (its regions: {known})")
    body = [line.rstrip() for line in lines[span[0]:span[1] + 1] if not REGION.match(line)]
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    if not body:
        raise cli.UserError(f"code marker {spec!r}: region {name!r} of {path} is empty")
    code = textwrap.dedent("\n".join(body))
    fence = "```"
    while fence in code:
        fence += "`"
    return f"{fence}{LANGUAGES.get(source.suffix, '')}\n{code}\n{fence}"


# ---------------------------------------------------------------------------------------
# Reading times
# ---------------------------------------------------------------------------------------
def reading_minutes(chapter: Path) -> int:
    """The minutes a chapter says it takes to read: its one "About N minutes to read"."""
    if not chapter.is_file():
        raise cli.UserError(f"the minutes table links to {chapter}, which does not exist")
    found = READING_TIME.findall(chapter.read_text())
    if len(found) != 1:
        raise cli.UserError(f"{chapter} says 'About N minutes to read' {len(found)} times; a chapter states "
                            "its reading time once, in those words")
    return int(found[0])


def minutes_column(table: str, page: Path) -> str:
    """The table with each row's last cell set to the reading time of the chapter its first
    link names (a link relative to ``page``); the header and separator rows are kept."""
    rows = table.rstrip("\n").split("\n")
    out = []
    for row in rows:
        if not row.startswith("|") or re.match(r"^\|[-:| ]+\|$", row) or row is rows[0]:
            out.append(row)
            continue
        link = re.search(r"\]\(([^)#]+\.md)[^)]*\)", row)
        if link is None:
            raise cli.UserError(f"{page.name}: a row of the minutes table links to no chapter: {row[:60]}")
        minutes = reading_minutes((page.parent / link.group(1)).resolve())
        cells = row.rstrip().rstrip("|").split("|")
        out.append("|".join(cells[:-1]) + f"| {minutes} |")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------
def render(text: str, page: Path | None = None, root: Path = ROOT) -> str:
    """The page with every marked part generated afresh (``page``: where it lives, for links)."""
    page = page or root / "README.md"
    kinds: dict[str, Callable[[dict], str]] = {}

    def fill(m: re.Match) -> str:
        head, kind, path, old = m.group(1), m.group(2), m.group(3), m.group(4)
        if kind == "code":
            return head + excerpt(path, root) + "\n" + m.group(5)
        if kind == "minutes":
            return head + minutes_column(old, page) + "\n" + m.group(5)
        if kind == "records":  # a folder of records, listed from their own commands
            return head + cli.load_file("docs/records.py").table(root / path) + "\n" + m.group(5)
        if not kinds:
            kinds.update(renderers())  # imports torch: only for pages with a table
        if kind not in kinds:
            raise cli.UserError(f"unknown table kind {kind!r} in marker {head.strip()}")
        source, note = root / path, ""
        if CARD in source.name:  # a kind of record, one per card: the newest
            records = cli.load_file("docs/records.py")
            found = records.of_kind(source.name, source.parent)
            if not found:
                raise cli.UserError(f"no record of kind {path} (one per card, e.g. "
                                    f"{source.name.replace(CARD, 'h100')}); run the command that writes one")
            source = source.parent / found[0][0]
            shown = source.relative_to(root).as_posix() if source.is_relative_to(root) else str(source)
            note = f"\n\nThe newest record of its kind, on {records.device_of(found[0][1])}: `{shown}`."
        elif not source.exists():
            raise cli.UserError(f"{path} is named by a marker but does not exist; run the command that writes it")
        try:
            table = kinds[kind](json.loads(source.read_text()))
        except (KeyError, ValueError, TypeError) as e:  # a record of another kind, or without that part
            raise cli.UserError(f"{path} cannot be shown as {kind!r} (marker {head.strip()}): {e!r}") from None
        return head + table + note + "\n" + m.group(5)

    try:
        text = MARK.sub(fill, text)
        return fill_numbers(text, numbers()) if NUMBER.search(text) else text
    except cli.UserError as e:
        raise cli.UserError(f"{page.relative_to(root) if page.is_relative_to(root) else page}: {e}") from None


def pages(root: Path = ROOT) -> list[Path]:
    """The Markdown files: the READMEs and the chapters beside them, not build output or dot folders."""
    found = []
    for md in sorted(root.glob("**/*.md")):
        parts = md.relative_to(root).parts
        if "build" in parts or any(p.startswith(".") for p in parts):  # build output, .venv-ci, .git
            continue
        found.append(md)
    return found


def stale(root: Path = ROOT, write: bool = False) -> list[Path]:
    """The pages whose generated parts differ from what rendering makes now (rewritten if ``write``)."""
    out = []
    for md in pages(root):
        old = md.read_text()
        new = render(old, md, root)
        if new != old:
            out.append(md.relative_to(root))
            if write:
                md.write_text(new)
    return out


# ---------------------------------------------------------------------------------------
# Word budgets
# ---------------------------------------------------------------------------------------
FENCE = re.compile(r"^\s*(`{3,}|~{3,})")


def prose(text: str) -> str:
    """The text outside fenced code blocks (indented ones in lists too) and HTML comments."""
    kept, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None:
            if m:
                fence = m.group(1)
            else:
                kept.append(line)
        elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) and line.strip() == m.group(1):
            fence = None
    text = re.sub(r"<!-- (?:n \w+|/n) -->", "", "\n".join(kept))  # a number's markers split no word
    return re.sub(r"<!--.*?-->", " ", text, flags=re.S)


def prose_words(text: str) -> int:
    """Words as `wc -w` counts them, in the prose only."""
    return len(prose(text).split())


def budget(page: str) -> int | None:
    """A Markdown file's own budget in prose words (None: only the total binds it)."""
    return BUDGET_EXCEPTIONS.get(page, BUDGET_CHAPTER if page in CHAPTERS else None)


def word_report(root: Path = ROOT) -> tuple[list[str], list[str]]:
    """(lines of the report, the budgets exceeded)."""
    lines, over, total = [], [], 0
    for md in pages(root):
        name = md.relative_to(root).as_posix()
        words = prose_words(md.read_text())
        total += words
        limit = budget(name)
        lines.append(f"{words:7,d}  {name}" + (f"  (budget {limit:,})" if limit else ""))
        if limit and words > limit:
            over.append(f"{name}: {words:,} prose words, budget {limit:,}")
    lines.append(f"{total:7,d}  in all (budget {BUDGET_ALL:,})")
    if total > BUDGET_ALL:
        over.append(f"all Markdown: {total:,} prose words, budget {BUDGET_ALL:,}")
    return lines, over


def main(argv: list[str] | None = None) -> int:
    parser = cli.parser(__doc__)
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--check", action="store_true", help="change nothing; exit 1 if anything is stale")
    what.add_argument("--words", action="store_true", help="count prose words; exit 1 if over a budget")
    args = parser.parse_args(argv)
    if args.words:
        lines, over = word_report(ROOT)
        print("\n".join(lines))
        for line in over:
            print(f"over budget: {line}", file=sys.stderr)
        return 1 if over else 0
    found = stale(ROOT, write=not args.check)
    for path in found:
        print(f"{'stale' if args.check else 'updated'}: {path}")
    return 1 if (args.check and found) else 0


if __name__ == "__main__":
    cli.run(main)
