"""The CUDA chapter's kernels run on the CPU through the execution-model emulation (cuda/emulate/):
every GEMM version × layout × dtype × epilogue, every autotuning candidate (float32), version 0's
table, and the backward kernels against torch, NaN/±inf,
the emulation's three ways of running a block's threads (fibers by a hand-written switch or by
swapcontext, OS threads), and the same kernels under AddressSanitizer and ThreadSanitizer (plus
proof that a race is caught)."""

from __future__ import annotations

import ctypes
import functools
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from conftest import REASONS, ROOT, load_script, run_script

emu = load_script("cuda/emulated.py")

CXX = shutil.which(os.environ.get("CXX", "c++"))
pytestmark = pytest.mark.skipif(emu.unavailable_reason() is not None, reason=str(emu.unavailable_reason()))
VERSIONS = list(emu.versions())[1:]  # 0 only picks one of them
CODE_F32, CODE_F64 = emu.dtype_code(torch.float32), emu.dtype_code(torch.float64)  # dense_kernels::DType
# (M, N, K): 1×1×1, an empty batch, one below / at / above the 16-, 32-, 64- and 128-wide tiles
# and the 8-, 16- and 32-deep k steps, primes.
SHAPES = [(1, 1, 1), (0, 7, 5), (15, 17, 9), (31, 33, 16), (63, 65, 7), (64, 32, 33), (129, 127, 17), (33, 40, 260),
          (37, 41, 43)]
TOL = {torch.float32: dict(atol=2e-5, rtol=1e-4), torch.float64: dict(atol=1e-12, rtol=1e-10),
       # 16-bit outputs: the float32 sum rounded once to 8 (bfloat16) or 11 (float16) bits of mantissa,
       # against the float64 product of the same (16-bit) inputs
       torch.bfloat16: dict(atol=1e-3, rtol=2 ** -7), torch.float16: dict(atol=1e-3, rtol=2 ** -10)}
TF32_VERSIONS = (25,)  # float32 operands rounded to tf32 (10 bits): 2^-11 relative on every product


def tolerance(version: int, dtype: torch.dtype) -> dict:
    return dict(atol=3e-2, rtol=1e-2) if version in TF32_VERSIONS else TOL[dtype]


def uses_tma(version: int) -> bool:
    return bool(emu.library().emu_uses_tma(version))


def tma_rows(layout: str, m: int, n: int, k: int, dtype: torch.dtype) -> bool:
    """Whether TMA can copy these operands' rows: their contiguous dimensions whole 16-byte multiples."""
    per = 16 // torch.empty(0, dtype=dtype).element_size()
    a_row, b_row = (m if layout[0] == "t" else k), (k if layout[1] == "t" else n)
    return a_row % per == 0 and b_row % per == 0


# Every version with every element type it is built for (cuda/dense_kernels.h's kVersionInfo).
CASES = [(v, d) for v in VERSIONS for d in emu.DTYPES if v in emu.versions(d)]
CASE_IDS = [f"{v}-{emu.DTYPE_NAMES[d]}" for v, d in CASES]


def reference(layout: str, a, b, bias, epilogue):
    """The float64 result from the same inputs, in the inputs' dtype for the comparison."""
    a, b = a.double(), b.double()
    bias = None if bias is None else bias.double()
    c = (a.t() if layout[0] == "t" else a) @ (b.t() if layout[1] == "t" else b)
    if epilogue == emu.KBIAS_SIGMOID:
        c = torch.sigmoid(c + bias if bias is not None else c)
    return c


def run_gemm(version, layout, a, b, bias, epilogue, m, n, k):
    c = torch.full((m, n), float("nan"), dtype=a.dtype)  # every output must be written
    emu.gemm(version, layout, a, b, c, bias, m, n, k, epilogue)
    return c


@pytest.mark.parametrize("version, dtype", CASES, ids=CASE_IDS)
def test_every_gemm_layout_and_epilogue_matches_torch(version, dtype):
    g = torch.Generator().manual_seed(version)
    for m, n, k in SHAPES:
        for layout in ("nt", "nn", "tn"):
            a = torch.randn((k, m) if layout[0] == "t" else (m, k), generator=g, dtype=dtype)
            b = torch.randn((n, k) if layout[1] == "t" else (k, n), generator=g, dtype=dtype)
            bias = torch.randn(n, generator=g, dtype=dtype)
            if uses_tma(version) and not tma_rows(layout, m, n, k, dtype):
                with pytest.raises(ValueError, match="through TMA, which copies rows of whole 16-byte multiples"):
                    run_gemm(version, layout, a, b, bias, emu.KPLAIN, m, n, k)
                continue
            for epilogue, bi in ((emu.KPLAIN, None), (emu.KBIAS_SIGMOID, bias), (emu.KBIAS_SIGMOID, None)):
                got = run_gemm(version, layout, a, b, bi, epilogue, m, n, k).double()
                torch.testing.assert_close(got, reference(layout, a, b, bi, epilogue), **tolerance(version, dtype),
                                           msg=lambda s, t=(layout, m, n, k, epilogue): f"v{version} {t}: {s}")


@pytest.mark.parametrize("version, dtype", CASES, ids=CASE_IDS)
def test_nan_and_inf_give_torchs_nan_pattern(version, dtype):
    """sigmoid(F.linear(...)) of NaN is NaN, of ±inf 0 or 1, of inf − inf NaN: the same here."""
    # (rows of 24 and 32: whole 16-byte multiples in every type, as the TMA versions need)
    x = torch.randn(19, 24, dtype=torch.float64)
    w = torch.randn(32, 24, dtype=torch.float64)
    b = torch.randn(32, dtype=torch.float64)
    x[0, 3], x[1, :] = float("nan"), float("inf")
    x[2, 5], x[3, 0] = float("inf"), float("-inf")
    w[4, 1], b[5], b[6] = float("nan"), float("inf"), float("-inf")
    xs, ws, bs = x.to(dtype), w.to(dtype), b.to(dtype)
    got = emu.forward(xs, ws, bs, version)
    want = torch.sigmoid(F.linear(xs.double(), ws.double(), bs.double()))
    assert torch.equal(got.isnan(), want.isnan()), f"v{version} {dtype}: NaN pattern differs"
    assert want.isnan().any() and (want == 1).any() and (want == 0).any()
    torch.testing.assert_close(got.double(), want, equal_nan=True, **tolerance(version, dtype))


def test_forward_and_backward_against_nn_linear_every_version():
    g = torch.Generator().manual_seed(1)
    for version, dtype in [(0, d) for d in emu.DTYPES] + CASES:
        # odd features, but whole 16-byte rows for the versions that take their operands through TMA
        fin, fout = (16, 24) if uses_tma(version) else (13, 9)
        x = torch.randn(3, 11, fin, generator=g, dtype=dtype, requires_grad=True)  # (*, in) input
        w = torch.randn(fout, fin, generator=g, dtype=dtype, requires_grad=True)
        b = torch.randn(fout, generator=g, dtype=dtype, requires_grad=True)
        grad = torch.randn(3, 11, fout, generator=g, dtype=dtype)
        y = emu.dense(version)(x, w, b)
        ours = [y, *torch.autograd.grad(y, (x, w, b), grad)]
        x64, w64, b64 = (t.detach().double().requires_grad_() for t in (x, w, b))
        y_ref = torch.sigmoid(F.linear(x64, w64, b64))
        ref = [y_ref, *torch.autograd.grad(y_ref, (x64, w64, b64), grad.double())]
        if dtype in (torch.bfloat16, torch.float16):
            # the project's rule for 16-bit types: the error against the float64 truth within 4× of
            # eager nn.Linear's own in that type, plus one rounding of the largest value
            y_e = torch.sigmoid(F.linear(x, w, b))
            eager = [y_e, *torch.autograd.grad(y_e, (x, w, b), grad)]
            for o, e, r in zip(ours, eager, ref):
                assert o.dtype == dtype
                err, err_eager = (o.double() - r).abs().max(), (e.double() - r).abs().max()
                assert err <= 4 * err_eager + torch.finfo(dtype).eps * r.abs().max(), (version, dtype, err, err_eager)
        else:
            for o, r in zip(ours, ref):
                assert o.dtype == dtype
                torch.testing.assert_close(o.double(), r, **tolerance(version, dtype),
                                           msg=lambda s, v=version, d=dtype: f"v{v} {d}: {s}")
        # an empty batch: y is empty, grad weight is zero, grad bias is zero
        x0 = torch.zeros(0, fin, dtype=dtype, requires_grad=True)
        w0 = torch.randn(fout, fin, dtype=dtype, requires_grad=True)
        b0 = torch.randn(fout, dtype=dtype, requires_grad=True)
        y0 = emu.dense(version)(x0, w0, b0)
        y0.sum().backward()
        assert y0.shape == (0, fout) and torch.equal(w0.grad, torch.zeros_like(w0)) and torch.equal(b0.grad, 0 * b0)


def test_bad_inputs_get_clear_errors():
    fn = emu.dense(8)
    with pytest.raises(TypeError, match="dtype mismatch"):
        fn(torch.randn(2, 3), torch.randn(4, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="in_features"):
        fn(torch.randn(2, 3), torch.randn(4, 5))
    beyond = max(VERSIONS) + 1
    with pytest.raises(ValueError, match=f"no emulated GEMM version {beyond}"):
        emu.gemm(beyond, "nt", torch.ones(1, 1), torch.ones(1, 1), torch.empty(1, 1), None, 1, 1, 1, emu.KPLAIN)
    # a version not built for a type refuses it, naming the version and the type
    with pytest.raises(ValueError, match="no emulated GEMM version 3 .* dtype torch.bfloat16"):
        one = torch.ones(1, 1, dtype=torch.bfloat16)
        emu.gemm(3, "nt", one, one, torch.empty(1, 1, dtype=torch.bfloat16), None, 1, 1, 1, emu.KPLAIN)


@pytest.mark.parametrize("version", emu.GRAD_VERSIONS)
def test_sigmoid_grad_kernels_match_torch_and_are_bit_identical_run_to_run(version):
    g = torch.Generator().manual_seed(2)
    # (1025, 64): v3 spreads the rows over 4 blocks per column group (8 emulated SMs)
    for rows, cols in ((1, 1), (0, 5), (33, 31), (1025, 64), (70, 4)):
        for dtype in (torch.float32, torch.float64):
            x4s = (False, True) if version == 1 and dtype == torch.float32 and cols % 4 == 0 else (False,)
            for x4 in x4s:
                gr = torch.randn(rows, cols, generator=g, dtype=dtype)
                y = torch.rand(rows, cols, generator=g, dtype=dtype)
                dz, db = torch.empty_like(y), torch.empty(cols, dtype=dtype)
                emu.sigmoid_grad(gr, y, dz, db, version, x4=x4)
                want = gr * y * (1 - y)
                torch.testing.assert_close(dz, want, **TOL[dtype])
                torch.testing.assert_close(db, want.sum(0), **TOL[dtype])
                def again(gr=gr, y=y, x4=x4):  # "the same bits on every run", whatever order the blocks run in
                    dz2, db2 = torch.empty_like(y), torch.empty(y.shape[1], dtype=y.dtype)
                    emu.sigmoid_grad(gr, y, dz2, db2, version, x4=x4)
                    return dz2, db2

                for dz2, db2 in in_block_orders(again):
                    assert torch.equal(db, db2) and torch.equal(dz, dz2), "the bias gradient changed with the order"
    dz_only = torch.empty(70, 4)
    emu.sigmoid_grad(torch.ones(70, 4), torch.full((70, 4), 0.5), dz_only, None, version)  # no bias gradient
    assert torch.equal(dz_only, torch.full((70, 4), 0.25))


def test_small_batch_paths_are_taken_and_deterministic():
    """With 8 emulated SMs, B = 32 gives v8 two tiles: version 0 must pick v9 and split K."""
    lib = emu.library()

    def work(m: int, n: int, k: int, sms: int) -> int:
        return lib.emu_gemm_workspace(emu.resolve(0, m, n, k, torch.float32, sms), CODE_F32, m, n, k, sms)

    assert work(32, 200, 4096, emu.SM_COUNT) == 4 * 32 * 200  # 4 slices × M × N
    assert work(32, 200, 4096, 2) == 0  # two SMs: two tiles fill them, plain v8
    # the chapter's example: B = 32, I = O = 4096 on 132 SMs → 32 tiles × 5 slices = 160 blocks
    assert work(32, 4096, 4096, 132) == 5 * 32 * 4096
    assert lib.emu_sigmoid_grad_workspace(3, 4096, 64, emu.SM_COUNT) == 4 * 64
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(32, 700, generator=g), torch.randn(200, 700, generator=g)
    bias = torch.randn(200, generator=g)
    runs = in_block_orders(lambda: run_gemm(0, "nt", a, b, bias, emu.KBIAS_SIGMOID, 32, 200, 700))
    assert all(torch.equal(runs[0], r) for r in runs[1:]), "split-K's bits depend on the order its blocks run in"
    torch.testing.assert_close(runs[0], torch.sigmoid(a @ b.t() + bias), **TOL[torch.float32])


# The autotuning candidates' shapes as cuda/static_report.py lists them (the test below checks them
# against the header's, through the emulation).
TUNE_SHAPES = load_script("cuda/static_report.py").TUNE_CANDIDATES


@pytest.mark.parametrize("index", range(len(TUNE_SHAPES)), ids=lambda i: f"tune{i}")
def test_every_autotuning_candidate_matches_torch_in_every_layout(index):
    """Each candidate (v11's template at another shape), float32, at every tile edge, each layout
    and epilogue; float64 is refused with a one-line error, never computed."""
    candidate = emu.tune_candidates()[index]
    g = torch.Generator().manual_seed(index)
    for m, n, k in SHAPES:
        for layout in ("nt", "nn", "tn"):
            a = torch.randn((k, m) if layout[0] == "t" else (m, k), generator=g)
            b = torch.randn((n, k) if layout[1] == "t" else (k, n), generator=g)
            bias = torch.randn(n, generator=g)
            for epilogue, bi in ((emu.KPLAIN, None), (emu.KBIAS_SIGMOID, bias)):
                got = run_gemm(candidate["version"], layout, a, b, bi, epilogue, m, n, k).double()
                torch.testing.assert_close(got, reference(layout, a, b, bi, epilogue), **TOL[torch.float32],
                                           msg=lambda s, t=(layout, m, n, k, epilogue): f"{candidate}: {t}: {s}")
    one = torch.ones(1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=f"no emulated GEMM version {candidate['version']} .* torch.float64"):
        emu.gemm(candidate["version"], "nt", one, one, torch.empty_like(one), None, 1, 1, 1, emu.KPLAIN)


def test_candidates_are_the_ones_the_static_report_knows():
    """The candidates' shapes (the header, through the emulation) and cuda/static_report.py's
    TUNE_CANDIDATES, from which it computes their napkin maths, are the same list; each shape
    cuts evenly into warps and pieces."""
    candidates = emu.tune_candidates()
    assert [tuple(c[f] for f in emu.TUNE_FIELDS[:8]) for c in candidates] == TUNE_SHAPES and len(candidates) >= 6
    for c in candidates:
        assert c["bm"] % c["wm"] == 0 and c["bn"] % c["wn"] == 0 and c["wm"] % (8 * c["tm"]) == 0
        assert c["wn"] % (4 * c["tn"]) == 0 and c["threads"] == (c["bm"] // c["wm"]) * (c["bn"] // c["wn"]) * 32


def test_version_0_follows_the_committed_table():
    """cuda/gemm_choice.h's defaults: in float32, v8 where v8's tiles fill the SMs (or K is too
    shallow to split), else v9, so v9 exactly where v9 would split K; in float64, bfloat16 and
    float16, which no GPU record confirms, ATen's ops, except where a stage carries kernels only
    (the PTX stage), which takes v8 and v9 as float32 does."""
    lib = emu.library()
    for m in (1, 32, 100, 129, 1000, 4096):
        for n in (64, 1000, 4096):
            for k in (100, 300, 4096):
                for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
                    for sms in (8, 114, 132):
                        splits = lib.emu_gemm_workspace(9, emu.dtype_code(dtype), m, n, k, sms) > 0
                        where = (m, n, k, dtype, sms)
                        lesson = 9 if splits else 8
                        assert emu.resolve(0, m, n, k, dtype, sms, kernels_only=True) == lesson, where
                        assert emu.resolve(0, m, n, k, dtype, sms) == (lesson if dtype == torch.float32 else emu.ATEN)
    assert emu.grad_kernels_confirmed(torch.float32)
    assert not any(emu.grad_kernels_confirmed(t) for t in (torch.float64, torch.bfloat16, torch.float16))


def test_one_resolver_sizes_the_workspace_of_what_the_launch_runs():
    """On sm_90a, with the predicted table: bfloat16 at B = 32, I = 4100 (rows of 8,200 bytes, which
    TMA cannot copy) runs v12, whose 17 slices need 17·32·4096 floats of workspace, not v35's 4;
    at I = 4096 it runs v35. Version 0's workspace is refused until resolved: its answer depends
    on the operands, which the workspace's arguments do not hold."""
    lib, bf16 = emu.library(), emu.dtype_code(torch.bfloat16)
    assert lib.emu_gemm_workspace(0, bf16, 32, 4096, 4100, 132) == -1
    resolve = functools.partial(emu.resolve, 0, 32, 4096, dtype=torch.bfloat16, sm_count=132, arch=90, predicted=True)
    assert resolve(k=4100) == 12 and resolve(k=4096) == 35 and resolve(k=4096, aligned=False) == 12
    assert resolve(k=4096, arch=80) == 12 and resolve(k=4096, layout="tn") == 35
    assert lib.emu_gemm_workspace(12, bf16, 32, 4096, 4100, 132) == 17 * 32 * 4096
    assert lib.emu_gemm_workspace(35, bf16, 32, 4096, 4096, 132) == 4 * 32 * 4096
    # the fills-the-GPU class: v33 where TMA can, else v24; kernels_only never changes a kernel's choice
    big = functools.partial(emu.resolve, 0, 4096, 4096, 4096, torch.bfloat16, 132, arch=90, predicted=True)
    assert big() == 33 == big(kernels_only=True) and big(aligned=False) == 24 and big(arch=89) == 24
    # a version asked for by number is that version, whatever the table
    assert emu.resolve(31, 32, 4096, 4100, torch.bfloat16, 132) == 31


def test_skinny_batches_split_k_over_every_sm_deterministically():
    """v12 at B = 32, I = O = 4096 on 132 SMs: 32 tiles of 32×128 × 16 slices of K = 512 blocks,
    within the 4 per SM that fit (float32); partials added in slice order, the same bits on every run."""
    lib = emu.library()
    assert lib.emu_gemm_workspace(12, CODE_F32, 32, 4096, 4096, 132) == 16 * 32 * 4096
    assert lib.emu_gemm_workspace(12, CODE_F64, 32, 4096, 4096, 132) == 9 * 32 * 4096  # float64: 2 blocks an SM
    assert lib.emu_gemm_workspace(12, CODE_F32, 4096, 4096, 4096, 132) == 0  # a large batch fills the SMs unsplit
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(32, 1000, generator=g), torch.randn(70, 1000, generator=g)
    bias = torch.randn(70, generator=g)
    assert lib.emu_gemm_workspace(12, CODE_F32, 32, 70, 1000, emu.SM_COUNT) > 0  # the split path runs here
    runs = in_block_orders(lambda: run_gemm(12, "nt", a, b, bias, emu.KBIAS_SIGMOID, 32, 70, 1000))
    assert all(torch.equal(runs[0], r) for r in runs[1:]), "v12's bits depend on the order its blocks run in"
    torch.testing.assert_close(runs[0], torch.sigmoid(a @ b.t() + bias), **TOL[torch.float32])


BLOCK_ORDERS = (0, 1, 2, 3)  # as written, then three shuffled orders (emu_set_block_order)


def in_block_orders(run):
    """run() once per block order of the emulation; the order is set back to the written one after."""
    lib = emu.library()
    lib.emu_set_block_order.argtypes = [ctypes.c_uint]
    try:
        out = []
        for seed in BLOCK_ORDERS:
            lib.emu_set_block_order(seed)
            out.append(run())
        return out
    finally:
        lib.emu_set_block_order(0)


def test_the_shuffled_block_orders_expose_a_result_that_depends_on_the_order():
    """The check above can fail: a planted kernel whose blocks add their rows into one output in the
    order they run (no atomics, as only the emulation can) gives different bits in the shuffled orders."""
    lib = emu.library()
    p = ctypes.c_void_p
    lib.emu_planted_order_dependent.argtypes = [p, p, ctypes.c_int64, ctypes.c_int64]
    g = torch.Generator().manual_seed(7)
    parts = torch.randn(64, 256, generator=g) * torch.logspace(-6, 6, 64)[:, None]  # magnitudes that round apart

    def run():
        out = torch.zeros(256)
        assert lib.emu_planted_order_dependent(parts.data_ptr(), out.data_ptr(), 64, 256) == 0
        return out

    runs = in_block_orders(run)
    assert not all(torch.equal(runs[0], r) for r in runs[1:])
    torch.testing.assert_close(runs[0], parts.sum(0), rtol=1e-5, atol=1e-3)


F64_LAST = max(v for v in VERSIONS if v in emu.versions(torch.float64))  # grad_check's gradcheck is float64's


def test_grad_check_script_emulated():
    result = run_script("grad_check.py", "cuda", "--emulate", "--kernel", str(F64_LAST), "-b", "3", "-i", "5",
                        "-o", "4", "--no-bias")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "all checks passed" in result.stdout and "FAIL" not in result.stdout
    # before the checks, the version's idea and what they will cost, measured at these sizes
    idea = re.escape(emu.idea(F64_LAST))
    assert re.search(rf"^v{F64_LAST}: {idea}; about \d+\.\d s$", result.stdout, re.M), result.stdout
    bad = run_script("grad_check.py", "cuda", "--emulate", "--kernel", "99")
    assert bad.returncode == 2 and "--kernel must be one of" in bad.stderr


def test_emulated_script_prints_the_slices_the_chapter_asks_for():
    result = run_script("cuda/emulated.py", "--slices", "2", "8", "114", "132")
    assert result.returncode == 0, result.stderr
    got = [int(x) for x in re.findall(r"SMs: (\d+)", result.stdout)]
    lib = emu.library()
    assert got == [max(1, lib.emu_gemm_workspace(emu.resolve(0, 32, 4096, 4096, torch.float32, s), CODE_F32, 32, 4096,
                                                 4096, s) // (32 * 4096))
                   for s in (2, 8, 114, 132)] == [1, 1, 4, 5]


@pytest.mark.slow
def test_emulated_script_times_fibers_against_os_threads():
    result = run_script("cuda/emulated.py", "-m", "20", "-n", "20", "-k", "20", "--versions", "1", "3")
    assert result.returncode == 0, result.stderr
    rows = re.findall(r"^\| (\d) \| (\d+) \| [\d.]+ \| [\d.]+ \| \d+ \|$", result.stdout, re.M)
    assert rows == [("1", "256"), ("3", "1024")], result.stdout
    too_big = run_script("cuda/emulated.py", "-m", "1000", "-n", "1000", "-k", "1000")
    assert too_big.returncode == 2 and "would take minutes" in too_big.stderr


@pytest.mark.skipif(REASONS["cuda"] is None, reason="the cuda mode runs here")
def test_grad_check_without_a_gpu_points_to_the_emulation():
    result = run_script("grad_check.py", "cuda")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "python grad_check.py cuda --emulate" in result.stderr


# ---- the emulation's ways of running a block's threads, on a kernel whose answer is known ----

BACKENDS = {"fibers": [], "ucontext": ["-DCUDA_EMU_UCONTEXT"], "threads": ["-DCUDA_EMU_THREADS"]}
PROGRAM = r"""
#include "emulate/cuda_emu.h"
// Each block sums its 256 inputs with a tree through shared memory (a barrier per level), then
// every thread also takes its lane neighbour's value with a shuffle.
void tree_sum(const int* in, int* out) {
  __shared__ int s[256];
  const unsigned t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
  s[t] = in[i];
  __syncthreads();
  for (unsigned stride = 128; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
  }
  out[i] = s[0] * 1000 + __shfl_xor_sync(0xffffffffu, int(t), 1);
}
// A barrier inside a branch that only some threads take.
void divergent(int* out) {
  if (threadIdx.x < 5) __syncthreads();
  out[threadIdx.x] = 1;
}
int main(int argc, char** argv) {
  if (argc > 1) {  // the broken kernel: the launch must fail, not hang
    int out[64];
    const int rc = emu::launch(dim3{1, 1, 1}, dim3{64, 1, 1}, [&] { divergent(out); });
    std::printf("status %d\n", rc);
    return 0;
  }
  int in[3 * 256], out[3 * 256];
  for (int i = 0; i < 3 * 256; ++i) in[i] = (i * 7919) % 101;
  if (emu::launch(dim3{3, 1, 1}, dim3{256, 1, 1}, [&] { tree_sum(in, out); }) != 0) return 1;
  for (int b = 0; b < 3; ++b) {
    int sum = 0;
    for (int t = 0; t < 256; ++t) sum += in[b * 256 + t];
    for (int t = 0; t < 256; ++t)
      if (out[b * 256 + t] != sum * 1000 + (t ^ 1)) return std::printf("wrong at block %d thread %d\n", b, t), 1;
  }
  std::printf("ok\n");
  return 0;
}
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_each_way_of_running_threads_gives_the_known_answer(backend, tmp_path):
    """Barriers, shared memory, blockIdx/threadIdx and shuffles, the same in every backend; and
    a barrier that not every thread reaches stops the launch with a message (fibers; OS
    threads hang there, as a GPU does)."""
    if CXX is None:
        pytest.skip("needs a C++ compiler")
    (tmp_path / "p.cpp").write_text(PROGRAM)
    exe = tmp_path / "p"
    build = subprocess.run([CXX, "-std=c++17", "-O2", "-pthread", *BACKENDS[backend], f"-I{ROOT / 'cuda'}",
                            str(tmp_path / "p.cpp"), "-o", str(exe)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    result = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
    if backend == "threads":
        return
    broken = subprocess.run([str(exe), "broken"], capture_output=True, text=True, timeout=60)
    assert broken.stdout.strip() == "status 2", broken.stdout + broken.stderr
    assert ("5 threads wait at __syncthreads, 0 on an mbarrier, 0 at a warp-wide instruction, 59 have returned"
            in broken.stderr)


@pytest.mark.slow
def test_the_kernels_give_the_same_bits_on_fibers_and_on_os_threads():
    """The library built with OS threads (what ThreadSanitizer runs) against the default build:
    a GEMM per version, element type and layout and the shuffling backward kernel, bit for bit."""
    threads = emu.load(("-DCUDA_EMU_THREADS",))
    g = torch.Generator().manual_seed(4)
    candidates = [(c["version"], torch.float32) for c in emu.tune_candidates()]
    for version, dtype in [*CASES, *candidates]:
        for layout in ("nt", "nn", "tn"):
            # TMA copies whole 16-byte rows: 40 and 72 elements are such rows in every type
            m, n, k = (40, 40, 72) if uses_tma(version) else (33, 40, 70)
            a = torch.randn((k, m) if layout[0] == "t" else (m, k), generator=g, dtype=dtype)
            b = torch.randn((n, k) if layout[1] == "t" else (k, n), generator=g, dtype=dtype)
            bias = torch.randn(n, generator=g, dtype=dtype)
            ours = run_gemm(version, layout, a, b, bias, emu.KBIAS_SIGMOID, m, n, k)
            c = torch.full((m, n), float("nan"), dtype=dtype)
            emu.gemm(version, layout, a, b, c, bias, m, n, k, emu.KBIAS_SIGMOID, lib=threads)
            assert torch.equal(ours, c), (version, dtype, layout)
    gr, y = torch.randn(300, 36, generator=g), torch.rand(300, 36, generator=g)
    for version in emu.GRAD_VERSIONS:
        outs = []
        for lib in (None, threads):
            dz, db = torch.empty_like(y), torch.empty(36)
            emu.sigmoid_grad(gr, y, dz, db, version, lib=lib)
            outs.append((dz, db))
        assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1]), version


# ---- the same kernels under the sanitizers (a standalone driver: cuda/emulate/driver.cpp) ----

def build_drivers(tmp_path: Path, *builds: tuple[str, Path]) -> list[Path]:
    """The driver built once per (sanitizer, copy of cuda/), the compiles side by side (each is one
    translation unit, 20 to 40 seconds on one core)."""
    if CXX is None:
        pytest.skip("needs a C++ compiler")
    exes, procs = [], []
    for n, (sanitizer, source_root) in enumerate(builds):
        exes.append(tmp_path / f"driver_{sanitizer}_{n}")
        cmd = [CXX, "-std=c++17", "-O1", "-g", "-pthread", f"-fsanitize={sanitizer}", "-fno-omit-frame-pointer",
               f"-I{source_root}", str(source_root / "emulate" / "driver.cpp"), "-o", str(exes[-1])]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    errors = [proc.communicate(timeout=600)[1] for proc in procs]
    for (sanitizer, _), proc, stderr in zip(builds, procs, errors):
        runtime = {"address": "asan", "thread": "tsan"}[sanitizer]
        if proc.returncode != 0 and "cannot find" in stderr and (runtime in stderr or "sanitize" in stderr):
            pytest.skip(f"this compiler has no {sanitizer} sanitizer runtime: {stderr[-300:]}")
        assert proc.returncode == 0, stderr[-4000:]
    return exes


def build_driver(tmp_path: Path, sanitizer: str, source_root: Path = ROOT / "cuda") -> Path:
    return build_drivers(tmp_path, (sanitizer, source_root))[0]


def run_driver(exe: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    result = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=900,
                            env={**os.environ, **(env or {})})
    if "unexpected memory mapping" in result.stderr:  # old TSan runtimes on kernels with high ASLR entropy
        pytest.skip(f"ThreadSanitizer cannot run on this kernel: {result.stderr[-300:]}")
    return result


# "N of N kernel runs matched the reference (V GEMM versions and candidates, C of them candidates)"
DRIVER_LINE = re.compile(r"(\d+) of (\d+) kernel runs matched the reference \((\d+) GEMM versions and candidates, "
                         r"(\d+) of them candidates\)")


def run_every_kernel(exe: Path, *args: str, env: dict | None = None) -> None:
    """The driver's whole list in two processes side by side (one on a single core), each taking
    every other version (--shard i/n); every process must pass, and together they must have run
    every version and candidate once."""
    shards = max(1, min(2, os.cpu_count() or 1))
    with ThreadPoolExecutor(shards) as pool:
        results = list(pool.map(lambda i: run_driver(exe, *args, "--shard", f"{i}/{shards}", env=env), range(shards)))
    totals = [0, 0]
    for result in results:
        assert "Sanitizer" not in result.stderr, result.stderr[-4000:]
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
        line = DRIVER_LINE.search(result.stdout)
        assert line and line[1] == line[2], result.stdout[-2000:]
        totals = [totals[0] + int(line[3]), totals[1] + int(line[4])]
    assert totals == [len(VERSIONS) + len(TUNE_SHAPES), len(TUNE_SHAPES)], totals


@pytest.fixture(scope="module")
def sanitized(tmp_path_factory) -> dict[str, Path]:
    """The driver under each sanitizer, built side by side."""
    builds = ("address", ROOT / "cuda"), ("thread", ROOT / "cuda")
    return dict(zip(("address", "thread"), build_drivers(tmp_path_factory.mktemp("sanitized"), *builds)))


@pytest.mark.slow
def test_every_kernel_under_address_sanitizer(sanitized):
    run_every_kernel(sanitized["address"], env={"ASAN_OPTIONS": "detect_leaks=0"})


@pytest.mark.slow
def test_every_kernel_under_thread_sanitizer(sanitized):
    run_every_kernel(sanitized["thread"], "--quick")


@pytest.mark.slow
def test_the_driver_refuses_a_shard_or_version_it_cannot_take(sanitized):
    for args in (["--shard", "2/2"], ["--shard", "x"], ["--shard"], ["-1"], ["--fast"]):
        result = run_driver(sanitized["address"], *args, env={"ASAN_OPTIONS": "detect_leaks=0"})
        assert result.returncode == 2 and "usage:" in result.stderr and not result.stdout, (args, result.stderr)


@pytest.mark.slow
def test_thread_sanitizer_reports_a_missing_syncthreads(tmp_path):
    """The race check can fail: the shared-memory kernel without the __syncthreads that ends a
    k step (fast threads overwrite the tile that slow ones still read) must be reported."""
    copy = tmp_path / "cuda"
    shutil.copytree(ROOT / "cuda", copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    path, version = racy_source(copy)
    exe = build_driver(tmp_path, "thread", copy)
    result = run_driver(exe, "--quick", str(version), env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert "WARNING: ThreadSanitizer: data race" in result.stderr, result.stderr[-3000:]
    assert path.name in result.stderr  # the report points into the edited kernel
    assert result.returncode != 0


def racy_source(copy: Path) -> tuple[Path, int]:
    """Remove the second __syncthreads of the shared-memory-tile version in a copy of cuda/."""
    path = copy / "kernels" / "v3_smem.cuh"
    text = path.read_text()
    start = text.index("void gemm_v3(")
    first = text.index("__syncthreads();", start)
    second = text.index("__syncthreads();", first + 1)
    path.write_text(text[:second] + "/* removed */" + text[second + len("__syncthreads();"):])
    return path, 3


@pytest.mark.slow
def test_a_pipeline_that_reads_a_stage_before_its_copies_land_is_caught(tmp_path):
    """v24's ring of cp.async stages, with its wait off by one (it waits for one group too few, so
    the step it computes on has not landed): the emulation makes each copy only at the wait that
    completes it, so the kernel reads the stage's old bytes and its results are wrong, as they may be
    on a GPU. Without the barrier after the wait, ThreadSanitizer reports the race as well."""
    copy = tmp_path / "cuda"
    shutil.copytree(ROOT / "cuda", copy, ignore=shutil.ignore_patterns("*.py", "*.md"))
    path = copy / "tensor_cores" / "v24_pipeline.cuh"
    text = path.read_text()
    assert text.count("cp_async_wait<kV24Stages - 2>();") == 1
    path.write_text(text.replace("cp_async_wait<kV24Stages - 2>();", "cp_async_wait<kV24Stages - 1>();"))
    barrier = "__syncthreads();                  // ...everyone's"
    assert text.count(barrier) == 1
    unbarred = shutil.copytree(copy, tmp_path / "unbarred")
    (unbarred / path.relative_to(copy)).write_text(text.replace(barrier, "/* removed */ // ...everyone's"))
    wrong_exe, racy_exe = build_drivers(tmp_path, ("address", copy), ("thread", unbarred))
    wrong = run_driver(wrong_exe, "--quick", "24", env={"ASAN_OPTIONS": "detect_leaks=0"})
    assert "MISMATCH v24" in wrong.stdout and wrong.returncode != 0, wrong.stdout[-2000:]
    racy = run_driver(racy_exe, "--quick", "24", env={"TSAN_OPTIONS": "halt_on_error=1"})
    assert "WARNING: ThreadSanitizer: data race" in racy.stderr and racy.returncode != 0, racy.stderr[-3000:]
