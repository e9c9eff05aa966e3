"""The tensor-core chapter's figures (cuda/tensor_cores/figures.py): the numbers each one draws,
asked of the emulation, held against the PTX ISA's definitions as tests/test_instructions.py and
tests/test_hopper.py encode them (never against the emulation a second time); the split-TF32
figure against its record; and the script's output."""

from __future__ import annotations

import json

import pytest

import cli
from conftest import ROOT, load_script, run_script

figures = load_script("cuda/tensor_cores/figures.py")
records = load_script("docs/records.py", "records_for_tc_figures")
SCRIPT = "cuda/tensor_cores/figures.py"


@pytest.fixture(scope="module")
def lib():
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    return figures.library()


def inverse(table: dict) -> dict:
    """{(lane, element): (row, col)} -> {(row, col): (lane, element)}"""
    return {rc: owner for owner, rc in table.items()}


@pytest.mark.parametrize("name, table", [("A", 0), ("B", 1), ("C", 2)])
def test_the_mma_fragment_figure_is_the_ptx_isas_table(lib, name, table):
    from ptx_isa import ptx_table  # (lane, element) -> (row, col): A m×k, B k×n, C m×n

    drawn = figures.mma_fragments(lib)[name]
    assert drawn == inverse(ptx_table(table))
    assert len(drawn) == figures.TABLES[name][1] * figures.TABLES[name][2]


def test_the_ldmatrix_figure_is_what_the_ptx_isa_says_x4_does(lib):
    """Matrix j's rows come from the addresses of lanes 8j to 8j+7, row r from lane 8j + r, and
    land in register j as the PTX ISA's figure distributes an 8×8 matrix (ldmatrix_ptx)."""
    from ptx_isa import ldmatrix_ptx

    drawn = figures.ldmatrix_x4(lib)
    assert drawn["sources"] == {(j, r): 8 * j + r for j in range(4) for r in range(8)}
    want = {(j, r, c): (lane, half) for j in range(4) for (lane, half), (r, c) in ldmatrix_ptx(False).items()}
    assert drawn["received"] == want


def test_the_wgmma_figure_is_the_ptx_isas_accumulator_table(lib):
    from ptx_isa import d_table

    drawn = figures.wgmma_d(figures.WGMMA_N, lib)
    assert drawn == inverse(d_table(figures.WGMMA_N)) and len(drawn) == 64 * figures.WGMMA_N
    assert {drawn[16 * w, 0][0] // 32 for w in range(4)} == {0, 1, 2, 3}  # the rows the figure colours by warp


def test_the_swizzle_figure_is_the_ptx_isas_128_byte_atom(lib):
    from ptx_isa import SWIZZLE, swizzle_rows

    grid = figures.swizzle128(lib)
    for r in range(8):
        for c in range(8):
            moved = swizzle_rows(128 * r + 16 * c, SWIZZLE["128B"])
            assert (moved // 128, moved % 128 // 16) == (r, grid[r][c]), (r, c)
    assert grid[3] == [3, 2, 1, 0, 7, 6, 5, 4]  # c XOR 3, by hand


def test_the_descriptor_figure_has_the_ptx_isas_bits(lib):
    from ptx_isa import FIELDS, SPAN, SWIZZLE, encode

    drawn = figures.descriptor(figures.EXAMPLE_DESCRIPTOR, lib)
    assert {name: (low, width) for name, (low, width, _) in drawn["fields"].items()} == FIELDS
    assert {name: unit for name, (_, _, unit) in drawn["fields"].items()} == {
        "start": 16, "lbo": 16, "sbo": 16, "base_offset": 1, "swizzle": 1}  # addresses in 16-byte units
    read = {b for low, width in FIELDS.values() for b in range(low, low + width)}
    assert drawn["unused"] == sorted(set(range(64)) - read)
    # the example: v31's B operand (nt) at its second k-step, smem_desc(8192 + 32, 16, 1024, 128B)
    assert figures.EXAMPLE_DESCRIPTOR == encode(start=8192 + 32, lbo=16, sbo=1024, swizzle=SWIZZLE["128B"])
    assert drawn["decoded"] == {"start": 8224, "lbo": 16, "sbo": 1024, "base_offset": 0, "swizzle": 1}
    assert drawn["swizzle_bytes"] == SPAN[SWIZZLE["128B"]]
    assert [figures.swizzle_span(m, lib) for m in (0, 2, 3)] == [SPAN[m] for m in (0, 2, 3)]


def test_the_split_tf32_figure_draws_the_records_forward_gemm():
    rec = json.loads(figures.RECORD.read_text())
    drawn = figures.split_tf32(rec)
    gemm = [r for r in rec["results"] if r["tensor"] == "forward GEMM"]
    for variant in ("float32", "tf32", "split", "v25", "v26", "v34"):
        assert drawn[variant] == sorted((r["in"], r["error"]) for r in gemm if r["variant"] == variant), variant
    assert drawn["allowed"] == sorted((r["in"], r["allowed"]) for r in gemm if r["variant"] == "v26")
    assert [k for k, _ in drawn["float32"]] == rec["shape"]["in"]


@pytest.mark.slow
@pytest.mark.parametrize("plant, drawn", [(1, "mma_fragments"), (3, "wgmma_d"), (4, "swizzle128")])
def test_a_planted_wrong_model_draws_a_wrong_figure(plant, drawn):
    """The figures follow the emulation: built with a definition planted wrong, the numbers differ."""
    emu = load_script("cuda/emulated.py")
    if emu.unavailable_reason():
        pytest.skip(f"the emulation {emu.unavailable_reason()}")
    right, wrong = figures.library(), figures.library(emu.load((f"-DCUDA_EMU_PLANT_FRAGMENT={plant}",)))
    assert getattr(figures, drawn)(lib=wrong) != getattr(figures, drawn)(lib=right)


def test_the_committed_figures_say_how_they_were_drawn():
    for name in figures.NAMES:
        path = ROOT / "docs" / "figures" / name
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert records.picture_command(path) == f"python {SCRIPT} --out docs/figures", name


@pytest.mark.plot
def test_the_script_draws_every_figure_and_says_how(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_script(SCRIPT, "--out", str(tmp_path), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(figures.NAMES)
    for name in figures.NAMES:
        assert records.picture_command(tmp_path / name) == f"python {SCRIPT} --out {tmp_path}", name


@pytest.mark.plot
def test_only_writes_the_figures_named(tmp_path):
    pytest.importorskip("matplotlib")
    result = run_script(SCRIPT, "--out", str(tmp_path), "--only", "tc_swizzle128.png", "tc_split_tf32.png",
                        timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tc_split_tf32.png", "tc_swizzle128.png"]


@pytest.mark.plot
@pytest.mark.parametrize("args, says", [
    (["--record", "docs/results/errors_cpu.json"], "of kind 'errors'; this needs a record of kind 'tf32_error'"),
    (["--record", "/no/such/record.json"], "--record /no/such/record.json: no such file"),
    (["--only", "tc_nothing.png"], "invalid choice"),
])
def test_mistakes_are_one_line_and_write_nothing(tmp_path, args, says):
    pytest.importorskip("matplotlib")
    result = run_script(SCRIPT, "--out", str(tmp_path), *args, timeout=120)
    assert result.returncode == 2 and says in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and not list(tmp_path.iterdir())


def test_a_missing_folder_is_one_line(tmp_path):
    result = run_script(SCRIPT, "--out", str(tmp_path / "missing"), timeout=120)
    assert result.returncode == 2 and "not a folder" in result.stderr and "Traceback" not in result.stderr


def test_the_script_says_what_to_install_without_matplotlib(tmp_path):
    code = ("import runpy, sys; sys.modules['matplotlib'] = None; "
            f"sys.argv = [{SCRIPT!r}, '--out', {str(tmp_path)!r}]; "
            f"runpy.run_path({SCRIPT!r}, run_name='__main__')")
    result = run_script("-c", code, timeout=120)
    assert result.returncode == 2 and "pip install matplotlib" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not list(tmp_path.iterdir())


def test_a_user_error_names_the_flag():
    with pytest.raises(cli.UserError, match="--out /no/such: not a folder"):
        figures.main(["--out", "/no/such"])
