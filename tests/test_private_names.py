"""No module of the repository reaches for another's private names: ``x._name`` on a module it
imported (``import x``, ``from parallel.dp import ring``) or loaded (``x = cli.load_file(path)``),
or ``from x import _name``. What two files share is public. Read with ast, importing nothing;
tests are left out (they may look inside what they test)."""

from __future__ import annotations

import ast
import subprocess

import pytest

from conftest import ROOT


def _sources() -> list[str]:
    listed = subprocess.run(["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout")
    return [p for p in listed.stdout.splitlines() if not p.startswith("tests/")]


def _module_file(dotted: str) -> str | None:
    """The repository file a dotted module name is (``parallel.dp.ring``, ``cli``), if any."""
    path = dotted.replace(".", "/")
    for candidate in (f"{path}.py", f"{path}/__init__.py"):
        if (ROOT / candidate).is_file():
            return candidate
    return None


def private_uses(path: str, source: str) -> list[str]:
    """Each private name ``path`` takes from another of the repository's modules."""
    tree = ast.parse(source, path)
    bound: dict[str, str] = {}  # local name -> the file of the module it names
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _module_file(alias.name)
                if target:
                    bound[alias.asname or alias.name.partition(".")[0]] = target if alias.asname else \
                        _module_file(alias.name.partition(".")[0]) or target
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = _module_file(f"{node.module}.{alias.name}")
                if sub:
                    bound[alias.asname or alias.name] = sub
                elif _module_file(node.module) and alias.name.startswith("_") and not alias.name.startswith("__"):
                    found.append(f"{path}:{node.lineno}: from {node.module} import {alias.name}")
        elif (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
              and isinstance(node.value, ast.Call) and node.value.args
              and isinstance(node.value.args[0], ast.Constant) and isinstance(node.value.args[0].value, str)
              and getattr(node.value.func, "attr", getattr(node.value.func, "id", None)) == "load_file"):
            bound[node.targets[0].id] = node.value.args[0].value
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound
                and bound[node.value.id] != path and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append(f"{path}:{node.lineno}: {node.value.id}.{node.attr} ({bound[node.value.id]})")
    return found


def test_no_module_takes_another_modules_private_names():
    found = [use for path in _sources() for use in private_uses(path, (ROOT / path).read_text())]
    assert found == []


@pytest.mark.parametrize("source, says", [
    ("import modes\nmodes._jit_build()\n", "modes._jit_build (modes.py)"),
    ("from parallel.collectives import algorithms\nalgorithms._plan(None)\n", "algorithms._plan"),
    ("import cli\nstatic = cli.load_file('cuda/static_report.py')\nstatic._x\n", "static._x (cuda/static_report.py)"),
    ("from parallel.dp.ring import _pieces\n", "from parallel.dp.ring import _pieces"),
])
def test_a_planted_private_use_is_found(source, says):
    found = private_uses("somewhere.py", source)
    assert len(found) == 1 and says in found[0], found


def test_a_module_may_use_its_own_private_names_and_other_libraries():
    assert private_uses("modes.py", "import modes\nimport torch\nmodes._jit_build()\ntorch._C\n") == []
