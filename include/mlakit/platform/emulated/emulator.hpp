#pragma once
// The emulated AMD device: the execution model behind platform/emulated/hip_runtime.hpp.
//
// A kernel launch runs every block of the grid on the CPU. The threads of a block are
// cooperatively scheduled fibers (Boost.Context) on one host thread, grouped into waves of 64
// lanes by thread index, as on CDNA hardware; blocks are spread over a pool of host threads.
// Block-level state (static LDS: `__shared__` variables are `thread_local`, and a block runs on
// one host thread; the dynamic LDS buffer) is private to the block while it runs. Global memory
// is host memory from an arena with a guard page after every allocation.
//
// Synchronisation is exact at the points the programming model defines: `__syncthreads()`
// releases when every live thread of the block has arrived; a wave-level operation (MFMA, DPP,
// shuffle) releases when all 64 lanes of the wave have deposited their operands, and each lane
// then computes its own result from all 64 inputs. A wave operation reached by only part of a
// wave, two lanes of one wave at different wave operations, or a barrier that can never
// release are reported as faults, as are unmodelled builtin arguments.
//
// Faults end the launch: the next synchronising call returns hipErrorLaunchFailure and the
// fault is printed to stderr.
//
// Traffic: every load and store of the kernels' translation units is reported to the
// emulator (the test build instruments them with clang's -fsanitize=thread hooks, without the
// ThreadSanitizer runtime); accesses that fall in device allocations are counted per launch.
// What is counted is what the code requests: there is no cache model.
//
// Implemented in emulator_impl.hpp, which exactly one translation unit of a program includes,
// compiled without the instrumentation.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace mlakit::emu {

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// What a thread of the running kernel sees as its built-in variables.
struct ThreadIds {
  Dim3 thread_idx, block_idx, block_dim, grid_dim;
};

// The calling fiber's ids (set by the scheduler before it resumes a fiber).
inline thread_local const ThreadIds* tls_ids = nullptr;

// A non-owning callable that runs one thread of a kernel.
struct KernelBody {
  void (*call)(void*) = nullptr;
  void* self = nullptr;
  void operator()() const { call(self); }
};

// The emulated target: gfx942 (MI300X, 304 CUs, 64 KiB LDS per workgroup, e4m3fnuz fp8) or
// gfx950 (MI355X, 256 CUs, 160 KiB, OCP e4m3fn).
struct TargetInfo {
  const char* arch_name;
  int gfx;
  int compute_units;
  int lds_bytes;
};
const TargetInfo& target();

// One kernel launch as the emulator ran it.
struct LaunchRecord {
  std::string kernel;
  Dim3 grid, block;
  std::size_t dynamic_lds = 0;
  std::uint64_t bytes_read = 0;     // global memory loads requested by the kernel
  std::uint64_t bytes_written = 0;  // global memory stores
  bool faulted = false;
};

// Launches recorded since the last clear (the calling host thread's launches only).
const std::vector<LaunchRecord>& launches();
void clear_launches();

// Runs a grid. Returns 0 on success, 1 for an invalid configuration (the launch does not
// run), 2 when the launch faulted (the fault is pending for the next synchronising call).
int run_grid(const char* name, const KernelBody& body, Dim3 grid, Dim3 block,
             std::size_t dynamic_lds);

// The calling kernel thread's dynamic LDS (aligned to 1024 bytes; filled with 0xFF bytes when
// the block starts, so an uninitialised read shows up as NaN).
unsigned char* dynamic_lds();

// Block barrier (__syncthreads).
void block_barrier();

// Wave operation: deposits `bytes` (at most kSlotBytes) of the lane's operands, waits until
// all 64 lanes of the wave have deposited theirs with the same `tag`, and returns the 64
// deposits (lane l at l * kSlotBytes). The lane's index in its wave is lane_in_wave().
inline constexpr std::size_t kSlotBytes = 64;
const unsigned char* wave_exchange(const void* operands, std::size_t bytes, std::uint64_t tag);
int lane_in_wave();

// Reports a fault of the calling kernel thread and ends the launch (does not return).
[[noreturn]] void fault(const std::string& what);

// Global memory accounting for operations the instrumentation does not see (atomics).
void count_access(const void* p, std::size_t bytes, bool write);

// Device memory.
void* device_alloc(std::size_t bytes);
bool device_free(void* p);
bool is_device_pointer(const void* p);
// The fault left by the last launch of the calling host thread, cleared by the call ("" if none).
std::string take_pending_fault();

}  // namespace mlakit::emu
