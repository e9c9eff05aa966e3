"""docs/render.py's generated parts that read no record: code excerpts from the source, and the
README's reading times from the chapters. Each test works in a folder of its own (tmp_path) as
the repository root, so it can change a source and watch the page go stale."""

from __future__ import annotations

import re
import textwrap

import pytest

import cli
from conftest import ROOT, load_script

render = load_script("docs/render.py")

SOURCE_PY = '''\
import torch


class Layer:
    """A layer."""

    @staticmethod
    def forward(x):
        # region core
        y = x * 2
        # endregion
        return y


def helper(a):
    return a + 1
'''

SOURCE_CPP = '''\
#include <cstdint>

// region loop
for (int64_t i = 0; i < n; ++i) {
  // region body
  y[i] = x[i] * 2;
  // endregion body
}
// endregion
'''


def page(spec: str, body: str = "stale\n") -> str:
    return f"Text before.\n\n<!-- code: {spec} -->\n{body}<!-- end code -->\n\nText after.\n"


@pytest.fixture
def repo(tmp_path):
    (tmp_path / "stage").mkdir()
    (tmp_path / "stage" / "dense.py").write_text(SOURCE_PY)
    (tmp_path / "stage" / "dense.cpp").write_text(SOURCE_CPP)
    return tmp_path


def test_a_python_method_is_shown_with_its_decorator_and_dedented(repo):
    block = render.excerpt("stage/dense.py#Layer.forward", repo)
    assert block == textwrap.dedent('''\
        ```python
        @staticmethod
        def forward(x):
            y = x * 2
            return y
        ```''')  # the region's marker lines inside the method are left out


def test_a_region_is_shown_in_the_files_language(repo):
    assert render.excerpt("stage/dense.py#core", repo) == "```python\ny = x * 2\n```"
    block = render.excerpt("stage/dense.cpp#loop", repo)
    assert block.startswith("```cpp\nfor (int64_t i = 0; i < n; ++i) {\n  y[i] = x[i] * 2;\n}")
    assert "region" not in block  # the nested region's markers do not show
    assert render.excerpt("stage/dense.cpp#body", repo) == "```cpp\ny[i] = x[i] * 2;\n```"


def test_the_page_shows_the_source_and_goes_stale_when_the_source_changes(repo):
    md = repo / "stage" / "README.md"
    md.write_text(page("stage/dense.py#helper"))
    assert render.stale(repo) == [md.relative_to(repo)]
    assert render.stale(repo, write=True) == [md.relative_to(repo)]
    assert "def helper(a):\n    return a + 1\n```\n<!-- end code -->\n\nText after." in md.read_text()
    assert md.read_text().startswith("Text before.\n\n<!-- code: stage/dense.py#helper -->\n```python\n")
    assert render.stale(repo) == []  # rendering again changes nothing
    (repo / "stage" / "dense.py").write_text(SOURCE_PY.replace("a + 1", "a + 2"))
    assert render.stale(repo) == [md.relative_to(repo)]  # the code drifted: --check would fail


def test_check_fails_on_drift_from_the_command_line(repo, monkeypatch, capsys):
    (repo / "README.md").write_text(page("stage/dense.py#helper"))
    monkeypatch.setattr(render, "ROOT", repo)
    assert render.main(["--check"]) == 1
    assert "stale: README.md" in capsys.readouterr().out
    assert render.main([]) == 0 and render.main(["--check"]) == 0


@pytest.mark.parametrize("spec, message", [
    ("stage/dense.py#nothing", ": stage/dense.py has no region or function 'nothing' (its regions: core)"),
    ("stage/dense.cpp#nothing", ": stage/dense.cpp has no region 'nothing' (its regions: body, loop)"),
    ("stage/missing.py#core", ": stage/missing.py does not exist"),
    ("stage/dense.py", " names no region: write stage/dense.py#NAME"),
])
def test_a_missing_region_is_one_clear_error(repo, spec, message):
    (repo / "README.md").write_text(page(spec))
    with pytest.raises(cli.UserError) as e:
        render.stale(repo)
    assert str(e.value) == f"README.md: code marker {spec!r}{message}"


@pytest.mark.parametrize("source, message", [
    ("# region a\nx = 1\n", "stage/bad.py:1: region 'a' has no endregion"),
    ("x = 1\n# endregion\n", "stage/bad.py:2: endregion without a region"),
    ("# region a\n# endregion\n# region a\n# endregion\n", "stage/bad.py:3: region 'a' is defined twice"),
    ("# region a\n# region b\n# endregion a\n# endregion\n", "stage/bad.py:3: endregion 'a' closes region 'b'"),
    ("# region\n# endregion\n", "stage/bad.py:1: a region needs a name"),
])
def test_malformed_regions_are_errors_that_name_the_line(repo, source, message):
    (repo / "stage" / "bad.py").write_text(source)
    with pytest.raises(cli.UserError, match=re.escape(message)):
        render.excerpt("stage/bad.py#a", repo)


def test_a_region_marker_is_a_whole_comment_line_only():
    assert render.REGION.match("    # region core") and render.REGION.match("\t// endregion")
    assert not render.REGION.match("x = 1  # region core")  # code on the line: not a marker
    assert not render.REGION.match("# regions of the tile")  # a comment that only starts alike


# ---------------------------------------------------------------------------------------
# Reading times: one source, the chapters
# ---------------------------------------------------------------------------------------
TABLE = """<!-- minutes: chapters -->
| chapter | minutes |
|---|---:|
| 1 · [one](one/README.md) | 99 |
| 2 · [two](two/README.md) | 99 |
<!-- end minutes -->
"""


def test_the_minutes_column_comes_from_each_chapters_own_line(tmp_path):
    for name, text in (("one", "**You need** nothing. About 10 minutes to read."),
                       ("two", "**You need** chapter 1. About 25\nminutes to read.")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "README.md").write_text(f"# {name}\n\n{text}\n")
    (tmp_path / "README.md").write_text(TABLE)
    assert render.stale(tmp_path, write=True) == [render.Path("README.md")]
    rows = "| 1 · [one](one/README.md) | 10 |\n| 2 · [two](two/README.md) | 25 |"
    assert rows in (tmp_path / "README.md").read_text()
    assert render.stale(tmp_path) == []
    (tmp_path / "two" / "README.md").write_text("# two\n\nAbout 30 minutes to read.\n")
    assert render.stale(tmp_path) == [render.Path("README.md")]  # the chapter moved: the table is stale
    (tmp_path / "two" / "README.md").write_text("# two\n\nAbout 30 minutes.\n")
    with pytest.raises(cli.UserError, match="says 'About N minutes to read' 0 times"):
        render.stale(tmp_path)


def test_every_chapter_states_its_reading_time_once_and_the_readme_shows_it():
    table = re.search(r"<!-- minutes: chapters -->\n(.*?)<!-- end minutes -->", (ROOT / "README.md").read_text(), re.S)
    assert table, "README.md's chapter table has no minutes marker"
    linked = re.findall(r"\]\(([\w/]+/README\.md)\)[^\n]*\| (\d+) \|\n", table.group(1))
    assert sorted(p for p, _ in linked) == sorted(render.CHAPTERS)
    for path, minutes in linked:
        assert render.reading_minutes(ROOT / path) == int(minutes), path


# ---------------------------------------------------------------------------------------
# A kind of record: one per card, the newest shown
# ---------------------------------------------------------------------------------------
@pytest.fixture
def cards(tmp_path, monkeypatch):
    """A repository whose docs/results/ holds one kind of GPU record taken on two cards."""
    import json

    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for card, device, date in (("h100", "NVIDIA H100 80GB HBM3", "2026-11-26T00:51:10+00:00"),
                               ("h200", "NVIDIA H200", "2026-11-27T08:00:00+00:00")):
        (results / f"demo_gpu_{card}.json").write_text(json.dumps({"device": device, "date": date, "value": card}))
    (results / "demo_gpu_a100.json").write_text(json.dumps({"device": "NVIDIA A100-SXM4-80GB", "value": "a100"}))
    table = {"demo": lambda record: f"| value |\n|---|\n| {record['value']} |"}
    monkeypatch.setattr(render, "renderers", lambda: table)
    return tmp_path


def test_a_kind_marker_shows_the_newest_record_of_its_kind_and_names_it(cards):
    text = render.render("<!-- demo: docs/results/demo_gpu_{card}.json -->\n<!-- end demo -->\n", root=cards)
    assert "| h200 |" in text  # the newest by its date, whichever card
    assert text.endswith("The newest record of its kind, on NVIDIA H200: `docs/results/demo_gpu_h200.json`.\n"
                         "<!-- end demo -->\n")
    literal = render.render("<!-- demo: docs/results/demo_gpu_h100.json -->\n<!-- end demo -->\n", root=cards)
    assert "| h100 |" in literal and "newest" not in literal  # a marker that names a file shows that file


def test_a_kind_marker_without_a_record_of_its_kind_is_one_clear_error(cards):
    with pytest.raises(cli.UserError, match=r"no record of kind docs/results/other_{card}\.json"):
        render.render("<!-- demo: docs/results/other_{card}.json -->\n<!-- end demo -->\n", root=cards)


# ---------------------------------------------------------------------------------------
# Numbers in sentences
# ---------------------------------------------------------------------------------------
def test_a_number_marker_is_written_from_its_function_and_goes_stale_when_the_value_changes(repo, monkeypatch):
    value = {"now": "11%"}
    monkeypatch.setattr(render, "numbers", lambda: {"gain": lambda: value["now"]})
    md = repo / "README.md"
    md.write_text("v4 is only <!-- n gain -->9%<!-- /n --> faster than v3.\n")
    assert render.stale(repo, write=True) == [md.relative_to(repo)]
    assert md.read_text() == "v4 is only <!-- n gain -->11%<!-- /n --> faster than v3.\n"
    assert render.stale(repo) == []
    value["now"] = "12%"  # re-measured: the page is stale until rendered
    assert render.stale(repo) == [md.relative_to(repo)]
    assert render.prose_words(md.read_text()) == 7  # the markers are no words
    assert render.prose_words("B=<!-- n b -->1<!-- /n -->, I=<!-- n i -->64<!-- /n -->-wide") == 2  # nor split one


@pytest.mark.parametrize("known, says", [
    ({}, "number marker 'gain' is defined in none of"),
    ({"gain": lambda: {}["missing"]}, "number 'gain' cannot be computed: KeyError('missing')"),
])
def test_a_number_marker_that_cannot_be_written_is_one_clear_error(repo, monkeypatch, known, says):
    monkeypatch.setattr(render, "numbers", lambda: known)
    (repo / "README.md").write_text("only <!-- n gain -->11%<!-- /n --> faster\n")
    with pytest.raises(cli.UserError, match=re.escape(says)):
        render.stale(repo)


def test_every_number_marker_on_the_pages_names_a_number_and_every_number_is_used():
    known = render.numbers()
    used = {name for md in render.pages() for name, _ in render.NUMBER.findall(md.read_text())}
    assert used <= set(known), sorted(used - set(known))
    assert set(known) <= used, f"defined but on no page: {sorted(set(known) - used)}"
