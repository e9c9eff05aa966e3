"""The chapters as text: prose within its word budgets, and what their exercises' answers claim
(the answers a reader checks by running something; the chapters' tables are docs/render.py's)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from conftest import REASONS, ROOT, load_script

render = load_script("docs/render.py")
needs_triton = pytest.mark.skipif(REASONS["triton"] is not None, reason=f"mode triton: {REASONS['triton']}")


# ---------------------------------------------------------------------------------------
# Word budgets: prose only
# ---------------------------------------------------------------------------------------
def test_prose_leaves_out_fenced_code_and_comments():
    text = textwrap.dedent("""\
        One two three.

        ```python
        not counted at all
        ```

        1. Four five:

           ~~~bash
           echo not counted
           ~~~
        <!-- code: a.py#b -->
        ````
        ```
        still code
        ````
        six
        """)
    assert render.prose_words(text) == 7  # One two three. 1. Four five: six
    assert render.prose_words("```\nan unclosed fence hides the rest\n") == 0


def test_every_chapter_and_all_markdown_keep_to_their_prose_budgets():
    lines, over = render.word_report(ROOT)
    assert not over, "\n".join(over + lines)
    chapters = {line.split()[1] for line in lines if "(budget" in line and "in all" not in line}
    assert chapters == set(render.CHAPTERS)  # every chapter has its own budget, and the report covers it
    assert render.budget("parallel/collectives/README.md") == 6_000 and render.budget("py/README.md") == 5_000
    assert render.budget("cuda/README.md") == 6_000 and render.budget("cuda/tensor_cores/README.md") == 5_000
    assert render.BUDGET_ALL == 34_000


# ---------------------------------------------------------------------------------------
# Chapter 6's exercises (tiles/README.md)
# ---------------------------------------------------------------------------------------
SPILLS = """
import json, os, subprocess, tempfile
from pathlib import Path
os.environ["TRITON_INTERPRET"] = "0"  # before kernels.py is loaded: @triton.jit compiles
import cli  # the working directory is the repository's root
report = cli.load_file("tiles/compiler_report.py")
kernels = report.compiled_kernels()
out = {{}}
for warps in (8, 4):
    config = {{**kernels.BACKWARD_CONFIG, "num_warps": warps}}
    c = report.compile_kernel(kernels, "grad_x_kernel", "f32", "ieee", config)
    folder = Path(tempfile.mkdtemp())
    (folder / "k.ptx").write_text(c.asm["ptx"])
    log = subprocess.run([report._ptxas(), "-v", f"--gpu-name=sm_{{report.ARCH}}a", str(folder / "k.ptx"),
                          "-o", str(folder / "k.cubin")], capture_output=True, text=True, check=True)
    usage = report.disasm.parse_ptxas(log.stdout + log.stderr)[c.metadata.name]
    out[warps] = {{"registers": usage["registers"], "spills": usage["spill_stores"] + usage["spill_loads"]}}
print(json.dumps(out))
"""


@needs_triton
@pytest.mark.slow
def test_grad_x_spills_at_4_warps_and_not_at_8():
    """Exercise 2's answer: BACKWARD_CONFIG's tile with 4 warps spills for sm_90; with its 8, not."""
    import triton

    if triton.__version__ != "3.6.0":
        pytest.skip(f"the exercise names Triton 3.6.0; this is {triton.__version__}")
    result = subprocess.run([sys.executable, "-c", SPILLS.format()], cwd=ROOT, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    usage = {int(k): v for k, v in json.loads(result.stdout.splitlines()[-1]).items()}
    assert usage[8]["spills"] == 0, usage
    assert usage[4]["spills"] > 0 and usage[4]["registers"] > usage[8]["registers"], usage


DOT = """
import importlib.util, os, sys
os.environ["TRITON_INTERPRET"] = "1"
import torch
spec = importlib.util.spec_from_file_location("kernels_under_test", sys.argv[1])
k = importlib.util.module_from_spec(spec)
spec.loader.exec_module(k)
x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((5, 7), (3, 7), (3,)))
y = torch.empty(5, 3, dtype=torch.float64)
k.forward_kernel[(1, 1)](x, w, b, y, 5, 3, 7, 7, 1, 7, 1, 1, 3, 1, HAS_BIAS=True, PRECISION="ieee",
                         BLOCK_M=32, BLOCK_N=32, BLOCK_K=32)
assert torch.allclose(y, torch.sigmoid(x @ w.t() + b))
"""


@needs_triton
@pytest.mark.slow
def test_the_interpreter_refuses_a_float64_dot_without_out_dtype(tmp_path):
    """Exercise 4's answer: without out_dtype=acc.dtype, Triton 3.6.0's front end (which the
    interpreter runs) stops a float64 product with an assertion; with it, the kernel is right."""
    import triton

    if triton.__version__ != "3.6.0":
        pytest.skip(f"the exercise names Triton 3.6.0; this is {triton.__version__}")
    source = (ROOT / "tiles" / "kernels.py").read_text()
    assert source.count(", out_dtype=acc.dtype") == 3  # the exercise's three tl.dot calls
    for name, text, ok in (("kept.py", source, True),
                           ("removed.py", source.replace(", out_dtype=acc.dtype", ""), False)):
        (tmp_path / name).write_text(text)
        result = subprocess.run([sys.executable, "-c", DOT, str(tmp_path / name)], capture_output=True, text=True,
                                timeout=300, cwd=ROOT)
        assert (result.returncode == 0) == ok, result.stderr[-3000:]
        if not ok:
            assert "AssertionError" in result.stderr, result.stderr[-3000:]
