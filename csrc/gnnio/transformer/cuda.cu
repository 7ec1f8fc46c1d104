// CUDA kernels of TransformerConv's fused reassociated attention (params.h has the math and the
// order of the sums). Shapes are the benchmark's and PyG's common ones: float32, F = H x C = 128,
// 1, 2 or 4 heads (transformer_fused_cuda_supported); the layer runs the unfused forms otherwise.
//
// Before the tiles, the launcher lists the light rows that have edges (CUB's stable
// DeviceSelect::If over the row ids with LightRowWithEdges): only they take a tile. Rows without
// edges are written by empty_rows_kernel (out = the skip or 0; no q~ or W_v work: 31% of
// powerlaw-1M-16M's rows), heavy rows by their items, merge_kernel and heavy_value_kernel.
//
// fused_kernel: one block of 8 warps per tile of 32 listed rows, in three phases.
//   1. q~ = W_k,h^T q_h for the tile's rows: warp w owns features [16w, 16w + 16), a lane 4 of
//      them for 4 rows (dg, dg + 8, dg + 16, dg + 24): each W_k load feeds 16 FFMA, and each
//      block reads W_k once (64 KB, from L2).
//   2. The warps walk the tile's rows longest first, each taking the next row when done with
//      one, kTransformerChunk slots at a time (walk_registers): lane l holds
//      features 4 l .. 4 l + 3 of q~ and of each of the chunk's slots, so x_j is read from
//      memory once per edge for all heads and no x row is staged (only the next chunk's column
//      indices, by cp.async into the warp's stage); the next chunk's loads are issued before the
//      chunk's sums, and slots past a range's end load its last slot's row (weight 0).
//   3. out = W_v,h x~_h (+ b_v) (+ residual), x~ in shared memory where q~ was: warp w owns
//      outputs [16w, 16w + 16), a lane 4 of them for 4 rows (tile_value).
// Blocks past the tiles take heavy rows' items (one warp an item: q~ of its row from
// heavy_query_kernel, the same walk, a partial (m, s, x~ unnormalised) per head); merge_kernel
// combines a heavy row's items per head into x~ (16-lane groups online, then the groups in
// order), and heavy_value_kernel applies W_v to 32 heavy rows a block (tile_value: W_v read once
// a block, not once a heavy row).
#include <cuda_runtime.h>
#include <thrust/iterator/counting_iterator.h>

#include <cmath>
#include <cub/device/device_select.cuh>

#include "gnnio/common/cp_async.cuh"
#include "gnnio/common/cuda_check.h"
#include "gnnio/common/item_offsets.cuh"
#include "gnnio/common/workspace.h"
#include "gnnio/transformer/params.h"

namespace gnnio {
namespace {

constexpr int kF = 128, kHC = 128;
constexpr int kTileRows = 32, kThreads = 256, kWarps = kThreads / 32;
constexpr int kChunk = kTransformerChunk;
// q~ of a row, per head (128 floats), then x~ in the same place.
constexpr int kHeadPitch = kF;
// A row's region: 580 = 4 (mod 32), so phase 3's loads of 8 rows at once fall in different banks.
constexpr int kRowPitch = 580;
constexpr int kQueryPitch = kHC + 4;  // the query tile's rows: 16-byte loads of 8 rows, 32 banks
constexpr int kWarpStage = kChunk * 4;  // a warp's chunk weights, [slot][head]
// Each warp's next-chunk column indices (int64 at most), after the warps' stages.
constexpr int kWarpIndices = kChunk * 2;
constexpr int kRowFloats = kTileRows * kRowPitch;
constexpr int kScratchFloats =
    kWarps * kWarpStage > kTileRows * kQueryPitch ? kWarps * kWarpStage : kTileRows * kQueryPitch;
// Then the tile's rows (int64, kTileRows: -1 past the list), their slot bounds (2 x kTileRows),
// the key bias's shift of each row's max (kTileRows x 4 floats), the rows by decreasing degree
// and the walk's next position in that order (ints).
constexpr size_t kSmemBytes = (kRowFloats + kScratchFloats) * sizeof(float) +
                              3 * kTileRows * sizeof(int64_t) + kTileRows * 4 * sizeof(float) +
                              (kTileRows + 1) * sizeof(int);
// heavy_value_kernel: x~ of 32 heavy rows at kRowPitch.
constexpr size_t kValueSmemBytes = kRowFloats * sizeof(float);
constexpr float kEps = 1e-16f;
constexpr int kMergeThreads = 256;

static_assert(kF == 128 && kHC == 128, "lane maps assume 128 features and 128 outputs");
static_assert(kTileRows == 4 * kWarps, "a lane forms q~ and out for 4 rows, 8 rows apart");
static_assert(kWarps * (kWarpStage + kWarpIndices) <= kScratchFloats,
              "the warps' stages and staged indices fit where the query tile was");
static_assert((kRowFloats + kWarps * kWarpStage) % 4 == 0 && kWarpIndices % 4 == 0,
              "staged indices 16-byte aligned (8-byte cp.async of int64; ptxas reads them as LDS.128)");

__device__ inline float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ inline float get(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// The walk of one row's (or item's) slots, lane l owning features 4 l .. 4 l + 3 of every slot
// of a chunk (a helper's proposal from the SASS count of v3's staged walk, bench/NOTES.md v21-v22:
// that walk staged each chunk through shared memory and reloaded q~ per slot; this one measured
// 8.30 -> 7.01 ms on an H100): each load is one slot's whole row, q~ sits in 4H registers, and
// x~'s sums read the chunk from registers. A lane's 8H partial scores (4-term FMA chains over
// its features) are combined by a reduce-scatter over the lanes (offsets 16, 8, 4, 2, 1: 31
// shuffles and adds at 4 heads), after which lane (j H + h) << kScatterShift<H> holds slot j's
// score for head h; the weights go back to every lane through the warp's stage (one store, 8
// broadcast loads).
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

// Lane l's features 4 l .. 4 l + 3 of the chunk's 8 slots. Slots past end load the chunk's last
// slot's row, not zeros: their weights are 0 and their scores -inf, so they add fma(0, x, acc) =
// acc (up to the sign of a zero acc; x's non-finite values stay in the row they belong to). No
// predicate and no zeroing a slot: the chunk loop 730 -> 647 instructions, the kernel 4.83 ->
// 4.72 ms on the H200 (bench/NOTES.md v25); one warp-uniform branch for an empty range.
template <typename index_t>
__device__ inline void load_rows(float4 (&xr)[8], const index_t* __restrict__ col,
                                 const float* __restrict__ x, int64_t base, int64_t end, int lane) {
  if (base < end) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int64_t k = base + j < end ? base + j : end - 1;
      xr[j] = ldg4(x + static_cast<int64_t>(col[k]) * kF + 4 * lane);
    }
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) xr[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// The chunk's column indices copied into the warp's stage by the copy engine (cp.async: no
// register waits for them), lane j < 8 slot base + j's; issued a chunk's scores ahead of the
// rows they address. wait_indices makes them visible to the warp.
// Of a non-empty range, every lane j < 8 copies slot min(base + j, end - 1)'s (as load_rows).
template <typename index_t>
__device__ inline void copy_indices(index_t* staged, const index_t* __restrict__ col, int64_t base,
                                    int64_t end, int lane) {
  if (lane < kChunk && base < end)
    cp_async_small<sizeof(index_t)>(staged + lane, col + (base + lane < end ? base + lane : end - 1));
  cp_async_commit();
}

// Each lane waits for its own copies (cp.async's waits order only the executing thread's); the
// __syncwarp then makes every lane's copies visible to the whole warp.
__device__ inline void wait_indices() {
  cp_async_wait_all();
  __syncwarp();
}

// load_rows with the indices staged by copy_indices.
template <typename index_t>
__device__ inline void load_rows_at(float4 (&xr)[8], const index_t* staged,
                                    const float* __restrict__ x, int64_t base, int64_t end, int lane) {
  if (base < end) {
    // With 32-bit indices, x_lane opaque to NVVM: each address is then one IMAD.WIDE (index x
    // 512 + x_lane), where the folded form took an IMAD.WIDE, a LOP3 and a LEA pair (~22
    // instructions a chunk; the tile walk's loop, which holds this block twice, 647 -> 601).
    // With 64-bit indices it spilled 12 bytes, so they keep the folded form.
    const float* x_lane = x + 4 * lane;
    if constexpr (sizeof(index_t) == 4) asm("" : "+l"(x_lane));
#pragma unroll
    for (int j = 0; j < 8; ++j) xr[j] = ldg4(x_lane + static_cast<int64_t>(staged[j]) * kF);
  } else {
#pragma unroll
    for (int j = 0; j < 8; ++j) xr[j] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// On entry xr holds the first chunk (load_rows); its last chunk's prefetch loads the first chunk
// of [next_begin, next_end) instead (the warp's next row: one memory latency less a row). On
// return every lane holds m and the row's running sum s per head, and acc = its 4 features
// (4 lane .. 4 lane + 3) of each head's unnormalised x~.
// The next chunk's column indices are copied into the warp's stage (cp.async) before this
// chunk's scores, not loaded where its rows are: each index load was used 8-20 instructions
// after issue, a memory latency a chunk (a helper's SASS count, bench/NOTES.md v23b; v24
// measured the kernel 5.66 -> 5.40 ms on an H100). Held in registers across the scores instead,
// they made ptxas spill 40 bytes.
template <typename index_t, int H>
__device__ void walk_registers(const float* qt, float* stage, index_t* staged,
                               const index_t* __restrict__ col,
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
    {  // the next chunk's: this row's, or the warp's next row's first
      const bool more = base + kChunk < end;
      copy_indices(staged, col, more ? base + kChunk : next_begin, more ? end : next_end, lane);
    }
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
    wait_indices();
    if (base + kChunk < end) load_rows_at(xn, staged, x, base + kChunk, end, lane);
    else load_rows_at(xn, staged, x, next_begin, next_end, lane);
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

// One step of phases 1 and 3's tile products: a[i][o] += sum_k get(x[i], k) w[k].o, k ascending,
// for 4 rows (i) and 4 outputs (o).
__device__ inline void tile_fma_step(float (&a)[4][4], const float4 (&x)[4], const float4 (&w)[4]) {
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const float xk = get(x[i], k);
      a[i][0] = __fmaf_rn(xk, w[k].x, a[i][0]);
      a[i][1] = __fmaf_rn(xk, w[k].y, a[i][1]);
      a[i][2] = __fmaf_rn(xk, w[k].z, a[i][2]);
      a[i][3] = __fmaf_rn(xk, w[k].w, a[i][3]);
    }
}

// q~ = W_k,h^T q_h of 32 rows, q in shared memory at pitch kQueryPitch: warp w forms features
// [16 w, 16 w + 16), a lane 4 of them for rows dg, dg + 8, dg + 16, dg + 24, 4 W_k rows and 4
// rows' 4 queries a step (8 loads for 64 FFMA); row d's q~ goes to dst + d dst_pitch. Each step's
// W_k rows are loaded a step ahead (double-buffered): each was used 15-45 instructions after
// issue, an L2 latency a step.
template <int H>
__device__ void tile_query_t(const float* qs, const float* __restrict__ w_key, float* dst,
                             int64_t dst_pitch, int warp, int lane) {
  constexpr int C = kHC / H;
  const int dg = lane >> 2, f0 = 16 * warp + 4 * (lane & 3);
  auto load_w = [&](int h, int c, float4 (&w)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = ldg4(w_key + static_cast<int64_t>(h * C + c + k) * kF + f0);
  };
  for (int h = 0; h < H; ++h) {
    float a[4][4] = {};
    float4 w[4];
    load_w(h, 0, w);
#pragma unroll 2
    for (int c = 0; c < C; c += 4) {
      float4 qv[4], w_next[4];
      load_w(h, c + 4 < C ? c + 4 : c, w_next);
#pragma unroll
      for (int i = 0; i < 4; ++i)
        qv[i] = *reinterpret_cast<const float4*>(qs + (dg + 8 * i) * kQueryPitch + h * C + c);
      tile_fma_step(a, qv, w);
#pragma unroll
      for (int k = 0; k < 4; ++k) w[k] = w_next[k];
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


// The key bias's shift of head h's direct scores, q_h . b_k,h (c ascending, C = its channels):
// the softmax drops it, the stats' max carries it (params.h). q and b_key 16-byte aligned; 16-byte
// loads, 16 channels ahead of their FMA chain (the empty rows' kernel, one row a lane, spent
// 0.2 ms on an H100 in 4-byte loads of 32 different rows a warp).
template <int C>
__device__ inline float key_shift(const float* q, const float* __restrict__ b_key) {
  static_assert(C % 16 == 0, "channels in batches of 16");
  float shift = 0.f;
#pragma unroll
  for (int c0 = 0; c0 < C; c0 += 16) {
    float4 qv[4], bv[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      qv[k] = *reinterpret_cast<const float4*>(q + c0 + 4 * k);
      bv[k] = ldg4(b_key + c0 + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      shift = __fmaf_rn(qv[k].x, bv[k].x, shift);
      shift = __fmaf_rn(qv[k].y, bv[k].y, shift);
      shift = __fmaf_rn(qv[k].z, bv[k].z, shift);
      shift = __fmaf_rn(qv[k].w, bv[k].w, shift);
    }
  }
  return shift;
}

// Phase 3's products for rows dg, dg + 8, dg + 16, dg + 24 of a tile of x~ at kRowPitch (head
// h's x~ at h x kF): a[i][k] = sum_f x~_i,h[f] W_v[h C + c][f] for outputs o0 .. o0 + 3
// (o0 = 16 warp + 4 (lane % 4), head o0 / C), f ascending; each step's W_v rows loaded a step
// ahead, as tile_query_t's.
template <int H>
__device__ void tile_value(const float* xt, const float* __restrict__ w_value_t, int warp,
                           int lane, float (&a)[4][4]) {
  constexpr int C = kHC / H;
  const int dg = lane >> 2, o0 = 16 * warp + 4 * (lane & 3), h = o0 / C;
  auto load_w = [&](int f, float4 (&w)[4]) {
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = ldg4(w_value_t + (f + k) * kHC + o0);
  };
#pragma unroll
  for (int i = 0; i < 4; ++i)
    for (int k = 0; k < 4; ++k) a[i][k] = 0.f;
  float4 w[4];
  load_w(0, w);
#pragma unroll 2
  for (int f = 0; f < kF; f += 4) {
    float4 w_next[4];
    load_w(f + 4 < kF ? f + 4 : f, w_next);
    float4 xv[4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
      xv[i] = *reinterpret_cast<const float4*>(xt + (dg + 8 * i) * kRowPitch + h * kF + f);
    tile_fma_step(a, xv, w);
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = w_next[k];
  }
}

// out[row, o0 .. o0 + 3] = a (+ b_v) (+ residual), in that order. out may be residual itself
// (transformer_fused_inference): each element is read here, then written, by this thread only,
// so residual is loaded coherently (not through the read-only path, which assumes no writes).
__device__ inline void store_out(const TransformerFusedParams& p, int64_t row, int o0,
                                 const float (&a)[4]) {
  float4 v = make_float4(a[0], a[1], a[2], a[3]);
  if (p.b_value) {
    const float4 bias = ldg4(static_cast<const float*>(p.b_value) + o0);
    v.x = __fadd_rn(v.x, bias.x);
    v.y = __fadd_rn(v.y, bias.y);
    v.z = __fadd_rn(v.z, bias.z);
    v.w = __fadd_rn(v.w, bias.w);
  }
  if (p.residual) {
    const float4 res = *reinterpret_cast<const float4*>(static_cast<const float*>(p.residual) + row * kHC + o0);
    v.x = __fadd_rn(res.x, v.x);
    v.y = __fadd_rn(res.y, v.y);
    v.z = __fadd_rn(res.z, v.z);
    v.w = __fadd_rn(res.w, v.w);
  }
  *reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * kHC + o0) = v;
}

// Rows without edges: out = residual + 0 (or 0: the attention of no edges, no b_v), stats =
// (scale q . b_k, 1e-16), as a walk of no slots would give. Without stats and with out in
// residual's place it is not launched; with out there only the stats are written (out keeps the
// residual, where a -0 stays -0 and residual + 0 is +0: the same value). A warp takes 32 rows: lane i finds
// whether row base + i is empty (one load of rowptr for the warp) and forms its stats, then the
// warp writes the empty rows' outputs one after another (a warp a row was 0.35 ms on an H100:
// 10^6 warps, each a few dependent memory latencies).
template <typename index_t, int H>
__global__ void __launch_bounds__(kThreads) empty_rows_kernel(TransformerFusedParams p) {
  constexpr int C = kHC / H;
  const int lane = threadIdx.x & 31;
  const int64_t base = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) - lane;
  const int64_t mine = base + lane;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const bool empty = mine < p.num_dst && rowptr[mine + 1] == rowptr[mine];
  unsigned todo = p.out == p.residual ? 0u : __ballot_sync(0xffffffffu, empty);
  if (empty && p.stats) {
    auto* stats = static_cast<float*>(p.stats);
    for (int h = 0; h < H; ++h) {
      const float shift = p.b_key ? key_shift<C>(static_cast<const float*>(p.query) + mine * kHC + h * C,
                                                 static_cast<const float*>(p.b_key) + h * C)
                                  : 0.f;
      stats[(mine * H + h) * 2] = __fadd_rn(0.f, __fmul_rn(static_cast<float>(p.scale), shift));
      stats[(mine * H + h) * 2 + 1] = __fadd_rn(0.f, kEps);
    }
  }
  while (todo) {
    const int64_t row = base + __ffs(todo) - 1;
    todo &= todo - 1;
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
    if (p.residual) {
      const float4 res = ldg4(static_cast<const float*>(p.residual) + row * kHC + 4 * lane);
      v = make_float4(__fadd_rn(res.x, 0.f), __fadd_rn(res.y, 0.f), __fadd_rn(res.z, 0.f),
                      __fadd_rn(res.w, 0.f));
    }
    *reinterpret_cast<float4*>(static_cast<float*>(p.out) + row * kHC + 4 * lane) = v;
  }
}

// The rows a tile takes: light (not heavy) and with edges.
template <typename index_t>
struct LightRowWithEdges {
  const index_t* rowptr;
  int64_t light_max_degree;
  __device__ bool operator()(index_t row) const {
    const int64_t len = static_cast<int64_t>(rowptr[row + 1]) - rowptr[row];
    return len > 0 && len <= light_max_degree;
  }
};

template <typename index_t>
size_t select_temp_bytes(int64_t num_dst) {
  size_t bytes = 0;
  GNNIO_CUDA_CHECK(cub::DeviceSelect::If(nullptr, bytes, thrust::counting_iterator<index_t>(0),
                                         static_cast<index_t*>(nullptr), static_cast<int64_t*>(nullptr),
                                         num_dst, LightRowWithEdges<index_t>{nullptr, 0}));
  return bytes;
}

// The tile row at position `lane` when the tile's rows are ordered by decreasing degree (ties by
// row position; rows past the list, begin = end = 0 as degree -1, last): a bitonic sort of 32
// (key, row) pairs over the warp's lanes.
__device__ inline int sort_by_degree(const int64_t* begins, const int64_t* ends, int lane) {
  // ascending keys: the degree negated, times 64, plus the row (unique keys, so partners agree)
  const int64_t degree = ends[lane] > begins[lane] ? ends[lane] - begins[lane] : -1;
  int64_t key = -(degree + 1) * 64 + lane;
  int row = lane;
#pragma unroll
  for (int k = 2; k <= 32; k <<= 1) {
#pragma unroll
    for (int j = k >> 1; j > 0; j >>= 1) {
      const int64_t other_key = __shfl_xor_sync(0xffffffffu, key, j);
      const int other_row = __shfl_xor_sync(0xffffffffu, row, j);
      const bool ascending = (lane & k) == 0, lower = (lane & j) == 0;
      const bool take = lower == ascending ? other_key < key : other_key > key;
      if (take) {
        key = other_key;
        row = other_row;
      }
    }
  }
  return row;
}

template <typename index_t, int H>
__global__ void __launch_bounds__(kThreads, 2)
    fused_kernel(TransformerFusedParams p, int64_t tile_blocks, const index_t* __restrict__ light_rows,
                 const int64_t* __restrict__ light_count, float* part, const float* heavy_qt) {
  extern __shared__ float4 smem4[];
  float* rows = reinterpret_cast<float*>(smem4);
  float* scratch = rows + kRowFloats;
  auto* tile_rows = reinterpret_cast<int64_t*>(scratch + kScratchFloats);
  int64_t* begins = tile_rows + kTileRows;
  int64_t* ends = begins + kTileRows;
  float* shifts = reinterpret_cast<float*>(ends + kTileRows);
  int* by_degree = reinterpret_cast<int*>(shifts + kTileRows * 4);
  int* next_walk = by_degree + kTileRows;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const auto* x = static_cast<const float*>(p.x);
  const auto* query = static_cast<const float*>(p.query);
  auto* stats = static_cast<float*>(p.stats);
  const float scale = static_cast<float>(p.scale);
  float* stage = scratch + warp * kWarpStage;
  auto* staged = reinterpret_cast<index_t*>(scratch + kWarps * kWarpStage + warp * kWarpIndices);
  float m[H], s[H], acc[H][4];
  float4 xr[8];

  if (blockIdx.x >= tile_blocks) {  // a heavy row's item, one a warp
    const int64_t item = (static_cast<int64_t>(blockIdx.x) - tile_blocks) * kWarps + warp;
    if (item >= p.split.num_items) return;
    const int64_t* it = p.split.heavy_items + 3 * item;
    float* qt = rows + warp * kRowPitch;
    for (int h = 0; h < H; ++h)
      *reinterpret_cast<float4*>(qt + h * kHeadPitch + 4 * lane) =
          ldg4(heavy_qt + it[0] * H * kHeadPitch + h * kHeadPitch + 4 * lane);
    __syncwarp();
    load_rows(xr, col, x, it[1], it[2], lane);
    walk_registers<index_t, H>(qt, stage, staged, col, x, it[1], it[2], 0, 0, xr, scale, lane, m,
                               s, acc);
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

  const int64_t first = static_cast<int64_t>(blockIdx.x) * kTileRows, count = *light_count;
  if (first >= count) return;  // (the grid is sized for every row; the list is shorter)
  const int num_rows = count - first < kTileRows ? static_cast<int>(count - first) : kTileRows;
  if (threadIdx.x < kTileRows) {  // -1 past the list's end: only the last tile's trailing rows
    const int64_t k = first + threadIdx.x;
    const int64_t row = k < count ? static_cast<int64_t>(light_rows[k]) : -1;
    tile_rows[threadIdx.x] = row;
    begins[threadIdx.x] = row >= 0 ? static_cast<int64_t>(rowptr[row]) : 0;
    ends[threadIdx.x] = row >= 0 ? static_cast<int64_t>(rowptr[row + 1]) : 0;
  }
  __syncthreads();
  if (warp == 0) by_degree[lane] = sort_by_degree(begins, ends, lane);
  if (threadIdx.x == 0) *next_walk = kWarps;
  float* qs = scratch;  // the query tile, [32][kQueryPitch = 132]; the warps' stages after phase 1
  for (int v = threadIdx.x; v < kTileRows * (kHC / 4); v += kThreads) {
    const int d = v / (kHC / 4), c4 = v % (kHC / 4);
    const int64_t row = tile_rows[d];
    const float4 q = row >= 0 ? ldg4(query + row * kHC + 4 * c4) : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(qs + d * kQueryPitch + 4 * c4) = q;
  }
  __syncthreads();
  if (threadIdx.x < kTileRows * H) {
    constexpr int C = kHC / H;
    const int d = threadIdx.x / H, h = threadIdx.x % H;
    shifts[d * 4 + h] = p.b_key ? key_shift<C>(qs + d * kQueryPitch + h * C,
                                               static_cast<const float*>(p.b_key) + h * C)
                                : 0.f;
  }
  tile_query_t<H>(qs, static_cast<const float*>(p.w_key), rows, kRowPitch, warp, lane);  // phase 1
  __syncthreads();
  // phase 2: the rows' walks in decreasing degree, each warp taking the next row when it is done
  // with one (a longest-first schedule: light rows run from 1 to light_max_degree slots, and a
  // fixed 4 rows a warp left the block waiting on its longest warp), prefetching its first chunk
  // during the current row's last. A row is walked whole by whichever warp takes it: the same
  // sums in the same order, so the bits do not depend on the schedule.
  int k = warp;  // the position in by_degree
  if (k < num_rows) load_rows(xr, col, x, begins[by_degree[k]], ends[by_degree[k]], lane);
  while (k < num_rows) {
    const int d = by_degree[k];
    int next = 0;
    if (lane == 0) next = atomicAdd(next_walk, 1);
    next = __shfl_sync(0xffffffffu, next, 0);
    const bool has_next = next < num_rows;
    const int dn = has_next ? by_degree[next] : 0;
    const int64_t row = tile_rows[d];
    float* qt = rows + d * kRowPitch;
    walk_registers<index_t, H>(qt, stage, staged, col, x, begins[d], ends[d],
                               has_next ? begins[dn] : 0, has_next ? ends[dn] : 0, xr, scale, lane,
                               m, s, acc);
    auto finish = [&](int h) {
      const float sum = __fadd_rn(s[h], kEps);
      *reinterpret_cast<float4*>(qt + h * kF + 4 * lane) =
          make_float4(acc[h][0] / sum, acc[h][1] / sum, acc[h][2] / sum, acc[h][3] / sum);
      if (lane == h && stats) {
        stats[(row * H + h) * 2] = __fadd_rn(m[h], __fmul_rn(scale, shifts[d * 4 + h]));
        stats[(row * H + h) * 2 + 1] = sum;
      }
    };
    // Unrolled before LLVM's GVN: otherwise `lane == h` rewrites m[h] as m[lane], a dynamically
    // indexed array that ptxas left in local memory here (16-byte frame, STL.128 at the walk's
    // end, LDL at each stats store).
#pragma unroll
    for (int h = 0; h < H; ++h) finish(h);
    k = next;
  }
  __syncthreads();
  float a[4][4];  // phase 3: out = W_v x~ (+ b_v) (+ residual)
  tile_value<H>(rows, static_cast<const float*>(p.w_value_t), warp, lane, a);
  for (int i = 0; i < 4; ++i) {
    const int64_t row = tile_rows[(lane >> 2) + 8 * i];
    if (row >= 0) store_out(p, row, 16 * warp + 4 * (lane & 3), a[i]);
  }
}

// A heavy row's items merged into its x~ (heavy_xt, [heavy index][H x kF]) and stats: one block
// of 256 threads per (heavy row, head), as the direct form's merge (attention/cuda_forward.cu):
// group g (16 lanes, lane l features 8 l .. 8 l + 7) merges items g, g + 16, ... online (the
// running max, the sum and x~ rescaled per item, loads kMergeBatch items ahead), then thread t
// merges the 16 groups' feature t in group order. A fixed tree: the result does not depend on
// scheduling, and a 2M-slot row's 16K items are merged by 64 groups (v21's 8 warps a row over
// all heads took 0.54 ms, most of it the hub's block).
template <int H>
__global__ void __launch_bounds__(kMergeThreads)
    merge_kernel(TransformerFusedParams p, const float* part, float* heavy_xt) {
  constexpr int kLanes = 16, kGroups = kMergeThreads / kLanes, kBatch = 4;
  constexpr int64_t kItemFloats = H * (kF + 4);
  __shared__ float4 group_acc[kGroups][kF / 4];
  __shared__ float group_m[kGroups], group_s[kGroups];
  const int64_t hr = blockIdx.x / H;
  const int h = blockIdx.x % H, g = threadIdx.x / kLanes, l = threadIdx.x % kLanes;
  const int64_t first = p.split.item_offsets[hr], last = p.split.item_offsets[hr + 1];
  float M = -INFINITY, S = 0.f;
  float4 acc[2] = {make_float4(0.f, 0.f, 0.f, 0.f), make_float4(0.f, 0.f, 0.f, 0.f)};
  for (int64_t it0 = first + g; it0 < last; it0 += kBatch * kGroups) {
    float mb[kBatch], sb[kBatch];
    float4 ab[kBatch][2];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {  // loads first (past the end: the first item again)
      const int64_t it = it0 + int64_t(u) * kGroups;
      const float* pi = part + (it < last ? it : first) * kItemFloats;
      mb[u] = pi[H * kF + 2 * h];
      sb[u] = pi[H * kF + 2 * h + 1];
      ab[u][0] = *reinterpret_cast<const float4*>(pi + h * kF + 8 * l);
      ab[u][1] = *reinterpret_cast<const float4*>(pi + h * kF + 8 * l + 4);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (it0 + int64_t(u) * kGroups >= last) break;
      // An item of no slots (only a raw call's items can have one) adds nothing: without this,
      // a group whose first item is empty forms exp(-inf - -inf) = NaN (v21's merge took
      // exp(m_i - M) = 0 for it).
      if (mb[u] == -INFINITY) continue;
      const float m_new = fmaxf(M, mb[u]);  // finite: the item has slots
      const float r_old = expf(M - m_new), r = expf(mb[u] - m_new);
      S = __fadd_rn(__fmul_rn(S, r_old), __fmul_rn(sb[u], r));
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        acc[k].x = __fadd_rn(__fmul_rn(acc[k].x, r_old), __fmul_rn(ab[u][k].x, r));
        acc[k].y = __fadd_rn(__fmul_rn(acc[k].y, r_old), __fmul_rn(ab[u][k].y, r));
        acc[k].z = __fadd_rn(__fmul_rn(acc[k].z, r_old), __fmul_rn(ab[u][k].z, r));
        acc[k].w = __fadd_rn(__fmul_rn(acc[k].w, r_old), __fmul_rn(ab[u][k].w, r));
      }
      M = m_new;
    }
  }
  group_acc[g][2 * l] = acc[0];
  group_acc[g][2 * l + 1] = acc[1];
  if (l == 0) {
    group_m[g] = M;
    group_s[g] = S;
  }
  __syncthreads();
  if (threadIdx.x >= kF) return;
  const int t = threadIdx.x;
  float m_row = -INFINITY;
  for (int w = 0; w < kGroups; ++w) m_row = fmaxf(m_row, group_m[w]);
  float a = 0.f, s_row = 0.f;
  for (int w = 0; w < kGroups; ++w) {
    if (group_m[w] == -INFINITY) continue;  // a group without items
    const float r = expf(group_m[w] - m_row);
    s_row = __fadd_rn(s_row, __fmul_rn(group_s[w], r));
    a = __fadd_rn(a, __fmul_rn(reinterpret_cast<const float*>(group_acc[w])[t], r));
  }
  s_row = __fadd_rn(s_row, kEps);
  heavy_xt[(hr * H + h) * kF + t] = a / s_row;
  if (t == 0 && p.stats) {
    constexpr int C = kHC / H;
    const int64_t row = p.split.heavy_rows[hr];
    const float shift = p.b_key ? key_shift<C>(static_cast<const float*>(p.query) + row * kHC + h * C,
                                               static_cast<const float*>(p.b_key) + h * C)
                                : 0.f;
    auto* stats = static_cast<float*>(p.stats);
    stats[(row * H + h) * 2] = __fadd_rn(m_row, __fmul_rn(static_cast<float>(p.scale), shift));
    stats[(row * H + h) * 2 + 1] = s_row;
  }
}

// out of 32 heavy rows a block: W_v x~ (+ b_v) (+ residual), x~ from merge_kernel.
template <int H>
__global__ void __launch_bounds__(kThreads) heavy_value_kernel(TransformerFusedParams p, const float* heavy_xt) {
  extern __shared__ float4 smem4[];
  float* rows = reinterpret_cast<float*>(smem4);
  const int64_t hr0 = static_cast<int64_t>(blockIdx.x) * kTileRows;
  for (int v = threadIdx.x; v < kTileRows * H * (kF / 4); v += kThreads) {
    const int d = v / (H * kF / 4), f4 = v % (H * kF / 4);
    const float4 xv = hr0 + d < p.split.num_heavy ? ldg4(heavy_xt + (hr0 + d) * H * kF + 4 * f4)
                                                   : make_float4(0.f, 0.f, 0.f, 0.f);
    *reinterpret_cast<float4*>(rows + d * kRowPitch + 4 * f4) = xv;
  }
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  float a[4][4];
  tile_value<H>(rows, static_cast<const float*>(p.w_value_t), warp, lane, a);
  for (int i = 0; i < 4; ++i) {
    const int64_t hr = hr0 + (lane >> 2) + 8 * i;
    if (hr < p.split.num_heavy) store_out(p, p.split.heavy_rows[hr], 16 * warp + 4 * (lane & 3), a[i]);
  }
}

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Workspace: [item partials: num_items x H x (kF + 4) | heavy rows' q~, then x~: num_heavy (to
// 32) x H x kF] floats, then 256-byte aligned: [item offsets | light rows | their count | CUB's
// select temp].
struct Workspace {
  size_t heavy_rows_at, item_offsets_at, light_rows_at, count_at, temp_at, temp_bytes, bytes;
};

Workspace workspace_of(const TransformerFusedParams& p) {
  Workspace w{};
  const int64_t heavy_rows = (p.split.num_heavy + kTileRows - 1) / kTileRows * kTileRows;
  w.heavy_rows_at = static_cast<size_t>(p.split.num_items) * p.heads * (kF + 4) * sizeof(float);
  w.item_offsets_at = workspace_align(
      w.heavy_rows_at + static_cast<size_t>(heavy_rows) * p.heads * kHeadPitch * sizeof(float));
  w.light_rows_at = workspace_align(w.item_offsets_at + item_offsets_bytes(p.split));
  const bool int32 = p.index_type == IndexType::kInt32;
  w.count_at =
      workspace_align(w.light_rows_at + p.num_dst * (int32 ? sizeof(int32_t) : sizeof(int64_t)));
  w.temp_at = workspace_align(w.count_at + sizeof(int64_t));
  w.temp_bytes = p.num_dst == 0 ? 0
                 : int32        ? select_temp_bytes<int32_t>(p.num_dst)
                                : select_temp_bytes<int64_t>(p.num_dst);
  w.bytes = w.temp_at + w.temp_bytes;
  return w;
}

template <typename index_t, int H>
void launch(const TransformerFusedParams& p, const Workspace& w, char* ws, cudaStream_t s) {
  auto* part = reinterpret_cast<float*>(ws);
  auto* heavy_rows_buf = reinterpret_cast<float*>(ws + w.heavy_rows_at);
  auto* light_rows = reinterpret_cast<index_t*>(ws + w.light_rows_at);
  auto* light_count = reinterpret_cast<int64_t*>(ws + w.count_at);
  size_t temp_bytes = w.temp_bytes;
  GNNIO_CUDA_CHECK(cub::DeviceSelect::If(
      ws + w.temp_at, temp_bytes, thrust::counting_iterator<index_t>(0), light_rows, light_count,
      p.num_dst, LightRowWithEdges<index_t>{static_cast<const index_t*>(p.rowptr), p.split.light_max_degree},
      s));
  if (p.stats || p.out != p.residual) {  // (otherwise the empty rows' out is already there)
    empty_rows_kernel<index_t, H><<<static_cast<unsigned>((p.num_dst + kThreads - 1) / kThreads),
                                    kThreads, 0, s>>>(p);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
  const int64_t heavy_blocks = (p.split.num_heavy + kTileRows - 1) / kTileRows;
  if (p.split.num_heavy > 0) {
    heavy_query_kernel<H><<<static_cast<unsigned>(heavy_blocks), kThreads, 0, s>>>(p, heavy_rows_buf);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
  auto kernel = fused_kernel<index_t, H>;
  GNNIO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  // Two blocks an SM need 2 x 92 KB of its 228: ask for the largest shared-memory carveout
  // (the driver may otherwise pick one that holds a single block).
  GNNIO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                        cudaSharedmemCarveoutMaxShared));
  // Tiles for every row that could be listed (the count is on the device): blocks past the
  // list's tiles return at once.
  const int64_t tile_blocks = (p.num_dst + kTileRows - 1) / kTileRows;
  const int64_t item_blocks = (p.split.num_items + kWarps - 1) / kWarps;
  kernel<<<static_cast<unsigned>(tile_blocks + item_blocks), kThreads, kSmemBytes, s>>>(
      p, tile_blocks, light_rows, light_count, part, heavy_rows_buf);
  GNNIO_CUDA_CHECK(cudaGetLastError());
  if (p.split.num_heavy > 0) {
    merge_kernel<H><<<static_cast<unsigned>(p.split.num_heavy * H), kMergeThreads, 0, s>>>(p, part, heavy_rows_buf);
    GNNIO_CUDA_CHECK(cudaGetLastError());
    GNNIO_CUDA_CHECK(cudaFuncSetAttribute(heavy_value_kernel<H>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kValueSmemBytes)));
    heavy_value_kernel<H><<<static_cast<unsigned>(heavy_blocks), kThreads, kValueSmemBytes, s>>>(
        p, heavy_rows_buf);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
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
  return workspace_of(p).bytes;
}

void transformer_fused_forward_cuda(const TransformerFusedParams& p, void* workspace, void* stream) {
  GNNIO_CHECK(transformer_fused_cuda_supported(p), ErrorKind::kInvalidArgument,
              "transformer_fused_forward on CUDA takes float32, 128 features, heads x channels = "
              "128 with 1, 2 or 4 heads, and 16-byte aligned operands");
  if (p.num_dst == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  auto* ws = static_cast<char*>(workspace);
  const Workspace w = workspace_of(p);
  TransformerFusedParams q = p;
  fill_item_offsets(q.split, ws + w.item_offsets_at, s);
  auto run = [&](auto index) {
    using index_t = decltype(index);
    if (q.heads == 1) launch<index_t, 1>(q, w, ws, s);
    else if (q.heads == 2) launch<index_t, 2>(q, w, ws, s);
    else launch<index_t, 4>(q, w, ws, s);
  };
  if (q.index_type == IndexType::kInt32) run(int32_t{});
  else run(int64_t{});
}

}  // namespace gnnio
