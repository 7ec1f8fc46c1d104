// CUDA kernels of TransformerConv's fused reassociated attention (params.h has the math and the
// order of the sums). Shapes are the benchmark's and PyG's common ones: float32, F = H x C = 128,
// 1, 2 or 4 heads (transformer_fused_cuda_supported); the layer runs the unfused forms otherwise.
//
// fused_kernel: one block of 8 warps per tile of 32 destinations, in three phases.
//   1. q~ = W_k,h^T q_h for the tile's rows: warp w owns features [16w, 16w + 16), a lane 4 of
//      them for 4 rows (dg, dg + 8, dg + 16, dg + 24): each W_k load feeds 16 FFMA, and each
//      block reads W_k once (64 KB, from L2).
//   2. Each warp walks 4 rows, kTransformerChunk slots at a time: lane (fg, eg) = (lane / 8,
//      lane % 8) holds quarter fg of slot eg's x_j (its float4s fg, fg + 4, ...) in registers
//      (8 x 16-byte loads) and forms its
//      partial scores against q~ in shared memory; two shuffles finish a score, three a chunk's
//      max. The chunk's rows then go to the warp's stage in shared memory and every lane adds
//      its 4 features of each slot, weighted, for every head: x_j is read from memory once per
//      edge for all heads, and no shuffle runs per slot and head (NOTES v20: the shared-row
//      kernel's butterflies per slot and head made it 1.5x slower than the per-head kernel).
//      The next chunk's loads are issued before that accumulation.
//   3. out = W_v,h x~_h (+ b_v) (+ residual), x~ in shared memory where q~ was: warp w owns
//      outputs [16w, 16w + 16), a lane 4 of them for 4 rows.
// Blocks past the tiles take heavy rows' items (one warp an item: q~ of its row, the same walk,
// a partial (m, s, x~ unnormalised) per head); merge_kernel combines a heavy row's items (warp w
// items w, w + 8, ... in order, then the warps in order) and applies W_v.
#include <cuda_runtime.h>

#include <cmath>
#include <type_traits>

#include "gnnio/common/cuda_check.h"
#include "gnnio/transformer/params.h"

namespace gnnio {
namespace {

constexpr int kF = 128, kHC = 128;
constexpr int kTileRows = 32, kThreads = 256, kWarps = kThreads / 32;
constexpr int kRowsPerWarp = kTileRows / kWarps;
constexpr int kChunk = kTransformerChunk;
// q~ of a row, per head (128 floats), then x~ in the same place. A lane's quarter of x_j is
// the float4s fg, fg + 4, fg + 8, ...: one load instruction of a chunk reads 64 contiguous bytes
// of each of its 8 rows (16 sectors, not 32), and the four quarters' q~ loads are 64 contiguous
// bytes (no bank conflict).
constexpr int kHeadPitch = kF;
// A row's region: 580 = 4 (mod 32), so the epilogue's loads of 8 rows at once fall in different
// banks.
constexpr int kRowPitch = 580;
constexpr int kQueryPitch = kHC + 4;  // the query tile's rows: 16-byte loads of 8 rows, 32 banks
constexpr int kStagePitch = kF + 4;   // a staged slot's row: 4 (mod 32), the quarter-warp's rows apart
constexpr int kWarpStage = kChunk * kStagePitch + kChunk * 4;  // x rows, then the chunk's weights
constexpr int kRowFloats = kTileRows * kRowPitch;
constexpr int kScratchFloats =
    kWarps * kWarpStage > kTileRows * kQueryPitch ? kWarps * kWarpStage : kTileRows * kQueryPitch;
// Then the tile's row bounds (int64, kTileRows + 1), the key bias's shift of each row's max
// (kTileRows x 4 floats) and the rows' flags.
constexpr size_t kSmemBytes = (kRowFloats + kScratchFloats) * sizeof(float) +
                              (kTileRows + 1) * sizeof(int64_t) + kTileRows * 4 * sizeof(float) +
                              kTileRows * sizeof(int);
constexpr float kEps = 1e-16f;
constexpr int kMergeThreads = 256;

static_assert(kF == 128 && kHC == 128, "lane maps assume 128 features and 128 outputs");
static_assert(kTileRows == 4 * kWarps, "a lane forms q~ and out for 4 rows, 8 rows apart");

enum RowFlag : int { kEmpty = 0, kHasEdges = 1, kHeavy = 2, kOutside = 3 };

__device__ inline float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ inline float get(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// Lane (fg, eg)'s quarter fg of slot base + eg's x_j (zeros past end).
template <typename index_t>
__device__ inline void load_chunk(float4 (&xr)[8], const index_t* __restrict__ col,
                                  const float* __restrict__ x, int64_t base, int64_t end, int lane) {
  const int64_t k = base + (lane & 7);
  if (k < end) {
    const float* src = x + static_cast<int64_t>(col[k]) * kF + 4 * (lane >> 3);
#pragma unroll
    for (int t = 0; t < 8; ++t) xr[t] = ldg4(src + 16 * t);
  } else {
#pragma unroll
    for (int t = 0; t < 8; ++t) xr[t] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// One row's (or item's) walk over slots [begin, end) with q~ at qt (head pitch kHeadPitch), xr
// holding its first chunk (load_chunk) on entry. Its last chunk's prefetch loads the first chunk
// of [next_begin, next_end) instead (the warp's next row: one memory latency less a row). On
// return every lane holds m and the row's running sum s per head, and acc = its 4 features
// (4 lane .. 4 lane + 3) of each head's unnormalised x~.
template <typename index_t, int H>
__device__ void walk(const float* qt, float* stage, const index_t* __restrict__ col,
                     const float* __restrict__ x, int64_t begin, int64_t end, int64_t next_begin,
                     int64_t next_end, float4 (&xr)[8], float scale, int lane, float (&m)[H],
                     float (&s)[H], float (&acc)[H][4]) {
  const int fg = lane >> 3, eg = lane & 7;
  float* xs = stage;
  float* ws = stage + kChunk * kStagePitch;
  for (int h = 0; h < H; ++h) {
    m[h] = -INFINITY;
    s[h] = 0.f;
    for (int k = 0; k < 4; ++k) acc[h][k] = 0.f;
  }
  for (int64_t base = begin; base < end; base += kChunk) {
    const bool valid = base + eg < end;
    float e[H], p[H], r[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const float* q = qt + h * kHeadPitch + 4 * fg;
      float a = 0.f;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const float4 qv = *reinterpret_cast<const float4*>(q + 16 * t);
        a = __fmaf_rn(qv.x, xr[t].x, a);
        a = __fmaf_rn(qv.y, xr[t].y, a);
        a = __fmaf_rn(qv.z, xr[t].z, a);
        a = __fmaf_rn(qv.w, xr[t].w, a);
      }
      a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, 8));
      a = __fadd_rn(a, __shfl_xor_sync(0xffffffffu, a, 16));
      e[h] = valid ? __fmul_rn(a, scale) : -INFINITY;
    }
#pragma unroll
    for (int h = 0; h < H; ++h) {
      float mx = e[h];
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
      const float m_new = fmaxf(m[h], mx);  // finite: slot base is always valid
      r[h] = expf(m[h] - m_new);
      p[h] = valid ? expf(e[h] - m_new) : 0.f;
      s[h] = __fadd_rn(__fmul_rn(s[h], r[h]), p[h]);
      m[h] = m_new;
    }
    float* row = xs + eg * kStagePitch + 4 * fg;
#pragma unroll
    for (int t = 0; t < 8; ++t) *reinterpret_cast<float4*>(row + 16 * t) = xr[t];
    if (fg == 0) {
#pragma unroll
      for (int h = 0; h < H; ++h) ws[eg * 4 + h] = p[h];
    }
    __syncwarp();
    const int n = end - base < kChunk ? static_cast<int>(end - base) : kChunk;
    if (base + kChunk < end) load_chunk(xr, col, x, base + kChunk, end, lane);
    else load_chunk(xr, col, x, next_begin, next_end, lane);
#pragma unroll
    for (int h = 0; h < H; ++h)
      for (int k = 0; k < 4; ++k) acc[h][k] = __fmul_rn(acc[h][k], r[h]);
    for (int j = 0; j < n; ++j) {
      const float4 xv = *reinterpret_cast<const float4*>(xs + j * kStagePitch + 4 * lane);
      const float4 wv = *reinterpret_cast<const float4*>(ws + j * 4);
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const float w = get(wv, h);
        acc[h][0] = __fmaf_rn(w, xv.x, acc[h][0]);
        acc[h][1] = __fmaf_rn(w, xv.y, acc[h][1]);
        acc[h][2] = __fmaf_rn(w, xv.z, acc[h][2]);
        acc[h][3] = __fmaf_rn(w, xv.w, acc[h][3]);
      }
    }
    __syncwarp();
  }
#pragma unroll
  for (int h = 0; h < H; ++h) {
    s[h] = __fadd_rn(s[h], __shfl_xor_sync(0xffffffffu, s[h], 1));
    s[h] = __fadd_rn(s[h], __shfl_xor_sync(0xffffffffu, s[h], 2));
    s[h] = __fadd_rn(s[h], __shfl_xor_sync(0xffffffffu, s[h], 4));
  }
}

// The walk with lane l owning features 4 l .. 4 l + 3 of every slot of the chunk
// (GNNIO_FUSED_WALK=registers; params.register_walk; a helper's proposal from the SASS count of
// walk(), bench/NOTES.md v21; NOT YET RUN ON A GPU): each load is one slot's whole row, q~ sits in
// 4H registers a row, and x~'s sums read the chunk from registers, so nothing is staged and q~ is
// not reloaded per slot. A lane's 8H partial scores (4-term FMA chains over its features) are
// combined by a reduce-scatter over the lanes (offsets 16, 8, 4, 2, 1: 31 shuffles and adds at
// 4 heads), after which lane (j H + h) << kScatterShift<H> holds slot j's score for head h; the
// weights go back to every lane through the warp's stage (one store, 8 broadcast loads). Its
// score is summed in another order than walk()'s (a tree over the lanes, not four quarters).
template <int H>
constexpr int kScatterShift = H == 4 ? 0 : H == 2 ? 1 : 2;

// One step of the reduce-scatter at lane offset O over the first N values of v (the rest of the
// offsets below it by recursion): a lane keeps the upper half if its bit O is set, adding its
// partner's copy of that half; once one value is left, the offsets below add the partners'.
template <int N, int O>
__device__ inline void reduce_scatter(float* v, int lane) {
  if constexpr (N > 1) {
    const bool upper = (lane & O) != 0;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float send = upper ? v[i] : v[i + N / 2];
      const float keep = upper ? v[i + N / 2] : v[i];
      v[i] = __fadd_rn(keep, __shfl_xor_sync(0xffffffffu, send, O));
    }
  } else {
    v[0] = __fadd_rn(v[0], __shfl_xor_sync(0xffffffffu, v[0], O));
  }
  if constexpr (O > 1) reduce_scatter<(N > 1 ? N / 2 : 1), O / 2>(v, lane);
}

// Lane l's features 4 l .. 4 l + 3 of the chunk's 8 slots (zeros past end).
template <typename index_t>
__device__ inline void load_rows(float4 (&xr)[8], const index_t* __restrict__ col,
                                 const float* __restrict__ x, int64_t base, int64_t end, int lane) {
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int64_t k = base + j;
    xr[j] = k < end ? ldg4(x + static_cast<int64_t>(col[k]) * kF + 4 * lane)
                    : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <typename index_t, int H>
__device__ void walk_registers(const float* qt, float* stage, const index_t* __restrict__ col,
                               const float* __restrict__ x, int64_t begin, int64_t end,
                               int64_t next_begin, int64_t next_end, float4 (&xr)[8], float scale,
                               int lane, float (&m)[H], float (&s)[H], float (&acc)[H][4]) {
  constexpr int kShift = kScatterShift<H>, N = kChunk * H;
  const int mine = lane >> kShift, my_j = mine / H;  // the (slot, head) this lane's score is
  float* ws = stage;  // the chunk's weights, [slot][head]
  float4 q[H];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    q[h] = *reinterpret_cast<const float4*>(qt + h * kHeadPitch + 4 * lane);
    for (int k = 0; k < 4; ++k) acc[h][k] = 0.f;
  }
  float m_mine = -INFINITY, s_mine = 0.f;
  for (int64_t base = begin; base < end; base += kChunk) {
    float v[N];
#pragma unroll
    for (int j = 0; j < kChunk; ++j)
#pragma unroll
      for (int h = 0; h < H; ++h) {
        float a = __fmul_rn(q[h].x, xr[j].x);
        a = __fmaf_rn(q[h].y, xr[j].y, a);
        a = __fmaf_rn(q[h].z, xr[j].z, a);
        v[j * H + h] = __fmaf_rn(q[h].w, xr[j].w, a);
      }
    reduce_scatter<N, 16>(v, lane);
    const bool valid = base + my_j < end;
    const float e = valid ? __fmul_rn(v[0], scale) : -INFINITY;
    float mx = e;  // the chunk's max for this lane's head: its slots are lane bits 2-4
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
    const float m_new = fmaxf(m_mine, mx);  // finite: slot base is always valid
    const float r = expf(m_mine - m_new);
    const float w = valid ? expf(e - m_new) : 0.f;
    s_mine = __fadd_rn(__fmul_rn(s_mine, r), w);
    m_mine = m_new;
    if ((lane & ((1 << kShift) - 1)) == 0) ws[mine] = w;
    float rh[H];
#pragma unroll
    for (int h = 0; h < H; ++h) rh[h] = __shfl_sync(0xffffffffu, r, h << kShift);
    __syncwarp();
    float4 xn[8];
    if (base + kChunk < end) load_rows(xn, col, x, base + kChunk, end, lane);
    else load_rows(xn, col, x, next_begin, next_end, lane);
#pragma unroll
    for (int h = 0; h < H; ++h)
      for (int k = 0; k < 4; ++k) acc[h][k] = __fmul_rn(acc[h][k], rh[h]);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const float wj = ws[j * H + h];
        acc[h][0] = __fmaf_rn(wj, xr[j].x, acc[h][0]);
        acc[h][1] = __fmaf_rn(wj, xr[j].y, acc[h][1]);
        acc[h][2] = __fmaf_rn(wj, xr[j].z, acc[h][2]);
        acc[h][3] = __fmaf_rn(wj, xr[j].w, acc[h][3]);
      }
    }
    __syncwarp();
#pragma unroll
    for (int j = 0; j < kChunk; ++j) xr[j] = xn[j];
  }
  float s_all = s_mine;  // the running sums of the chunk positions, as a tree over the slots
  s_all = __fadd_rn(s_all, __shfl_xor_sync(0xffffffffu, s_all, 4));
  s_all = __fadd_rn(s_all, __shfl_xor_sync(0xffffffffu, s_all, 8));
  s_all = __fadd_rn(s_all, __shfl_xor_sync(0xffffffffu, s_all, 16));
#pragma unroll
  for (int h = 0; h < H; ++h) {
    m[h] = __shfl_sync(0xffffffffu, m_mine, h << kShift);
    s[h] = __shfl_sync(0xffffffffu, s_all, h << kShift);
  }
}

// The walk and its chunk loads, by layout.
template <bool kRegisterWalk, typename index_t>
__device__ inline void first_chunk(float4 (&xr)[8], const index_t* __restrict__ col,
                                   const float* __restrict__ x, int64_t base, int64_t end, int lane) {
  if constexpr (kRegisterWalk) load_rows(xr, col, x, base, end, lane);
  else load_chunk(xr, col, x, base, end, lane);
}

template <bool kRegisterWalk, typename index_t, int H>
__device__ inline void walk_row(const float* qt, float* stage, const index_t* __restrict__ col,
                                const float* __restrict__ x, int64_t begin, int64_t end,
                                int64_t next_begin, int64_t next_end, float4 (&xr)[8], float scale,
                                int lane, float (&m)[H], float (&s)[H], float (&acc)[H][4]) {
  if constexpr (kRegisterWalk)
    walk_registers<index_t, H>(qt, stage, col, x, begin, end, next_begin, next_end, xr, scale, lane, m, s, acc);
  else
    walk<index_t, H>(qt, stage, col, x, begin, end, next_begin, next_end, xr, scale, lane, m, s, acc);
}

// q~ = W_k,h^T q_h of 32 rows, q in shared memory at pitch kQueryPitch: warp w forms features
// [16 w, 16 w + 16), a lane 4 of them for rows dg, dg + 8, dg + 16, dg + 24, 4 W_k rows and 4
// rows' 4 queries a step (8 loads for 64 FFMA); row d's q~ goes to dst + d dst_pitch.
template <int H>
__device__ void tile_query_t(const float* qs, const float* __restrict__ w_key, float* dst,
                             int64_t dst_pitch, int warp, int lane) {
  constexpr int C = kHC / H;
  const int dg = lane >> 2, f0 = 16 * warp + 4 * (lane & 3);
  for (int h = 0; h < H; ++h) {
    float a[4][4] = {};
#pragma unroll 2
    for (int c = 0; c < C; c += 4) {
      float4 w[4], qv[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = ldg4(w_key + static_cast<int64_t>(h * C + c + k) * kF + f0);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        qv[i] = *reinterpret_cast<const float4*>(qs + (dg + 8 * i) * kQueryPitch + h * C + c);
#pragma unroll
      for (int k = 0; k < 4; ++k)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float q = get(qv[i], k);
          a[i][0] = __fmaf_rn(q, w[k].x, a[i][0]);
          a[i][1] = __fmaf_rn(q, w[k].y, a[i][1]);
          a[i][2] = __fmaf_rn(q, w[k].z, a[i][2]);
          a[i][3] = __fmaf_rn(q, w[k].w, a[i][3]);
        }
    }
#pragma unroll
    for (int i = 0; i < 4; ++i)
      *reinterpret_cast<float4*>(dst + (dg + 8 * i) * dst_pitch + h * kHeadPitch + f0) =
          make_float4(a[i][0], a[i][1], a[i][2], a[i][3]);
  }
}

// q~ of the heavy rows, once (their items read it): 32 rows a block, [num_heavy (rounded up to
// 32)][H x 128] floats.
template <int H>
__global__ void __launch_bounds__(kThreads) heavy_query_kernel(TransformerFusedParams p, float* heavy_qt) {
  __shared__ float4 qs4[kTileRows * kQueryPitch / 4];
  float* qs = reinterpret_cast<float*>(qs4);
  const int64_t hr0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  const auto* query = static_cast<const float*>(p.query);
  for (int v = threadIdx.x; v < kTileRows * (kHC / 4); v += kThreads) {
    const int d = v / (kHC / 4), c4 = v % (kHC / 4);
    float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
    if (hr0 + d < p.split.num_heavy) q = ldg4(query + p.split.heavy_rows[hr0 + d] * kHC + 4 * c4);
    *reinterpret_cast<float4*>(qs + d * kQueryPitch + 4 * c4) = q;
  }
  __syncthreads();
  tile_query_t<H>(qs, static_cast<const float*>(p.w_key), heavy_qt + hr0 * H * kHeadPitch,
                  H * kHeadPitch, threadIdx.x >> 5, threadIdx.x & 31);
}

template <bool kRegisterWalk, typename index_t, int H>
__global__ void __launch_bounds__(kThreads, 2)
    fused_kernel(TransformerFusedParams p, int64_t num_tiles, float* part, const float* heavy_qt) {
  extern __shared__ float4 smem4[];
  float* rows = reinterpret_cast<float*>(smem4);
  float* scratch = rows + kRowFloats;
  auto* bounds = reinterpret_cast<int64_t*>(scratch + kScratchFloats);
  float* shifts = reinterpret_cast<float*>(bounds + kTileRows + 1);
  int* flags = reinterpret_cast<int*>(shifts + kTileRows * 4);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const float*>(p.x);
  const auto* query = static_cast<const float*>(p.query);
  const auto* w_key = static_cast<const float*>(p.w_key);
  auto* stats = static_cast<float*>(p.stats);
  const float scale = static_cast<float>(p.scale);
  float* stage = scratch + warp * kWarpStage;
  float m[H], s[H], acc[H][4];

  if (blockIdx.x >= num_tiles) {  // a heavy row's item, one a warp
    const int64_t item = (static_cast<int64_t>(blockIdx.x) - num_tiles) * kWarps + warp;
    if (item >= p.split.num_items) return;
    const int64_t* it = p.split.heavy_items + 3 * item;
    float* qt = rows + warp * kRowPitch;
    for (int h = 0; h < H; ++h)
      *reinterpret_cast<float4*>(qt + h * kHeadPitch + 4 * lane) =
          ldg4(heavy_qt + it[0] * H * kHeadPitch + h * kHeadPitch + 4 * lane);
    __syncwarp();
    float4 xr[8];
    first_chunk<kRegisterWalk>(xr, col, x, it[1], it[2], lane);
    walk_row<kRegisterWalk, index_t, H>(qt, stage, col, x, it[1], it[2], 0, 0, xr, scale, lane, m, s, acc);
    float* out = part + item * H * (kF + 4);  // (16-byte aligned for any H)
    for (int h = 0; h < H; ++h) {
      *reinterpret_cast<float4*>(out + h * kF + 4 * lane) =
          make_float4(acc[h][0], acc[h][1], acc[h][2], acc[h][3]);
      if (lane == 0) {
        out[H * kF + 2 * h] = m[h];
        out[H * kF + 2 * h + 1] = s[h];
      }
    }
    return;
  }

  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  float* qs = scratch;  // the query tile, [32][kQueryPitch = 132]; the warps' stages after phase 1
  for (int v = threadIdx.x; v < kTileRows * (kHC / 4); v += kThreads) {
    const int d = v / (kHC / 4), c4 = v % (kHC / 4);
    float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + d < p.num_dst) q = ldg4(query + (row0 + d) * kHC + 4 * c4);
    *reinterpret_cast<float4*>(qs + d * kQueryPitch + 4 * c4) = q;
  }
  for (int d = threadIdx.x; d <= kTileRows; d += kThreads)
    bounds[d] = row0 + d <= p.num_dst ? static_cast<int64_t>(rowptr[row0 + d]) : 0;
  __syncthreads();
  if (threadIdx.x < kTileRows * H) {  // the key bias's shift of the direct scores: q_h . b_k,h
    constexpr int C = kHC / H;
    const int d = threadIdx.x / H, h = threadIdx.x % H;
    float shift = 0.f;
    if (p.b_key) {
      const auto* b_key = static_cast<const float*>(p.b_key);
      for (int c = 0; c < C; ++c) shift = __fmaf_rn(qs[d * kQueryPitch + h * C + c], __ldg(b_key + h * C + c), shift);
    }
    shifts[d * 4 + h] = shift;
  }
  tile_query_t<H>(qs, w_key, rows, kRowPitch, warp, lane);  // phase 1: q~
  __syncthreads();
  // phase 2: the rows' walks, each row with edges prefetching the next one's first chunk
  auto flag_of = [&](int d) -> int {
    if (row0 + d >= p.num_dst) return kOutside;
    const int64_t len = bounds[d + 1] - bounds[d];
    return len > p.split.light_max_degree ? kHeavy : len > 0 ? kHasEdges : kEmpty;
  };
  float4 xr[8];
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int d = warp + kWarps * i;
    if (flag_of(d) == kHasEdges) {
      first_chunk<kRegisterWalk>(xr, col, x, bounds[d], bounds[d + 1], lane);
      break;
    }
  }
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int d = warp + kWarps * i;
    const int64_t row = row0 + d;
    float* qt = rows + d * kRowPitch;
    const int flag = flag_of(d);
    if (flag == kHasEdges || flag == kEmpty) {
      int64_t next_begin = 0, next_end = 0;
      for (int j = i + 1; j < kRowsPerWarp && flag == kHasEdges; ++j) {
        const int dj = warp + kWarps * j;
        if (flag_of(dj) == kHasEdges) {
          next_begin = bounds[dj];
          next_end = bounds[dj + 1];
          break;
        }
      }
      // (an empty row's walk runs no chunk: zeros, and xr is left for the next row)
      walk_row<kRegisterWalk, index_t, H>(qt, stage, col, x, bounds[d], bounds[d + 1], next_begin,
                                          next_end, xr, scale, lane, m, s, acc);
      for (int h = 0; h < H; ++h) {
        const float sum = __fadd_rn(s[h], kEps);
        *reinterpret_cast<float4*>(qt + h * kF + 4 * lane) =
            make_float4(acc[h][0] / sum, acc[h][1] / sum, acc[h][2] / sum, acc[h][3] / sum);
        if (lane == h) {
          const float m_row = flag == kEmpty ? 0.f : m[h];
          stats[(row * H + h) * 2] = __fadd_rn(m_row, __fmul_rn(scale, shifts[d * 4 + h]));
          stats[(row * H + h) * 2 + 1] = sum;
        }
      }
    }
    if (lane == 0) flags[d] = flag;
  }
  __syncthreads();
  {  // phase 3: out = W_v x~ (+ b_v) (+ residual)
    constexpr int C = kHC / H;
    const int dg = lane >> 2, o0 = 16 * warp + 4 * (lane & 3), h = o0 / C;
    const auto* w_value_t = static_cast<const float*>(p.w_value_t);
    float a[4][4] = {};
#pragma unroll 2
    for (int f = 0; f < kF; f += 4) {
      float4 w[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = ldg4(w_value_t + (f + k) * kHC + o0);
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float4 xv = *reinterpret_cast<const float4*>(rows + (dg + 8 * i) * kRowPitch + h * kF + f);
#pragma unroll
        for (int k = 0; k < 4; ++k) {
          const float xk = get(xv, k);
          a[i][0] = __fmaf_rn(xk, w[k].x, a[i][0]);
          a[i][1] = __fmaf_rn(xk, w[k].y, a[i][1]);
          a[i][2] = __fmaf_rn(xk, w[k].z, a[i][2]);
          a[i][3] = __fmaf_rn(xk, w[k].w, a[i][3]);
        }
      }
    }
    const float4 bias = p.b_value ? ldg4(static_cast<const float*>(p.b_value) + o0)
                                  : make_float4(0.f, 0.f, 0.f, 0.f);
    for (int i = 0; i < 4; ++i) {
      const int d = dg + 8 * i;
      const int flag = flags[d];
      if (flag == kHeavy || flag == kOutside) continue;
      const int64_t row = row0 + d;
      float4 v = make_float4(a[i][0], a[i][1], a[i][2], a[i][3]);
      if (flag == kHasEdges && p.b_value) {
        v.x = __fadd_rn(v.x, bias.x);
        v.y = __fadd_rn(v.y, bias.y);
        v.z = __fadd_rn(v.z, bias.z);
        v.w = __fadd_rn(v.w, bias.w);
      }
      if (p.residual) {
        const float4 res = ldg4(static_cast<const float*>(p.residual) + row * kHC + o0);
        v.x = __fadd_rn(res.x, v.x);
        v.y = __fadd_rn(res.y, v.y);
        v.z = __fadd_rn(res.z, v.z);
        v.w = __fadd_rn(res.w, v.w);
      }
      *reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * kHC + o0) = v;
    }
  }
}

// A heavy row's items merged, then W_v: one block of 8 warps a heavy row. Pass 1: each head's max
// over the items (lanes and warps over items, a fixed tree). Pass 2: warp w sums items w, w + 8,
// ... in order, lane l features 4 l .. 4 l + 3 of every head, each item rescaled by exp(m_i - M);
// the 8 warps' sums are added in warp order. Then thread t < 128 forms output t.
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(TransformerFusedParams p, const float* part) {
  constexpr int kMergeWarps = kMergeThreads / 32;
  __shared__ float4 sums[kMergeWarps][4][32];
  __shared__ float tails[kMergeWarps][4][2];  // per warp and head: (max, then sum)
  __shared__ float xt[4 * kF];
  const int64_t hr = blockIdx.x, row = p.split.heavy_rows[hr];
  const int64_t i0 = p.split.item_offsets[hr], i1 = p.split.item_offsets[hr + 1];
  const int H = static_cast<int>(p.heads), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t item_floats = H * (kF + 4);
  auto* stats = static_cast<float*>(p.stats);
  for (int h = 0; h < H; ++h) {
    float m = -INFINITY;
    for (int64_t it = i0 + threadIdx.x; it < i1; it += kMergeThreads)
      m = fmaxf(m, part[it * item_floats + H * kF + 2 * h]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if (lane == 0) tails[warp][h][0] = m;
  }
  __syncthreads();
  float M[4];
  for (int h = 0; h < H; ++h) {
    M[h] = tails[0][h][0];
    for (int w = 1; w < kMergeWarps; ++w) M[h] = fmaxf(M[h], tails[w][h][0]);
  }
  float4 acc[4];
  float sum[4];
  for (int h = 0; h < H; ++h) {
    acc[h] = make_float4(0.f, 0.f, 0.f, 0.f);
    sum[h] = 0.f;
  }
#pragma unroll 4
  for (int64_t it = i0 + warp; it < i1; it += kMergeWarps) {
    const float* pi = part + it * item_floats;
    for (int h = 0; h < H; ++h) {
      const float r = expf(pi[H * kF + 2 * h] - M[h]);
      const float4 a = *reinterpret_cast<const float4*>(pi + h * kF + 4 * lane);
      sum[h] = __fadd_rn(sum[h], __fmul_rn(pi[H * kF + 2 * h + 1], r));
      acc[h].x = __fadd_rn(acc[h].x, __fmul_rn(a.x, r));
      acc[h].y = __fadd_rn(acc[h].y, __fmul_rn(a.y, r));
      acc[h].z = __fadd_rn(acc[h].z, __fmul_rn(a.z, r));
      acc[h].w = __fadd_rn(acc[h].w, __fmul_rn(a.w, r));
    }
  }
  for (int h = 0; h < H; ++h) {
    sums[warp][h][lane] = acc[h];
    if (lane == 0) tails[warp][h][1] = sum[h];
  }
  __syncthreads();
  if (threadIdx.x < kHC) {  // thread t: feature t of every head (a float of lane t / 4's float4)
    const int t = threadIdx.x;
    for (int h = 0; h < H; ++h) {
      float a = 0.f, s_all = 0.f;
      for (int w = 0; w < kMergeWarps; ++w) {
        a = __fadd_rn(a, reinterpret_cast<const float*>(&sums[w][h][t >> 2])[t & 3]);
        s_all = __fadd_rn(s_all, tails[w][h][1]);
      }
      s_all = __fadd_rn(s_all, kEps);
      xt[h * kF + t] = a / s_all;
      if (t == 0) {
        float shift = 0.f;  // the key bias's shift of the direct scores: q_h . b_k,h
        if (p.b_key) {
          const int C = kHC / H;
          const auto* q = static_cast<const float*>(p.query) + row * kHC + h * C;
          for (int c = 0; c < C; ++c)
            shift = __fmaf_rn(q[c], static_cast<const float*>(p.b_key)[h * C + c], shift);
        }
        stats[(row * H + h) * 2] = __fadd_rn(M[h], __fmul_rn(static_cast<float>(p.scale), shift));
        stats[(row * H + h) * 2 + 1] = s_all;
      }
    }
  }
  __syncthreads();
  if (threadIdx.x >= kHC) return;
  const int t = threadIdx.x, C = kHC / H, h = t / C;
  const auto* w_value_t = static_cast<const float*>(p.w_value_t);
  float v = 0.f;
  for (int f = 0; f < kF; ++f) v = __fmaf_rn(xt[h * kF + f], __ldg(w_value_t + f * kHC + t), v);
  if (p.b_value) v = __fadd_rn(v, static_cast<const float*>(p.b_value)[t]);
  if (p.residual) v = __fadd_rn(static_cast<const float*>(p.residual)[row * kHC + t], v);
  static_cast<float*>(p.out)[row * kHC + t] = v;
}

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename index_t, int H>
void launch(const TransformerFusedParams& p, float* part, float* heavy_qt, cudaStream_t s) {
  auto kernel = p.register_walk ? fused_kernel<true, index_t, H> : fused_kernel<false, index_t, H>;
  GNNIO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  // Two blocks an SM need 2 x 110 KB of its 228: ask for the largest shared-memory carveout
  // (the driver may otherwise pick one that holds a single block).
  GNNIO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  const int64_t tiles = (p.num_dst + kTileRows - 1) / kTileRows;
  const int64_t item_blocks = (p.split.num_items + kWarps - 1) / kWarps;
  if (p.split.num_heavy > 0) {
    heavy_query_kernel<H><<<static_cast<unsigned>((p.split.num_heavy + kTileRows - 1) / kTileRows),
                            kThreads, 0, s>>>(p, heavy_qt);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
  kernel<<<static_cast<unsigned>(tiles + item_blocks), kThreads, kSmemBytes, s>>>(p, tiles, part, heavy_qt);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool transformer_fused_cuda_supported(const TransformerFusedParams& p) {
  return p.scalar_type == ScalarType::kFloat32 && p.features == kF && p.heads * p.channels == kHC &&
         (p.heads == 1 || p.heads == 2 || p.heads == 4) && aligned(p.x) && aligned(p.query) &&
         aligned(p.w_key) && aligned(p.w_value_t) && aligned(p.out) &&
         (!p.b_value || aligned(p.b_value)) && (!p.residual || aligned(p.residual)) &&
         (!p.b_key || aligned(p.b_key));
}

size_t transformer_fused_cuda_workspace_bytes(const TransformerFusedParams& p) {
  const int64_t heavy_rows = (p.split.num_heavy + kTileRows - 1) / kTileRows * kTileRows;
  return (static_cast<size_t>(p.split.num_items) * p.heads * (kF + 4) +
          static_cast<size_t>(heavy_rows) * p.heads * kHeadPitch) * sizeof(float);
}

void transformer_fused_forward_cuda(const TransformerFusedParams& p, void* workspace, void* stream) {
  GNNIO_CHECK(transformer_fused_cuda_supported(p), ErrorKind::kInvalidArgument,
              "transformer_fused_forward on CUDA takes float32, 128 features, heads x channels = "
              "128 with 1, 2 or 4 heads, and 16-byte aligned operands");
  GNNIO_CHECK(p.split.num_heavy == 0 || p.split.item_offsets, ErrorKind::kInvalidArgument,
              "transformer_fused_forward: heavy rows need their item offsets");
  if (p.num_dst == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  auto* part = static_cast<float*>(workspace);
  float* heavy_qt = part + p.split.num_items * p.heads * (kF + 4);
  auto run = [&](auto index) {
    using index_t = decltype(index);
    if (p.heads == 1) launch<index_t, 1>(p, part, heavy_qt, s);
    else if (p.heads == 2) launch<index_t, 2>(p, part, heavy_qt, s);
    else launch<index_t, 4>(p, part, heavy_qt, s);
  };
  if (p.index_type == IndexType::kInt32) run(int32_t{});
  else run(int64_t{});
  if (p.split.num_heavy > 0) {
    merge_kernel<<<static_cast<unsigned>(p.split.num_heavy), kMergeThreads, 0, s>>>(p, part);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace gnnio
