// The TMA ring of v32 to v35, written once: Stages stages of shared memory, each with two mbarriers.
// `full` completes a phase when the producer has announced the stage's bytes (one arrival, with
// expect_tx) and the copies have delivered them all; `empty` when every consumer thread has
// released the stage. Step i of the loop uses stage i % Stages in its (i / Stages)-th round, so the
// phase a thread waits for has parity (i / Stages) % 2: consumers wait on `full` for round i / Stages,
// the producer on `empty` for the round before, the one step i - Stages used.
//   nvcc -cubin -std=c++17 -O3 -arch=sm_90a -Xptxas -v cuda/units/tc_v32.cu -o /tmp/v32.cubin
// (CUTLASS's PipelineTmaAsync has the same four calls; it carries the phase bit in a state object
// flipped at each wrap, where here it is computed from the step.)
#pragma once

#include "../kernels/hopper_instructions.cuh"

namespace {

// region v32-ring
template <int Stages, uint32_t StageBytes>
struct TmaPipeline {
  uint64_t* full;   // [Stages]: the stage's bytes have landed
  uint64_t* empty;  // [Stages]: every consumer is done reading it
  // The barriers lie at `at` (16 bytes a stage, after the stages' tiles).
  __device__ __forceinline__ explicit TmaPipeline(unsigned char* at)
      : full(reinterpret_cast<uint64_t*>(at)), empty(reinterpret_cast<uint64_t*>(at) + Stages) {}
  __device__ __forceinline__ static int stage(int64_t step) { return int(step % Stages); }
  __device__ __forceinline__ static unsigned parity(int64_t step) { return unsigned(step / Stages) % 2; }

  // One thread, then __syncthreads() before any thread uses the ring.
  __device__ __forceinline__ void init(unsigned consumers) const {
    for (int s = 0; s < Stages; ++s) {
      mbarrier_init(&full[s], 1);  // the producer's arrival, with the bytes to come
      mbarrier_init(&empty[s], consumers);
    }
    fence_barrier_init();
  }
  // Producer (one thread): step's stage, once it is free (the first Stages steps find it so; a later
  // one waits until every consumer has released step - Stages), announced for StageBytes. Returns
  // the barrier that the step's TMA copies complete.
  __device__ __forceinline__ uint64_t* producer_acquire(int64_t step) const {
    if (step >= Stages) mbarrier_wait(&empty[stage(step)], parity(step - Stages));
    return announce(stage(step));
  }
  // The same for step + Stages, by a thread that consumes too and has just released `step` (one
  // warpgroup, thread 0 refilling the stage it read: v32, v34, v35).
  __device__ __forceinline__ uint64_t* producer_refill(int64_t step) const {
    mbarrier_wait(&empty[stage(step)], parity(step));  // every consumer has released `step`
    return announce(stage(step));
  }
  // Consumer: wait until step's bytes have landed.
  __device__ __forceinline__ void consumer_wait(int64_t step) const { mbarrier_wait(&full[stage(step)], parity(step)); }
  // Consumer: this thread is done reading step's stage.
  __device__ __forceinline__ void consumer_release(int64_t step) const { mbarrier_arrive(&empty[stage(step)]); }

  __device__ __forceinline__ uint64_t* announce(int s) const {
    mbarrier_arrive_expect_tx(&full[s], StageBytes);
    return &full[s];
  }
};
// endregion

}  // namespace
