"""The committed records under docs/results/: few, each shown by a chapter, each retakeable by its
own command (docs/records.py), and listed by docs/render.py from those commands."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import cli
from conftest import ROOT, load_script, run_script

# A cap that makes each new record displace an old one or argue for its place (each is cited by a
# chapter, below): the tutorial's budget of 30. The GPU plan's records of kinds not yet taken
# (cuda_kernels_{card}, cuda_candidates_{card}, ptx_load_{card}) will need room made for them.
MAX_RECORDS = 30


records = load_script("docs/records.py", "records_under_test")
render = load_script("docs/render.py", "render_under_test")
RESULTS = ROOT / "docs" / "results"
JSONS = sorted(RESULTS.glob("*.json"))
PICTURES = sorted(p for p in RESULTS.iterdir() if p.suffix in records.PICTURES)


def kinds(paths: list[Path]) -> set[str]:
    """The kinds of these records: one per record, but a GPU record taken on several cards is one kind."""
    return {records.kind(p.name, json.loads(p.read_text())) for p in paths}


def test_there_are_few_records():
    """Counted by kind: a second card's record of a kind (cuda_gpu_h200.json beside
    cuda_gpu_h100.json) is the same table retaken, not one more record to show."""
    assert 0 < len(kinds(JSONS)) <= MAX_RECORDS, (
        f"{len(kinds(JSONS))} kinds of JSON record under docs/results/ (at most {MAX_RECORDS})")


@pytest.mark.parametrize("path", JSONS, ids=lambda p: p.name)
def test_each_record_names_its_own_path_in_its_command(path):
    """The command a record keeps is the one that wrote it, here: run again, it writes this file."""
    record = json.loads(path.read_text())
    assert isinstance(record, dict) and record.get("command"), f"{path.name} keeps no command"
    outputs, _ = records._files_in(record["command"], RESULTS)
    assert path.name in outputs, f"{path.name}: its command does not write it: {record['command']}"


@pytest.mark.parametrize("path", JSONS + PICTURES, ids=lambda p: p.name)
def test_each_record_and_picture_is_shown_by_a_chapter(path):
    """Named by a chapter (a render marker, a link, a picture) or by docs/README.md's own text,
    itself or its kind (another card's record of that kind, or the kind with "{card}"): the
    generated list of records does not count."""
    assert records.shown_in(path.name, records.citations()), f"no Markdown file shows docs/results/{path.name}"


@pytest.mark.parametrize("path", PICTURES, ids=lambda p: p.name)
def test_each_picture_says_how_it_was_drawn(path):
    drawn_by = [r for r in records.load() if path.name in r.outputs and r.command]
    assert drawn_by or records.picture_command(path), (
        f"{path.name}: no record's command draws it and it carries no command (record_info.save_figure)")


def test_docs_readme_lists_every_record_from_its_command():
    text = (ROOT / "docs" / "README.md").read_text()
    assert "<!-- records: docs/results -->" in text
    listed = render.render(text)
    for path in JSONS:
        assert f"`{json.loads(path.read_text())['command']}`" in listed, path.name


# ---------------------------------------------------------------------------
# docs/records.py on a folder of its own
# ---------------------------------------------------------------------------

def _write(folder: Path, name: str, command: str, **extra) -> None:
    (folder / name).write_text(json.dumps({"command": command, "device": "cpu: test", "date": "2026-01-02T03:04",
                                           **extra}))


@pytest.fixture
def folder(tmp_path):
    """A folder of records; their commands name it by its absolute path."""
    return tmp_path


def test_run_order_puts_what_a_command_reads_first(folder):
    rel = folder.as_posix()
    _write(folder, "a_predict.json", f"python -m parallel.collectives.costmodel predict --validate {rel}/z_zero.json "
                                     f"--json {rel}/a_predict.json --plot {rel}/a_predict.png")
    _write(folder, "z_zero.json", f"python distributed.py --bench zero --json {rel}/z_zero.json")
    _write(folder, "b_bench.json", f"python benchmark.py -m py --json {rel}/b_bench.json", reads=[f"{rel}/c_fit.json"])
    _write(folder, "c_fit.json", f"python benchmark.py -m cpp --json {rel}/c_fit.json")
    found = {r.name: r for r in records.load(folder)}
    assert found["a_predict.json"].outputs == ["a_predict.json", "a_predict.png"]
    assert found["a_predict.json"].inputs == ["z_zero.json"] and found["a_predict.json"].needs_matplotlib
    order = [r.name for r in records.run_order(list(found.values()))]
    assert order.index("z_zero.json") < order.index("a_predict.json")
    assert order.index("c_fit.json") < order.index("b_bench.json")  # a record's own "reads"
    _write(folder, "z_zero.json", f"python distributed.py --bench zero --validate {rel}/a_predict.json "
                                  f"--json {rel}/z_zero.json")
    with pytest.raises(cli.UserError, match="cycle"):
        records.run_order(records.load(folder))


def test_a_picture_carries_the_command_that_drew_it(folder):
    pytest.importorskip("matplotlib", reason="matplotlib (optional) not installed")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import record_info

    rel = folder.as_posix()
    argv = ["tp_report.py", "shards", "--out", f"{rel}/shards.png"]
    monkey = sys.argv
    sys.argv = argv
    try:
        for suffix in (".png", ".svg"):
            fig, _ = plt.subplots()
            record_info.save_figure(fig, folder / f"shards{suffix}")
            plt.close(fig)
    finally:
        sys.argv = monkey
    for suffix in (".png", ".svg"):
        assert records.picture_command(folder / f"shards{suffix}").endswith(f"shards --out {rel}/shards.png")
    (folder / "shards.svg").unlink()
    (found,) = records.load(folder)
    assert found.name == "shards.png" and found.outputs == ["shards.png"]


def test_the_list_names_each_records_command_and_where_it_is_shown(folder):
    rel = folder.as_posix()
    _write(folder, "one.json", f"python benchmark.py -m py --json {rel}/one.json")
    (folder / "orphan.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0\0\0\0IEND\xaeB`\x82")
    text = records.table(folder)
    assert f"| `one.json` | `python benchmark.py -m py --json {rel}/one.json` | 2026-01-02 | nowhere |" in text
    assert "| `orphan.png` | no command recorded | – | nowhere |" in text and "Taken on cpu: test unless" in text


def test_run_refuses_before_starting_anything(folder):
    rel = folder.as_posix()
    _write(folder, "one.json", f"python benchmark.py -m py --rounds 2 -b 2 -i 2 -o 2 --json {rel}/one.json")
    chosen = records.load(folder)
    with pytest.raises(cli.UserError, match="exist .*one.json.*add --overwrite"):
        records.run(chosen, overwrite=False, dry_run=False)
    _write(folder, "two.json", f"python benchmark.py --json {rel}/two.json --plot {rel}/two.png")
    code = ("import sys; sys.modules['matplotlib'] = None; import cli; records = cli.load_file('docs/records.py');"
            f"r = [x for x in records.load(records.Path({rel!r})) if x.name == 'two.json'];"
            "cli.run(lambda: records.run(r, overwrite=True, dry_run=False))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "need matplotlib" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_list_and_dry_run_run_nothing():
    listed = run_script("docs/records.py", "--list", timeout=120)
    assert listed.returncode == 0, listed.stderr
    for path in JSONS:
        assert path.name in listed.stdout
    dry = run_script("docs/records.py", "--run", "--dry-run", timeout=120)
    assert dry.returncode == 0, dry.stderr
    import torch

    runnable = [r for r in records.load() if r.command and not r.needs_gpu
                and not (r.needs_cuda_torch and torch.version.cuda is None)]
    assert dry.stdout.count("] ") == len(runnable)
    if torch.version.cuda is None:
        assert "skip  build_sm90a.json: needs a CUDA build of torch and nvcc" in dry.stderr
    unknown = run_script("docs/records.py", "--run", "no_such_record", timeout=120)
    assert unknown.returncode == 2 and "no record named no_such_record.json" in unknown.stderr


def test_a_second_cards_record_of_a_shown_kind_is_accepted(tmp_path):
    """What a lease on another card brings back (tar -xzf records.tar.gz) is shown by the chapter
    that shows the kind, counted once against the cap, and retaken by its own command."""
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    for card, device in (("h100", "NVIDIA H100 80GB HBM3"), ("h200", "NVIDIA H200")):
        command = f"python cuda/bench_gpu.py gemm --json docs/results/cuda_gpu_{card}.json"
        _write(results, f"cuda_gpu_{card}.json", command, device=device)
    _write(results, "cpu_h100.json", "python benchmark.py --json docs/results/cpu_h100.json")  # not a GPU's record
    (tmp_path / "README.md").write_text("<!-- gpu_gemm: docs/results/cuda_gpu_h100.json -->\n")
    cited = records.citations(tmp_path)
    assert records.shown_in("cuda_gpu_h200.json", cited, results) == ["README.md"]
    assert records.shown_in("cpu_h100.json", cited, results) == []
    assert kinds(sorted(results.glob("*.json"))) == {"cuda_gpu_{card}.json", "cpu_h100.json"}
    (tmp_path / "README.md").write_text("<!-- gpu_gemm: docs/results/cuda_gpu_{card}.json -->\n")
    cited = records.citations(tmp_path)
    assert records.shown_in("cuda_gpu_h100.json", cited, results) == ["README.md"]
    assert [name for name, _ in records.of_kind("cuda_gpu_{card}.json", results)] == ["cuda_gpu_h200.json",
                                                                                       "cuda_gpu_h100.json"]


@pytest.mark.parametrize("name, device, kind", [
    ("cuda_gpu_h100.json", "NVIDIA H100 80GB HBM3", "cuda_gpu_{card}.json"),
    ("triton_gpu_h200_b32.json", "NVIDIA H200", "triton_gpu_{card}_b32.json"),
    ("ncu_gemm_h200.json", "NVIDIA H100 80GB HBM3", "ncu_gemm_h200.json"),  # its name is not its card's
    ("train_cuda_gpu_w2.json", "cuda", "train_cuda_gpu_w2.json"),
    ("cpu_1024.json", "cpu: AMD EPYC 9B14", "cpu_1024.json"),
])
def test_a_records_kind_is_its_name_with_its_own_card_left_open(name, device, kind):
    assert records.kind(name, {"device": device}) == kind


# ---------------------------------------------------------------------------
# docs/render.py: a marker it cannot fill is one line
# ---------------------------------------------------------------------------

def test_a_marker_on_a_record_it_cannot_show_is_one_line(tmp_path, capsys):
    """A marker whose record lacks what its table needs stops with the page and the marker named:
    a user error (cli.UserError, as for every other marker), one line and exit status 2 from the
    script, not a traceback, and not --check's 1 for a stale page."""
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"benchmark": "sweep", "points": []}))
    with pytest.raises(cli.UserError, match=f"^README.md: {sweep} cannot be shown as 'table'.*KeyError"):
        render.render(f"<!-- table: {sweep} -->\n<!-- end table -->\n")
    with pytest.raises(cli.UserError, match="unknown table kind 'nosuchkind'"):
        render.render(f"<!-- nosuchkind: {sweep} -->\n<!-- end nosuchkind -->\n")
    absent = f"<!-- table: {tmp_path / 'absent.json'} -->\n<!-- end table -->\n"
    with pytest.raises(cli.UserError, match="absent.json is named by a marker but does not exist"):
        render.render(absent)
    with pytest.raises(SystemExit) as exited:
        cli.run(lambda: render.render(absent))
    err = capsys.readouterr().err
    assert exited.value.code == 2 and len(err.strip().splitlines()) == 1 and "absent.json" in err, err
