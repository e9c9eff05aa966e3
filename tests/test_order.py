"""The book's reading order: no page uses a term that only a later page teaches.

The convention, the same on every page: a term is *defined* where it first appears emphasised
(*italic*, as the pages set a new term; a **bold** lead-in counts too), in the sentence that says
what it is. TERMS says which page defines each term. The checks:

(a) on the defining page, the term's first use is its emphasised definition;
(b) no page earlier in the order uses the term at all;
(c) README.md's chapter table lists the pages in ORDER, and each page's heading has its number;
(d) a page's "You need" line names only earlier chapters, and a "[chapter N](page)" link opens
    chapter N's page.

What is read is a page's prose. Left out: fenced code blocks and the regions docs/render.py writes
between `<!-- name: ... -->` and `<!-- end ... -->` (code excerpts and tables of measured records,
whose labels are a record's terse column names); and, on the defining page only, the page's
opening list ("You will learn", above "You need") and its headings, which name what the text under
them is about to teach.
An earlier page's opening list counts as a use: it promises what the reader cannot yet know.
"""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The reading order: the chapters, then the measuring appendix.
ORDER = [
    "py/README.md",                     # 1
    "cpp/README.md",                    # 2
    "cuda/README.md",                   # 3
    "ptx/README.md",                    # 4
    "cuda/tensor_cores/README.md",      # 5
    "tiles/README.md",                  # 6
    "parallel/dp/README.md",            # 7
    "parallel/collectives/README.md",   # 7, continued
    "parallel/tp/README.md",            # 8
    "docs/README.md",                   # appendix: how the measurements are taken
]
CHAPTER_NUMBERS = ["1", "2", "3", "4", "5", "6", "7", "7, continued", "8"]

# term -> (its pattern in prose, the page that defines it)
TERMS: dict[str, tuple[str, str]] = {
    "GEMM": (r"\bGEMMs?\b", "py/README.md"),
    "SM": (r"\bSMs?\b", "cuda/README.md"),
    "warp": (r"(?i)\bwarps?\b", "cuda/README.md"),
    "shared memory bank": (r"(?i)\bbanks?\b", "cuda/README.md"),
    "bank conflict": (r"(?i)\bbank conflicts?\b", "cuda/README.md"),
    "wavefront": (r"(?i)\bwavefronts?\b", "cuda/README.md"),
    "coalescing": (r"(?i)\bcoalesc", "cuda/README.md"),
    "sector": (r"(?i)\bsectors?\b", "cuda/README.md"),
    "occupancy": (r"(?i)\boccupancy\b", "cuda/README.md"),
    "register spill": (r"(?i)\bspill", "cuda/README.md"),
    "roofline": (r"(?i)\broof(?:line)?s?\b", "cuda/README.md"),
    "split-K": (r"\bsplit[- ]K\b", "cuda/README.md"),
    "cp.async": (r"\bcp\.async", "cuda/README.md"),
    "SASS": (r"\bSASS\b", "cuda/README.md"),
    "PTX": (r"\bPTX\b", "cuda/README.md"),
    "FFMA": (r"\bFFMAs?\b", "cuda/README.md"),
    "issue slot": (r"(?i)\bissue slots?\b", "cuda/README.md"),
    "LDG": (r"\bLDG\b", "cuda/README.md"),
    "LDS": (r"\bLDS\b", "cuda/README.md"),
    "STS": (r"\bSTS\b", "cuda/README.md"),
    "LDGSTS": (r"\bLDGSTS\b", "cuda/README.md"),
    "epilogue": (r"(?i)\bepilogues?\b", "cuda/README.md"),
    "cuBLAS": (r"\bcuBLAS\b", "cuda/README.md"),
    "ncu": (r"\bncu\b", "cuda/README.md"),
    "L2": (r"\bL2\b", "cuda/README.md"),
    "tensor core": (r"(?i)\btensor[- ]cores?\b", "cuda/README.md"),
    "TF32": (r"\bTF32\b", "cuda/tensor_cores/README.md"),
    "mma.sync": (r"\bmma\.sync", "cuda/tensor_cores/README.md"),
    "fragment": (r"(?i)\bfragments?\b", "cuda/tensor_cores/README.md"),
    "ldmatrix": (r"\bldmatrix", "cuda/tensor_cores/README.md"),
    "LDSM": (r"\bLDSM\b", "cuda/tensor_cores/README.md"),
    "HMMA": (r"\bHMMA\b", "cuda/tensor_cores/README.md"),
    "swizzle": (r"(?i)\bswizzl", "cuda/tensor_cores/README.md"),
    "warpgroup": (r"(?i)\bwarpgroups?\b", "cuda/tensor_cores/README.md"),
    "wgmma": (r"\bwgmma", "cuda/tensor_cores/README.md"),
    "HGMMA": (r"\bHGMMA\b", "cuda/tensor_cores/README.md"),
    "TMA": (r"\bTMA\b", "cuda/tensor_cores/README.md"),
    "mbarrier": (r"(?i)\bmbarriers?\b", "cuda/tensor_cores/README.md"),
    "descriptor": (r"(?i)\bdescriptors?\b", "cuda/tensor_cores/README.md"),
    "ptxas": (r"\bptxas\b", "cuda/README.md"),
    "DMMA": (r"\bDMMA\b", "tiles/README.md"),
    "DFMA": (r"\bDFMA\b", "tiles/README.md"),
    "PTX ISA": (r"\bPTX ISA\b", "ptx/README.md"),
    "state space": (r"(?i)\bstate spaces?\b", "ptx/README.md"),
    "virtual register": (r"(?i)\bvirtual registers?\b", "ptx/README.md"),
    "predicate": (r"(?i)\bpredicat", "ptx/README.md"),
    "all-reduce": (r"(?i)\ball-reduces?\b", "parallel/dp/README.md"),
    "reduce-scatter": (r"(?i)\breduce-scatters?\b", "parallel/dp/README.md"),
    "all-gather": (r"(?i)\ball-gathers?\b", "parallel/dp/README.md"),
    "ZeRO": (r"\bZeRO\b", "parallel/dp/README.md"),
}

_RENDERED = re.compile(r"^<!-- (?!end\b)[\w-]+:.*?^<!-- end\b[^\n]*$", re.M | re.S)
_HEADING = re.compile(r"^#+ .*$", re.M)
_FENCED = re.compile(r"^```.*?^```[^\n]*$", re.M | re.S)
# Emphasis in Markdown ends within its paragraph: a span never crosses a blank line.
_EMPHASIS = re.compile(r"\*\*(?=\S)((?:(?!\n\n).)+?)\*\*"
                       r"|(?<![*\w])\*(?=[^\s*])((?:(?!\n\n).)+?)(?<=[^\s*])\*(?![*\w])", re.S)


def prose(page: str) -> tuple[str, str]:
    """(the whole page, the page without its opening list and headings), code blocks and rendered
    regions blanked (replaced by as many newlines, so that positions still give line numbers)."""
    text = (ROOT / page).read_text(encoding="utf-8")
    blank = lambda m: "\n" * m.group(0).count("\n")  # noqa: E731
    text = _FENCED.sub(blank, _RENDERED.sub(blank, text))
    cut = text.find("**You need**")
    cut = 0 if cut < 0 else cut
    rest = _HEADING.sub("", "\n" * text[:cut].count("\n") + text[cut:])
    return text, rest


def first_use(text: str, pattern: str) -> tuple[int, bool] | None:
    """(line number, whether it lies inside *emphasis*) of the pattern's first match, or None."""
    m = re.search(pattern, text)
    if m is None:
        return None
    emphasised = any(e.start() < m.start() < e.end() for e in _EMPHASIS.finditer(text))
    return text.count("\n", 0, m.start()) + 1, emphasised


def test_readme_table_is_the_order():
    """(c) README.md's chapter table lists the chapter pages in ORDER, numbered as ORDER says,
    and each page's heading carries the same number."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("<!-- minutes: chapters -->")[1].split("<!-- end minutes -->")[0]
    rows = re.findall(r"^\| ([^·|]+?) · \[[^\]]*\]\(([^)]+)\)", table, re.M)
    assert [p for _, p in rows] == ORDER[:-1]
    assert [n for n, _ in rows] == CHAPTER_NUMBERS
    for number, page in zip(CHAPTER_NUMBERS, ORDER):
        heading = (ROOT / page).read_text(encoding="utf-8").splitlines()[0]
        assert heading.startswith(f"# Chapter {number} — "), (page, heading)


def test_each_term_is_defined_before_its_first_use():
    """(a) and (b), for every term of TERMS."""
    problems = []
    for term, (pattern, home) in TERMS.items():
        assert home in ORDER, (term, home)
        for page in ORDER[:ORDER.index(home)]:
            use = first_use(prose(page)[0], pattern)
            if use:
                problems.append(f"{page}:{use[0]} uses {term!r}, which {home} defines")
        _, rest = prose(home)
        use = first_use(rest, pattern)
        if use is None or not use[1]:
            where = "never" if use is None else f"first at line {use[0]}, not emphasised"
            problems.append(f"{home} defines {term!r}: {where}")
    assert not problems, "\n".join(problems)


def test_the_check_can_tell():
    """The rule itself: a use before the emphasised definition is found, an emphasised first use
    passes, in italic or in bold."""
    assert first_use("a warp here\n*warp*: 32 threads", TERMS["warp"][0]) == (1, False)
    assert first_use("2 * warps * 3", TERMS["warp"][0]) == (1, False)
    assert first_use("A *warp* is 32 threads; warps", TERMS["warp"][0]) == (1, True)
    assert first_use("**Warps.** 32 threads", TERMS["warp"][0]) == (1, True)
    assert first_use("*a\n\nwarp b*", TERMS["warp"][0]) == (3, False)  # no emphasis across paragraphs
    assert first_use("no such thing", TERMS["warp"][0]) is None


def _number(page: str) -> str:
    return CHAPTER_NUMBERS[ORDER.index(page)]


def test_you_need_names_only_earlier_chapters():
    """A page's "You need" line asks only for chapters before it in ORDER."""
    rank: dict[str, int] = {}
    for i, n in enumerate(CHAPTER_NUMBERS):
        rank.setdefault(n.split(",")[0], i)  # "chapter 7" is its first part
    for page in ORDER[:-1]:
        text = (ROOT / page).read_text(encoding="utf-8")
        need = text[text.index("**You need**"):].split("\n\n")[0]
        for n in re.findall(r"\b[Cc]hapters? (\d)", need):
            assert rank[n] < ORDER.index(page), (page, f"needs chapter {n}")


def test_chapter_links_point_at_that_chapter():
    """Every Markdown link whose text is "chapter N" opens chapter N's page."""
    for md in sorted(ROOT.glob("**/*.md")):
        if ".venv" in md.parts or "node_modules" in md.parts:
            continue
        text = md.read_text(encoding="utf-8")
        for n, target in re.findall(r"\[[Cc]hapter (\d)\]\(([^)#]+)", text):
            page = (md.parent / target).resolve().relative_to(ROOT).as_posix()
            assert page in ORDER and _number(page) == n, (md.relative_to(ROOT).as_posix(), n, target)
