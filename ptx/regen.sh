#!/usr/bin/env bash
# Regenerate the compiler's PTX next to the committed, hand-edited one, and show the edits:
#   bash ptx/regen.sh          writes ptx/generated/dense_kernels.ptx (git-ignored), then diffs
# The PTX comes from ptx/lesson_kernels.cu: the kernels the PTX stage carries (GEMM v8, v9, the
# v1 sigmoid-grad kernels), not all of cuda/kernels/. sm_80 is the oldest target whose PTX has
# cp.async (v8's double buffering uses it there); newer GPUs (sm_90: H100/H200) JIT it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p ptx/generated
nvcc -ptx -arch=sm_80 -O3 -std=c++17 ptx/lesson_kernels.cu -o ptx/generated/dense_kernels.ptx
echo "generated ptx/generated/dense_kernels.ptx; the hand edits (- compiler, + ours):"
diff -u ptx/generated/dense_kernels.ptx ptx/dense_kernels.ptx || true
