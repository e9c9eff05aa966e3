"""The PTX stage's modules, one per CUDA context (ptx/module_cache.h, used by ptx/loader.cpp).

The driver gives a new context the handle of a destroyed one, and a module dies with its context.
Without a GPU, the cache is compiled against a fake driver whose contexts take the handle of a
destroyed one; on a GPU, the stage itself runs across a context destroyed and made again."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from conftest import GPU, NO_GPU, REASONS, ROOT, run_script

# A fake driver: a context lives in a slot, and the slot's address is its handle, so a context
# made after one is destroyed takes its handle; ids count up, as cuCtxGetId's are unique for
# the life of the process. A module records the id of the context it was loaded in, and dies
# with that context. The driver only ever acts on the current context, as the real one does:
# unloading a module that is not the current context's own is what the real driver would do
# with a reused handle pushed (or a dead context pushed), and is counted as an error here.
FAKE_DRIVER = r"""
#include <cstdint>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "module_cache.h"

namespace {

struct Slot {
  bool alive = false;
  std::uint64_t id = 0;
};
using Context = Slot*;

struct Module {
  std::uint64_t owner = 0;  // the id of the context it was loaded in
  int serial = 0;
};

Slot slots[2];
Context current = nullptr;
std::uint64_t next_id = 1;
int loads = 0, unloads = 0, errors = 0;
std::set<int> live;  // serials of the modules still loaded in a live context
std::set<std::pair<int, std::uint64_t>> owners;  // (serial, owner)
bool fail_next_load = false;

Context make(Slot& slot) {
  slot = Slot{true, next_id++};
  return current = &slot;
}

void destroy(Slot& slot) {  // its modules go with it
  for (auto [serial, owner] : owners)
    if (owner == slot.id) live.erase(serial);
  slot.alive = false;
  if (current == &slot) current = nullptr;
}

std::uint64_t current_id() {
  if (current == nullptr || !current->alive) throw std::logic_error("no live context is current");
  return current->id;
}

Module load() {
  if (fail_next_load) {
    fail_next_load = false;
    throw std::runtime_error("the PTX did not load");
  }
  Module m{current_id(), ++loads};
  live.insert(m.serial);
  owners.insert({m.serial, m.owner});
  return m;
}

void unload(Module& m) {
  ++unloads;
  if (current == nullptr || !current->alive || current->id != m.owner || !live.count(m.serial)) {
    ++errors;
    std::printf("error: module %d of context %llu unloaded in context %llu\n", m.serial,
                static_cast<unsigned long long>(m.owner),
                static_cast<unsigned long long>(current ? current->id : 0));
  }
  live.erase(m.serial);
}

dense_ptx::ModuleCache<Context, Module> cache;

const Module& use() { return cache.current(current, current_id(), load, unload); }

void report(const char* fact, long long value) { std::printf("%s %lld\n", fact, value); }

void report_use(const char* step) {
  const Module& m = use();
  std::printf("%s.owner %llu\n%s.alive %d\n", step, static_cast<unsigned long long>(m.owner), step,
              static_cast<int>(live.count(m.serial)));
}

}  // namespace

int main() {
  make(slots[0]);                               // context 1
  report_use("first");
  report_use("again");
  report("loads_after_again", loads);
  make(slots[1]);                               // context 2
  report_use("second_context");
  report("loaded_two", static_cast<long long>(cache.loaded()));

  destroy(slots[0]);                            // context 1 dies with its module...
  make(slots[0]);                               // ...and context 3 takes its handle
  report("same_handle", current == &slots[0]);
  report_use("reused_handle");
  report("loaded_after_reuse", static_cast<long long>(cache.loaded()));

  cache.retire();                               // a new PTX, context 3 current
  cache.unload_stale(current, current_id(), unload);
  report("unloads_at_retire", unloads);
  report("loaded_after_retire", static_cast<long long>(cache.loaded()));
  report_use("after_retire");

  destroy(slots[1]);                            // context 2 dies holding a module of the old PTX...
  make(slots[1]);                               // ...and context 4 takes its handle
  report_use("second_reused");
  report("unloads_after_second_reused", unloads);

  Context three = &slots[0];                    // no context current: nothing can be unloaded now
  current = nullptr;
  cache.retire();
  report("unloads_without_a_context", unloads);
  current = three;
  report_use("back_in_three");                  // context 3 unloads its own stale module
  report("unloads_back_in_three", unloads);

  cache.retire();
  fail_next_load = true;
  try {
    use();
    report("failed_load_raised", 0);
  } catch (const std::runtime_error&) {
    report("failed_load_raised", 1);
  }
  report("loaded_after_failed_load", static_cast<long long>(cache.loaded()));
  report_use("after_failed_load");

  report("errors", errors);
  return 0;
}
"""

# What the fake driver must see; ".owner" is the id of the context the module was loaded in.
EXPECTED = {
    "first.owner": 1, "first.alive": 1, "again.owner": 1, "again.alive": 1, "loads_after_again": 1,
    "second_context.owner": 2, "second_context.alive": 1, "loaded_two": 2,
    # the dead context's module is not returned for the new context at its handle
    "same_handle": 1, "reused_handle.owner": 3, "reused_handle.alive": 1, "loaded_after_reuse": 2,
    # a new PTX: the current context's module is unloaded now, context 2's is left to context 2
    "unloads_at_retire": 1, "loaded_after_retire": 0, "after_retire.owner": 3, "after_retire.alive": 1,
    # context 2 died holding its stale module: dropped, never unloaded into context 4
    "second_reused.owner": 4, "second_reused.alive": 1, "unloads_after_second_reused": 1,
    "unloads_without_a_context": 1, "back_in_three.owner": 3, "back_in_three.alive": 1,
    "unloads_back_in_three": 2,
    # a load that fails leaves no entry: the next use loads again
    "failed_load_raised": 1, "loaded_after_failed_load": 0, "after_failed_load.owner": 3,
    "after_failed_load.alive": 1,
    "errors": 0,
}


def test_module_cache_against_a_driver_that_reuses_handles(tmp_path):
    """Keyed by context id: a context that takes a destroyed one's handle loads its own module,
    and a module is unloaded only in its own live context, never into another."""
    cxx = shutil.which(os.environ.get("CXX", "c++"))
    if cxx is None:
        pytest.skip("needs a C++ compiler (none found as $CXX or c++)")
    exe = tmp_path / "fake_driver"
    build = subprocess.run([cxx, "-std=c++17", "-O0", "-Wall", "-Wextra", "-Werror", f"-I{ROOT / 'ptx'}", "-x", "c++",
                            "-", "-o", str(exe)], input=FAKE_DRIVER, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-3000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stdout + run.stderr
    facts = {}
    for line in run.stdout.splitlines():
        key, value = line.rsplit(" ", 1)
        facts[key] = int(value) if value.lstrip("-").isdigit() else value
    assert facts == EXPECTED, run.stdout


# In a process of its own: it destroys CUDA contexts (through ctypes on libcuda), torch's primary
# context among them, which no later test in this process could use.
REMADE_CONTEXTS = r"""
import ctypes, json, torch, modes
stage, ops, f = modes.stage("ptx"), torch.ops.dense_ptx, modes.dense("ptx")
driver = ctypes.CDLL("libcuda.so.1")
x, w = torch.randn(64, 32), torch.randn(16, 32)
want = torch.sigmoid(x.double() @ w.double().t())

def right() -> bool:  # no cuBLAS: its handle belongs to the context it was made in
    return bool(torch.allclose(f(x.cuda(), w.cuda(), None).cpu().double(), want, atol=1e-5, rtol=1e-4))

def here() -> tuple[int, int]:
    context, id_ = ctypes.c_void_p(), ctypes.c_ulonglong()
    assert driver.cuCtxGetCurrent(ctypes.byref(context)) == 0
    assert driver.cuCtxGetId(None, ctypes.byref(id_)) == 0
    return context.value, id_.value

seen = {"right before": right(), "modules before": ops.load_here()}
torch_context, torch_id = here()

# A context of our own holds a module, then is destroyed; the next load_ptx must not touch it.
device, mine, popped = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_void_p()
assert driver.cuDeviceGet(ctypes.byref(device), 0) == 0
assert driver.cuCtxCreate_v2(ctypes.byref(mine), 0, device) == 0
seen["modules with ours"] = ops.load_here()
assert driver.cuCtxPopCurrent_v2(ctypes.byref(popped)) == 0 and popped.value == mine.value
assert driver.cuCtxDestroy_v2(mine) == 0
try:
    stage.load_ptx()
    seen["load_ptx after ours died"] = "no error"
except RuntimeError as e:
    seen["load_ptx after ours died"] = str(e).splitlines()[0]
seen["right after ours died"] = right()

# torch's primary context, destroyed (its module with it) and retained again by the runtime.
torch.cuda.synchronize()
torch.cuda.empty_cache()
assert driver.cuDevicePrimaryCtxReset_v2(device) == 0
seen["right after the reset"] = right()
context, id_ = here()
seen["same handle"], seen["new id"] = context == torch_context, id_ != torch_id
seen["modules after the reset"] = ops.load_here()
stage.load_ptx()
seen["right after load_ptx"] = right()
print(json.dumps(seen))
"""


@pytest.mark.gpu
@pytest.mark.skipif(not GPU or REASONS["ptx"] is not None, reason=NO_GPU if not GPU else f"mode ptx: {REASONS['ptx']}")
def test_ptx_stage_across_a_context_destroyed_and_made_again():
    """Destroyed contexts: a load_ptx leaves them alone, and torch's primary context, reset and
    retained again (at its old handle, with a new id), loads a module of its own."""
    result = run_script("-c", REMADE_CONTEXTS)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["new id"], seen  # cuCtxGetId: unique for the life of the process
    assert seen == {"right before": True, "modules before": 1, "modules with ours": 2,
                    "load_ptx after ours died": "no error", "right after ours died": True,
                    "right after the reset": True, "same handle": seen["same handle"], "new id": True,
                    # the dead primary context's entry is dropped where the new one took its handle
                    "modules after the reset": 1 if seen["same handle"] else 2,
                    "right after load_ptx": True}, seen
