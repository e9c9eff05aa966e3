// The segmented ring of parallel/collectives/algorithms.py with its loop in C++: the op
// dense_collectives::segmented_ring_. It answers "how much of the gap to gloo's own all_reduce
// is the interpreter?"; all_reduce's auto runs it wherever a process has loaded it
// (parallel/collectives/README.md, "How much is the interpreter?").
//
// Build and check:  python -m pytest tests/test_collectives_cpp.py     (JIT build, cached in
//                   build/jit/dense_collectives; parallel/collectives/cpp_loop.py loads it)
// Measure:          python distributed.py --bench cpu --world-size 4       (CPU time by thread)
//                   python distributed.py --bench allreduce --world-size 4 (busbw against gloo's)
//
// Everything else is the Python version's, so that only the interpreter differs: the same
// segments, the same messages through the same process group's send and recv (c10d, gloo), in
// the same order, two in flight, and the same additions (its results equal the Python
// version's, bit for bit; the test checks). What goes: the Python frames, the bindings and the
// GIL handoffs around each of the 2(n − 1)·s segment steps.

#include <torch/extension.h>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <deque>
#include <vector>

namespace {

using WorkPtr = c10::intrusive_ptr<c10d::Work>;

// One message each way, as the Python version's pg.recv / pg.send; none for an empty segment
// (both sides skip it: they cut the same agreed numel the same way).
WorkPtr post_recv(c10d::ProcessGroup& pg, const at::Tensor& t, int src) {
  if (t.numel() == 0) return WorkPtr();
  std::vector<at::Tensor> one{t};
  return pg.recv(one, src, 0);
}

WorkPtr post_send(c10d::ProcessGroup& pg, const at::Tensor& t, int dst) {
  if (t.numel() == 0) return WorkPtr();
  std::vector<at::Tensor> one{t};
  return pg.send(one, dst, 0);
}

void wait(const WorkPtr& w) {
  if (w) w->wait();
}

struct Step {
  WorkPtr recv, send;
  at::Tensor mine, scratch;  // reduce-scatter only: the segment to add into, and what came
  bool last = false;         // the reduce-scatter's last step: divide here for "avg"
};

void segmented_ring_(at::Tensor flat, const std::string& group_name, int64_t s, bool avg, at::Tensor scratch) {
  TORCH_CHECK(flat.dim() == 1 && flat.is_contiguous() && flat.device().is_cpu(),
              "segmented_ring_ needs a contiguous 1-D CPU tensor");
  TORCH_CHECK(s >= 1, "segmented_ring_ needs at least one segment per chunk");
  // No GIL to release: a call through torch.ops runs the kernel without it.

  auto pg = c10d::resolve_process_group(group_name);
  const int64_t r = pg->getRank(), n = pg->getSize();
  if (n == 1 || flat.numel() == 0) return;
  const auto mod = [n](int64_t x) { return ((x % n) + n) % n; };
  const int right = static_cast<int>(mod(r + 1)), left = static_cast<int>(mod(r - 1));

  // s segments per chunk: the caller's collectives._segments_per_chunk, as in the Python loop
  const auto chunks = at::tensor_split(flat, n);
  std::vector<std::vector<at::Tensor>> segments;
  for (const auto& c : chunks) segments.push_back(at::tensor_split(c, s));
  const int64_t longest_segment = segments[0][0].numel();
  TORCH_CHECK(scratch.numel() >= 2 * longest_segment && scratch.dtype() == flat.dtype(),
              "segmented_ring_ needs a scratch of two segments of the tensor's dtype");
  const at::Tensor slots = scratch.narrow(0, 0, 2 * longest_segment).view({2, longest_segment});
  const int64_t count = (n - 1) * s;  // segment steps per phase, (step, j) in order

  // Reduce-scatter: at step k send segment j of chunk r − k − 1, receive and add segment j of
  // chunk r − k − 2. Step i + 2 is posted once step i is added and its send is done.
  std::deque<Step> pending;
  const auto finish_reduce = [&](Step& st) {
    wait(st.recv);
    if (st.mine.numel()) at::add_out(st.mine, st.mine, st.scratch);  // own + partial, as in Python
    if (st.last && avg) st.mine.div_(n);
    wait(st.send);
  };
  for (int64_t i = 0; i < count; ++i) {
    if (pending.size() == 2) {
      finish_reduce(pending.front());
      pending.pop_front();
    }
    const int64_t step = i / s, j = i % s;
    Step st;
    st.mine = segments[mod(r - step - 2)][j];
    st.scratch = slots[i % 2].narrow(0, 0, st.mine.numel());
    st.last = step == n - 2;
    st.recv = post_recv(*pg, st.scratch, left);
    st.send = post_send(*pg, segments[mod(r - step - 1)][j], right);
    pending.push_back(std::move(st));
  }
  while (!pending.empty()) {
    finish_reduce(pending.front());
    pending.pop_front();
  }

  // All-gather: at step k pass segment j of chunk r − k on, receive chunk r − k − 1's in place.
  for (int64_t i = 0; i < count; ++i) {
    if (pending.size() == 2) {
      wait(pending.front().recv);
      wait(pending.front().send);
      pending.pop_front();
    }
    const int64_t step = i / s, j = i % s;
    Step st;
    st.recv = post_recv(*pg, segments[mod(r - step - 1)][j], left);
    st.send = post_send(*pg, segments[mod(r - step)][j], right);
    pending.push_back(std::move(st));
  }
  for (auto& st : pending) {
    wait(st.recv);
    wait(st.send);
  }
}

}  // namespace

TORCH_LIBRARY(dense_collectives, m) {
  m.def("segmented_ring_(Tensor(a!) flat, str group_name, int segments_per_chunk, bool avg, Tensor(b!) scratch) -> ()");
}

TORCH_LIBRARY_IMPL(dense_collectives, CPU, m) { m.impl("segmented_ring_", &segmented_ring_); }
