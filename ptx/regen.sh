#!/usr/bin/env bash
# Regenerate the compiler's PTX next to the committed, hand-edited one, and show the edits:
#   bash ptx/regen.sh          writes ptx/generated/dense_kernels.ptx (git-ignored), then diffs
# The PTX comes from ptx/lesson_kernels.cu: the kernels the PTX stage carries (GEMM v8, v9, the
# v1 sigmoid-grad kernels), not all of cuda/kernels/. sm_80 is the oldest target whose PTX has
# cp.async (v8's double buffering uses it there); newer GPUs (sm_90: H100/H200) JIT it.
set -euo pipefail
cd "$(dirname "$0")/.."
# nvcc where the Python scripts find it (cli.cuda_tool): PATH, $CUDA_HOME, the package index's
# wheels (requirements-cuda.txt), /usr/local/cuda
nvcc=$(python -c 'import cli; print(cli.cuda_tool("nvcc") or "")')
if [[ -z $nvcc ]]; then
  echo "ptx/regen.sh: nvcc not found: install the CUDA toolkit, or python -m pip install -r requirements-cuda.txt" >&2
  exit 1
fi
mkdir -p ptx/generated
"$nvcc" -ptx -arch=sm_80 -O3 -std=c++17 ptx/lesson_kernels.cu -o ptx/generated/dense_kernels.ptx
# nvcc names file-local symbols with a hash that changes from build to build (_INTERNAL_<8 hex>_,
# _GLOBAL__N__<8 hex>_); blanked on both sides, the diff shows the hand edits and nothing else.
blank() { sed -E 's/(_INTERNAL_|_GLOBAL__N__)[0-9a-f]{8}_/\1xxxxxxxx_/g' "$1"; }
echo "generated ptx/generated/dense_kernels.ptx; the hand edits (- compiler, + ours):"
diff -u --label "ptx/generated/dense_kernels.ptx (nvcc)" --label "ptx/dense_kernels.ptx (edited)" \
  <(blank ptx/generated/dense_kernels.ptx) <(blank ptx/dense_kernels.ptx) || true
