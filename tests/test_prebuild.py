"""conftest's background prebuild starts only the builds the selected tests need."""

from __future__ import annotations

from types import SimpleNamespace

from conftest import ROOT, prebuild_steps


def item(module: str, **params):
    """A collected test as prebuild_steps sees it: its module's path and its parameters."""
    return SimpleNamespace(path=ROOT / "tests" / module, callspec=SimpleNamespace(params=params) if params else None)


def test_chapter_1_selection_starts_no_build():
    """`-k py-cpu` over test_dense.py and test_edge_cases.py (chapter 1's "run it" line): every
    test runs the py stage, which needs nothing built, though both modules name the cpp stage."""
    items = [item("test_dense.py", mode="py", device="cpu"), item("test_edge_cases.py", mode="py", device="cpu")]
    assert prebuild_steps(items) == []


def test_a_stage_parameter_asks_for_that_stage_alone():
    items = [item("test_dense.py", mode="py", device="cpu"), item("test_edge_cases.py", mode="cpp", device="cpu")]
    assert prebuild_steps(items) == ["cpp"]


def test_a_test_without_a_stage_asks_for_what_its_module_names():
    assert prebuild_steps([item("test_py.py"), item("test_dense.py", mode="py")]) == []
    assert prebuild_steps([item("test_py.py"), item("test_cpp.py")]) == ["cpp"]
    # test_hopper.py's "mode" is a swizzle mode, not a stage: its module's needs count.
    assert "emulation" in prebuild_steps([item("test_py.py"), item("test_hopper.py", mode="128B")])
    assert prebuild_steps([item("test_counters.py"), item("test_emulate.py")])[-2:] == ["emulation", "counters"]


def test_one_test_file_starts_no_build():
    """Its tests would wait for the build either way: nothing runs beside it."""
    assert prebuild_steps([item("test_cpp.py"), item("test_cpp.py", mode="cpp")]) == []
