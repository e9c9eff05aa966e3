// The PTX stage's modules, one per CUDA context: which module a launch uses, and when a module is
// unloaded. Plain C++, free of the driver (the loader passes in the driver's answers and calls),
// so that tests/test_ptx_module_cache.py can check these rules against a fake driver, anywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <unordered_map>
#include <utility>

namespace dense_ptx {

// A context is known by its id (cuCtxGetId: unique for the life of the process), never by its
// handle: the driver gives a new context the handle of a destroyed one (a primary context that
// is reset and retained again keeps its handle), and a module dies with the context it was
// loaded in.
//
// The only context the driver is ever asked about is the calling thread's current one. Passing
// the handle of a destroyed context to any driver call is undefined, and from here there is no
// telling whether another thread destroyed a context since its module was loaded; so a module is
// unloaded only while its own context is current, and the handles of the others serve only to be
// compared.
//
// Not thread-safe: the loader calls it under its one mutex.
template <class Context, class Module>
class ModuleCache {
 public:
  // The module of the current PTX in `context`, the calling thread's current context, whose id is
  // `id`: loaded by load() on its first use in this context, after unload_stale(). load() may
  // throw; then this context holds no module.
  template <class Load, class Unload>
  Module& current(Context context, std::uint64_t id, Load&& load, Unload&& unload) {
    auto found = entries_.find(id);
    if (found != entries_.end() && found->second.generation == generation_) return found->second.module;
    unload_stale(context, id, unload);
    return entries_.emplace(id, Entry{context, generation_, load()}).first->second.module;
  }

  // A new PTX, from the next current() on: every module now holds an earlier one, and each
  // context unloads its own through unload_stale() (current() calls it).
  void retire() { ++generation_; }

  // Where `context` (the calling thread's current context, id `id`) holds a module of an earlier
  // PTX, unload(module) unloads it. unload may throw; the entry is gone by then.
  template <class Unload>
  void unload_stale(Context context, std::uint64_t id, Unload&& unload) {
    forget_gone(context, id);
    auto found = entries_.find(id);
    if (found == entries_.end() || found->second.generation == generation_) return;
    Module stale = std::move(found->second.module);
    entries_.erase(found);
    unload(stale);
  }

  // How many contexts hold a module of the current PTX. A context destroyed since it loaded one
  // counts until a new context takes its handle: nothing else says that it is gone.
  std::size_t loaded() const {
    std::size_t n = 0;
    for (const auto& kv : entries_) n += kv.second.generation == generation_;
    return n;
  }

  // Whether any context holds a module, of this PTX or an earlier one.
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    Context context;
    std::uint64_t generation;  // of the PTX it holds
    Module module;
  };

  // A live context's handle is its own: an entry with `context`'s handle and another id belongs
  // to a context that is gone, and its module went with it. Dropped, not unloaded.
  void forget_gone(Context context, std::uint64_t id) {
    for (auto it = entries_.begin(); it != entries_.end();) {
      if (it->second.context == context && it->first != id) {
        it = entries_.erase(it);
      } else {
        ++it;
      }
    }
  }

  std::unordered_map<std::uint64_t, Entry> entries_;
  std::uint64_t generation_ = 0;
};

}  // namespace dense_ptx
