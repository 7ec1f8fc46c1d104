// CUDA kernels of TransformerConv's fused reassociated attention (params.h has the math and the
// order of the sums). Shapes are the benchmark's and PyG's common ones: float32, F = H x C = 128,
// 1, 2 or 4 heads (transformer_fused_cuda_supported); the layer runs the unfused forms otherwise.
//
// fused_kernel: one block of 8 warps per tile of 32 destinations, in three phases.
//   1. q~ = W_k,h^T q_h for the tile's rows: warp w owns features [16w, 16w + 16), a lane 4 of
//      them for 4 rows (dg, dg + 8, dg + 16, dg + 24): each W_k load feeds 16 FFMA, and each
//      block reads W_k once (64 KB, from L2).
//   2. Each warp walks 4 rows, kTransformerChunk slots at a time: lane (fg, eg) = (lane / 8,
//      lane % 8) holds quarter fg of slot eg's x_j in registers (8 x 16-byte loads) and forms its
//      partial scores against q~ in shared memory; two shuffles finish a score, three a chunk's
//      max. The chunk's rows then go to the warp's stage in shared memory and every lane adds
//      its 4 features of each slot, weighted, for every head: x_j is read from memory once per
//      edge for all heads, and no shuffle runs per slot and head (NOTES v20: the shared-row
//      kernel's butterflies per slot and head made it 1.5x slower than the per-head kernel).
//      The next chunk's loads are issued before that accumulation.
//   3. out = W_v,h x~_h (+ b_v) (+ residual), x~ in shared memory where q~ was: warp w owns
//      outputs [16w, 16w + 16), a lane 4 of them for 4 rows.
// Blocks past the tiles take heavy rows' items (one warp an item: q~ of its row, the same walk,
// a partial (m, s, x~ unnormalised) per head); merge_kernel combines a heavy row's items in item
// order and applies W_v.
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
// q~ of a row: per head, four quarters of 32 features at a pitch of 36 floats, so that the four
// quarters' loads of one instruction fall in different banks.
constexpr int kQuarterPitch = 36, kHeadPitch = 4 * kQuarterPitch;
// A row's region holds q~ (up to 4 x 144 floats), then x~ (4 x 128). 580 = 4 (mod 32): the
// epilogue's loads of 8 rows at once fall in different banks.
constexpr int kRowPitch = 580;
constexpr int kQueryPitch = kHC + 1;  // the query tile's rows: scalar loads of 8 rows, 8 banks
constexpr int kStagePitch = kF + 4;   // a staged slot's row: 4 (mod 32), the quarter-warp's rows apart
constexpr int kWarpStage = kChunk * kStagePitch + kChunk * 4;  // x rows, then the chunk's weights
constexpr int kRowFloats = kTileRows * kRowPitch;
constexpr int kScratchFloats =
    kWarps * kWarpStage > kTileRows * kQueryPitch ? kWarps * kWarpStage : kTileRows * kQueryPitch;
constexpr size_t kSmemBytes = (kRowFloats + kScratchFloats + kTileRows) * sizeof(float);
constexpr float kEps = 1e-16f;
constexpr int kMergeThreads = kF;

static_assert(kF == 128 && kHC == 128, "lane maps assume 128 features and 128 outputs");
static_assert(kTileRows == 4 * kWarps, "a lane forms q~ and out for 4 rows, 8 rows apart");

enum RowFlag : int { kEmpty = 0, kHasEdges = 1, kHeavy = 2, kOutside = 3 };

__device__ inline float4 ldg4(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ inline float get(const float4& v, int k) {
  return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// One row's (or item's) walk over slots [begin, end) with q~ at qt (head pitch kHeadPitch). On
// return every lane holds m and the row's running sum s per head, and acc = its 4 features
// (4 lane .. 4 lane + 3) of each head's unnormalised x~.
template <typename index_t, int H>
__device__ void walk(const float* qt, float* stage, const index_t* __restrict__ col,
                     const float* __restrict__ x, int64_t begin, int64_t end, float scale, int lane,
                     float (&m)[H], float (&s)[H], float (&acc)[H][4]) {
  const int fg = lane >> 3, eg = lane & 7;
  float* xs = stage;
  float* ws = stage + kChunk * kStagePitch;
  for (int h = 0; h < H; ++h) {
    m[h] = -INFINITY;
    s[h] = 0.f;
    for (int k = 0; k < 4; ++k) acc[h][k] = 0.f;
  }
  float4 xr[8];
  auto load = [&](int64_t base) {
    const int64_t k = base + eg;
    if (k < end) {
      const float* src = x + static_cast<int64_t>(col[k]) * kF + 32 * fg;
#pragma unroll
      for (int t = 0; t < 8; ++t) xr[t] = ldg4(src + 4 * t);
    } else {
#pragma unroll
      for (int t = 0; t < 8; ++t) xr[t] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  };
  load(begin);
  for (int64_t base = begin; base < end; base += kChunk) {
    const bool valid = base + eg < end;
    float e[H], p[H], r[H];
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const float* q = qt + h * kHeadPitch + fg * kQuarterPitch;
      float a = 0.f;
#pragma unroll
      for (int t = 0; t < 8; ++t) {
        const float4 qv = *reinterpret_cast<const float4*>(q + 4 * t);
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
    float4* row = reinterpret_cast<float4*>(xs + eg * kStagePitch + 32 * fg);
#pragma unroll
    for (int t = 0; t < 8; ++t) row[t] = xr[t];
    if (fg == 0) {
#pragma unroll
      for (int h = 0; h < H; ++h) ws[eg * 4 + h] = p[h];
    }
    __syncwarp();
    const int n = end - base < kChunk ? static_cast<int>(end - base) : kChunk;
    load(base + kChunk);
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

// q~ of one row by one warp (the items' rows): lane owns features 4 lane .. 4 lane + 3.
template <int H>
__device__ void row_query_t(const float* __restrict__ q, const float* __restrict__ w_key, float* qt,
                            int lane) {
  constexpr int C = kHC / H;
  for (int h = 0; h < H; ++h) {
    float a[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll 8
    for (int c = 0; c < C; ++c) {
      const float qv = __ldg(q + h * C + c);
      const float4 w = ldg4(w_key + static_cast<int64_t>(h * C + c) * kF + 4 * lane);
      a[0] = __fmaf_rn(qv, w.x, a[0]);
      a[1] = __fmaf_rn(qv, w.y, a[1]);
      a[2] = __fmaf_rn(qv, w.z, a[2]);
      a[3] = __fmaf_rn(qv, w.w, a[3]);
    }
    *reinterpret_cast<float4*>(qt + h * kHeadPitch + (lane >> 3) * kQuarterPitch + 4 * (lane & 7)) =
        make_float4(a[0], a[1], a[2], a[3]);
  }
}

template <typename index_t, int H>
__global__ void __launch_bounds__(kThreads, 2)
    fused_kernel(TransformerFusedParams p, int64_t num_tiles, float* part) {
  extern __shared__ float4 smem4[];
  float* rows = reinterpret_cast<float*>(smem4);
  float* scratch = rows + kRowFloats;
  int* flags = reinterpret_cast<int*>(scratch + kScratchFloats);
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
    const int64_t row = p.split.heavy_rows[it[0]];
    float* qt = rows + warp * kRowPitch;
    row_query_t<H>(query + row * kHC, w_key, qt, lane);
    __syncwarp();
    walk<index_t, H>(qt, stage, col, x, it[1], it[2], scale, lane, m, s, acc);
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
  float* qs = scratch;  // the query tile, [32][129]; the warps' stages after phase 1
  for (int v = threadIdx.x; v < kTileRows * (kHC / 4); v += kThreads) {
    const int d = v / (kHC / 4), c4 = v % (kHC / 4);
    float4 q = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row0 + d < p.num_dst) q = ldg4(query + (row0 + d) * kHC + 4 * c4);
    float* dst = qs + d * kQueryPitch + 4 * c4;
    dst[0] = q.x;
    dst[1] = q.y;
    dst[2] = q.z;
    dst[3] = q.w;
  }
  __syncthreads();
  {  // phase 1: q~
    constexpr int C = kHC / H;
    const int dg = lane >> 2, f0 = 16 * warp + 4 * (lane & 3);
    for (int h = 0; h < H; ++h) {
      float a[4][4] = {};
#pragma unroll 8
      for (int c = 0; c < C; ++c) {
        const float4 w = ldg4(w_key + static_cast<int64_t>(h * C + c) * kF + f0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const float qv = qs[(dg + 8 * i) * kQueryPitch + h * C + c];
          a[i][0] = __fmaf_rn(qv, w.x, a[i][0]);
          a[i][1] = __fmaf_rn(qv, w.y, a[i][1]);
          a[i][2] = __fmaf_rn(qv, w.z, a[i][2]);
          a[i][3] = __fmaf_rn(qv, w.w, a[i][3]);
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
        *reinterpret_cast<float4*>(rows + (dg + 8 * i) * kRowPitch + h * kHeadPitch +
                                   (f0 >> 5) * kQuarterPitch + (f0 & 31)) =
            make_float4(a[i][0], a[i][1], a[i][2], a[i][3]);
    }
  }
  __syncthreads();
  for (int i = 0; i < kRowsPerWarp; ++i) {  // phase 2: the rows' walks
    const int d = warp + kWarps * i;
    const int64_t row = row0 + d;
    float* qt = rows + d * kRowPitch;
    int flag = kOutside;
    if (row < p.num_dst) {
      const int64_t begin = rowptr[row], end = rowptr[row + 1];
      flag = end - begin > p.split.light_max_degree ? kHeavy : end > begin ? kHasEdges : kEmpty;
      if (flag != kHeavy) {
        walk<index_t, H>(qt, stage, col, x, begin, end, scale, lane, m, s, acc);
        for (int h = 0; h < H; ++h) {
          const float sum = __fadd_rn(s[h], kEps);
          const float inv_row[4] = {acc[h][0] / sum, acc[h][1] / sum, acc[h][2] / sum, acc[h][3] / sum};
          *reinterpret_cast<float4*>(qt + h * kF + 4 * lane) =
              make_float4(inv_row[0], inv_row[1], inv_row[2], inv_row[3]);
          if (lane == h) {
            stats[(row * H + h) * 2] = flag == kEmpty ? 0.f : m[h];
            stats[(row * H + h) * 2 + 1] = sum;
          }
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

// A heavy row's items merged in item order, then W_v: one block a heavy row, thread t = feature
// t, then output t.
__global__ void __launch_bounds__(kMergeThreads) merge_kernel(TransformerFusedParams p, const float* part) {
  __shared__ float xt[4 * kF];
  const int64_t hr = blockIdx.x, row = p.split.heavy_rows[hr];
  const int64_t i0 = p.split.item_offsets[hr], i1 = p.split.item_offsets[hr + 1];
  const int H = static_cast<int>(p.heads), t = threadIdx.x;
  const int64_t item_floats = H * (kF + 4);
  auto* stats = static_cast<float*>(p.stats);
  for (int h = 0; h < H; ++h) {
    float m = -INFINITY;
    for (int64_t it = i0; it < i1; ++it) m = fmaxf(m, part[it * item_floats + H * kF + 2 * h]);
    float sum = 0.f, a = 0.f;
    for (int64_t it = i0; it < i1; ++it) {
      const float* pi = part + it * item_floats;
      const float r = expf(pi[H * kF + 2 * h] - m);
      sum = __fadd_rn(sum, __fmul_rn(pi[H * kF + 2 * h + 1], r));
      a = __fadd_rn(a, __fmul_rn(pi[h * kF + t], r));
    }
    sum = __fadd_rn(sum, kEps);
    xt[h * kF + t] = a / sum;
    if (t == 0) {
      stats[(row * H + h) * 2] = m;
      stats[(row * H + h) * 2 + 1] = sum;
    }
  }
  __syncthreads();
  const int C = kHC / H, h = t / C;
  const auto* w_value_t = static_cast<const float*>(p.w_value_t);
  float v = 0.f;
  for (int f = 0; f < kF; ++f) v = __fmaf_rn(xt[h * kF + f], __ldg(w_value_t + f * kHC + t), v);
  if (p.b_value) v = __fadd_rn(v, static_cast<const float*>(p.b_value)[t]);
  if (p.residual) v = __fadd_rn(static_cast<const float*>(p.residual)[row * kHC + t], v);
  static_cast<float*>(p.out)[row * kHC + t] = v;
}

bool aligned(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

template <typename index_t, int H>
void launch(const TransformerFusedParams& p, float* part, cudaStream_t s) {
  auto kernel = fused_kernel<index_t, H>;
  GNNIO_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        static_cast<int>(kSmemBytes)));
  const int64_t tiles = (p.num_dst + kTileRows - 1) / kTileRows;
  const int64_t item_blocks = (p.split.num_items + kWarps - 1) / kWarps;
  kernel<<<static_cast<unsigned>(tiles + item_blocks), kThreads, kSmemBytes, s>>>(p, tiles, part);
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

bool transformer_fused_cuda_supported(const TransformerFusedParams& p) {
  return p.scalar_type == ScalarType::kFloat32 && p.features == kF && p.heads * p.channels == kHC &&
         (p.heads == 1 || p.heads == 2 || p.heads == 4) && aligned(p.x) && aligned(p.query) &&
         aligned(p.w_key) && aligned(p.w_value_t) && aligned(p.out) &&
         (!p.b_value || aligned(p.b_value)) && (!p.residual || aligned(p.residual));
}

size_t transformer_fused_cuda_workspace_bytes(const TransformerFusedParams& p) {
  return static_cast<size_t>(p.split.num_items) * p.heads * (kF + 4) * sizeof(float);
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
  auto run = [&](auto index) {
    using index_t = decltype(index);
    if (p.heads == 1) launch<index_t, 1>(p, part, s);
    else if (p.heads == 2) launch<index_t, 2>(p, part, s);
    else launch<index_t, 4>(p, part, s);
  };
  if (p.index_type == IndexType::kInt32) run(int32_t{});
  else run(int64_t{});
  if (p.split.num_heavy > 0) {
    merge_kernel<<<static_cast<unsigned>(p.split.num_heavy), kMergeThreads, 0, s>>>(p, part);
    GNNIO_CUDA_CHECK(cudaGetLastError());
  }
}

}  // namespace gnnio
