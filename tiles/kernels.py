"""The Dense layer's three Triton kernels: one program per output tile, masked for any shape.

    forward    y  = sigmoid(x Wᵀ + b)                    tile of y  (BLOCK_M × BLOCK_N), loop over K
    grad_x     dx = dz W,   dz = g · y (1 − y)           tile of dx (BLOCK_M × BLOCK_K), loop over N
    grad_w     dW = dzᵀ x,  db = Σ_rows dz               tile of dW (BLOCK_N × BLOCK_K), loop over M

Shapes: x is M×K, W is N×K, y and g are M×N (M rows, K in_features, N out_features). Every
tensor comes with its two strides, so transposed or expanded (stride 0) inputs need no copy.
Offsets are 64-bit (a tensor may hold more than 2³¹ elements).

Nothing here imports torch, and nothing decides how the kernels run: whether ``@triton.jit``
makes a GPU kernel or an interpreted one is decided by TRITON_INTERPRET when this file is
executed (tiles/dense.py sets it on a machine without a GPU; tiles/compiler_report.py
clears it to compile for sm_90).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Tile configurations, as keyword arguments of a launch. On a GPU the forward is autotuned over
# FORWARD_CONFIGS; the first is the hand-written kernels' tile (chapter 4, v5-v8: 128×128 outputs
# per block of 256 threads), and the one tiles/compiler_report.py compiles for sm_90. The
# backward keeps BACKWARD_CONFIG (tiles/dense.py says why), with 8 warps: with 4, ptxas spills
# grad_x_kernel's registers for sm_90 (the chapter's exercise 2). The interpreter runs one
# program at a time in NumPy: small tiles, and 16, the least tl.dot accepts, would make many more.
FORWARD_CONFIGS = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s}
                   for bm, bn, bk, w, s in [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                                            (64, 64, 32, 4, 4), (64, 64, 16, 4, 2), (32, 32, 32, 4, 2)]]
BACKWARD_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3}
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}


@triton.jit
def _sigmoid(z):
    # 1 / (1 + e^-z): z = +inf gives 1/(1+0) = 1, z = -inf gives 1/(1+inf) = 0, NaN stays NaN,
    # as torch.sigmoid. (e^z / (1 + e^z) would give inf/inf = NaN for z = +inf.)
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_b, stride_ym, stride_yn,
                   HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = tl.arange(0, BLOCK_K).to(tl.int64)
    # A BLOCK_M × BLOCK_K tile of x and a BLOCK_K × BLOCK_N tile of Wᵀ: the same pointers,
    # moved BLOCK_K columns on at each step.
    x_ptrs = x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk
    w_ptrs = w_ptr + rk[:, None] * stride_wk + rn[None, :] * stride_wn
    # The step, in 64 bits too: a stride that fits 32 bits, times BLOCK_K, may not.
    x_step = BLOCK_K * tl.cast(stride_xk, tl.int64)
    w_step = BLOCK_K * tl.cast(stride_wk, tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=x_ptr.dtype.element_ty)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        # Out of range: 0, which adds nothing to any output that is stored.
        x = tl.load(x_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(x, w, acc, input_precision=PRECISION, out_dtype=acc.dtype)
        x_ptrs += x_step
        w_ptrs += w_step
    # The epilogue: bias and sigmoid on the accumulator, in registers; z never reaches memory.
    if HAS_BIAS:
        acc += tl.load(b_ptr + rn * stride_b, mask=rn < N, other=0.0)[None, :]
    y = _sigmoid(acc)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn):
    """dz = g · y (1 − y) for one BLOCK_M × BLOCK_N tile, computed where it is used: dz is
    never written to memory. Out of range it is 0 (g = y = 0 there)."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    g = tl.load(g_ptr + rm[:, None] * stride_gm + rn[None, :] * stride_gn, mask=mask, other=0.0)
    y = tl.load(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, mask=mask, other=0.0)
    return g * (1.0 - y) * y  # in torch.sigmoid's backward's order: the same bits


@triton.jit
def grad_x_kernel(g_ptr, y_ptr, w_ptr, dx_ptr, M, N, K,
                  stride_gm, stride_gn, stride_ym, stride_yn, stride_wn, stride_wk, stride_dxm, stride_dxk,
                  PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rk = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=w_ptr.dtype.element_ty)
    for n in range(0, tl.cdiv(N, BLOCK_N)):
        rn = (n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        dz = _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk,
                    mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc = tl.dot(dz, w, acc, input_precision=PRECISION, out_dtype=acc.dtype)
    tl.store(dx_ptr + rm[:, None] * stride_dxm + rk[None, :] * stride_dxk, acc,
             mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def grad_w_kernel(g_ptr, y_ptr, x_ptr, dw_ptr, db_ptr, M, N, K,
                  stride_gm, stride_gn, stride_ym, stride_yn, stride_xm, stride_xk, stride_dwn, stride_dwk,
                  DW: tl.constexpr, DB: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=x_ptr.dtype.element_ty)
    db = tl.zeros((BLOCK_N,), dtype=x_ptr.dtype.element_ty)
    for m in range(0, tl.cdiv(M, BLOCK_M)):
        rm = (m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        dz = _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn)
        if DW:
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            acc = tl.dot(tl.trans(dz), x, acc, input_precision=PRECISION, out_dtype=acc.dtype)
        if DB:
            # The bias gradient rides along: this program already holds every row of dz for
            # its columns, in a fixed order, so the sum is the same bit for bit on every run
            # (no atomics). Programs with pid_k > 0 compute it too and do not store it.
            db += tl.sum(dz, axis=0)
    if DW:
        tl.store(dw_ptr + rn[:, None] * stride_dwn + rk[None, :] * stride_dwk, acc,
                 mask=(rn[:, None] < N) & (rk[None, :] < K))
    if DB:
        if pid_k == 0:
            tl.store(db_ptr + rn, db, mask=rn < N)
