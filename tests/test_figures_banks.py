"""Chapter 3's bank figure (cuda/figures.py, cuda_banks.png): the request it draws is v5's read of
B's tile as the kernel indexes it, and its wavefronts are the counters' (cuda/emulate/counters.cpp),
which agree with the banks the figure colours and with v5's counted excessive wavefronts."""

from __future__ import annotations

import random

import pytest

import cli
from conftest import ROOT, load_script

figures = load_script("cuda/figures.py")
V5 = (ROOT / "cuda" / "kernels" / "v5_blocktile_2d.cuh").read_text()
COUNTERS = (ROOT / "cuda" / "emulate" / "counters.cpp").read_text()


def test_the_drawn_request_is_v5s_read_of_bs():
    # the kernel's own lines: a thread's column of the tile and its read of B's tile
    assert "const int tx = threadIdx.x % (BN / TN)" in V5 and "const int row0 = ty * TM, col0 = tx * TN;" in V5
    assert "b[j] = Bs[kk][col0 + j];" in V5 and "__shared__ T Bs[BK][BN];" in V5
    _, bn, _, tn, _ = figures.tiles()[5]["f32"]
    request = figures.v5_b_request(kk=1)
    assert [lane for lane, _, _ in request] == list(range(32)) and {s for _, _, s in request} == {16}
    assert [a for _, a, _ in request] == [4 * (bn + (lane % (bn // tn)) * tn) for lane in range(32)]


def test_the_figures_bank_is_the_counters_word_modulo_32():
    # counters.cpp: a lane's words are address / 4, a word's bank word % 32
    assert "for (uintptr_t w = a / 4;" in COUNTERS and "++per_bank[buf[i] % 32]" in COUNTERS
    assert [figures.bank(a) for a in (0, 4, 124, 128, 132, 4 * 37)] == [0, 1, 31, 0, 1, 5]


@pytest.fixture(scope="module")
def lib():
    counters = cli.load_file("cuda/counters.py")
    if counters.unavailable_reason():
        pytest.skip(counters.unavailable_reason())
    return counters.library()


def most_words_per_bank(addresses: list[int]) -> int:
    """One phase of 4-byte reads by the figure's bank(): the most distinct words one bank holds."""
    per_bank: dict[int, set[int]] = {}
    for a in addresses:
        per_bank.setdefault(figures.bank(a), set()).add(a // 4)
    return max(len(words) for words in per_bank.values())


@pytest.mark.slow
def test_the_counters_wavefronts_are_the_most_words_a_bank_of_the_figure_holds(lib):
    rng = random.Random(0)
    for _ in range(200):
        addresses = [4 * rng.randrange(256) for _ in range(32)]
        found, phases = figures.wavefronts([(lane, a, 4) for lane, a in enumerate(addresses)], lib)
        assert (found, phases) == (most_words_per_bank(addresses), 1)


@pytest.mark.slow
def test_v5s_request_takes_twice_its_phases_and_that_is_v5s_counted_excess(lib):
    found, phases = figures.wavefronts(figures.v5_b_request(), lib)
    assert (found, phases) == (8, 4)
    counters = cli.load_file("cuda/counters.py")
    bm, bn, bk = 128, 128, 8  # v5's float32 tile: one block, one k-step
    (c,) = counters.count_gemm(5, "nt", bm, bn, bk)
    excessive = c.metrics["excessive_wavefronts_mem_shared_op_ld"]
    # every warp (8), every kk, two LDS.128 of B's row (b[0..3], b[4..7]) alike; A's reads broadcast
    assert excessive == 8 * bk * 2 * (found - phases)
