"""The tensor cores' accumulation in the emulator (cuda/emulate/tc_accumulate.h): its two models
held against cuda/tensor_cores/accumulation_vectors.py, a separate encoding of the published
description in exact fractions, on vectors whose truncated and rounded sums differ; and mma.sync
and wgmma through the emulator giving the selected model's bits."""

from __future__ import annotations

import ctypes
import json
import math
import shutil
import struct
import subprocess
import sys
from fractions import Fraction

import pytest

from conftest import ROOT, load_script

emu = load_script("cuda/emulated.py")
if emu.unavailable_reason():
    pytest.skip(f"the emulation {emu.unavailable_reason()}", allow_module_level=True)
vectors = load_script("cuda/tensor_cores/accumulation_vectors.py")

EXACT, H100 = 0, 1  # emu::Accumulation
MODELS = {"exact": EXACT, "h100": H100}
D = ctypes.POINTER(ctypes.c_double)


@pytest.fixture(scope="module")
def lib() -> ctypes.CDLL:
    lib = emu.library()
    lib.emu_tc_block.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_float, D, D, ctypes.c_int]
    lib.emu_tc_block.restype = ctypes.c_float
    lib.emu_set_accumulation.argtypes, lib.emu_set_accumulation.restype = [ctypes.c_int], ctypes.c_int
    vectors._declare(lib.emu_tc_accumulation_run)
    return lib


@pytest.fixture(scope="module")
def record() -> dict:
    return json.loads(vectors.VECTORS.read_text())


def bits(x: float) -> int:
    return struct.unpack("<I", struct.pack("<f", x))[0]


def block(lib: ctypes.CDLL, model: int, v: dict) -> int:
    """The emulator's block on one vector, as float32 bits."""
    c, a, b = vectors.words(v)
    fmt = v["format"]
    av = (ctypes.c_double * len(a))(*[float(vectors.decode(fmt, w)) for w in a])
    bv = (ctypes.c_double * len(b))(*[float(vectors.decode(fmt, w)) for w in b])
    cf = struct.unpack("<f", struct.pack("<I", c))[0]
    return bits(lib.emu_tc_block(model, vectors.FORMATS.index(fmt), cf, av, bv, len(a)))


def test_the_committed_vectors_are_what_the_script_writes(record):
    assert record == json.loads(json.dumps(vectors.record()))
    assert record["command"] == vectors.COMMAND


def test_the_vectors_tell_the_models_apart(record):
    """Most crafted vectors, in every format, have different exact and H100 bits: a model that
    rounded where the other cuts would fail them."""
    for fmt in vectors.FORMATS:
        mine = [v for v in record["vectors"] if v["format"] == fmt and not v["name"].startswith("random")]
        differ = [v["name"] for v in mine if v["expected"]["exact"] != v["expected"]["h100"]]
        assert len(differ) >= len(mine) - 1, (fmt, differ)


def test_a_few_vectors_by_hand(record):
    """The reference model's bits on vectors worked out by hand (the docstrings' arithmetic)."""
    def value(fmt: str, name: str, model: str) -> Fraction:
        (v,) = [v for v in record["vectors"] if v["format"] == fmt and v["name"] == name]
        return vectors.f32_value(int(v["expected"][model], 16))
    two = Fraction(2)
    assert value("bf16", "final cut toward zero", "h100") == 1
    assert value("bf16", "final cut toward zero", "exact") == 1 + two**-23
    assert value("f16", "cancellation to a small remainder", "h100") == 0
    assert value("f16", "cancellation to a small remainder", "exact") == Fraction(3, 2) * two**-28
    assert value("bf16", "product significand at least 2", "h100") == Fraction(9, 4) + 5 * two**-22
    assert value("bf16", "product significand at least 2", "exact") == Fraction(9, 4) + 6 * two**-22
    assert value("tf32", "product significand at least 2", "h100") == Fraction(9, 4) + 2 * two**-22
    assert value("f16", "float16 subnormal operand", "h100") == two**-10
    assert value("f16", "float16 subnormal operand", "exact") == two**-10 + 3 * two**-33
    assert value("tf32", "small products below the kept bits", "exact") == 1 + two**-23


@pytest.mark.parametrize("model", ["exact", "h100"])
def test_the_emulators_block_is_the_models_on_every_vector(lib, record, model):
    wrong = [(v["format"], v["name"], f"{block(lib, MODELS[model], v):#010x}", v["expected"][model])
             for v in record["vectors"] if block(lib, MODELS[model], v) != int(v["expected"][model], 16)]
    assert not wrong


def test_the_h100_block_agrees_on_many_random_vectors(lib):
    """100 random blocks a format, exponents spread over ±6 (operands) and ±8 (C)."""
    for fmt in vectors.FORMATS:
        for v in vectors.random_vectors(fmt, 100, seed=7):
            for model in MODELS:
                assert block(lib, MODELS[model], v) == int(v["expected"][model], 16), (fmt, model, v)


def test_non_finite_blocks_are_ieee(lib):
    inf = math.inf
    def run(c: float, a: list[float], b: list[float]) -> float:
        return lib.emu_tc_block(H100, 0, c, (ctypes.c_double * 2)(*a), (ctypes.c_double * 2)(*b), 2)
    assert run(1.0, [inf, 1.0], [1.0, 1.0]) == inf
    assert math.isnan(run(1.0, [inf, -inf], [1.0, 1.0]))
    assert math.isnan(run(1.0, [inf, 0.0], [0.0, 1.0]))  # inf·0
    assert run(-inf, [1.0, 2.0], [1.0, 1.0]) == -inf


@pytest.mark.parametrize("model", ["exact", "h100"])
def test_mma_and_wgmma_give_the_selected_models_bits(lib, record, model):
    """Every probe (mma.sync bf16/f16/tf32, wgmma bf16/f16/tf32), every output of every vector."""
    previous = lib.emu_set_accumulation(MODELS[model])
    try:
        for kind in vectors.PROBES:
            results = vectors.run_probe(lib.emu_tc_accumulation_run, kind, record["vectors"])
            assert results and not vectors.compare(results, model), (kind, vectors.compare(results, model)[:3])
    finally:
        lib.emu_set_accumulation(previous)


def test_the_exact_sum_is_the_default_and_the_environment_selects_the_h100_model(lib):
    """A fresh process: emu_set_accumulation returns the model it replaces."""
    path = str(emu.build())
    code = "import ctypes, sys; print(ctypes.CDLL(sys.argv[1]).emu_set_accumulation(0))"
    def first(env: dict) -> str:
        result = subprocess.run([sys.executable, "-c", code, path], capture_output=True, text=True, env=env,
                                timeout=60)
        return result.stdout.strip()
    assert first({}) == "0"
    assert first({"CUDA_EMU_TC_ACCUMULATION": "h100"}) == "1"
    previous = lib.emu_set_accumulation(H100)
    try:
        assert lib.emu_set_accumulation(7) == -1 and lib.emu_set_accumulation(H100) == H100  # refused, unchanged
    finally:
        lib.emu_set_accumulation(previous)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_the_probe_compiles_for_sm90a(tmp_path):
    result = subprocess.run(["nvcc", "-cubin", "-std=c++17", "-O3", "-arch=sm_90a",
                             str(ROOT / "cuda" / "tensor_cores" / "accumulation_probe.cu"), "-o",
                             str(tmp_path / "probe.cubin")], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]


@pytest.mark.gpu
def test_on_the_gpu_each_instruction_matches_one_model_throughout(record):
    """On an H100 or H200: every block's outputs agree, and each instruction's results are all
    one model's (which one is the finding: accumulation_vectors.py --gpu --record says)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("needs an sm_90 GPU (H100, H200)")
    _, measured = vectors.on_gpu(record)
    for instruction in {(r["instruction"], r["format"]) for r in measured["results"]}:
        mine = [r for r in measured["results"] if (r["instruction"], r["format"]) == instruction]
        assert all(r["outputs_agree"] for r in mine), instruction
        common = set(vectors.MODELS).intersection(*(set(r["matches"]) for r in mine))
        assert common, (instruction, [(r["vector"], r["bits"], r["matches"]) for r in mine if len(r["matches"]) < 2])
