#!/usr/bin/env bash
# Regenerate the compiler's PTX next to the committed, hand-edited one, and show the edits:
#   bash ptx/regen.sh          writes ptx/generated/dense_kernels.ptx (git-ignored), then diffs
# sm_80 is the oldest target the kernels need; newer GPUs (sm_90, H100/H200) JIT it.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p ptx/generated
nvcc -ptx -arch=sm_80 -O3 -std=c++17 cuda/dense_kernels.cu -o ptx/generated/dense_kernels.ptx
echo "generated ptx/generated/dense_kernels.ptx; the hand edits (- compiler, + ours):"
diff -u ptx/generated/dense_kernels.ptx ptx/dense_kernels.ptx || true
