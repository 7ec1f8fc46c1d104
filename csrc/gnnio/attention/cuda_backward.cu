// Backward kernels of the attention family (see params.h for the math).
//
// delta_kernel: D_i = dout_i . out_i per (row, head), from out_acc when the forward kept it.
// Pass A walks csr_by_dst: per (destination, head), recomputes each slot's score and weight
// from the stats, writes the per-edge gradients and sums the destination-side ones.
// Pass B (cuda_backward_pass_b.cu) walks csr_by_src: per (source, head), the same
// recomputation through t2c, summing the source-side gradients. Heavy rows of either CSR are
// split into work items whose partial sums are added in item order by a merge kernel;
// everything else is written by the one group that owns it: no atomics, the same bits every run.
#include <cstdlib>
#include <type_traits>

#include "gnnio/attention/backward_common.cuh"
#include "gnnio/common/cuda_check.h"

namespace gnnio {
namespace {

using namespace attention_detail;

template <typename scalar_t, int L, int CPL>
__global__ void delta_kernel(AttentionBackwardParams b) {
  const AttentionParams& p = b.fwd;
  const Group<L> g;
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / L;
  if (group >= p.num_dst * p.heads) return;
  const int64_t C = p.channels;
  const auto* go = static_cast<const scalar_t*>(b.grad_out) + group * C;
  auto lane_dot = [&](const auto* out) {  // out as scalar_t, or the float out_acc
    float part = 0.0f;
#pragma unroll
    for (int t = 0; t < CPL; ++t) {
      const int64_t c = int64_t(g.sub) * CPL + t;
      if (c < C) part += to_acc(go[c]) * to_acc(out[c]);
    }
    return part;
  };
  // The unrounded out of a low-precision forward when it was kept.
  const float part = p.out_acc ? lane_dot(static_cast<const float*>(p.out_acc) + group * C)
                               : lane_dot(static_cast<const scalar_t*>(p.out) + group * C);
  const float d = g.sum(part);
  if (g.sub == 0) static_cast<float*>(b.delta)[group] = d;
}

// GATv2's d att in per-block sums (b.att_blocks): each lane group's share of row i (zero for
// work items and skipped tasks) is added over the block's groups of the same head, in group
// order, into row blockIdx.x of grad_att_partial [att_blocks + num_heavy, H, C]. Every thread
// of the block must call it; the launch gives it kRowThreads * CPL floats of dynamic shared memory
// (none when att_blocks is 0, so the other kernels keep all of L1).
template <int L, int CPL>
__device__ void att_block_sum(const AttentionBackwardParams& b, const Group<L>& g, const float (&datt)[CPL]) {
  constexpr int G = kRowThreads / L;
  extern __shared__ float shared[];  // [G][C], C <= L * CPL
  const int64_t H = b.fwd.heads, C = b.fwd.channels;
  const int q = threadIdx.x / L;
#pragma unroll
  for (int t = 0; t < CPL; ++t) {
    const int64_t c = int64_t(g.sub) * CPL + t;
    if (c < C) shared[q * C + c] = datt[t];
  }
  __syncthreads();
  const int64_t first_group = int64_t(blockIdx.x) * G;
  float* row = static_cast<float*>(b.grad_att_partial) + int64_t(blockIdx.x) * H * C;
  for (int64_t x = threadIdx.x; x < H * C; x += kRowThreads) {
    const int64_t h = x / C, c = x % C;
    float sum = 0.0f;
    for (int w = static_cast<int>((h - first_group % H + H) % H); w < G; w += static_cast<int>(H))
      sum += shared[w * C + c];
    row[x] = sum;
  }
}

// Blocks of kRowThreads per SM that pass A's registers are bounded for (__launch_bounds__).
// Most kinds keep the 80 registers of 6 blocks (3 of kThreads: latency-bound kernels, more
// resident warps). The dot kind with separate float32 key and value rows (TransformerConv)
// holds a key and a value row per slot in flight and the online sums: at 80 registers it
// spilled 124 / 192 bytes, ~40 local accesses in the slot loop. Measured on an H100 (bench/
// NOTES.md v28, pass A of powerlaw-1M-16M): 6 blocks 7.44 ms, 5 blocks (96 registers, 16 / 20
// bytes spilled) 7.23, 4 blocks (110 registers, no spill) 8.17: occupancy counts for more than
// the spills, and 5 is the best of the three. 16-bit rows keep 6: at 5 their pass A was 5%
// slower on the same graph (bf16 5.96 -> 6.23 ms, fp16 6.01 -> 6.31, NOTES v29). CPL 8 keeps 4
// blocks.
template <ScoreKind K, typename scalar_t, int CPL, bool kKeyIsValue>
constexpr int kPassAMinBlocks =
    CPL >= 8 ? row_blocks(2)
    : K == ScoreKind::kDot && !kKeyIsValue && std::is_same_v<scalar_t, float> ? 5
                                                                             : row_blocks(3);

// kOnline (GATv2 and dot): b.delta_in_pass_a. A template parameter, so that the default kernel
// carries none of that mode's registers. kKeyIsValue: key_is_value(p) (dispatch_kind_kv).
template <ScoreKind K, typename scalar_t, typename index_t, int L, int CPL, bool kKeyIsValue, bool kOnline>
__global__ void __launch_bounds__(kRowThreads, (kPassAMinBlocks<K, scalar_t, CPL, kKeyIsValue>)) pass_a_kernel(AttentionBackwardParams b, Partials part) {
  const AttentionParams& p = b.fwd;
  const Group<L> g;
  const int64_t group = (blockIdx.x * int64_t(blockDim.x) + threadIdx.x) / L;
  const int64_t task = group / p.heads, h = group % p.heads;
  float datt[CPL];
#pragma unroll
  for (int t = 0; t < CPL; ++t) datt[t] = 0.0f;
  // The task's work; true when its datt is row i's share of d att (a light row).
  auto run = [&]() -> bool {
  if (task >= p.num_dst + p.split.num_items) return false;
  int64_t i, begin, end;
  if (!task_range<index_t>(p.rowptr, p.split, task, i, begin, end)) return false;
  const auto* col = static_cast<const index_t*>(p.col);
  const int64_t H = p.heads, C = p.channels;
  const float slope = static_cast<float>(p.negative_slope), scale = static_cast<float>(p.scale);
  DstSide<scalar_t, CPL> d;
  d.load(p, i, h, g.sub, p.vector_io);
  float gi[CPL];
  load_row<scalar_t, L, CPL>(b.grad_out, (i * H + h) * C, g, C, p.vector_io, gi);
  const float* st = static_cast<const float*>(p.stats) + (i * H + h) * 2;
  // online (delta_in_pass_a, GATv2 and dot): D_i is not known yet. The row's sums are then kept
  // as A = sum p (r g - shift) f and B = sum p f for each f (GATv2: d query's att * lrelu'(z),
  // d att's lrelu(z); dot: d query's scale * key), next to sum p (r g - shift) and sum p, with the shift moved after every step
  // to the running estimate of D_i (sums rebased: A -= moved B); at the end D_i = shift + that,
  // and each result is A - (D_i - shift) B.
  constexpr bool online = (K == ScoreKind::kGatV2 || K == ScoreKind::kDot) && kOnline;
  const float m = st[0], s = st[1];
  const float delta = online ? 0.0f : static_cast<const float*>(b.delta)[i * H + h];
  float g_score = 0.0f, dq[CPL], bq[CPL], batt[CPL];
  float shift = 0.0f, wsum = 0.0f, rel = 0.0f;  // online: shift, sum p, sum p (r g - shift)
  bool first = true;
#pragma unroll
  for (int t = 0; t < CPL; ++t) dq[t] = bq[t] = batt[t] = 0.0f;
  constexpr int U = kSlotsInFlight<K, CPL>;
  using Batch = SlotBatch<index_t, L, U>;
  // Slots u0 .. u0 + n - 1 of the batch at base: loads first, then the arithmetic.
  auto step = [&](const Batch& batch, int64_t base, int u0, int n) {
    float kk[U][CPL], v[U][CPL];
    if constexpr (sizeof(scalar_t) == 2) {  // every gather before the first conversion
      int64_t j[U];
#pragma unroll
      for (int u = 0; u < U; ++u) j[u] = batch.get(g, u0, u);
      load_slots<K, scalar_t, L, CPL, kKeyIsValue, U>(p, g, j, base + u0, n, h, kk, v);
    } else {  // float32: this order keeps ptxas' allocation (8-16 fewer bytes of stack)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t k = base + u0 + (u < n ? u : 0), j = batch.get(g, u0, u);
        load_key<K, scalar_t, L, CPL>(p, g, j, k, h, kk[u]);
        if (!kKeyIsValue) {
          load_value<scalar_t, L, CPL>(p, g, j, k, h, v[u]);
        } else {
#pragma unroll
          for (int t = 0; t < CPL; ++t) v[u][t] = kk[u][t];
        }
      }
    }
    if constexpr (online) {  // no per-slot outputs here
      // r g of the step's slots first: their plain mean is the row's first shift, so that the
      // first step's terms p (r g - shift) are not measured from one outlying slot.
      float rgs[U], first_mean = 0.0f;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        float r;
        rgs[u] = u < n ? slot_rg<scalar_t, L, CPL>(p, g, gi, v[u], base + u0 + u, h, r) : 0.0f;
        first_mean += rgs[u];
      }
      if (first) shift = first_mean / n, first = false;
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u >= n) continue;  // uniform across the group
        float z[CPL];
        const float prob = slot_prob<K, scalar_t, L, CPL>(p, g, d, m, s, kk[u], z);
        const float x = prob * (rgs[u] - shift);
        wsum += prob;
        rel += x;
#pragma unroll
        for (int t = 0; t < CPL; ++t) {
          if constexpr (K == ScoreKind::kGatV2) {
            const float f = d.att[t] * (z[t] > 0.0f ? 1.0f : slope), lz = leaky(z[t], slope);
            dq[t] += x * f;
            bq[t] += prob * f;
            datt[t] += x * lz;
            batt[t] += prob * lz;
          } else {  // dot: z is the slot's key
            dq[t] += x * (scale * z[t]);
            bq[t] += prob * (scale * z[t]);
          }
        }
      }
      if (wsum > 0.0f) {
        // Then the shift moves to the running estimate of D_i (the p-weighted mean r g so far),
        // the sums rebased with it: the terms stay about as small as the r g - D_i of the path
        // that forms D_i from out. A shift fixed at the first slot's r g lost up to 3x more to
        // rounding (ef568ef, NOTES v8).
        const float moved = (shift + rel / wsum) - shift;  // the move as rounded
        shift += moved;
        rel -= moved * wsum;
#pragma unroll
        for (int t = 0; t < CPL; ++t) dq[t] -= moved * bq[t], datt[t] -= moved * batt[t];
      }
    } else {
#pragma unroll
      for (int u = 0; u < U; ++u) {
        if (u >= n) continue;  // uniform across the group
        const int64_t k = base + u0 + u;
        float z[CPL], prob_r;
        const float de = slot_grad<K, scalar_t, L, CPL>(p, g, d, gi, m, s, delta, kk[u], v[u], k, h, z, prob_r);
        if (b.grad_edge_value) {
          float ev[CPL];
#pragma unroll
          for (int t = 0; t < CPL; ++t) ev[t] = prob_r * gi[t];
          store_row<scalar_t, L, CPL>(b.grad_edge_value, (k * H + h) * C, g, C, p.vector_io, ev);
        }
        if constexpr (K == ScoreKind::kGat) {
          const float gz = de * (z[0] > 0.0f ? 1.0f : slope);
          g_score += gz;
          if (b.grad_edge_score && g.sub == 0)
            static_cast<scalar_t*>(b.grad_edge_score)[k * H + h] = from_acc<scalar_t>(gz);
          continue;
        }
        float dk[CPL];  // d (edge) key of this slot
#pragma unroll
        for (int t = 0; t < CPL; ++t) {
          if constexpr (K == ScoreKind::kGatV2) {
            dk[t] = de * d.att[t] * (z[t] > 0.0f ? 1.0f : slope);
            dq[t] += dk[t];
            datt[t] += de * leaky(z[t], slope);
          } else {
            dk[t] = de * scale * d.q[t];
            dq[t] += de * scale * z[t];
          }
        }
        store_row<scalar_t, L, CPL>(b.grad_edge_key, (k * H + h) * C, g, C, p.vector_io, dk);
      }
    }
  };
  for (int64_t base = begin; base < end; base += Batch::kSize) {
    Batch batch;
    batch.load(col, base, begin, end, g.sub);
    const int count = end - base < Batch::kSize ? static_cast<int>(end - base) : Batch::kSize;
    if constexpr (Batch::kPerLane > 1) {
      step(batch, base, 0, count);
    } else {
#pragma unroll 1
      for (int u0 = 0; u0 < count; u0 += U) step(batch, base, u0, count - u0 < U ? count - u0 : U);
    }
  }
  if (task < p.split.num_items) {
    float* slot = part.base + (task * H + h) * part.stride;
    if (online) {  // OnlineSlot: merge_online_kernel corrects the sums once it has the row's D_i
      using S = OnlineSlot;
      if (g.sub == 0) slot[S::kShift] = shift, slot[S::kWeight] = wsum, slot[S::kDelta] = rel;
      store_acc_row(slot + S::kVectors, g, C, dq);
      store_acc_row(slot + S::kVectors + C, g, C, bq);
      store_acc_row(slot + S::kVectors + 2 * C, g, C, datt);
      store_acc_row(slot + S::kVectors + 3 * C, g, C, batt);
      return false;
    }
    if (g.sub == 0) slot[0] = g_score;
    store_acc_row(slot + 1, g, C, dq);
    store_acc_row(slot + 1 + C, g, C, datt);
    return false;  // the merge kernel adds the items
  }
  if (online) {
    // D_i - shift = sum p (r g - shift) + shift (sum p - 1), without forming D_i first.
    const float d_rel = rel + shift * (wsum - 1.0f);
#pragma unroll
    for (int t = 0; t < CPL; ++t) dq[t] -= d_rel * bq[t], datt[t] -= d_rel * batt[t];
    if (g.sub == 0) static_cast<float*>(b.delta)[i * H + h] = shift + d_rel;
  }
  if (b.grad_dst_score && g.sub == 0)
    static_cast<scalar_t*>(b.grad_dst_score)[i * H + h] = from_acc<scalar_t>(g_score);
  store_row<scalar_t, L, CPL>(b.grad_query, (i * H + h) * C, g, C, p.vector_io, dq);
  if (b.grad_att_partial && b.att_blocks == 0)
    store_acc_row(static_cast<float*>(b.grad_att_partial) + (i * H + h) * C, g, C, datt);
  return true;
  };
  if (!run()) {  // nothing of row i's share here (an item's went to its partials)
#pragma unroll
    for (int t = 0; t < CPL; ++t) datt[t] = 0.0f;
  }
  if (b.att_blocks > 0) att_block_sum<L, CPL>(b, g, datt);
}

// GAT's destination side from pass B's per-slot d scores: one thread per (task, head) of the
// csr_by_dst split adds its slots in slot order (pass A's order), a light row into
// grad_dst_score and a heavy row's item into its partial for merge_kernel, and copies them to
// grad_edge_score when that is not slot_grad itself.
template <typename scalar_t, typename index_t>
__global__ void slot_sum_kernel(AttentionBackwardParams b, Partials part) {
  const AttentionParams& p = b.fwd;
  const int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  const int64_t H = p.heads, task = t / H, h = t % H;
  if (task >= p.num_dst + p.split.num_items) return;
  int64_t i, begin, end;
  if (!task_range<index_t>(p.rowptr, p.split, task, i, begin, end)) return;
  const float* sg = b.slot_grad;
  auto* edge_out = static_cast<scalar_t*>(b.grad_edge_score);
  const bool copy = edge_out && static_cast<const void*>(edge_out) != static_cast<const void*>(sg);
  float sum = 0.0f;
  for (int64_t k = begin; k < end; ++k) {
    const float v = sg[k * H + h];
    sum += v;
    if (copy) edge_out[k * H + h] = from_acc<scalar_t>(v);
  }
  if (task < p.split.num_items)
    part.base[(task * H + h) * part.stride] = sum;
  else if (b.grad_dst_score)
    static_cast<scalar_t*>(b.grad_dst_score)[i * H + h] = from_acc<scalar_t>(sum);
}

// Pass A's grid: one lane group per (task, head).
int64_t pass_a_blocks(const AttentionParams& p, int lanes) {
  return blocks_for((p.num_dst + p.split.num_items) * p.heads * lanes, kRowThreads);
}

}  // namespace

int64_t attention_backward_cuda_att_blocks(const AttentionBackwardParams& b) {
  const AttentionParams& p = b.fwd;
  // Policy: per-destination shares unless GNNIO_ATT_BLOCKS=1 (or 2: the same, with pass A's
  // shared-memory carveout set to the least). The block sums save N x H x C floats (0.41 GiB
  // on powerlaw-1M-16M at 4 x 32) but made pass A 30% slower there (7.8 -> 10.1 ms, commit
  // 1a98f6b, bench/ab_attention_backward.py): each block waits at the barrier for its longest
  // row. A memory saver to opt into, not the default.
  const char* knob = std::getenv("GNNIO_ATT_BLOCKS");
  if (!knob || (knob[0] != '1' && knob[0] != '2')) return 0;
  if (p.kind != ScoreKind::kGatV2 || p.num_dst == 0 || p.heads == 0 || p.channels == 0 ||
      p.scalar_type == ScalarType::kFloat64 || p.channels > kMaxCudaChannels)
    return 0;
  int64_t blocks = 0;
  dispatch_attention(p, [&](auto, auto, auto l, auto) {
    constexpr int L = decltype(l)::value;
    // Per-block sums pay off when a block holds several rows of each head: with G groups
    // and H heads a block's H x C sums replace G x C per-row ones.
    if (kRowThreads / L >= 4 * p.heads) blocks = pass_a_blocks(p, L);
  });
  return blocks;
}

namespace {
// The slot path computes GAT's outputs only: with any other gradient asked for (raw-op callers
// can pass query, att, ...), pass A must run.
bool slot_grads_possible(const AttentionBackwardParams& b) {
  return b.fwd.kind == ScoreKind::kGat && !b.grad_edge_value && !b.grad_query && !b.grad_edge_key &&
         !b.grad_att_partial && (b.grad_dst_score || b.grad_edge_score);
}
}  // namespace

bool attention_backward_cuda_gat_slot_grads(const AttentionBackwardParams& b) {
  // Policy: for GAT, pass A's only work is d dst_score (and d edge_score), scalars per slot that
  // pass B computes anyway: writing them (nnz x H floats, 0.27 GB on powerlaw-1M-16M at 4
  // heads) and summing them per destination replaces pass A's second gather of a value row per
  // edge (pass A was 6.8 of GATConv's 26.8 ms there). GNNIO_GAT_SLOT_GRADS=0 keeps pass A (A/B).
  if (!slot_grads_possible(b)) return false;
  const char* knob = std::getenv("GNNIO_GAT_SLOT_GRADS");
  return !(knob && knob[0] == '0');
}

namespace {
// slot_grad aliases grad_edge_score when that is float32 (the same values, already in place).
bool slot_grad_is_edge_grad(const AttentionBackwardParams& b) {
  return b.grad_edge_score && b.fwd.scalar_type == ScalarType::kFloat32;
}
}  // namespace

namespace {
// Floats per (work item, head) of pass A's partials: OnlineSlot's when it forms D_i itself.
int64_t pass_a_stride(const AttentionBackwardParams& b) {
  return b.delta_in_pass_a ? OnlineSlot::stride(b.fwd.channels) : 1 + 2 * b.fwd.channels;
}
}  // namespace

bool attention_backward_cuda_delta_in_pass_a(ScoreKind kind, bool grad_query, bool grad_att,
                                             bool grad_edge_key, bool grad_edge_value) {
  // Policy: GATv2's pass A walks every destination row before pass B anyway, so it forms D_i
  // (sum over the row of p r g) on the way instead of delta_kernel reading out: the forward then
  // does not keep out, one N x H x C buffer less from the forward to the backward of every
  // layer (in a stack, every layer's out is alive until the backward reaches it: the 3-layer
  // GATv2 training step on powerlaw-1M-8M went from 9.60 to 7.93 GiB, e11cc4e), for 73.7
  // against 72.0 ms a step (74339e1: the rebased shift's extra work). Its sums are relative to
  // a shift that follows the running estimate of D_i, so they round about as the r g - D_i of
  // the path from out do (NOTES v10; a shift fixed at the first slot's r g lost up to 3x more,
  // which kept this mode opt-in until then). GNNIO_GATV2_DELTA_IN_PASS_A=0 keeps out and forms
  // D_i from it. Never when a per-slot gradient (d edge_key, d edge_value) is asked for: that
  // needs D_i at each slot. The dot kind (TransformerConv) the same way since v12: its out is
  // the buffer that kept the layer's extra memory above PyG's / 15 (3.51 against 3.21 GiB on
  // powerlaw-1M-16M, NOTES v12); GNNIO_DOT_DELTA_IN_PASS_A=0 keeps it.
  const bool gatv2 = kind == ScoreKind::kGatV2, dot = kind == ScoreKind::kDot;
  if (!(gatv2 || dot) || !(grad_query || grad_att) || grad_edge_key || grad_edge_value)
    return false;
  const char* knob = std::getenv(gatv2 ? "GNNIO_GATV2_DELTA_IN_PASS_A" : "GNNIO_DOT_DELTA_IN_PASS_A");
  return !(knob && knob[0] == '0');
}

namespace {
// Byte offsets in the workspace: pass A's partials from 0, pass B's after them, then GAT's
// slot_grad (when it is not grad_edge_score), all floats; then the item_offsets tables of
// split (csr_by_dst) and split_t (csr_by_src), each at a 256-byte boundary when the split has
// heavy rows (reserved whether or not this call's merges read them: a few KB).
struct BackwardLayout {
  size_t offsets = 0;    // split's table
  size_t offsets_t = 0;  // split_t's table
  size_t bytes = 0;      // the whole workspace
};

BackwardLayout backward_layout(const AttentionBackwardParams& b) {
  const int64_t H = b.fwd.heads;
  int64_t floats = b.fwd.split.num_items * H * pass_a_stride(b) +
                   b.split_t.num_items * H * (1 + 2 * b.fwd.channels);
  if (b.gat_slot_grads && !slot_grad_is_edge_grad(b))
    floats += b.fwd.nnz * b.fwd.heads;
  BackwardLayout layout;
  layout.bytes = static_cast<size_t>(floats) * sizeof(float);
  auto add_table = [&](const RowSplit& split, size_t& at) {
    if (item_offsets_bytes(split) == 0) return;
    at = workspace_align(layout.bytes);
    layout.bytes = at + item_offsets_bytes(split);
  };
  add_table(b.fwd.split, layout.offsets);
  add_table(b.split_t, layout.offsets_t);
  return layout;
}
}  // namespace

size_t attention_backward_cuda_workspace_bytes(const AttentionBackwardParams& b) {
  return backward_layout(b).bytes;
}

void attention_delta_cuda(const AttentionBackwardParams& b, void* stream) {
  const AttentionParams& p = b.fwd;
  GNNIO_CHECK(p.scalar_type != ScalarType::kFloat64 && p.channels <= kMaxCudaChannels,
              ErrorKind::kInvalidArgument,
              "graph_attention delta on CUDA: float32/float16/bfloat16 and <= 256 channels");
  auto s = static_cast<cudaStream_t>(stream);
  if (p.num_dst * p.heads == 0) return;
  if (p.channels == 0) {
    GNNIO_CUDA_CHECK(cudaMemsetAsync(b.delta, 0, p.num_dst * p.heads * sizeof(float), s));
    return;
  }
  dispatch_attention(p, [&](auto scalar, auto /*index: unused*/, auto l, auto cpl) {
    constexpr int L = decltype(l)::value, CPL = decltype(cpl)::value;
    delta_kernel<decltype(scalar), L, CPL><<<blocks_for(p.num_dst * p.heads * L), kThreads, 0, s>>>(b);
  });
  GNNIO_CUDA_CHECK(cudaGetLastError());
}

void attention_backward_cuda(const AttentionBackwardParams& b, void* workspace, void* stream) {
  const AttentionParams& p = b.fwd;
  GNNIO_CHECK(p.scalar_type != ScalarType::kFloat64 && p.channels <= kMaxCudaChannels,
              ErrorKind::kInvalidArgument,
              "graph_attention backward on CUDA: float32/float16/bfloat16 and <= 256 channels");
  GNNIO_CHECK(!p.shared_kv, ErrorKind::kInvalidArgument,
              "graph_attention backward on CUDA reads key and value rows per head (shared rows are "
              "copied per head first)");
  if (p.heads == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  const int64_t stride = 1 + 2 * p.channels;
  const Partials part_a{static_cast<float*>(workspace), pass_a_stride(b)};
  const Partials part_b{part_a.base + p.split.num_items * p.heads * part_a.stride, stride};
  const bool need_a = b.grad_dst_score || b.grad_edge_score || b.grad_query || b.grad_edge_key ||
                      b.grad_att_partial || b.grad_edge_value;
  const bool online = b.delta_in_pass_a;
  GNNIO_CHECK(!online || ((p.kind == ScoreKind::kGatV2 || p.kind == ScoreKind::kDot) &&
                          need_a && !b.delta_ready && !b.grad_edge_key && !b.grad_edge_value &&
                          b.delta),
              ErrorKind::kInvalidArgument,
              "graph_attention backward: delta_in_pass_a needs GATv2 or dot with d query or d att, "
              "no per-slot gradient and a delta buffer");
  GNNIO_CHECK(!b.key_grad_into_value || (p.key == p.value && b.grad_value && !b.grad_key),
              ErrorKind::kInvalidArgument,
              "graph_attention backward: key_grad_into_value needs key == value and grad_value only");
  GNNIO_CHECK(!b.gat_slot_grads || slot_grads_possible(b), ErrorKind::kInvalidArgument,
              "graph_attention backward: gat_slot_grads set for a call that cannot use it");
  const bool by_slots = b.gat_slot_grads;
  const bool need_b = b.grad_src_score || b.grad_key || b.grad_value || by_slots;
  // The merges' item tables, filled only for the splits whose merge runs below.
  const BackwardLayout layout = backward_layout(b);
  RowSplit split = p.split, split_t = b.split_t;
  if ((need_a || by_slots) && p.num_dst > 0)
    fill_item_offsets(split, static_cast<char*>(workspace) + layout.offsets, s);
  if (need_b && p.num_src > 0)
    fill_item_offsets(split_t, static_cast<char*>(workspace) + layout.offsets_t, s);
  dispatch_attention(p, [&](auto scalar, auto index, auto l, auto cpl) {
    using scalar_t = decltype(scalar);
    using index_t = decltype(index);
    constexpr int L = decltype(l)::value, CPL = decltype(cpl)::value;
    const int64_t H = p.heads;
    AttentionBackwardParams q = b;
    set_dropout_test(q.fwd);
    if (by_slots)
      q.slot_grad = slot_grad_is_edge_grad(b) ? static_cast<float*>(b.grad_edge_score)
                                              : part_b.base + b.split_t.num_items * H * stride;
    const size_t smem = (kMergeThreads / L) * stride * sizeof(float);
    const size_t smem_online = (kMergeThreads / L) * (p.channels > 0 ? 2 * p.channels : 2) * sizeof(float);
    q.fwd.vector_io = rows_aligned(p, CPL, {b.grad_out, b.grad_query, b.grad_key, b.grad_value,
                                            b.grad_edge_key, b.grad_edge_value});
    if (p.num_dst > 0 && !b.delta_ready && !online) {
      delta_kernel<scalar_t, L, CPL><<<blocks_for(p.num_dst * H * L), kThreads, 0, s>>>(q);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
    if (need_a && p.num_dst > 0 && !by_slots) {
      GNNIO_CHECK(b.att_blocks == 0 || (b.grad_att_partial && b.att_blocks == pass_a_blocks(p, L)),
                  ErrorKind::kInvalidArgument,
                  "graph_attention backward: att_blocks must be attention_backward_cuda_att_blocks(b)");
      auto launch = [&](auto* kernel) {
        if (b.att_blocks > 0) {  // a measurement knob (see attention_backward_cuda_att_blocks)
          const char* knob = std::getenv("GNNIO_ATT_BLOCKS");
          GNNIO_CUDA_CHECK(cudaFuncSetAttribute(
              kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
              knob && knob[0] == '2' ? int(cudaSharedmemCarveoutMaxL1) : int(cudaSharedmemCarveoutDefault)));
        }
        kernel<<<pass_a_blocks(p, L), kRowThreads, b.att_blocks > 0 ? kRowThreads * CPL * sizeof(float) : 0, s>>>(q, part_a);
      };
      dispatch_kind_kv(p, [&](auto kind, auto key_is_value) {
        constexpr ScoreKind KK = decltype(kind)::value;
        constexpr bool KV = decltype(key_is_value)::value;
        if constexpr (KK == ScoreKind::kGatV2 || KK == ScoreKind::kDot) {
          if (online) {
            launch(pass_a_kernel<KK, scalar_t, index_t, L, CPL, KV, true>);
            return;
          }
        }
        launch(pass_a_kernel<KK, scalar_t, index_t, L, CPL, KV, false>);
      });
      const unsigned heavy_blocks = static_cast<unsigned>(p.split.num_heavy * H);
      if (p.split.num_heavy > 0 && online)
        merge_online_kernel<scalar_t, L, CPL><<<heavy_blocks, kMergeThreads, smem_online, s>>>(
            split, part_a, H, p.channels, q.fwd.vector_io, b.grad_query,
            static_cast<float*>(b.grad_att_partial), b.att_blocks > 0 ? b.att_blocks : -1,
            static_cast<float*>(b.delta));
      else if (p.split.num_heavy > 0)
        merge_kernel<scalar_t, L, CPL><<<heavy_blocks, kMergeThreads, smem, s>>>(
            split, part_a, H, p.channels, q.fwd.vector_io, b.grad_dst_score, b.grad_query, b.grad_att_partial, true,
            b.att_blocks > 0 ? b.att_blocks : -1);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
    if (need_b && p.num_src > 0) attention_pass_b_cuda(q, split_t, part_b, s);
    if (by_slots && p.num_dst > 0) {
      slot_sum_kernel<scalar_t, index_t><<<blocks_for((p.num_dst + p.split.num_items) * H), kThreads, 0, s>>>(q, part_a);
      if (p.split.num_heavy > 0)  // the same merge as pass A's, with only the scalar output
        merge_kernel<scalar_t, L, CPL><<<static_cast<unsigned>(p.split.num_heavy * H), kMergeThreads, smem, s>>>(
            split, part_a, H, p.channels, q.fwd.vector_io, b.grad_dst_score, nullptr, nullptr, true, -1);
      GNNIO_CUDA_CHECK(cudaGetLastError());
    }
  });
}

}  // namespace gnnio
