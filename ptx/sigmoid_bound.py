"""The error bound of the PTX stage's approximate sigmoid (EDIT-A), derived and checked on the CPU.

The edit computes y = rcp.approx(1 + ex2.approx(fl(z · c))) with c = fl32(−log2 e), all in
float32 with .ftz. The PTX ISA manual states the accuracy of the two approximations:
  ex2.approx.f32: "maximum ulp error is 2 ulp from correctly rounded result" (so ≤ 2.5 ulp of 2^t),
  rcp.approx.f32: "maximum ulp error is 1 across the full range of inputs".
With u = 2^-24 (a float32 ulp is at most 2u of the value) and s = sigmoid(z), following the
relative errors through the four steps gives (first order, `bound`):
  |y − s| ≤ s · [ (1 − s) · (|z|·(ε_c + u) + 5u) + 3u ]
where ε_c = |c − (−log2 e)| / log2 e is the rounding of the constant. Its maximum over z is about
3.5u ≈ 2.1e-7. `emulate_worst` checks it on the CPU for any hardware that meets the manual's
figures: exact float32 multiply and add, and the two approximations replaced by their worst
allowed results (ex2 ±2 ulp around the correctly rounded value, rcp anywhere within 1 ulp).
The real instructions are only measured on a GPU (tests/test_cuda.py::test_ptx_sigmoid_error_bound).

Examples:
  python ptx/sigmoid_bound.py              # the bound's maximum and the emulated worst case
  python ptx/sigmoid_bound.py -n 2000000   # denser sampling
"""

from __future__ import annotations

import argparse
import math
import sys

import numpy as np

U = 2.0 ** -24
C = np.float32(-math.log2(math.e))  # the constant in the PTX: 0fBFB8AA3B
EPS_C = abs(float(C) + math.log2(math.e)) / math.log2(math.e)


def exact(z: np.ndarray) -> np.ndarray:
    z = z.astype(np.float64)
    e = np.exp(-np.abs(z))  # never overflows; keeps full relative precision for either sign
    return np.where(z >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def bound(z: np.ndarray) -> np.ndarray:
    """The derived bound on |y − sigmoid(z)|, per z."""
    s = exact(z)
    return s * ((1.0 - s) * (np.abs(z.astype(np.float64)) * (EPS_C + U) + 5 * U) + 3 * U)


def _ulp(x: np.ndarray) -> np.ndarray:
    """The float32 spacing at |x| (x as float32): the size of one ulp there."""
    return np.spacing(np.abs(x.astype(np.float32))).astype(np.float64)


def emulate_worst(z: np.ndarray) -> np.ndarray:
    """The largest |y − sigmoid(z)| that any ex2/rcp within the manual's error could produce."""
    z = z.astype(np.float32)
    t = z * C                                             # mul.ftz.f32, round to nearest
    two_t = np.exp2(t.astype(np.float64))
    e_rn = two_t.astype(np.float32)
    worst = np.zeros(z.shape)
    s = exact(z)
    for k in (-2, 2):                                     # ex2: 2 ulp either side of the rounded value
        e = e_rn.copy()
        for _ in range(abs(k)):
            e = np.nextafter(e, np.float32(np.inf if k > 0 else 0))
        d = np.float32(1) + e                             # add.ftz.f32
        r = 1.0 / d.astype(np.float64)
        r_rn = r.astype(np.float32)
        for cand in (np.nextafter(r_rn, np.float32(0)), r_rn, np.nextafter(r_rn, np.float32(np.inf))):
            ok = np.abs(cand.astype(np.float64) - r) <= _ulp(r)   # rcp: within 1 ulp of 1/d
            worst = np.maximum(worst, np.where(ok, np.abs(cand.astype(np.float64) - s), 0.0))
    return worst


def samples(n: int, limit: float = 80.0) -> np.ndarray:
    """Dense float32 samples of [−limit, limit] (no subnormal results, no overflow there),
    plus every float32 in [−4, 4] at a stride of 64 ulps near the bound's maximum."""
    grid = np.linspace(-limit, limit, n, dtype=np.float32)
    near = np.arange(np.float32(1.0).view(np.int32), np.float32(4.0).view(np.int32), 64, dtype=np.int32)
    near = near.view(np.float32)
    return np.concatenate([grid, near, -near])


def main(argv: list[str] | None = None) -> int:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=doc[doc.index("Examples:"):],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=400_000, help="evenly spaced samples of [-80, 80]")
    args = parser.parse_args(argv)
    if args.n < 2:
        parser.error("-n must be at least 2")
    z = samples(args.n)
    b, w = bound(z), emulate_worst(z)
    print(f"bound: max over z of s·[(1−s)(|z|(ε_c+u) + 5u) + 3u] = {b.max():.3e} ({b.max() / U:.2f} u), "
          f"at z = {z[b.argmax()]:.3f}")
    print(f"emulated worst case over {z.size} samples: {w.max():.3e} at z = {z[w.argmax()]:.3f}; "
          f"bound exceeded at {(w > b).sum()} samples")
    return 0 if (w <= b).all() else 1


if __name__ == "__main__":
    sys.exit(main())
