#pragma once
// Hopper (sm_90a) synchronisation building blocks of the warp-specialized mainloop:
//   - mbarrier wrappers and a ring pipeline object with a phase-tracking state
//     (producer_acquire / producer_commit / consumer_wait / consumer_release),
//   - named barriers with an enum of the barrier ids the mainloop uses,
//   - setmaxnreg (register hand-over from producer to consumer warpgroups),
//   - the async-proxy fence, cp.async group waits, 16-byte shared-memory accesses at shared
//     addresses.
// PTX semantics follow the PTX ISA sections on mbarrier, bar.sync / bar.arrive, setmaxnreg,
// fence.proxy.async and cp.async. Only sm_90a device code emits instructions;
// elsewhere the functions compile to nothing (the host never launches that kernel there).
#include <cstdint>

#include "../platform/intrinsics.hpp"
#include "../platform/platform.hpp"
#include "wgmma_sm90.hpp"

#if defined(MLAKIT_PLATFORM_CUDA)

namespace mlakit::arch {

// ---- mbarrier ---------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(std::uint64_t* bar, int count) {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(detail::smem_u32(bar)), "r"(count)
               : "memory");
#else
  (void)bar, (void)count;
#endif
}

// Makes barrier initialisation visible to the other threads (and to the async proxy).
__device__ __forceinline__ void mbar_init_fence() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];\n" ::"r"(detail::smem_u32(bar))
               : "memory");
#else
  (void)bar;
#endif
}

// Blocks until the phase of `bar` with parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, std::uint32_t parity) {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_LOOP:\n"
      "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_LOOP;\n"
      "}\n" ::"r"(detail::smem_u32(bar)),
      "r"(parity)
      : "memory");
#else
  (void)bar, (void)parity;
#endif
}

// Position in a ring of `Stages` stages: the stage index and the parity of its current use.
template <int Stages>
struct PipelineState {
  std::uint32_t count = 0;  // uses of the ring so far (tiles produced or consumed)
  __device__ int stage() const { return static_cast<int>(count % Stages); }
  __device__ std::uint32_t phase() const { return (count / Stages) & 1u; }
  __device__ void advance(int n = 1) { count += static_cast<std::uint32_t>(n); }
  // The position k uses after this one (a tile that takes several consecutive stages).
  __device__ PipelineState at(int k) const {
    return PipelineState{count + static_cast<std::uint32_t>(k)};
  }
};

// A ring of `Stages` shared-memory stages. Each stage is filled in `Parts` parts that become
// ready one after the other (a KV tile arrives in 64-column chunks, so the matrix work on the
// first chunk starts before the last one lands): `full[s][part]` completes when all
// ProducerThreads producer threads have written that part. Each stage is released in `Groups`
// groups of parts (e.g. the V columns one consumer warpgroup reads, the rest): `empty[s][g]`
// completes when the consumer warps that read group g of the stage are done with it (one
// arrival per warp); how many warps that is is given per stage and group at init. Every warp
// arrives only after reading the data of that use, so no arrival can count towards a later use.
template <int Stages, int Parts, int Groups, int ProducerThreads>
struct RingPipeline {
  struct Storage {
    std::uint64_t full[Stages][Parts];
    std::uint64_t empty[Stages][Groups];
  };
  Storage& st;

  // One thread initialises; the caller fences and synchronises the block afterwards.
  __device__ static void init(Storage& s, const int (&consumer_warps)[Stages][Groups]) {
    for (int i = 0; i < Stages; ++i) {
      for (int p = 0; p < Parts; ++p) mbar_init(&s.full[i][p], ProducerThreads);
      for (int g = 0; g < Groups; ++g) mbar_init(&s.empty[i][g], consumer_warps[i][g]);
    }
  }

  // Producer: waits until group `g` of the stage of `ps` was released after its previous use.
  // The first use of each stage passes at once: the parity waited for is the one before
  // phase 0.
  __device__ void producer_acquire(const PipelineState<Stages>& ps, int g) const {
    mbar_wait(&st.empty[ps.stage()][g], ps.phase() ^ 1u);
  }
  // Producer: this thread's writes of `part` are complete and fenced for the async proxy.
  __device__ void producer_commit(const PipelineState<Stages>& ps, int part) const {
    mbar_arrive(&st.full[ps.stage()][part]);
  }
  // Producer: `part` is complete once every cp.async this thread has issued so far has landed
  // (the arrival is made by the copy unit, the thread does not wait). Consumers then fence
  // the async proxy before their wgmma reads (consumer_wait does).
  __device__ void producer_commit_cp_async(const PipelineState<Stages>& ps, int part) const {
#if defined(MLAKIT_WGMMA_ENABLED)
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(
                     detail::smem_u32(&st.full[ps.stage()][part]))
                 : "memory");
#else
    (void)ps, (void)part;
#endif
  }
  // Consumer: waits until `part` of the stage of `ps` holds the tile; the fence orders the
  // producer's generic-proxy writes (cp.async, st.shared) before this thread's wgmma reads.
  __device__ void consumer_wait(const PipelineState<Stages>& ps, int part) const {
    consumer_wait_generic(ps, part);
    fence_proxy_async_smem();
  }
  // Consumer: the same wait for a stage that only generic-proxy loads read (ldmatrix,
  // ld.shared; no wgmma takes it from shared memory), or whose writers fenced the async proxy
  // before they arrived (producer_commit after fence_proxy_async_smem): the mbarrier's phase
  // completion orders the writes before this thread's reads, and it needs no fence of its
  // own. (The fence is a MEMBAR.ALL.CTA plus FENCE.VIEW.ASYNC.S in sm_90a machine code: it
  // also waits for the thread's own earlier shared-memory stores and atomics.)
  __device__ void consumer_wait_generic(const PipelineState<Stages>& ps, int part) const {
    mbar_wait(&st.full[ps.stage()][part], ps.phase());
  }
  // Consumer: this warp no longer reads group `g` of the stage (called by every lane after
  // the warp-collective wait that retired its wgmma reads; lane 0 arrives).
  __device__ void consumer_release(const PipelineState<Stages>& ps, int g) const {
    if (detail::lane_id() == 0) mbar_arrive(&st.empty[ps.stage()][g]);
  }
};

// ---- named barriers -------------------------------------------------------------------------

// Hardware barrier ids of the warp-specialized mainloop (0 is __syncthreads).
enum class NamedBarrier : int {
  consumers = 1,  // both consumer warpgroups (Q loaded, epilogue exchange, piece boundary)
  max_a = 2,      // warpgroup 0 published the running max and P of the even tile of a pair
  max_b = 3,      // warpgroup 1 published them for the odd tile
  producer = 4,   // the producer warpgroup (in-place fp8 conversion steps)
  pa_read = 5,    // warpgroup 1's P V reading P of the even tile retired
  // 6 is unused.
  // The keys-as-M mainloop (decode_kt_sm90.hpp), per consumer warpgroup (0, 1):
  tile_max = 7,    // every warp of warpgroup 0 published its tile maxima of the rows
  tile_p = 8,      // every warp of warpgroup 0 wrote its keys of P
  tile_max_1 = 9,  // the same for warpgroup 1 (32-row tiles)
  tile_p_1 = 10,
};

__device__ __forceinline__ void named_sync(NamedBarrier id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}
// The same barrier for warps that reach it at different instructions (bar.sync is the aligned
// form, which PTX requires every participating warp to execute at the same instruction).
__device__ __forceinline__ void named_sync_unaligned(NamedBarrier id, int threads) {
  asm volatile("barrier.sync %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(NamedBarrier id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(static_cast<int>(id)), "r"(threads) : "memory");
}

// ---- registers, copies, shared-memory accesses -----------------------------------------------

template <int Regs>
__device__ __forceinline__ void setmaxnreg_inc() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}
template <int Regs>
__device__ __forceinline__ void setmaxnreg_dec() {
#if defined(MLAKIT_WGMMA_ENABLED)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Regs));
#endif
}

// 16-byte shared-memory load and store at a shared address.
__device__ __forceinline__ std::uint32_t lds32(std::uint32_t addr) {
  std::uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ uint4 lds128(std::uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(addr)
               : "memory");
  return v;
}
__device__ __forceinline__ void sts32(std::uint32_t addr, std::uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts128(std::uint32_t addr, const uint4& v) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(v.x), "r"(v.y),
               "r"(v.z), "r"(v.w)
               : "memory");
}

}  // namespace mlakit::arch

#endif  // MLAKIT_PLATFORM_CUDA
