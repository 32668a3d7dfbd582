#pragma once
// The keys-as-M form of the fp8 matrix mode (Compute::fp8_matrix; 64 rows, e4m3fn KV): both
// products on e4m3 wgmma, the raw tile read as it is (docs/design.md, "The fp8 matrix mode"):
//   S^T [64 keys x 64 rows]  = K [64 x 576] . Q^T [576 x 64]     (18 k-steps of m64n64k32 per
//                               Q plane; SS: the raw tile is A, a Q plane is B)
//   O^T [256 dims x 64 rows] += V^T [256 x 64] . P^T [64 x 64]   (per warpgroup and tile: 4 dim
//                               blocks x 2 k-steps; V^T from registers, P^T from shared memory)
// Numerics (each choice measured in docs/design.md):
//   - Q as two e4m3 planes hi = e4m3(x), lo = e4m3(x - hi) of x = q 2^e, e per row putting its
//     largest |q| in [2^7, 2^8): a bf16 value keeps its 8 significant bits down to 2^-10 of the
//     row's largest; the row's softmax factor is scale_log2 x 2^-e.
//   - S^T in chains of 4 k-steps (both planes), each chain's sum added into f32 registers: e4m3
//     wgmma sums with a truncating alignment, so no chain is longer than 8 wgmma.
//   - P as one e4m3fn plane, unscaled: with the lazy running max (slack 8) P <= 2^8 and the
//     largest P of a row is at least 1. The row sums use the f32 P.
//   - O^T per pair of tiles: each 64-dim block's chain of 4 k-steps (both tiles) starts from
//     zero and is added into O^T in f32 once it retired, so O's error does not grow with the
//     context length.
// Layouts: the producer writes a raw tile as five 128-column chunks [64 tokens][128 B] with the
// 128-byte swizzle (KtMatrixSharedStorage), the K-major layout of e4m3 operands; the pieces
// that read it (load_vt_e4m3_kt, store_pt_e4m3_kt) are those of arch/wgmma_fp8_sm90.hpp.
// The schedule is the 64-row keys-as-M one (KtMainloopOf::consume_pairs); only the P V of a
// pair differs (pair_pv()).
#include <cstdint>

#include "../../arch/wgmma_fp8_sm90.hpp"
#include "raw_fp8_form.hpp"

#if defined(MLAKIT_HAS_SM90A_KERNELS)

namespace mlakit::detail {

template <class Tr>
struct KtMatrixForm : KtRawFp8Form<Tr> {
  using Base = KtRawFp8Form<Tr>;
  using Base::kConsumerThreads;
  using Base::kCopies;
  using Base::kMbOwn;
  using Base::kRows;
  using Base::kS;
  using Base::kTok;
  using Base::kTokStride;
  using Base::ctx;
  using Base::tiles;
  using Base::state;
  using typename Base::Copy;
  using typename Base::Pipeline;
  using typename Base::Range;
  using typename Base::State;
  using Storage = KtMatrixSharedStorage;
  static_assert(kRows == 64 && Tr::kFp8Matrix && kMbOwn == 4, "64 rows, dims split");
  static constexpr int kChunk = Storage::kChunkBytes;  // bytes of a 128-column chunk

  // ---- producer ------------------------------------------------------------------------------
  // Tile i of the range into ring stage st: lane (r0, sub) copies bytes [16 (4 c + sub), + 16)
  // of its tokens r0 + 32 k, c < kCopies, into chunk c / 2 at unit (4 c + sub) & 7 (the
  // chunk-ring form's layout; the tokens share r0 & 7, hence the swizzled column). Slots past
  // the range repeat its last token (token_sources).
  __device__ void produce(const Range& r, State& st) const {
    constexpr bool kSplit = Tr::Problem::kSplitCache;  // rotary chunks from kv_rope
    if (r.n_tiles == 0) return;
    const Pipeline pipe{state.bars};
    const int pl = static_cast<int>(threadIdx.x) - kConsumerThreads;
    const int sub = pl & 3, r0 = pl >> 2;
    const std::int32_t* table = ctx.page_table();
    const int last = r.kv_end - 1;
    const std::uint32_t dst_even = r0 * 128 + ((sub ^ (r0 & 7)) << 4);  // copies c = 0, 2, ..
    const std::uint32_t dst_odd = r0 * 128 + (((4 + sub) ^ (r0 & 7)) << 4);
    int id[kTok];
    this->fetch_pages(table, r.kv_begin, last, pl, id);
    for (int i = 0; i < r.n_tiles; ++i) {
      const int kt = r.kv_begin + 64 * i;
      const unsigned char *src[kTok], *rope[kTok] = {};
      this->template token_sources<kSplit>(r, kt, r0, sub, id, src, rope);
      if (i + 1 < r.n_tiles) this->fetch_pages(table, kt + 64, last, pl, id);  // in flight
      pipe.producer_acquire(st, 0);
      const std::uint32_t stage = Copy::per_thread(smem_u32(tiles.kv[st.stage()]));
#pragma unroll
      for (int k = 0; k < kTok; ++k) {
#pragma unroll
        for (int c = 0; c < kCopies; ++c)
          Copy::copy16_evict_first(
              stage + ((c & 1) ? dst_odd : dst_even) + (c >> 1) * kChunk + k * kTokStride * 128,
              this->template copy_src<kSplit>(src[k], rope[k], c), 16u);
      }
      pipe.producer_commit_cp_async(st, 0);
      st.advance();
    }
  }

  // ---- consumer operands -------------------------------------------------------------------

  // Q [64 x 576] -> the two e4m3 planes (chunks of 128 columns, 128-byte swizzle), each row
  // times 2^e with its largest |q| in [2^7, 2^8) (exact in hi + lo for bf16 values down to
  // 2^-10 of it); state.q_scale gets scale_log2 x 2^-e.
  __device__ void load_q() const {
    unsigned char* const hi = tiles.q[0];
    unsigned char* const lo = tiles.q[1];
    ctx.template load_q_pow2<kConsumerThreads, 8, true>(
        [&](int r, int blk, const float(&v)[16]) {
          std::uint32_t h[4], l[4];
#pragma unroll
          for (int k = 0; k < 4; ++k) {
            const float x[4] = {v[4 * k], v[4 * k + 1], v[4 * k + 2], v[4 * k + 3]};
            arch::split_e4m3x4(x, h[k], l[k]);
          }
          const std::uint32_t off = (blk >> 3) * kChunk + arch::sw128_offset(r, 16 * (blk & 7));
          *reinterpret_cast<uint4*>(hi + off) = uint4{h[0], h[1], h[2], h[3]};
          *reinterpret_cast<uint4*>(lo + off) = uint4{l[0], l[1], l[2], l[3]};
        },
        state.q_scale, ctx.p.scale_log2);
    arch::fence_proxy_async_smem();
  }

  // The shared address of the tile at ring position st once it landed, fenced for wgmma (S^T
  // reads the raw tile from shared memory).
  __device__ std::uint32_t tile_kv(const Pipeline& pipe, const State& st) const {
    pipe.consumer_wait(st, 0);
    return smem_u32(tiles.kv[st.stage()]);
  }

  // S^T = K Q^T for the tile at shared address kv: chains of 4 k-steps x 2 planes (the last
  // one 2 k-steps), the first into s, each later one into a zeroed accumulator added to s in
  // f32 once it retired. Returns with every wgmma of the tile retired.
  __device__ void issue_s(float (&s)[kS], std::uint32_t kv, int wi, int lane,
                          const State& st) const {
    (void)wi, (void)lane, (void)st;
    std::uint32_t q_addr = smem_u32(tiles.q[0]);
    asm volatile("" : "+r"(kv), "+r"(q_addr));
    const arch::WgmmaDescBase dk = arch::WgmmaDescBase::make(kv, 16, 1024);
    const arch::WgmmaDescBase dq = arch::WgmmaDescBase::make(q_addr, 16, 1024);
    constexpr std::uint32_t kPlane = Storage::kChunks * kChunk;
    auto chain = [&](float(&d)[kS], int c) {
      arch::wgmma_fence();
#pragma unroll
      for (int j = 0; j < (c < 4 ? 4 : 2); ++j) {
        const int ks = 4 * c + j;
        const std::uint32_t off = (ks >> 2) * kChunk + 32 * (ks & 3);
#pragma unroll
        for (int pl = 0; pl < 2; ++pl)
          arch::WgmmaE4m3::mma_ss_n64(d, dk.at(off), dq.at(pl * kPlane + off), j + pl > 0);
      }
      arch::wgmma_commit();
    };
    chain(s, 0);
#pragma unroll
    for (int c = 1; c < 5; ++c) {
      float part[kS];
      chain(part, c);
      arch::wgmma_wait<0>();
      arch::fence_operand(s);
      arch::fence_operand(part);
#pragma unroll
      for (int i = 0; i < kS; ++i) s[i] += part[i];
    }
  }

  // P^T of the thread's scores into the pair's plane for this tile at shared address p
  // (store_pt_e4m3_kt: kappa order, 64-byte swizzle), unscaled (see the header).
  __device__ void store_p(const float (&s)[kS], std::uint32_t p, int wi, int lane) const {
    arch::store_pt_e4m3_kt(s, 1.0f, p, wi, lane);
  }

  // O^T += V^T P^T for both tiles of the pair (A at ring position st_a, B at st_b; their P^T
  // planes at p_a, p_b), dims [256 w, 256 w + 256): per 64-dim block mt one chain of 4 k-steps
  // (A's two, then B's) into a zeroed accumulator, added to o[mt] once it retired; the next
  // block's V^T fragments are loaded while a chain runs. Every warp releases both stages once
  // its last fragments were read. Returns with every wgmma retired.
  __device__ void pair_pv(float (&o)[kMbOwn][kS], const Pipeline& pipe, const State& st_a,
                          const State& st_b, std::uint32_t p_a, std::uint32_t p_b, int w, int wi,
                          int lane) const {
    pipe.consumer_wait_generic(st_a, 0);  // only ldmatrix reads the stages here
    pipe.consumer_wait_generic(st_b, 0);
    std::uint32_t kv_a = smem_u32(tiles.kv[st_a.stage()]), kv_b = smem_u32(tiles.kv[st_b.stage()]);
    asm volatile("" : "+r"(kv_a), "+r"(kv_b), "+r"(p_a), "+r"(p_b));
    const arch::WgmmaDescBase da = arch::WgmmaDescBase::make(p_a, 16, 512, arch::WgmmaSwizzle::b64);
    const arch::WgmmaDescBase db = arch::WgmmaDescBase::make(p_b, 16, 512, arch::WgmmaSwizzle::b64);
    const int d0 = 256 * w + 16 * wi;
    // [tile][k-step][register] of the V^T fragments of one dim block
    auto load = [&](int mt, std::uint32_t(&v)[2][2][4]) {
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        arch::load_vt_e4m3_kt(kv_a, d0 + 64 * mt, j, lane, v[0][j]);
        arch::load_vt_e4m3_kt(kv_b, d0 + 64 * mt, j, lane, v[1][j]);
      }
    };
    std::uint32_t next[2][2][4];
    load(0, next);
#pragma unroll
    for (int mt = 0; mt < kMbOwn; ++mt) {
      std::uint32_t v[2][2][4];
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int j = 0; j < 2; ++j)
#pragma unroll
          for (int k = 0; k < 4; ++k) v[x][j][k] = next[x][j][k];
      float part[kS];
      arch::wgmma_fence();
#pragma unroll
      for (int x = 0; x < 2; ++x)
#pragma unroll
        for (int j = 0; j < 2; ++j)
          arch::WgmmaE4m3::mma_rs_n64(part, v[x][j], (x == 0 ? da : db).at(32 * j), x + j > 0);
      arch::wgmma_commit();
      if (mt + 1 < kMbOwn) {
        load(mt + 1, next);
      } else {  // every read of both stages is done
        __syncwarp();
        pipe.consumer_release(st_a, 0);
        pipe.consumer_release(st_b, 0);
      }
      arch::wgmma_wait<0>();
      arch::fence_operand(part);
#pragma unroll
      for (int i = 0; i < kS; ++i) o[mt][i] += part[i];
    }
  }
};

}  // namespace mlakit::detail

#endif  // MLAKIT_HAS_SM90A_KERNELS
