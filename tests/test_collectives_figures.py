"""Chapter 7 (continued)'s figures: what they draw is the algorithms' own schedule, and the
script draws them (or says what to install)."""

from __future__ import annotations

import pytest

from conftest import load_script, run_script
from parallel.collectives import costmodel, figures

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("p", [2, 4, 8])
def test_doubling_pairs_blocks_of_ranks_then_everyone_holds_the_sum(p):
    stages = figures.doubling(p)
    assert len(stages) == 1 + (p.bit_length() - 1)  # log₂p exchanges
    for k, (_, cells) in enumerate(stages):
        for r, row in enumerate(cells):  # after step k: the 2ᵏ ranks that differ from r in the low k bits
            group = frozenset(q for q in range(p) if q >> k == r >> k)
            assert row == [group] * p, (k, r)
    assert all(figures.label(c, p) == "Σ" for row in stages[-1][1] for c in row)


@pytest.mark.parametrize("p", [2, 4, 8])
def test_halving_doubling_scatters_block_r_to_rank_r_then_gathers_with_the_rings_bytes(p):
    stages = figures.halving_doubling(p)
    steps = p.bit_length() - 1
    assert len(stages) == 1 + 2 * steps
    everyone = frozenset(range(p))
    _, scattered = stages[steps]  # after the reduce-scatter: rank r holds block r complete, nothing else
    for r, row in enumerate(scattered):
        assert row == [everyone if b == r else None for b in range(p)], r
    assert all(c == everyone for row in stages[-1][1] for c in row)
    # Blocks rank 0 sends: the ones it gives up while halving, the ones it receives while doubling
    # come from a partner that sends as many. In all, the bandwidth term of the cost model.
    sent = 0
    for (_, before), (_, after) in zip(stages, stages[1:]):
        sent += sum((a is None) != (b is None) for a, b in zip(before[0], after[0]))
    unit = costmodel.Link(alpha=0.0, beta=1.0)  # one second per byte, no fixed cost, no additions
    assert sent / p == pytest.approx(costmodel.halving_doubling(p, 1.0, unit))


def test_a_cell_names_whose_contributions_it_sums():
    assert figures.label(frozenset({2, 0}), 4) == "0+2"
    assert figures.label(frozenset(range(4)), 4) == "Σ"
    assert figures.label(None, 4) == ""


@pytest.mark.plot
def test_the_script_draws_the_three_figures(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_script("-m", "parallel.collectives.figures", "--out", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    for name in figures.NAMES:
        assert (tmp_path / name).read_bytes()[:8] == PNG, name


def test_the_script_says_what_to_install_without_matplotlib(tmp_path):
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = ['figures', '--out', {str(tmp_path)!r}]; "
            "runpy.run_module('parallel.collectives.figures', run_name='__main__')")
    result = run_script("-c", code)
    assert result.returncode == 2 and "pip install matplotlib" in result.stderr, result.stderr
    assert not list(tmp_path.iterdir())


def test_the_script_refuses_a_folder_that_does_not_exist(tmp_path):
    result = run_script("-m", "parallel.collectives.figures", "--out", str(tmp_path / "missing"))
    assert result.returncode == 2 and "not a folder" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.plot
def test_the_models_picture_shows_every_algorithm_and_carries_its_command(tmp_path):
    """The chapter's model-against-measurement picture: docs/records.py redraws it from the
    command inside it, after the records it reads."""
    pytest.importorskip("matplotlib")


    out = tmp_path / "model.png"
    records = [f"docs/results/allreduce_gloo_w{n}.json" for n in (2, 4)]
    result = run_script("-m", "parallel.collectives.costmodel", "plot", *records, "--out", str(out), timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    command = load_script("docs/records.py").picture_command(out)
    assert command and "costmodel plot" in command and all(r in command for r in records), command
    assert "segmented_ring" in costmodel.PREDICT  # the picture draws every algorithm the model prices
