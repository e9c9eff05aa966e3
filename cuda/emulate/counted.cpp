//   python cuda/counters.py --help   (builds this file with counters.cpp, and runs them)
// The instrumented half of the memory counters (cuda/emulate/counters.cpp says how they work):
// the chapter's kernels exactly as the plain emulation builds them, plus nine planted patterns
// whose counts are known by hand, for the tests (tests/test_counters.py). cuda/counters.py
// compiles this file with -DCUDA_EMU_COUNT -fsanitize=kernel-address.
#include "emulate/emulate.cpp"

namespace {

// A warp of 32 threads, one pattern each:
//   0  coalesced:      lane i reads in[i]                    (4 sectors per request)
//   1  column-major:   lane i reads in[i * 32]               (32 sectors per request: a row apart)
//   2  stride-32:      lane i writes and reads s[i * 32]     (one bank, 32 words: 31 conflicts)
//   3  broadcast:      lane 0 writes s[0], every lane reads it (one word: no conflict)
//   4  cp.async:       lane i copies in[4i .. 4i+3] to s[4i ..] (16 bytes, sm_80's LDGSTS): one
//                      request of 512 neighbouring bytes, 16 sectors; its destinations, in four
//                      phases of 8 lanes, each fill the 32 banks once: 4 wavefronts, none excessive
//   5  cp.async, one bank: lane i copies in[4i .. 4i+3] to s[32i ..]: the same 16 sectors, but the
//                      8 lanes of a phase all write banks 0-3: 8 wavefronts a phase, 32 in all, 28
//                      excessive
//   6  ldmatrix:       ldmatrix.x4, lane i gives the row at byte 16i: each matrix's 8 rows lie 16
//                      bytes apart, in the 8 groups of 4 banks: one LDSM request, 1 wavefront a
//                      matrix, 4 in all, none excessive
//   7  ldmatrix, one bank group: ldmatrix.x4, lane i gives the row at byte 128i: each matrix's 8
//                      rows lie 128 bytes apart, all in banks 0-3: 8 wavefronts a matrix, 32 in
//                      all, 28 excessive
//   8  ldmatrix.x1:    lane i gives the row at byte 128i, as in 7, but the instruction reads only
//                      lanes 0-7's rows: 8 wavefronts, 7 excessive
// Every pattern ends with each lane storing one float to out[i]: a 4-sector store request.
void planted(int which, const float* in, float* out) {
  alignas(16) __shared__ float s[32 * 32];
  const unsigned i = threadIdx.x;
  float v = 0;
  if (which == 6 || which == 7) {
    uint32_t d[4];
    ldmatrix<4, false>(d, reinterpret_cast<const unsigned char*>(s) + (which == 6 ? 16 : 128) * i);
    v = float(d[0] & 1u);
  }
  if (which == 8) {
    uint32_t d[1];
    ldmatrix<1, false>(d, reinterpret_cast<const unsigned char*>(s) + 128 * i);
    v = float(d[0] & 1u);
  }
  if (which == 0) v = in[i];
  if (which == 1) v = in[i * 32];
  if (which == 2) s[i * 32] = float(i);
  // (s[i / 32], which is s[0] in a warp: GCC leaves an access at an index it knows uninstrumented,
  // so it would not be counted; every index in the chapter's kernels depends on threadIdx too)
  if (which == 3 && i % 32 == 0) s[i / 32] = 1;
  if (which == 4) cp_async16(&s[4 * i], &in[4 * i]);
  if (which == 5) cp_async16(&s[32 * i], &in[4 * i]);
  cp_async_wait_all();  // (the copies land here, uncounted: the emulator's side of the hardware)
  __syncthreads();
  if (which == 2) v = s[i * 32];
  if (which == 3) v = s[i / 32];
  out[i] = v;
}

}  // namespace

extern "C" EMU_API int cnt_planted(int which, const float* in, float* out) {
  return emu::launch(dim3{1, 1, 1}, dim3{32, 1, 1}, [&] { planted(which, in, out); });
}
