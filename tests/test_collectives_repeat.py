"""parallel/collectives/repeat.py: the allreduce benchmark's goal row in launch after launch,
alternating settings of gloo's I/O threads; its summary, the table and the numbers chapter 7
(continued) takes from its record."""

from __future__ import annotations

import json
import os
import sys

import pytest

from conftest import load_script, run_script
from parallel.collectives import repeat


def _launch(setting: int, ratio: float, ci: tuple[float, float]) -> dict:
    return {"setting": setting, "algorithm": "one_shot", "ratio": ratio, "ratio_ci": list(ci), "auto_us": 1.0,
            "all_reduce_us": 1.0, "date": "d", "gloo_io_thread_nices": None}


RECORD = {"benchmark": "allreduce_repeat", "device": "cpu: test", "torch": "t", "backend": "gloo", "world_size": 2,
          "bytes": 4 << 20, "settings": [0, 19], "date": "d", "command": "python -m parallel.collectives.repeat",
          "launches": [_launch(0, 1.05, (0.95, 1.15)), _launch(19, 0.90, (0.85, 0.95)),
                       _launch(0, 1.01, (0.96, 1.03)), _launch(19, 0.93, (0.88, 1.00)),
                       _launch(0, 1.07, (1.00, 1.12)), _launch(19, 0.85, (0.80, 0.89))]}


def test_pairs_are_consecutive_launches_and_the_summary_is_per_setting():
    assert repeat.paired_shifts(RECORD) == pytest.approx([0.15, 0.08, 0.22])
    s = repeat.summary(RECORD)
    assert (s[0]["lowest"], s[0]["median"], s[0]["highest"]) == (1.01, 1.05, 1.07)
    assert (s[19]["lowest"], s[19]["median"], s[19]["highest"]) == (0.85, 0.90, 0.93)
    assert s[0]["below_goal"] == 0 and s[19]["below_goal"] == 1
    assert s[0]["holding_median"] == 2  # (0.96–1.03) misses 1.05
    assert s[19]["holding_median"] == 2  # (0.80–0.89) misses 0.90


def test_one_setting_has_no_pairs():
    one = {**RECORD, "settings": [0], "launches": [r for r in RECORD["launches"] if r["setting"] == 0]}
    assert repeat.paired_shifts(one) == []
    assert "difference" not in repeat.table(one)


def test_the_table_has_a_row_per_pair_with_its_difference():
    rows = [r for r in repeat.table(RECORD).splitlines() if r.startswith("| ")]
    assert rows[0] == "| launch | left alone | $DENSE_GLOO_IO_NICE=19 | difference |"
    assert rows[1] == "| 1 | 1.05 (0.95–1.15) | 0.90 (0.85–0.95) | +0.15 |"
    assert len(rows) == 4


def test_the_chapters_numbers_come_from_the_record(monkeypatch):
    numbers = load_script("parallel/collectives/page_numbers.py")
    monkeypatch.setattr(numbers, "committed", lambda name: RECORD)
    assert numbers.NUMBERS["coll_repeat_shift"]() == "−0.08 to −0.22"  # lowering the threads: ratio down
    assert numbers.NUMBERS["coll_repeat_spread"]() == "0.08"  # 19's 0.85 to 0.93


@pytest.mark.parametrize("args, says", [
    (("--world-size", "1"), "--world-size must be at least 2"),
    (("--settings", "19,19"), "two different settings"),
    (("--settings", "x"), "--settings"),
    (("--kib", "5"), "invalid choice"),
    (("--launches", "0"), "--launches"),
])
def test_bad_arguments_are_refused_in_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as stop:
        repeat.main(list(args))
    assert stop.value.code == 2 and says in capsys.readouterr().err.strip().splitlines()[-1]


def test_an_unwritable_json_path_is_refused_before_any_launch(tmp_path):
    result = run_script("-m", "parallel.collectives.repeat", "--json", str(tmp_path / "no" / "r.json"), timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "launch" not in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="gloo's threads are set the Linux way")
def test_a_short_run_records_its_launch_under_the_setting_asked_for(tmp_path):
    out = tmp_path / "r.json"
    result = run_script("-m", "parallel.collectives.repeat", "--launches", "1", "--kib", "4", "--settings", "19",
                        "--json", str(out), timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    record = json.loads(out.read_text())
    assert [r["setting"] for r in record["launches"]] == [19] and record["bytes"] == 4 << 10
    assert record["launches"][0]["gloo_io_thread_nices"] and all(
        int(k) == 19 for k in record["launches"][0]["gloo_io_thread_nices"])
    assert all(r["ratio_ci"] and r["ratio_ci"][0] <= r["ratio"] <= r["ratio_ci"][1] for r in record["launches"])
    assert repeat.table(record) in result.stdout


def test_launches_alternate_the_settings_each_in_its_own_environment(monkeypatch):
    """run() launches at each setting in turn, the setting in $DENSE_GLOO_IO_NICE for the ranks
    it starts, and leaves the variable as it found it."""
    from parallel.common import launch
    from parallel.common.threads import IO_NICE_VAR

    seen = []

    def fake_launch(fn, world_size, args, **kw):
        seen.append(os.environ[IO_NICE_VAR])
        row = {"bytes": args[0][0], "variant": "auto", "busbw_ratio_to_dist": 1.0, "ratio_ci": [0.9, 1.1],
               "time_us": 1.0, "algorithm": "one_shot"}
        return [{"results": [row, {**row, "variant": "dist.all_reduce"}], "date": "d"}]

    monkeypatch.setattr(launch, "launch", fake_launch)
    monkeypatch.delenv(IO_NICE_VAR, raising=False)
    record = repeat.run(2, 4 << 10, 2, (0, 19))
    assert seen == ["0", "19", "0", "19"] and IO_NICE_VAR not in os.environ
    assert [r["setting"] for r in record["launches"]] == [0, 19, 0, 19]


def test_a_failed_launch_is_one_error_not_a_traceback(monkeypatch):
    import cli
    from parallel.common import launch

    def failing(*args, **kw):
        raise launch.LaunchError("1 of 2 ranks failed:\n  rank 1: exit code 1")

    monkeypatch.setattr(launch, "launch", failing)
    with pytest.raises(cli.UserError, match="rank 1: exit code 1") as stop:
        repeat.main(["--launches", "1", "--kib", "4"])
    assert stop.value.code == 1
