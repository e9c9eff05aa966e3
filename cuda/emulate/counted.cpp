// The instrumented half of the memory counters (cuda/emulate/counters.cpp says how they work):
// the chapter's kernels exactly as the plain emulation builds them, plus four planted patterns
// whose counts are known by hand, for the tests (tests/test_counters.py). cuda/counters.py
// compiles this file with -DCUDA_EMU_COUNT -fsanitize=kernel-address.
#include "emulate/emulate.cpp"

namespace {

// A warp of 32 threads, one pattern each:
//   0  coalesced:      lane i reads in[i]                    (4 sectors per request)
//   1  column-major:   lane i reads in[i * 32]               (32 sectors per request: a row apart)
//   2  stride-32:      lane i writes and reads s[i * 32]     (one bank, 32 words: 31 conflicts)
//   3  broadcast:      lane 0 writes s[0], every lane reads it (one word: no conflict)
void planted(int which, const float* in, float* out) {
  __shared__ float s[32 * 32];
  const unsigned i = threadIdx.x;
  float v = 0;
  if (which == 0) v = in[i];
  if (which == 1) v = in[i * 32];
  if (which == 2) s[i * 32] = float(i);
  // (s[i / 32], which is s[0] in a warp: GCC leaves an access at an index it knows uninstrumented,
  // so it would not be counted; every index in the chapter's kernels depends on threadIdx too)
  if (which == 3 && i % 32 == 0) s[i / 32] = 1;
  __syncthreads();
  if (which == 2) v = s[i * 32];
  if (which == 3) v = s[i / 32];
  out[i] = v;
}

}  // namespace

extern "C" EMU_API int cnt_planted(int which, const float* in, float* out) {
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] { planted(which, in, out); });
}
