// GAT attention on WSB tiles, CUDA (attention.h): the tile products on tensor cores (wmma),
// scores, softmax and sums in float32 registers.
//
// Inside a tile, lane l owns row r = l / 2 and the eight columns 8 (l % 2) .. + 7: its count,
// score, weight and score gradient; the row's two lanes combine with one shuffle. Operand
// blocks go through the warp's shared-memory slab: wmma's fragment layout is opaque, so P is
// written there by the lanes and loaded as an operand, and a product is stored there and read
// back by the lanes. Every output has one owning warp: no atomics, the same bits every run.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "gnnio/common/convert.cuh"
#include "gnnio/common/cp_async.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/vec.cuh"
#include "gnnio/wsb/attention.h"
#include "gnnio/wsb/mma.cuh"
#include "gnnio/wsb/policy.h"

namespace gnnio {
namespace {

namespace wmma = nvcuda::wmma;

constexpr float kSoftmaxEps = 1e-16f;  // PyG's softmax denominator guard
constexpr unsigned kFullMask = 0xffffffffu;
// kCap: the widest head a build stages (policy.h's channel capacities), a multiple of 16.
// Row pitch of a staged 16 x C block: kCap plus 16 bytes (4 floats, 8 halves): a multiple of
// wmma's 4 / 8 elements, every fragment pointer 32-byte aligned, and consecutive rows 4 banks
// apart.
template <typename T, int kCap>
constexpr int kLd = kCap + 16 / int(sizeof(T));
template <int kCap>
constexpr int kFrags = kCap / 16;

// P goes into float16 operands times 2^15 (P <= 1, so at most 32768 < 65504), and the products
// are scaled back by 2^-15 at the store, exactly: unscaled, the weights of a row of thousands of
// edges (P ~ 1e-6) would round in float16's subnormal range, to 2^-25 absolute instead of 2^-11
// relative. bfloat16 has float32's exponent range; tf32 too.
template <typename T>
constexpr float kPScale = std::is_same_v<T, __half> ? 32768.f : 1.f;
template <typename T>
constexpr float kPUnscale = std::is_same_v<T, __half> ? 1.f / 32768.f : 1.f;

template <typename T, int kCap>
struct ForwardSlab {
  T p[kWsbTileSize];                // P, an MMA operand
  T rows[kWsbTile * kLd<T, kCap>];  // the tile's 16 value rows of one head
  float tile[kWsbTileSize];     // a 16 x 16 product, staged for the store
};

template <typename T, int kCap>
struct BackwardSlab {
  T p[kWsbTileSize];
  T rows[kWsbTile * kLd<T, kCap>];   // value rows (pass A: the tile's sources; pass B: the block's own)
  T rows2[kWsbTile * kLd<T, kCap>];  // dout rows (pass A: the block's own; pass B: the tile's destinations)
  float tile[kWsbTileSize];
};

// LeakyReLU with its product rounded on its own: the forward's two passes and the backward
// form the same e from the same z whatever nvcc contracts around it.
__device__ inline float leaky(float z, float slope) { return z > 0.f ? z : __fmul_rn(z, slope); }

// Starts staging rows r0 .. r0+15 of a [n, H, C] tensor's head h into a slab block (zeros past n
// and C, up to the 16-channel multiple the fragments read); staged() waits for it. vec: the
// tensor is 16-byte aligned and C a multiple of a 16-byte vector, so a lane moves 16 bytes at a
// time (a vector never straddles C) with cp.async, and the warp goes on while they land; the
// element path stores as it loads.
template <typename T, int kCap>
__device__ void stage_rows(T* dst, const T* src, int64_t r0, int64_t n, int64_t heads, int64_t h,
                           int channels, int c16, int lane, bool vec) {
  if (vec) {
    constexpr int kV = 16 / int(sizeof(T));
    const int per_row = c16 / kV;
    for (int x = lane; x < kWsbTile * per_row; x += 32) {
      const int r = x / per_row, c = (x % per_row) * kV;
      const bool ok = r0 + r < n && c < channels;
      cp_async16(dst + r * kLd<T, kCap> + c, ok ? src + ((r0 + r) * heads + h) * channels + c : src, ok);
    }
    return;
  }
  const T zero = from_acc<T>(0.f);
  for (int x = lane; x < kWsbTile * c16; x += 32) {
    const int r = x / c16, c = x % c16;
    const bool ok = r0 + r < n && c < channels;
    dst[r * kLd<T, kCap> + c] = ok ? src[((r0 + r) * heads + h) * channels + c] : zero;
  }
}

// The warp's staged rows are in its slab, for every lane.
__device__ inline void staged() {
  cp_async_wait_all();
  __syncwarp();
}

template <typename T>
__device__ inline T operand_of(float w) {
  if constexpr (std::is_same_v<T, float>) return w;  // rounded to tf32 in the fragment
  else return from_acc<T>(w * kPScale<T>);
}

template <typename T>
using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, MmaTraits<T>::kK, float>;
template <typename T, typename Layout>
using AFrag = wmma::fragment<wmma::matrix_a, 16, 16, MmaTraits<T>::kK,
                             typename MmaTraits<T>::operand, Layout>;
template <typename T, typename Layout>
using BFrag = wmma::fragment<wmma::matrix_b, 16, 16, MmaTraits<T>::kK,
                             typename MmaTraits<T>::operand, Layout>;

// acc[j] += A (16 x 16, row-major at a, pitch lda) · B[:, 16 j .. 16 j + 15] (row-major at b,
// pitch kLd<T, kCap>), for j < frags.
template <typename T, int kCap>
__device__ void mma_rows(AccFrag<T> (&acc)[kFrags<kCap>], const T* a, int lda, const T* b, int frags) {
  constexpr int kK = MmaTraits<T>::kK;
  for (int k = 0; k < kWsbTile; k += kK) {
    AFrag<T, wmma::row_major> af;
    wmma::load_matrix_sync(af, a + k, lda);
    to_operand<T>(af);
#pragma unroll
    for (int j = 0; j < kFrags<kCap>; ++j) {
      if (j < frags) {
        BFrag<T, wmma::row_major> bf;
        wmma::load_matrix_sync(bf, b + k * kLd<T, kCap> + j * 16, kLd<T, kCap>);
        to_operand<T>(bf);
        wmma::mma_sync(acc[j], af, bf, acc[j]);
      }
    }
  }
}

// out (16 x 16) = A (16 x C16, row-major, pitch kLd<T, kCap>) · Bᵀ for B 16 x C16 row-major (same
// pitch): the dot products of every row of a with every row of b.
template <typename T, int kCap>
__device__ void mma_row_dots(AccFrag<T>& out, const T* a, const T* b, int c16) {
  constexpr int kK = MmaTraits<T>::kK;
  wmma::fill_fragment(out, 0.f);
  for (int k = 0; k < c16; k += kK) {
    AFrag<T, wmma::row_major> af;
    BFrag<T, wmma::col_major> bf;  // element (k', n) of Bᵀ is b[n * kLd<T, kCap> + k']
    wmma::load_matrix_sync(af, a + k, kLd<T, kCap>);
    wmma::load_matrix_sync(bf, b + k, kLd<T, kCap>);
    to_operand<T>(af);
    to_operand<T>(bf);
    wmma::mma_sync(out, af, bf, out);
  }
}

struct Lane {
  int r, cb;  // row, first of the eight columns
  __device__ explicit Lane(int lane) : r(lane >> 1), cb((lane & 1) * 8) {}
};

// The operands every kernel reads, typed once.
template <typename T>
struct Operands {
  const T* src_score;
  const T* dst_score;  // nullptr: no destination score
  const T* value;
  const T* dout;        // backward only
  const float* stats;   // backward only
  const float* delta;   // backward only
  int64_t heads;
  int channels, c16, frags;  // c16: channels padded to whole 16-wide fragments
  float slope;
  __device__ Operands(const WsbAttentionParams& p, const void* grad_out, const void* d)
      : src_score(static_cast<const T*>(p.src_score)),
        dst_score(static_cast<const T*>(p.dst_score)),
        value(static_cast<const T*>(p.value)),
        dout(static_cast<const T*>(grad_out)),
        stats(static_cast<const float*>(p.stats)),
        delta(static_cast<const float*>(d)),
        heads(p.heads),
        channels(static_cast<int>(p.channels)),
        c16((channels + 15) / 16 * 16),
        frags(c16 / 16),
        slope(static_cast<float>(p.negative_slope)) {}
};

// The warp's work item (block of 16 rows, head) among blocks(rows) x heads, kWarps a CTA;
// false past the end (for the whole warp).
template <int kWarps>
__device__ bool work_item(int64_t rows, int64_t heads, int warp, int64_t& block, int64_t& head) {
  const int64_t item = int64_t(blockIdx.x) * kWarps + warp;
  if (item >= (rows + kWsbTile - 1) / kWsbTile * heads) return false;
  block = item / heads;
  head = item % heads;
  return true;
}

template <typename T, typename index_t, int kCap>
__global__ void __launch_bounds__(WsbAttentionConfig::kForwardWarps * 32)
    wsb_attention_forward_kernel(WsbAttentionParams p, bool vec) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kWarps = WsbAttentionConfig::kForwardWarps;
  __shared__ __align__(128) ForwardSlab<T, kCap> slabs[kWarps];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  ForwardSlab<T, kCap>& slab = slabs[warp];
  const Lane ln(lane);
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  // A CTA serves several block rows when there are fewer heads than warps.
  int64_t b, h;
  if (!work_item<kWarps>(p.num_dst, p.heads, warp, b, h)) return;
  const Operands<T> op(p, nullptr, nullptr);
  const int64_t H = op.heads, i = b * kWsbTile + ln.r;
  const bool row_ok = i < p.num_dst;
  const int64_t begin = block_rowptr[b], end = block_rowptr[b + 1];
  const int C = op.channels, c16 = op.c16, frags = op.frags;
  const float slope = op.slope;
  const T *src_score = op.src_score, *dst_score = op.dst_score, *value = op.value;

  // The first tile's value rows are in flight through pass 1, each next tile's while its P is formed.
  if (begin < end)
    stage_rows<T, kCap>(slab.rows, value, int64_t(block_col[begin]) * kWsbTile, p.num_src, H, h, C, c16, lane, vec);
  const float sd = dst_score && row_ok ? to_acc(dst_score[i * H + h]) : 0.f;
  // Pass 1: the row's max and sum from the scores alone.
  float m = -INFINITY, s = 0.f;
  bool seen = false;  // an edge, whatever its score
  for (int64_t t = begin; t < end; ++t) {
    const int64_t c0 = int64_t(block_col[t]) * kWsbTile + ln.cb;
    const float* cnt = p.count + t * kWsbTileSize + ln.r * kWsbTile + ln.cb;
    float e[8], tile_max = -INFINITY;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      seen |= cnt[q] > 0.f;
      e[q] = cnt[q] > 0.f ? leaky(to_acc(src_score[(c0 + q) * H + h]) + sd, slope) : -INFINITY;
      tile_max = fmaxf(tile_max, e[q]);
    }
    if (tile_max > m) {
      s = m == -INFINITY ? 0.f : s * expf(m - tile_max);
      m = tile_max;
    }
#pragma unroll
    for (int q = 0; q < 8; ++q)
      if (cnt[q] > 0.f) s += cnt[q] * expf(e[q] - m);
  }
  const float m_other = __shfl_xor_sync(kFullMask, m, 1), s_other = __shfl_xor_sync(kFullMask, s, 1);
  // Every lane shuffles (a full-mask shuffle inside `seen || ...` would run in some lanes only).
  const int seen_other = __shfl_xor_sync(kFullMask, int(seen), 1);
  const bool row_seen = seen || seen_other != 0;
  float M = fmaxf(m, m_other), S = 0.f;
  if (M == -INFINITY) {
    // No edge: PyG's empty softmax. Edges whose scores are all -inf: PyG's (and the CPU's)
    // exp(-inf - -inf) = NaN.
    M = 0.f;
    S = row_seen ? NAN : 0.f;
  } else {  // the same two terms in both lanes, added in either order: the same float
    S = (m == -INFINITY ? 0.f : s * expf(m - M)) + (m_other == -INFINITY ? 0.f : s_other * expf(m_other - M));
  }
  S += kSoftmaxEps;
  if ((lane & 1) == 0 && row_ok) {
    auto* st = static_cast<float*>(p.stats) + (i * H + h) * 2;
    st[0] = M;
    st[1] = S;
  }

  // Pass 2: out = P · value with P final.
  AccFrag<T> acc[kFrags<kCap>];
#pragma unroll
  for (int j = 0; j < kFrags<kCap>; ++j) wmma::fill_fragment(acc[j], 0.f);
  for (int64_t t = begin; t < end; ++t) {
    const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
    const float* cnt = p.count + t * kWsbTileSize + ln.r * kWsbTile + ln.cb;
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      float w = 0.f;
      if (cnt[q] > 0.f) {
        const float e = leaky(to_acc(src_score[(c0 + ln.cb + q) * H + h]) + sd, slope);
        w = cnt[q] * expf(e - M) / S;
      }
      slab.p[ln.r * kWsbTile + ln.cb + q] = operand_of<T>(w);
    }
    staged();
    mma_rows<T, kCap>(acc, slab.p, kWsbTile, slab.rows, frags);
    __syncwarp();  // the slab is written again for the next tile
    if (t + 1 < end)
      stage_rows<T, kCap>(slab.rows, value, int64_t(block_col[t + 1]) * kWsbTile, p.num_src, H, h, C, c16,
                          lane, vec);
  }
  auto* out = static_cast<T*>(p.out);
  auto* out_acc = static_cast<float*>(p.out_acc);
#pragma unroll
  for (int j = 0; j < kFrags<kCap>; ++j) {
    if (j >= frags) break;
    wmma::store_matrix_sync(slab.tile, acc[j], kWsbTile, wmma::mem_row_major);
    __syncwarp();
    for (int x = lane; x < kWsbTileSize; x += 32) {
      const int64_t row = b * kWsbTile + x / kWsbTile;
      const int c = j * 16 + x % kWsbTile;
      if (row < p.num_dst && c < C) {
        const int64_t o = (row * H + h) * C + c;
        const float v = slab.tile[x] * kPUnscale<T>;
        out[o] = from_acc<T>(v);
        if (out_acc) out_acc[o] = v;
      }
    }
    __syncwarp();
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an architecture without these MMA shapes: fail loudly
#endif
}

// D_i = dout_i . out_i per (destination, head): one warp each, lanes over the channels. Run only
// where pass A does not (no destination score gradient); pass A forms D_i itself.
template <typename T>
__global__ void wsb_attention_delta_kernel(WsbAttentionBackwardParams b) {
  const WsbAttentionParams& p = b.fwd;
  const int64_t rows = p.num_dst * p.heads, C = p.channels;
  const auto* dout = static_cast<const T*>(b.grad_out);
  const auto* out = static_cast<const T*>(p.out);
  const auto* out_acc = static_cast<const float*>(p.out_acc);
  const int lane = threadIdx.x % 32;
  for (int64_t ih = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32; ih < rows;
       ih += int64_t(gridDim.x) * blockDim.x / 32) {
    float d = 0.f;
    for (int64_t c = lane; c < C; c += 32)
      d = fma_pinned(to_acc(dout[ih * C + c]), out_acc ? out_acc[ih * C + c] : to_acc(out[ih * C + c]), d);
    for (int off = 16; off > 0; off >>= 1) d += __shfl_xor_sync(kFullMask, d, off);
    if (lane == 0) static_cast<float*>(b.delta)[ih] = d;
  }
}

// Pass A: d dst_score, by destination block.
template <typename T, typename index_t, int kCap>
__global__ void __launch_bounds__(WsbAttentionConfig::kBackwardWarps * 32)
    wsb_attention_pass_a_kernel(WsbAttentionBackwardParams bp, bool vec_value, bool vec_dout) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kWarps = WsbAttentionConfig::kBackwardWarps;
  __shared__ __align__(128) BackwardSlab<T, kCap> slabs[kWarps];
  const WsbAttentionParams& p = bp.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  BackwardSlab<T, kCap>& slab = slabs[warp];
  const Lane ln(lane);
  const auto* block_rowptr = static_cast<const index_t*>(p.block_rowptr);
  const auto* block_col = static_cast<const index_t*>(p.block_col);
  int64_t b, h;
  if (!work_item<kWarps>(p.num_dst, p.heads, warp, b, h)) return;
  const Operands<T> op(p, bp.grad_out, bp.delta);
  const int64_t H = op.heads, i = b * kWsbTile + ln.r;
  const bool row_ok = i < p.num_dst;
  const int64_t begin = block_rowptr[b], end = block_rowptr[b + 1];
  const int C = op.channels, c16 = op.c16;
  const float slope = op.slope;
  const T *src_score = op.src_score, *dst_score = op.dst_score, *value = op.value, *dout = op.dout;
  const float* stats = op.stats;

  const float sd = dst_score && row_ok ? to_acc(dst_score[i * H + h]) : 0.f;
  const float M = row_ok ? stats[(i * H + h) * 2] : 0.f, S = row_ok ? stats[(i * H + h) * 2 + 1] : 1.f;
  // The block's dout rows and the first tile's value rows load together; each next tile's value
  // rows while this tile's score gradients are formed.
  if (begin < end) {
    stage_rows<T, kCap>(slab.rows2, dout, b * kWsbTile, p.num_dst, H, h, C, c16, lane, vec_dout);
    stage_rows<T, kCap>(slab.rows, value, int64_t(block_col[begin]) * kWsbTile, p.num_src, H, h, C, c16,
                        lane, vec_value);
  }
  // D_i = dout_i . out_i = sum_j P_ij dP_ij (out_i = sum_j P_ij v_j before any bias), so the
  // score gradient sum_j P_ij (dP_ij - D_i) lk_ij (lk: LeakyReLU's slope at z_ij) is
  // sum_j P_ij dP_ij lk_ij - D_i sum_j P_ij lk_ij: three running sums over the tiles, D_i at the
  // end, with no read of out or second read of dout; D_i is written for pass B.
  float g_dp = 0.f, g_p = 0.f, d_sum = 0.f;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t c0 = int64_t(block_col[t]) * kWsbTile;
    // The weights need no staged row: formed while the value rows land.
    const float* cnt = p.count + t * kWsbTileSize + ln.r * kWsbTile + ln.cb;
    float w[8];
    unsigned positive = 0;  // z > 0 of each slot: LeakyReLU's branch in the score gradient
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      w[q] = 0.f;
      if (cnt[q] > 0.f) {
        const float z = to_acc(src_score[(c0 + ln.cb + q) * H + h]) + sd;
        w[q] = cnt[q] * expf(leaky(z, slope) - M) / S;
        positive |= unsigned(z > 0.f) << q;
      }
    }
    staged();
    AccFrag<T> dp;
    mma_row_dots<T, kCap>(dp, slab.rows2, slab.rows, c16);  // dP = dout_block · value_tileᵀ
    wmma::store_matrix_sync(slab.tile, dp, kWsbTile, wmma::mem_row_major);
    __syncwarp();  // the tile for every lane; the value rows free
    if (t + 1 < end)
      stage_rows<T, kCap>(slab.rows, value, int64_t(block_col[t + 1]) * kWsbTile, p.num_src, H, h, C, c16,
                          lane, vec_value);
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      if (cnt[q] > 0.f) {
        const float wdp = __fmul_rn(w[q], slab.tile[ln.r * kWsbTile + ln.cb + q]);
        const bool pos = positive >> q & 1u;
        d_sum += wdp;
        g_dp += pos ? wdp : __fmul_rn(wdp, slope);
        g_p += pos ? w[q] : __fmul_rn(w[q], slope);
      }
    }
    __syncwarp();  // the tile is written again for the next tile
  }
  d_sum += __shfl_xor_sync(kFullMask, d_sum, 1);
  g_dp += __shfl_xor_sync(kFullMask, g_dp, 1);
  g_p += __shfl_xor_sync(kFullMask, g_p, 1);
  const float g = __fsub_rn(g_dp, __fmul_rn(d_sum, g_p));
  if ((lane & 1) == 0 && row_ok) static_cast<float*>(bp.delta)[i * H + h] = d_sum;
  if ((lane & 1) == 0 && row_ok) static_cast<T*>(bp.grad_dst_score)[i * H + h] = from_acc<T>(g);
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an architecture without these MMA shapes: fail loudly
#endif
}

// Pass B: d src_score and d value, by source block over the transposed tiles.
template <typename T, typename index_t, int kCap>
__global__ void __launch_bounds__(WsbAttentionConfig::kBackwardWarps * 32)
    wsb_attention_pass_b_kernel(WsbAttentionBackwardParams bp, bool vec_value, bool vec_dout) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr int kWarps = WsbAttentionConfig::kBackwardWarps;
  __shared__ __align__(128) BackwardSlab<T, kCap> slabs[kWarps];
  const WsbAttentionParams& p = bp.fwd;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  BackwardSlab<T, kCap>& slab = slabs[warp];
  const Lane ln(lane);
  const auto* block_rowptr = static_cast<const index_t*>(bp.block_rowptr_t);
  const auto* block_col = static_cast<const index_t*>(bp.block_col_t);
  int64_t sb, h;
  if (!work_item<kWarps>(p.num_src, p.heads, warp, sb, h)) return;
  const Operands<T> op(p, bp.grad_out, bp.delta);
  const int64_t H = op.heads, j = sb * kWsbTile + ln.r;
  const bool row_ok = j < p.num_src;
  const int64_t begin = block_rowptr[sb], end = block_rowptr[sb + 1];
  const int C = op.channels, c16 = op.c16, frags = op.frags;
  const float slope = op.slope;
  const T *src_score = op.src_score, *dst_score = op.dst_score, *value = op.value, *dout = op.dout;
  const float *stats = op.stats, *delta = op.delta;

  const float ss = row_ok ? to_acc(src_score[j * H + h]) : 0.f;
  // The block's value rows and the first tile's dout rows load together.
  if (begin < end) {
    stage_rows<T, kCap>(slab.rows, value, sb * kWsbTile, p.num_src, H, h, C, c16, lane, vec_value);
    stage_rows<T, kCap>(slab.rows2, dout, int64_t(block_col[begin]) * kWsbTile, p.num_dst, H, h, C, c16,
                        lane, vec_dout);
  }
  AccFrag<T> acc[kFrags<kCap>];
#pragma unroll
  for (int f = 0; f < kFrags<kCap>; ++f) wmma::fill_fragment(acc[f], 0.f);
  float g = 0.f;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t d0 = int64_t(block_col[t]) * kWsbTile;
    // The tile's 16 destinations' max, sum and D_i, loaded once (lane k and k + 16: destination
    // d0 + k) and handed to the 16 rows' lanes by shuffles, not loaded by each of them.
    const int64_t i_own = d0 + (lane & 15);
    const bool own_ok = i_own < p.num_dst;
    const float m_own = own_ok ? stats[(i_own * H + h) * 2] : 0.f;
    const float s_own = own_ok ? stats[(i_own * H + h) * 2 + 1] : 1.f;
    const float d_own = own_ok ? delta[i_own * H + h] : 0.f;
    // Pᵀ needs no staged row: formed (and written to the slab, free since the last tile's
    // products) while the dout rows land.
    const float* cnt = bp.count_t + t * kWsbTileSize + ln.r * kWsbTile + ln.cb;
    float w[8];
    unsigned positive = 0;  // z > 0 of each slot: LeakyReLU's branch in the score gradient
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      w[q] = 0.f;
      const float m_i = __shfl_sync(kFullMask, m_own, ln.cb + q);
      const float s_i = __shfl_sync(kFullMask, s_own, ln.cb + q);
      if (cnt[q] > 0.f) {
        const int64_t i = d0 + ln.cb + q;
        const float z = dst_score ? ss + to_acc(dst_score[i * H + h]) : ss;
        w[q] = cnt[q] * expf(leaky(z, slope) - m_i) / s_i;
        positive |= unsigned(z > 0.f) << q;
      }
      slab.p[ln.r * kWsbTile + ln.cb + q] = operand_of<T>(w[q]);
    }
    staged();  // the dout rows, and Pᵀ for every lane
    AccFrag<T> dp;
    mma_row_dots<T, kCap>(dp, slab.rows, slab.rows2, c16);  // dPᵀ = value_block · dout_tileᵀ
    wmma::store_matrix_sync(slab.tile, dp, kWsbTile, wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int q = 0; q < 8; ++q) {
      const float d_i = __shfl_sync(kFullMask, d_own, ln.cb + q);
      if (cnt[q] > 0.f) {
        const float de = w[q] * (slab.tile[ln.r * kWsbTile + ln.cb + q] - d_i);
        g += (positive >> q & 1u) ? de : de * slope;
      }
    }
    mma_rows<T, kCap>(acc, slab.p, kWsbTile, slab.rows2, frags);  // d value += Pᵀ · dout_tile
    __syncwarp();  // the slab is written again for the next tile
    if (t + 1 < end)
      stage_rows<T, kCap>(slab.rows2, dout, int64_t(block_col[t + 1]) * kWsbTile, p.num_dst, H, h, C, c16,
                          lane, vec_dout);
  }
  g += __shfl_xor_sync(kFullMask, g, 1);
  if ((lane & 1) == 0 && row_ok && bp.grad_src_score)
    static_cast<T*>(bp.grad_src_score)[j * H + h] = from_acc<T>(g);
  if (bp.grad_value) {
    auto* gv = static_cast<T*>(bp.grad_value);
#pragma unroll
    for (int f = 0; f < kFrags<kCap>; ++f) {
      if (f >= frags) break;
      wmma::store_matrix_sync(slab.tile, acc[f], kWsbTile, wmma::mem_row_major);
      __syncwarp();
      for (int x = lane; x < kWsbTileSize; x += 32) {
        const int64_t row = sb * kWsbTile + x / kWsbTile;
        const int c = f * 16 + x % kWsbTile;
        if (row < p.num_src && c < C)
          gv[(row * H + h) * C + c] = from_acc<T>(slab.tile[x] * kPUnscale<T>);
      }
      __syncwarp();
    }
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an architecture without these MMA shapes: fail loudly
#endif
}

// CTAs for one work item (block row, head) per warp.
int grid_of(int64_t rows, int64_t heads, int warps) {
  const int64_t items = wsb_blocks(rows) * heads, ctas = (items + warps - 1) / warps;
  GNNIO_CHECK(ctas <= INT32_MAX, ErrorKind::kInvalidArgument, "wsb_attention: ", items,
              " (block row, head) pairs exceed one launch's grid");
  return static_cast<int>(ctas);
}

// Whether a [n, H, C] tensor's head rows (C apart) can be staged 16 bytes at a time (stage_rows'
// vec): common/vec.cuh's rule.
template <typename T>
bool vector_rows(const void* base, int64_t channels) {
  return vector_width<T>(channels, {}, {base}) > 1;
}

// A head wider than the build's capacity would read past its slab: dispatch_capacity's rule,
// checked where the build is launched.
template <int kCap>
void check_capacity(int64_t channels) {
  static_assert(kCap % 16 == 0 && kCap <= kWsbAttentionMaxChannels, "whole fragments, within the widest head");
  GNNIO_CHECK(channels <= kCap, ErrorKind::kInternal, "wsb_attention: ", channels,
              " channels a head in a build for ", kCap);
}

template <typename T, typename index_t, int kCap>
void launch_forward(const WsbAttentionParams& p, cudaStream_t stream) {
  constexpr int kWarps = WsbAttentionConfig::kForwardWarps;
  check_capacity<kCap>(p.channels);
  wsb_attention_forward_kernel<T, index_t, kCap><<<grid_of(p.num_dst, p.heads, kWarps), kWarps * 32, 0, stream>>>(
      p, vector_rows<T>(p.value, p.channels));
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

template <typename T, typename index_t, int kCap>
void launch_backward(const WsbAttentionBackwardParams& b, cudaStream_t stream) {
  const WsbAttentionParams& p = b.fwd;
  constexpr int kWarps = WsbAttentionConfig::kBackwardWarps;
  check_capacity<kCap>(p.channels);
  const bool vec_value = vector_rows<T>(p.value, p.channels);
  const bool vec_dout = vector_rows<T>(b.grad_out, p.channels);
  // Pass A forms D_i as it goes; without it (no destination score gradient) pass B still needs it.
  if (!b.grad_dst_score && (b.grad_src_score || b.grad_value) && p.num_dst > 0 && p.num_src > 0) {
    const int64_t warps = p.num_dst * p.heads;
    const int blocks = static_cast<int>(std::min<int64_t>((warps + 7) / 8, 1 << 20));
    wsb_attention_delta_kernel<T><<<blocks, 256, 0, stream>>>(b);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
  if (b.grad_dst_score && p.num_dst > 0) {
    wsb_attention_pass_a_kernel<T, index_t, kCap><<<grid_of(p.num_dst, p.heads, kWarps), kWarps * 32, 0, stream>>>(
        b, vec_value, vec_dout);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
  if ((b.grad_src_score || b.grad_value) && p.num_src > 0) {
    wsb_attention_pass_b_kernel<T, index_t, kCap><<<grid_of(p.num_src, p.heads, kWarps), kWarps * 32, 0, stream>>>(
        b, vec_value, vec_dout);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
}

// The channel capacity a head of `channels` is staged with (policy.h): the narrow slabs where
// they fit, so more warps share an SM.
template <typename Fn>
void dispatch_capacity(int64_t channels, Fn&& fn) {
  if (channels <= WsbAttentionConfig::kNarrowChannels)
    fn(std::integral_constant<int, WsbAttentionConfig::kNarrowChannels>{});
  else
    fn(std::integral_constant<int, kWsbAttentionMaxChannels>{});
}

template <typename Fn>
void dispatch_tensor_core(ScalarType scalar, IndexType index, Fn&& fn) {
  dispatch_index(index, [&](auto index_tag) {
    switch (scalar) {
      case ScalarType::kFloat32: return fn(float{}, index_tag);
      case ScalarType::kFloat16: return fn(__half{}, index_tag);
      case ScalarType::kBFloat16: return fn(__nv_bfloat16{}, index_tag);
      case ScalarType::kFloat64:
        detail::fail(ErrorKind::kInvalidArgument,
                     "wsb_attention on CUDA runs on tensor cores and takes float32 (as tf32), "
                     "float16 or bfloat16, got float64; use the CSR backend for float64");
    }
  });
}

}  // namespace

void wsb_attention_forward_cuda(const WsbAttentionParams& p, void* stream) {
  if (p.num_dst == 0 || p.heads == 0) return;
  GNNIO_CHECK(p.channels <= kWsbAttentionMaxChannels, ErrorKind::kInvalidArgument,
              "wsb_attention: at most ", kWsbAttentionMaxChannels, " channels a head, got ", p.channels);
  dispatch_tensor_core(p.scalar_type, p.index_type, [&](auto scalar, auto index) {
    dispatch_capacity(p.channels, [&](auto cap) {
      launch_forward<decltype(scalar), decltype(index), decltype(cap)::value>(p, static_cast<cudaStream_t>(stream));
    });
  });
}

void wsb_attention_backward_cuda(const WsbAttentionBackwardParams& b, void* stream) {
  if (b.fwd.heads == 0) return;
  GNNIO_CHECK(b.fwd.channels <= kWsbAttentionMaxChannels, ErrorKind::kInvalidArgument,
              "wsb_attention: at most ", kWsbAttentionMaxChannels, " channels a head, got ",
              b.fwd.channels);
  dispatch_tensor_core(b.fwd.scalar_type, b.fwd.index_type, [&](auto scalar, auto index) {
    dispatch_capacity(b.fwd.channels, [&](auto cap) {
      launch_backward<decltype(scalar), decltype(index), decltype(cap)::value>(b, static_cast<cudaStream_t>(stream));
    });
  });
}

}  // namespace gnnio
