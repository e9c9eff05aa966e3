//   python cuda/tensor_cores/trace.py --help   (draws the events this records; tests/test_pipeline_trace.py)
// An optional trace of the Hopper instructions' events (hopper.h), for drawing a pipeline's
// timeline (cuda/tensor_cores/trace.py): mbarrier init, TMA copy issued, its bytes landed, a
// barrier's phase completed, arrive, wait begun and completed, wgmma issued and waited. Off by
// default: each hook is one relaxed atomic load until emu_trace(1) turns it on.
// The clock is the emulator's own: `seq` orders the events (a strict order, one tick an event) and
// `step` counts the scheduler's fiber switches so far in the launch (0 with OS threads). Neither is
// a time on a GPU: they say what happened before what in this emulated run.
// Kept per warpgroup: a thread's events are recorded only for thread 0 of its warpgroup (the
// producer's elected thread in v32-v35, and one thread of each consumer warpgroup); the copy
// engine's (landed, phase completed) with thread -1. Recorded with the HopperState's mutex held,
// so the OS-thread build appends without a race.
#pragma once

#include <atomic>
#include <cstdint>
#include <vector>

namespace emu {

enum TraceKind : int {
  kTraceInit = 0,      // mbarrier.init: value = the arrival count
  kTraceTmaIssue = 1,  // cp.async.bulk.tensor issued on the barrier: value = bytes
  kTraceLanded = 2,    // a copy's bytes landed (by the copy engine): value = bytes
  kTracePhase = 3,     // the barrier's phase completed: value = the phase's number (0, 1, ...)
  kTraceArrive = 4,    // mbarrier.arrive: value = expect_tx bytes announced (0: a plain arrive)
  kTraceWaitBegin = 5,  // mbarrier.try_wait.parity begun: value = the parity waited for
  kTraceWaitEnd = 6,   // ... and completed
  kTraceWgmmaIssue = 7,  // wgmma.mma_async issued: value = its N
  kTraceWgmmaWait = 8,   // wgmma.wait_group N completed groups: value = N
};
struct TraceEvent {
  int64_t seq, step;
  int32_t block_x, block_y, thread, kind;
  uint32_t bar;  // the barrier's shared offset (0 for wgmma)
  int64_t value;
};
struct TraceState {
  std::atomic<bool> on{false};
  int64_t step = 0;
  std::vector<TraceEvent> events;
};
inline TraceState& trace_state() {
  static TraceState* state = new TraceState;
  return *state;
}
inline bool tracing() { return trace_state().on.load(std::memory_order_relaxed); }
// The caller holds HopperState's mutex. `thread` -1: the copy engine.
inline void trace_event(int thread, int kind, uint32_t bar, int64_t value) {
  TraceState& t = trace_state();
  if (thread >= 0 && thread % 128 != 0) return;
  t.events.push_back({int64_t(t.events.size()), t.step, int32_t(blockIdx.x), int32_t(blockIdx.y), thread, kind, bar,
                      value});
}

}  // namespace emu
