"""The Dense layer's three Triton kernels: one program per output tile, masked for any shape.

    forward    y  = sigmoid(x Wᵀ + b)                    tile of y  (BLOCK_M × BLOCK_N), loop over K
    grad_x     dx = dz W,   dz = g · y (1 − y)           tile of dx (BLOCK_M × BLOCK_K), loop over N
    grad_w     dW = dzᵀ x,  db = Σ_rows dz               tile of dW (BLOCK_N × BLOCK_K), loop over M

Shapes: x is M×K, W is N×K, y and g are M×N (M rows, K in_features, N out_features). Every
tensor comes with its two strides, so transposed or expanded (stride 0) inputs need no copy.
Offsets are 64-bit (a tensor may hold more than 2³¹ elements).

Element types: float32 and float64 compute in their own type; bfloat16 and float16 tiles are
multiplied by tl.dot into a float32 accumulator, the epilogue (bias, sigmoid, dz) is float32,
and each result is rounded once, to nearest even, as it is stored. The constexpr INTERPRETED
(the stage passes its own; by default, how this file's kernels run) routes bfloat16 around
Triton 3.6's interpreter, which gets three bfloat16 operations wrong: tl.dot multiplies the raw
bit patterns, float32 → bfloat16 truncates, and bfloat16 → float32 gets subnormals wrong. There
every conversion is done on the bits, exactly, and the dot is a float32 dot of the exactly
widened tiles (a product of two bfloat16 fits float32's 24 bits): the products a bfloat16 dot
with a float32 accumulator forms. Compiled, INTERPRETED is False and the kernel does the
bfloat16 dot itself (tiles/compiler_report.py shows its instructions).

Nothing here imports torch, and nothing decides how the kernels run: whether ``@triton.jit``
makes a GPU kernel or an interpreted one is decided by TRITON_INTERPRET when this file is
executed (tiles/dense.py sets it on a machine without a GPU; tiles/compiler_report.py
clears it to compile for sm_90).
"""

from __future__ import annotations

import triton
import triton.language as tl

# Tile configurations, as keyword arguments of a launch. On a GPU the forward is autotuned over
# FORWARD_CONFIGS; the first is the hand-written kernels' tile (chapter 3, v5-v8: 128×128 outputs
# per block of 256 threads), and the one tiles/compiler_report.py compiles for sm_90. The
# backward keeps BACKWARD_CONFIG (tiles/dense.py says why), with 8 warps: with 4, ptxas spills
# grad_x_kernel's registers for sm_90 (the chapter's exercise 2). The interpreter runs one
# program at a time in NumPy: small tiles, and 16, the least tl.dot accepts, would make many more.
FORWARD_CONFIGS = [{"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "num_warps": w, "num_stages": s}
                   for bm, bn, bk, w, s in [(128, 128, 32, 8, 3), (128, 64, 32, 4, 4), (64, 128, 32, 4, 4),
                                            (64, 64, 32, 4, 4), (64, 64, 16, 4, 2), (32, 32, 32, 4, 2)]]
BACKWARD_CONFIG = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32, "num_warps": 8, "num_stages": 3}
INTERPRETER_CONFIG = {"BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 32}
# What @triton.jit reads below (TRITON_INTERPRET, through Triton's knobs): the kernels' INTERPRETED
# defaults to it, so a launch that does not say gets the bfloat16 arithmetic right either way.
RUN_BY_INTERPRETER = bool(triton.knobs.runtime.interpret)


@triton.jit
def _sigmoid(z):
    # 1 / (1 + e^-z): z = +inf gives 1/(1+0) = 1, z = -inf gives 1/(1+inf) = 0, NaN stays NaN,
    # as torch.sigmoid. (e^z / (1 + e^z) would give inf/inf = NaN for z = +inf.)
    return 1.0 / (1.0 + tl.exp(-z))


@triton.jit
def _widen(t, INTERPRETED: tl.constexpr):
    """t in its accumulator's type, exactly: float64 stays float64, the rest becomes float32."""
    # One return, in branches the compiler settles from the types (it refuses returns of two types).
    if t.dtype == tl.float64:
        wide = t
    elif INTERPRETED and t.dtype == tl.bfloat16:
        # A bfloat16 is the top half of a float32: shift its bits into place.
        wide = (t.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    else:
        wide = t.to(tl.float32)
    return wide


@triton.jit
def _narrow(v, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """v (in its accumulator's type) rounded once to the tensor's type, to nearest even."""
    if INTERPRETED and dtype == tl.bfloat16:
        # Round to nearest even on the bits: add 0x7FFF, plus 1 when the kept half is odd, and
        # keep the top 16 bits (a carry moves into the exponent, up to inf, as it should). NaN
        # keeps its sign and stays NaN (the addition could carry its payload into the sign).
        u = v.to(tl.uint32, bitcast=True)
        rounded = (u + (0x7FFF + ((u >> 16) & 1))) >> 16
        rounded = tl.where(v != v, (u >> 16) | 0x40, rounded)
        narrow = rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        narrow = v.to(dtype)
    return narrow


@triton.jit
def _operand(t, INTERPRETED: tl.constexpr):
    """A tile as tl.dot takes it: as it is, but for bfloat16 under the interpreter, whose dot
    multiplies bfloat16 bit patterns; widened exactly, the float32 dot computes the same products."""
    if INTERPRETED and t.dtype == tl.bfloat16:
        operand = _widen(t, INTERPRETED)
    else:
        operand = t
    return operand


@triton.jit
def forward_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                   stride_xm, stride_xk, stride_wn, stride_wk, stride_b, stride_ym, stride_yn,
                   HAS_BIAS: tl.constexpr, PRECISION: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   INTERPRETED: tl.constexpr = RUN_BY_INTERPRETER):
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
    acc_type = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32  # bfloat16, float16: float32
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=acc_type)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        # Out of range: 0, which adds nothing to any output that is stored.
        x = tl.load(x_ptrs, mask=(rm[:, None] < M) & (rk[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(rk[:, None] < k_left) & (rn[None, :] < N), other=0.0)
        acc = tl.dot(_operand(x, INTERPRETED), _operand(w, INTERPRETED), acc,
                     input_precision=PRECISION, out_dtype=acc.dtype)
        x_ptrs += x_step
        w_ptrs += w_step
    # The epilogue: bias and sigmoid on the accumulator, in registers; z never reaches memory.
    if HAS_BIAS:
        acc += _widen(tl.load(b_ptr + rn * stride_b, mask=rn < N, other=0.0), INTERPRETED)[None, :]
    y = _narrow(_sigmoid(acc), y_ptr.dtype.element_ty, INTERPRETED)  # the one rounding
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, y, mask=(rm[:, None] < M) & (rn[None, :] < N))


@triton.jit
def _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn, INTERPRETED: tl.constexpr):
    """dz = g · y (1 − y) for one BLOCK_M × BLOCK_N tile, computed where it is used: dz is
    never written to memory. Out of range it is 0 (g = y = 0 there). Computed in the
    accumulator's type and rounded to g's, as torch's sigmoid backward returns it: the GEMMs
    take it in that type, as eager autograd's do."""
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    g = _widen(tl.load(g_ptr + rm[:, None] * stride_gm + rn[None, :] * stride_gn, mask=mask, other=0.0), INTERPRETED)
    y = _widen(tl.load(y_ptr + rm[:, None] * stride_ym + rn[None, :] * stride_yn, mask=mask, other=0.0), INTERPRETED)
    return _narrow(g * (1.0 - y) * y, g_ptr.dtype.element_ty, INTERPRETED)  # torch's order: the same bits


@triton.jit
def grad_x_kernel(g_ptr, y_ptr, w_ptr, dx_ptr, M, N, K,
                  stride_gm, stride_gn, stride_ym, stride_yn, stride_wn, stride_wk, stride_dxm, stride_dxk,
                  PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  INTERPRETED: tl.constexpr = RUN_BY_INTERPRETER):
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    rk = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    acc_type = tl.float64 if w_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros((BLOCK_M, BLOCK_K), dtype=acc_type)
    for n in range(0, tl.cdiv(N, BLOCK_N)):
        rn = (n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
        dz = _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn, INTERPRETED)
        w = tl.load(w_ptr + rn[:, None] * stride_wn + rk[None, :] * stride_wk,
                    mask=(rn[:, None] < N) & (rk[None, :] < K), other=0.0)
        acc = tl.dot(_operand(dz, INTERPRETED), _operand(w, INTERPRETED), acc,
                     input_precision=PRECISION, out_dtype=acc.dtype)
    tl.store(dx_ptr + rm[:, None] * stride_dxm + rk[None, :] * stride_dxk,
             _narrow(acc, dx_ptr.dtype.element_ty, INTERPRETED), mask=(rm[:, None] < M) & (rk[None, :] < K))


@triton.jit
def grad_w_kernel(g_ptr, y_ptr, x_ptr, dw_ptr, db_ptr, M, N, K,
                  stride_gm, stride_gn, stride_ym, stride_yn, stride_xm, stride_xk, stride_dwn, stride_dwk,
                  DW: tl.constexpr, DB: tl.constexpr, PRECISION: tl.constexpr,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  INTERPRETED: tl.constexpr = RUN_BY_INTERPRETER):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)).to(tl.int64)
    rk = (pid_k * BLOCK_K + tl.arange(0, BLOCK_K)).to(tl.int64)
    acc_type = tl.float64 if x_ptr.dtype.element_ty == tl.float64 else tl.float32
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=acc_type)
    db = tl.zeros((BLOCK_N,), dtype=acc_type)
    for m in range(0, tl.cdiv(M, BLOCK_M)):
        rm = (m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
        dz = _dz_tile(g_ptr, y_ptr, rm, rn, M, N, stride_gm, stride_gn, stride_ym, stride_yn, INTERPRETED)
        if DW:
            x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :] * stride_xk,
                        mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
            acc = tl.dot(_operand(tl.trans(dz), INTERPRETED), _operand(x, INTERPRETED), acc,
                         input_precision=PRECISION, out_dtype=acc.dtype)
        if DB:
            # The bias gradient rides along: this program already holds every row of dz for
            # its columns, in a fixed order, so the sum is the same bit for bit on every run
            # (no atomics). Programs with pid_k > 0 compute it too and do not store it.
            db += tl.sum(_widen(dz, INTERPRETED), axis=0)
    if DW:
        tl.store(dw_ptr + rn[:, None] * stride_dwn + rk[None, :] * stride_dwk,
                 _narrow(acc, dw_ptr.dtype.element_ty, INTERPRETED), mask=(rn[:, None] < N) & (rk[None, :] < K))
    if DB:
        if pid_k == 0:
            tl.store(db_ptr + rn, _narrow(db, db_ptr.dtype.element_ty, INTERPRETED), mask=rn < N)
