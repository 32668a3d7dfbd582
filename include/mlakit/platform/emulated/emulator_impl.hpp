#pragma once
// Implementation of the emulated AMD device (emulator.hpp). Include it in exactly one
// translation unit of a program, compiled WITHOUT -fsanitize=thread (it defines the hooks that
// the instrumented kernel code calls). Needs Boost.Context (link boost_context).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <thread>

#include "emulator.hpp"

#if !defined(__gfx942__) && !defined(__gfx950__)
#error "the emulated AMD platform needs a target: define __gfx942__ or __gfx950__"
#endif

namespace mlakit::emu {

namespace impl {

struct Fault {
  std::string what;
};

// ---- device memory: one reserved arena, a guard page after every allocation ---------------
// Allocations end at a page boundary (rounded up to 256 bytes, the alignment hipMalloc gives),
// so a read past the rounded end faults (SIGSEGV) instead of reading a neighbour. Freed
// ranges become inaccessible and are not reused.
constexpr std::uintptr_t kArenaBytes = std::uintptr_t(1) << 40;
constexpr std::size_t kPage = 4096;

struct Arena {
  std::uintptr_t base = 0;
  std::uintptr_t cursor = 0;
  std::mutex mu;
  std::map<std::uintptr_t, std::pair<std::uintptr_t, std::size_t>> live;  // pointer -> pages
  Arena() {
    void* p =
        mmap(nullptr, kArenaBytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
      std::fprintf(stderr, "mlakit emulator: cannot reserve the device arena\n");
      std::abort();  // test infrastructure, not library code
    }
    base = cursor = reinterpret_cast<std::uintptr_t>(p);
  }
};
// Read by the access hooks without a lock: set once, before main.
inline std::uintptr_t g_arena_base = 0;
inline Arena& arena() {
  static Arena a;
  return a;
}
inline const bool g_arena_ready = [] {
  g_arena_base = arena().base;
  return true;
}();

inline thread_local std::uint64_t tls_read = 0, tls_written = 0;

inline bool in_arena(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p) - g_arena_base < kArenaBytes;
}

// ---- blocks, waves, lanes -------------------------------------------------------------------
constexpr int kWave = 64;
constexpr std::size_t kStackBytes = 512 * 1024;

struct Wave {
  int size = 0;  // lanes launched in this wave
  int arrived = 0;
  std::uint64_t gen = 0;
  alignas(64) unsigned char slots[2][kWave][kSlotBytes];
  std::uint64_t tags[2][kWave];
};

struct Lane {
  boost::context::fiber fiber;  // the suspended lane (empty while it runs or when done)
  boost::context::fiber sink;   // inside the lane: the scheduler to return to
  ThreadIds ids;
  Wave* wave = nullptr;
  int lane = 0;
  std::uint64_t wave_ops = 0;
  const std::uint64_t* wait_on = nullptr;  // runnable again once *wait_on != wait_value
  std::uint64_t wait_value = 0;
  bool done = false;
};

struct Block {
  std::unique_ptr<Lane[]> lanes;
  std::unique_ptr<Wave[]> waves;
  int threads = 0;
  int live = 0;
  int arrived = 0;
  std::uint64_t gen = 0;
  unsigned char* lds = nullptr;
  bool faulted = false;
  std::string fault;
};

// Fiber stacks, reused by the blocks a host thread runs.
struct StackPool {
  std::vector<void*> free;
  ~StackPool() {
    for (void* p : free) munmap(p, kStackBytes);
  }
};
inline thread_local StackPool tls_stacks;

struct PooledStack {
  boost::context::stack_context allocate() {
    void* p;
    if (!tls_stacks.free.empty()) {
      p = tls_stacks.free.back();
      tls_stacks.free.pop_back();
    } else {
      p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE,
               MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (p == MAP_FAILED) throw std::bad_alloc();
    }
    boost::context::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = static_cast<char*>(p) + kStackBytes;
    return sc;
  }
  void deallocate(boost::context::stack_context& sc) {
    tls_stacks.free.push_back(static_cast<char*>(sc.sp) - kStackBytes);
  }
};

inline thread_local Block* tls_block = nullptr;
inline thread_local Lane* tls_lane = nullptr;

inline bool runnable(const Lane& l) {
  return !l.done && (l.wait_on == nullptr || *l.wait_on != l.wait_value);
}
// Makes runnable lane l the host thread's current lane (the scheduler's sweep and the
// hand-over in yield_lane both resume lanes through it).
inline void enter(Lane& l) {
  l.wait_on = nullptr;
  tls_lane = &l;
  tls_ids = &l.ids;
}

// A lane that waits hands its host thread straight to the next runnable lane of the block's
// sweep (the lane the scheduler would resume next), so that a wave operation costs one fiber
// switch per lane instead of two; the scheduler's continuation travels along with it. The last
// runnable lane of the sweep returns to the scheduler. Lanes run in the same order as with a
// switch through the scheduler after every lane.
inline void yield_lane() {
  Block& b = *tls_block;
  Lane& l = *tls_lane;
  const int n = b.threads;
  for (int t = static_cast<int>(&l - b.lanes.get()) + 1; t < n; ++t) {
    Lane& m = b.lanes[t];
    if (!runnable(m)) continue;
    enter(m);
    // m continues in its own yield_lane (or at its start); it stores this lane's continuation
    // and receives the scheduler's.
    l.sink = std::move(m.fiber).resume_with([&l](boost::context::fiber&& from) {
      l.fiber = std::move(from);
      return std::move(l.sink);
    });
    return;
  }
  l.sink = std::move(l.sink).resume();
}

inline void lane_finished(Block& b, Lane& l) {
  l.done = true;
  --b.live;
  if (b.arrived > 0 && b.arrived == b.live) {  // the exited thread no longer holds the barrier
    b.arrived = 0;
    ++b.gen;
  }
}

// Runs one block to completion; returns false on a fault (message in b.fault).
inline bool run_block(Block& b, const KernelBody& body, Dim3 block_idx, Dim3 grid, Dim3 block) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  b.threads = b.live = n;
  b.arrived = 0;
  b.faulted = false;
  b.fault.clear();
  const int nw = (n + kWave - 1) / kWave;
  b.lanes.reset(new Lane[n]);
  b.waves.reset(new Wave[nw]);
  for (int w = 0; w < nw; ++w) b.waves[w].size = std::min(kWave, n - w * kWave);
  for (int t = 0; t < n; ++t) {
    Lane& l = b.lanes[t];
    l.ids.thread_idx = Dim3{unsigned(t) % block.x, unsigned(t) / block.x % block.y,
                            unsigned(t) / (block.x * block.y)};
    l.ids.block_idx = block_idx;
    l.ids.block_dim = block;
    l.ids.grid_dim = grid;
    l.wave = &b.waves[t / kWave];
    l.lane = t % kWave;
    l.fiber = boost::context::fiber(std::allocator_arg, PooledStack{},
                                    [&b, &l, &body](boost::context::fiber&& sink) {
                                      l.sink = std::move(sink);
                                      try {
                                        body();
                                      } catch (const Fault& f) {
                                        if (!b.faulted) {
                                          b.faulted = true;
                                          b.fault = f.what;
                                        }
                                      }
                                      lane_finished(b, l);
                                      return std::move(l.sink);
                                    });
  }
  tls_block = &b;
  for (;;) {
    bool progressed = false, all_done = true;
    for (int t = 0; t < n && !b.faulted; ++t) {
      Lane& l = b.lanes[t];
      if (l.done) continue;
      all_done = false;
      if (!runnable(l)) continue;
      enter(l);
      // Lanes after l may run before control comes back (yield_lane); the one that returns
      // here is tls_lane, and the sweep goes on after it.
      boost::context::fiber back = std::move(l.fiber).resume();
      tls_lane->fiber = std::move(back);
      t = static_cast<int>(tls_lane - b.lanes.get());
      progressed = true;
    }
    if (b.faulted || all_done) break;
    if (!progressed) {
      int at_barrier = 0, at_wave = 0;
      for (int t = 0; t < n; ++t) {
        const Lane& l = b.lanes[t];
        if (!l.done) (l.wait_on == &b.gen ? at_barrier : at_wave)++;
      }
      b.faulted = true;
      b.fault = "deadlock: " + std::to_string(at_barrier) + " threads wait at __syncthreads and " +
                std::to_string(at_wave) +
                " at a wave operation that can never complete (a barrier or wave operation "
                "not reached by every thread that must reach it)";
      break;
    }
  }
  tls_lane = nullptr;
  tls_ids = nullptr;
  b.lanes.reset();  // unwinds the stacks of lanes left suspended by a fault
  tls_block = nullptr;
  return !b.faulted;
}

inline thread_local std::vector<LaunchRecord> tls_launches;
inline thread_local std::string tls_pending_fault;

}  // namespace impl

// ---- the interface of emulator.hpp -----------------------------------------------------------

const TargetInfo& target() {
#if defined(__gfx942__)
  static const TargetInfo t{"gfx942:sramecc+:xnack-", 942, 304, 64 * 1024};
#else
  static const TargetInfo t{"gfx950:sramecc+:xnack-", 950, 256, 160 * 1024};
#endif
  return t;
}

const std::vector<LaunchRecord>& launches() { return impl::tls_launches; }
void clear_launches() { impl::tls_launches.clear(); }

int run_grid(const char* name, const KernelBody& body, Dim3 grid, Dim3 block,
             std::size_t dynamic_lds) {
  const std::uint64_t threads = std::uint64_t(block.x) * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 0x7FFFFFFFu || grid.y > 65535 ||
      grid.z > 65535 || threads == 0 || threads > 1024 ||
      dynamic_lds > std::size_t(target().lds_bytes))
    return 1;
  const std::uint64_t blocks = std::uint64_t(grid.x) * grid.y * grid.z;
  int workers = static_cast<int>(std::thread::hardware_concurrency());
  if (const char* e = std::getenv("MLAKIT_EMU_THREADS")) workers = std::atoi(e);
  workers = static_cast<int>(std::max<std::uint64_t>(
      1, std::min<std::uint64_t>(blocks, std::uint64_t(std::max(workers, 1)))));

  std::atomic<std::uint64_t> next{0}, read{0}, written{0};
  std::mutex fault_mu;
  std::string first_fault;
  auto work = [&] {
    const std::uint64_t r0 = impl::tls_read, w0 = impl::tls_written;
    // 1024-byte aligned dynamic LDS of this host thread.
    std::unique_ptr<unsigned char[]> raw(new unsigned char[dynamic_lds + 1024]);
    unsigned char* lds = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<std::uintptr_t>(raw.get()) + 1023) & ~std::uintptr_t(1023));
    impl::Block b;
    for (;;) {
      const std::uint64_t i = next.fetch_add(1);
      if (i >= blocks) break;
      const Dim3 bi{unsigned(i % grid.x), unsigned(i / grid.x % grid.y),
                    unsigned(i / (std::uint64_t(grid.x) * grid.y))};
      std::memset(lds, 0xFF, dynamic_lds);
      b.lds = lds;
      if (!impl::run_block(b, body, bi, grid, block)) {
        std::lock_guard<std::mutex> g(fault_mu);
        if (first_fault.empty())
          first_fault = std::string(name) + ", block (" + std::to_string(bi.x) + ", " +
                        std::to_string(bi.y) + ", " + std::to_string(bi.z) + "): " + b.fault;
        next.store(blocks);  // stop the launch
        break;
      }
    }
    read += impl::tls_read - r0;
    written += impl::tls_written - w0;
  };
  std::vector<std::thread> pool;
  for (int w = 1; w < workers; ++w) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();

  LaunchRecord rec;
  rec.kernel = name;
  rec.grid = grid;
  rec.block = block;
  rec.dynamic_lds = dynamic_lds;
  rec.bytes_read = read.load();
  rec.bytes_written = written.load();
  rec.faulted = !first_fault.empty();
  impl::tls_launches.push_back(rec);
  if (!first_fault.empty()) {
    std::fprintf(stderr, "mlakit emulator: fault in %s\n", first_fault.c_str());
    impl::tls_pending_fault = first_fault;
    return 2;
  }
  return 0;
}

unsigned char* dynamic_lds() { return impl::tls_block->lds; }

void block_barrier() {
  impl::Block& b = *impl::tls_block;
  impl::Lane& l = *impl::tls_lane;
  if (++b.arrived == b.live) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  l.wait_on = &b.gen;
  l.wait_value = b.gen;
  impl::yield_lane();
}

int lane_in_wave() { return impl::tls_lane->lane; }

const unsigned char* wave_exchange(const void* operands, std::size_t bytes, std::uint64_t tag) {
  impl::Lane& l = *impl::tls_lane;
  impl::Wave& w = *l.wave;
  if (w.size != impl::kWave)
    fault("wave operation in a wave of " + std::to_string(w.size) +
          " lanes (the emulator models wave operations of full 64-lane waves only)");
  if (bytes > kSlotBytes) fault("wave operation with more than 64 bytes of operands per lane");
  const int p = static_cast<int>(l.wave_ops & 1);
  std::memcpy(w.slots[p][l.lane], operands, bytes);
  w.tags[p][l.lane] = tag;
  if (++w.arrived == impl::kWave) {
    for (int i = 0; i < impl::kWave; ++i)
      if (w.tags[p][i] != tag)
        fault("lanes " + std::to_string(i) + " and " + std::to_string(l.lane) +
              " of one wave reached different wave operations (tags " +
              std::to_string(w.tags[p][i]) + " and " + std::to_string(tag) + ")");
    w.arrived = 0;
    ++w.gen;
  } else {
    l.wait_on = &w.gen;
    l.wait_value = w.gen;
    impl::yield_lane();
  }
  ++l.wave_ops;
  return &w.slots[p][0][0];
}

[[noreturn]] void fault(const std::string& what) {
  const ThreadIds* ids = tls_ids;
  std::string where;
  if (ids != nullptr)
    where = "thread (" + std::to_string(ids->thread_idx.x) + ", " +
            std::to_string(ids->thread_idx.y) + ", " + std::to_string(ids->thread_idx.z) + "): ";
  throw impl::Fault{where + what};
}

void count_access(const void* p, std::size_t bytes, bool write) {
  if (impl::in_arena(p)) (write ? impl::tls_written : impl::tls_read) += bytes;
}

void* device_alloc(std::size_t bytes) {
  if (bytes == 0) return nullptr;
  impl::Arena& a = impl::arena();
  const std::size_t rounded = (bytes + 255) & ~std::size_t(255);
  const std::size_t span = (rounded + impl::kPage - 1) & ~(impl::kPage - 1);
  std::lock_guard<std::mutex> g(a.mu);
  if (a.cursor + span + impl::kPage > a.base + impl::kArenaBytes) return nullptr;
  void* start = reinterpret_cast<void*>(a.cursor);
  if (mprotect(start, span, PROT_READ | PROT_WRITE) != 0) return nullptr;
  a.cursor += span + impl::kPage;  // the next page stays a guard
  char* p = static_cast<char*>(start) + (span - rounded);
  a.live[reinterpret_cast<std::uintptr_t>(p)] = {reinterpret_cast<std::uintptr_t>(start), span};
  return p;
}

bool device_free(void* p) {
  if (p == nullptr) return true;
  impl::Arena& a = impl::arena();
  std::lock_guard<std::mutex> g(a.mu);
  const auto it = a.live.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == a.live.end()) return false;
  // The pages become inaccessible (a use after free faults) and are given back.
  void* page = reinterpret_cast<void*>(it->second.first);
  mprotect(page, it->second.second, PROT_NONE);
  madvise(page, it->second.second, MADV_DONTNEED);
  a.live.erase(it);
  return true;
}

bool is_device_pointer(const void* p) { return impl::in_arena(p); }

std::string take_pending_fault() {
  std::string f = std::move(impl::tls_pending_fault);
  impl::tls_pending_fault.clear();
  return f;
}

}  // namespace mlakit::emu

// ---- access hooks called by the instrumented translation units ---------------------------------
// clang -fsanitize=thread -fno-sanitize-link-runtime -mllvm -tsan-instrument-atomics=0
// -mllvm -tsan-instrument-func-entry-exit=0: every load and store of N bytes calls
// __tsan_readN / __tsan_writeN, memcpy / memset / memmove call __tsan_mem*.
extern "C" {
void __tsan_init() {}
#define MLAKIT_EMU_HOOK(N)                                                                      \
  void __tsan_read##N(void* p) { ::mlakit::emu::count_access(p, N, false); }                    \
  void __tsan_write##N(void* p) { ::mlakit::emu::count_access(p, N, true); }                    \
  void __tsan_unaligned_read##N(void* p) { ::mlakit::emu::count_access(p, N, false); }          \
  void __tsan_unaligned_write##N(void* p) { ::mlakit::emu::count_access(p, N, true); }          \
  void __tsan_volatile_read##N(void* p) { ::mlakit::emu::count_access(p, N, false); }           \
  void __tsan_volatile_write##N(void* p) { ::mlakit::emu::count_access(p, N, true); }           \
  void __tsan_unaligned_volatile_read##N(void* p) { ::mlakit::emu::count_access(p, N, false); } \
  void __tsan_unaligned_volatile_write##N(void* p) { ::mlakit::emu::count_access(p, N, true); }
MLAKIT_EMU_HOOK(1)
MLAKIT_EMU_HOOK(2)
MLAKIT_EMU_HOOK(4)
MLAKIT_EMU_HOOK(8)
MLAKIT_EMU_HOOK(16)
#undef MLAKIT_EMU_HOOK
void __tsan_read_range(void* p, unsigned long n) { ::mlakit::emu::count_access(p, n, false); }
void __tsan_write_range(void* p, unsigned long n) { ::mlakit::emu::count_access(p, n, true); }
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void* __tsan_memcpy(void* d, const void* s, unsigned long n) {
  ::mlakit::emu::count_access(s, n, false);
  ::mlakit::emu::count_access(d, n, true);
  return std::memcpy(d, s, n);
}
void* __tsan_memmove(void* d, const void* s, unsigned long n) {
  ::mlakit::emu::count_access(s, n, false);
  ::mlakit::emu::count_access(d, n, true);
  return std::memmove(d, s, n);
}
void* __tsan_memset(void* d, int c, unsigned long n) {
  ::mlakit::emu::count_access(d, n, true);
  return std::memset(d, c, n);
}
}
