"""The TMA ring's timeline (cuda/tensor_cores/trace.py): the emulator's optional event trace
(cuda/emulate/trace.h) of v33 at one block, held to the mbarrier protocol, and its Chrome trace."""

from __future__ import annotations

import json

import pytest

import cli
from conftest import load_script

trace = load_script("cuda/tensor_cores/trace.py")
emulated = cli.load_file("cuda/emulated.py")


@pytest.fixture(scope="module")
def lib():
    if emulated.unavailable_reason():
        pytest.skip(emulated.unavailable_reason())
    return trace.library()


@pytest.fixture(scope="module")
def events(lib) -> list[dict]:
    return trace.run(33, trace.SHAPE, lib)


def test_the_trace_is_off_unless_asked(lib):
    lib.emu_trace(1)
    lib.emu_trace(0)  # cleared, then off: a run records nothing
    torch = pytest.importorskip("torch")
    a, b = torch.zeros(128, 64, dtype=torch.bfloat16), torch.zeros(256, 64, dtype=torch.bfloat16)
    emulated.gemm(33, "nt", a, b, torch.empty(128, 256, dtype=torch.bfloat16), None, 128, 256, 64, emulated.KPLAIN,
                  lib=lib)
    assert lib.emu_trace_count() == 0


def test_v33s_events_are_its_rings(events):
    m, n, k = trace.SHAPE
    steps, stages = k // 64, 4  # tma_pipeline.cuh's ring of kV33Stages, a k-step of 64
    bars = trace.barriers(events)
    assert sorted(bars.values()) == sorted((r, s) for r in ("full", "empty") for s in range(stages))
    kinds = [(trace.role(e["thread"]), e["kind"]) for e in events]
    assert kinds.count(("producer", "tma issued")) == 2 * steps  # A's tile and B's, each step
    assert kinds.count(("producer", "arrive")) == steps  # one expect_tx a step
    for consumer in ("consumer 0", "consumer 1"):
        assert kinds.count((consumer, "wait completed")) == steps
        assert kinds.count((consumer, "wgmma issued")) == 4 * steps  # k-steps of 16 in 64
        assert kinds.count((consumer, "arrive")) == steps - 1  # each releases every step but the last
    announced = {e["value"] for e in events if e["kind"] == "arrive" and e["value"]}
    assert announced == {(128 + 256) * 64 * 2}  # dense_kernels.h's tma_stage_bytes(33)
    assert [e["seq"] for e in events] == list(range(events[0]["seq"], events[0]["seq"] + len(events)))


def test_the_order_respects_the_mbarrier_protocol(events):
    assert trace.check_protocol(events) == []
    bars = trace.barriers(events)
    full = {b for b, (r, _) in bars.items() if r == "full"}
    # every consumer's wait on a full barrier completes after that stage's bytes landed for the phase
    for e in events:
        if e["kind"] == "wait completed" and e["bar"] in full and e["thread"] > 0:
            assert any(x["kind"] == "landed" and x["bar"] == e["bar"] and x["seq"] < e["seq"] for x in events)


def test_a_wait_completed_before_its_phase_is_caught(events):
    """The check itself: moving a consumer's first completed wait before the bytes of its stage
    landed breaks the order, and check_protocol says where."""
    first = next(i for i, e in enumerate(events) if e["kind"] == "wait completed" and e["thread"] == 128)
    landed = next(i for i, e in enumerate(events) if e["kind"] == "landed")
    broken = [dict(e) for e in events]
    moved = broken.pop(first)
    broken.insert(landed, moved)
    for seq, e in enumerate(broken):
        e["seq"] = seq
    wrong = trace.check_protocol(broken)
    assert wrong and "consumer 0's wait 0" in wrong[0]


def test_the_chrome_trace_has_a_track_per_role_and_the_waits_as_slices(events):
    doc = json.loads(json.dumps(trace.chrome_trace(events)))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X"]
    assert all({"ts", "dur", "pid", "tid", "name"} <= set(e) and e["dur"] >= 1 for e in slices)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"}
    assert names == {"producer", "copy engine", "consumer 0", "consumer 1"}
    waits = [e for e in slices if e["cat"] == "wait completed"]
    assert len(waits) == sum(e["kind"] == "wait completed" for e in events) and max(w["dur"] for w in waits) > 1


def test_the_script_writes_the_trace_where_asked(tmp_path, capsys):
    out = tmp_path / "v33.json"
    assert trace.main(["--out", str(out)]) == 0
    assert json.loads(out.read_text())["traceEvents"] and "perfetto" in capsys.readouterr().out


@pytest.mark.plot
def test_the_timeline_is_drawn(tmp_path, events):
    pytest.importorskip("matplotlib")
    trace.draw(tmp_path / "t.png", events)
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
