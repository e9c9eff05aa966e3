"""The structure of parallel/: every import of every module (module level or inside a function),
read with ast, without importing anything.

- no cycle among the modules;
- no chapter imports a later one (dp, chapter 7, before collectives, chapter 7 continued,
  before tp, chapter 8), and common/ imports no chapter;
- no module imports another folder's private names (``from x import _name``, or ``x._name``
  on an imported module): what two folders share is public and lives in common/.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from conftest import ROOT

# The order the folders may import each other in: each only from itself and those before it.
ORDER = {"common": 0, "dp": 1, "collectives": 2, "tp": 3}


def modules(package: Path) -> dict[str, Path]:
    """Dotted name -> file, for every module of ``package`` (a folder holding __init__.py)."""
    base = package.parent
    found = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The known module ``name`` is, or lies in (``a.b.c`` where only ``a.b`` is a module)."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> list[tuple[str, str | None, int]]:
    """(imported module, the name taken from it or None, line) for every import of a known
    module in ``path``; ``module._name`` on an imported module counts as taking ``_name``."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    found.append((target, None, node.lineno))
                    if alias.asname:
                        aliases[alias.asname] = target
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level − 1 packages
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:  # a submodule: from parallel.dp import ring
                    found.append((full, None, node.lineno))
                    aliases[alias.asname or alias.name] = full
                elif (target := _resolve(base, known)) is not None:
                    found.append((target, alias.name, node.lineno))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and node.attr.startswith("_") and not node.attr.startswith("__")):
            found.append((aliases[node.value.id], node.attr, node.lineno))
    return found


def folder(module: str) -> str | None:
    """The folder of parallel/ a module belongs to (None: the package's own __init__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def problems(package: Path) -> list[str]:
    """Every cycle, import of a later chapter and private name taken across folders."""
    known = modules(package)
    graph: dict[str, set[str]] = {m: set() for m in known}
    found = []
    for module, path in known.items():
        mine = folder(module)
        for target, name, line in imports(module, path, known):
            where = f"{path.relative_to(package.parent)}:{line}"
            if target != module:
                graph[module].add(target)
            theirs = folder(target)
            if mine is None:
                continue  # the package's face (parallel/__init__.py) may name every chapter
            if theirs is None:
                found.append(f"{where}: {module} imports the package root {target} (it imports every chapter)")
            elif ORDER.get(theirs, 99) > ORDER.get(mine, 99):
                found.append(f"{where}: {module} ({mine}) imports {target} ({theirs}), a later chapter")
            if name and name.startswith("_") and not name.startswith("__") and theirs != mine:
                found.append(f"{where}: {module} takes the private {target}.{name} from another folder")
    found += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(graph)]
    return list(dict.fromkeys(found))  # an import of several names is one problem, said once


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected component of more than one module (or a
    module importing itself), found by depth-first search."""
    state, stack, out = {}, [], []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == "open":
                out.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return out


def test_parallel_has_no_cycle_no_import_of_a_later_chapter_and_no_private_name_across_folders():
    assert problems(ROOT / "parallel") == []


def test_every_folder_is_in_the_order():
    folders = {p.name for p in (ROOT / "parallel").iterdir() if (p / "__init__.py").is_file()}
    assert folders == set(ORDER)


def test_the_check_finds_each_kind_of_problem(tmp_path):
    """The checker on a small package with one of each mistake (and the patterns that are allowed)."""
    pkg = tmp_path / "parallel"
    files = {
        "__init__.py": "from parallel.dp import ring\n",  # the package's face may import a chapter
        "common/__init__.py": "",
        "common/p2p.py": "def peers(): ...\ndef _hidden(): ...\n",
        "common/loop.py": "def run():\n    from parallel.dp import trainer\n",  # common -> a chapter, lazily
        "dp/__init__.py": "",
        "dp/ring.py": "from parallel.common.p2p import peers\nfrom .trainer import go\n",
        "dp/trainer.py": "from parallel.collectives.zero import ZeRO\nfrom parallel.dp.ring import x\n",
        "collectives/__init__.py": "",
        "collectives/zero.py": "from parallel.common.p2p import _hidden\n",
        "collectives/bench.py": "from parallel.dp import ring\nring._late\n",
        "tp/__init__.py": "",
        "tp/layers.py": "import parallel.common.p2p as p2p\np2p._hidden()\nfrom parallel import RingError\n",
    }
    for name, text in files.items():
        (pkg / name).parent.mkdir(parents=True, exist_ok=True)
        (pkg / name).write_text(text)
    found = "\n".join(problems(pkg))
    assert "parallel.common.loop (common) imports parallel.dp.trainer (dp), a later chapter" in found
    assert "parallel.dp.trainer (dp) imports parallel.collectives.zero (collectives), a later chapter" in found
    assert "parallel.collectives.zero takes the private parallel.common.p2p._hidden" in found
    assert "parallel.collectives.bench takes the private parallel.dp.ring._late" in found
    assert "parallel.tp.layers takes the private parallel.common.p2p._hidden" in found
    assert "parallel.tp.layers imports the package root parallel" in found
    assert "import cycle: parallel.dp.ring -> parallel.dp.trainer -> parallel.dp.ring" in found
    assert "parallel/__init__.py" not in found and "parallel/dp/ring.py" not in found  # both allowed
    assert len(problems(pkg)) == 7


# ---------------------------------------------------------------------------
# The one interface: what the training loop asks of a strategy
# ---------------------------------------------------------------------------

def test_every_chapters_strategy_is_what_the_loop_asks_for():
    from parallel.collectives.zero import ZeRO
    from parallel.common.training import Config, Strategy
    from parallel.dp.trainer import DataParallel
    from parallel.tp.training import TensorParallel

    for how in (DataParallel(Config()), ZeRO(Config()), TensorParallel(Config(tp=1))):  # one process, no group
        assert isinstance(how, Strategy), type(how).__name__
        assert (how.rank, how.size) == (0, 1)


def test_the_buckets_go_by_the_all_reduce_they_are_given():
    import torch

    from parallel.dp.reducer import GradReducer

    calls = []

    def counted(t: torch.Tensor, group=None, check: bool = True) -> torch.Tensor:
        calls.append((t.numel(), check))
        return t.mul_(2)  # not a sum: shows that what it returned is what the gradients hold

    model = torch.nn.Linear(3, 2)
    reducer = GradReducer(list(model.parameters()), bucket_bytes=1 << 20, all_reduce=counted)
    model(torch.ones(4, 3)).sum().backward()
    reducer.finish()
    reducer.close()
    assert calls == [(8, True), (8, False)]  # the agreement at construction, then the one bucket
    assert torch.equal(model.bias.grad, torch.full((2,), 8.0))  # 4 rows, doubled


def test_distributed_py_reduces_the_buckets_by_the_all_reduce_that_picks_by_size():
    import distributed
    from parallel.collectives import algorithms
    from parallel.common.training import Config
    from parallel.dp.ring import ring_all_reduce
    from parallel.dp.trainer import DataParallel

    assert distributed.make_strategy(Config(world_size=1)).all_reduce is algorithms.all_reduce
    assert DataParallel(Config()).all_reduce is ring_all_reduce  # chapter 7 alone: its ring


def test_chapter_7s_train_is_plain_data_parallelism_and_says_so():
    from parallel.common.training import Config
    from parallel.dp.trainer import train

    for change in ({"zero": True}, {"tp": 2}):
        with pytest.raises(ValueError, match="plain data parallelism.*distributed.train"):
            train(Config(world_size=1, **change))
