// CPU attention kernels: the reference implementation of params.h's contract, and the one CI
// tests. Same algorithm as the CUDA kernels (one streaming pass per (destination, head) with an
// online softmax; the backward pass as two gathers, over csr_by_dst then csr_by_src), but every
// sum is accumulated in double, so the result carries no error beyond the inputs' and outputs'.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "gnnio/attention/dropout.h"
#include "gnnio/attention/params.h"
#include "gnnio/common/cpu_dispatch.h"

namespace gnnio {
namespace {

constexpr double kSoftmaxEps = 1e-16;  // PyG's softmax denominator guard

// Branch-free (a table indexed by the comparison): the sign of z is data, about half of a row's
// channels each way, so a branch on it was mispredicted at every other channel, most of the CPU
// GATv2's time. The same values as v > 0 ? v : v * slope, NaN and -0 included.
inline double leaky_grad(double v, double slope) {
  const double grad[2] = {slope, 1.0};
  return grad[v > 0];
}
inline double leaky(double v, double slope) { return v * leaky_grad(v, slope); }

// sum over c < C of term(c), in double, as four interleaved partial sums added in a fixed order
// at the end: the same value every run, and four independent add chains where one chain's add
// latency was most of the CPU attention's time (GATv2 on Cora: the score and value dots).
template <typename Term>
inline double channel_sum(int64_t C, Term&& term) {
  double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  int64_t c = 0;
  for (; c + 4 <= C; c += 4) {
    s0 += term(c);
    s1 += term(c + 1);
    s2 += term(c + 2);
    s3 += term(c + 3);
  }
  for (; c < C; ++c) s0 += term(c);
  return (s0 + s1) + (s2 + s3);
}

template <ScoreKind K>
using Kind = std::integral_constant<ScoreKind, K>;

// Calls fn(Kind<kind>{}): the score is a compile-time choice, so the per-slot loops carry no
// switch and the unused operands' loads compile away.
template <typename Fn>
void dispatch_kind(ScoreKind kind, Fn&& fn) {
  switch (kind) {
    case ScoreKind::kGat: return fn(Kind<ScoreKind::kGat>{});
    case ScoreKind::kGatV2: return fn(Kind<ScoreKind::kGatV2>{});
    case ScoreKind::kDot: return fn(Kind<ScoreKind::kDot>{});
  }
  detail::fail(ErrorKind::kInvalidArgument, "attention: unknown score kind ", static_cast<int>(kind));
}

const char* kind_name(ScoreKind kind) {
  switch (kind) {
    case ScoreKind::kGat: return "gat";
    case ScoreKind::kGatV2: return "gatv2";
    case ScoreKind::kDot: return "dot";
  }
  return "?";
}

// The forward's operands, typed. Optional operands are nullptr and read as 0, which is also what
// makes the gradient of an absent operand well defined (the gradient at zero).
template <typename T>
struct Operands {
  int64_t H, C;
  const T* src_score;
  const T* dst_score;
  const T* edge_score;
  const T* query;
  const T* key;
  const T* edge_key;
  const T* att;
  const T* value;
  const T* edge_value;
  double slope, scale;
  double dropout, keep_scale;  // keep_scale = 1 / (1 - dropout)
  uint64_t seed;
  bool shared_kv;        // key and value rows [num_src, 1, C] (params.h)
  std::vector<T> zeros;  // [C]: the row of an absent operand, read as 0 without a test per channel

  // Row (r, h) of a [rows, H, C] operand, or nullptr for an absent one.
  const T* vec(const T* base, int64_t r, int64_t h) const {
    return base ? base + (r * H + h) * C : nullptr;
  }
  // Source j's key or value row for head h: its own row, or (shared_kv) the one every head reads.
  const T* kv(const T* base, int64_t j, int64_t h) const {
    return shared_kv ? base + j * C : vec(base, j, h);
  }
  // The same, with zeros for an absent one.
  const T* row(const T* base, int64_t r, int64_t h) const {
    return base ? base + (r * H + h) * C : zeros.data();
  }

  // GAT's pre-activation: src_score_j + dst_score_i + edge_score_k.
  double gat_z(int64_t i, int64_t j, int64_t k, int64_t h) const {
    return double(src_score[j * H + h]) + (dst_score ? double(dst_score[i * H + h]) : 0.0) +
           (edge_score ? double(edge_score[k * H + h]) : 0.0);
  }

  // e_k of destination i, source j, slot k, head h, rounded to the input precision as PyG and
  // the CUDA kernel have it. The max is then an exact score, stored exactly in the stats, so the
  // backward's exp(e - m) is exactly the forward's (a one-edge row gets weight 1.0 in both passes,
  // as in PyG, instead of 1 +- an ulp of the stats' rounding).
  template <ScoreKind K>
  double score(int64_t i, int64_t j, int64_t k, int64_t h) const {
    return static_cast<double>(static_cast<T>(unrounded_score<K>(i, j, k, h)));
  }

  template <ScoreKind K>
  double unrounded_score(int64_t i, int64_t j, int64_t k, int64_t h) const {
    if constexpr (K == ScoreKind::kGat) {
      return leaky(gat_z(i, j, k, h), slope);
    } else {
      const T* q = vec(query, i, h);
      const T* kj = kv(key, j, h);
      const T* ek = row(edge_key, k, h);
      if constexpr (K == ScoreKind::kGatV2) {
        const T* a = att + h * C;
        return channel_sum(C, [&](int64_t c) {
          return double(a[c]) * leaky(double(q[c]) + double(kj[c]) + double(ek[c]), slope);
        });
      } else {
        return scale * channel_sum(C, [&](int64_t c) {
          return double(q[c]) * (double(kj[c]) + double(ek[c]));
        });
      }
    }
  }

  // r_k = keep_k / (1 - dropout): 0 for a dropped weight, 1 without dropout. The mask is a pure
  // function of (seed, slot, head), so the backward passes redraw exactly the forward's mask.
  double keep(int64_t k, int64_t h) const {
    if (dropout <= 0) return 1.0;
    return dropout_keep(seed, k, h, H, dropout) ? keep_scale : 0.0;
  }
};

template <typename T>
Operands<T> operands(const AttentionParams& p) {
  auto cast = [](const void* v) { return static_cast<const T*>(v); };
  return {p.heads,          p.channels,          cast(p.src_score), cast(p.dst_score),
          cast(p.edge_score), cast(p.query),     cast(p.key),       cast(p.edge_key),
          cast(p.att),      cast(p.value),       cast(p.edge_value), p.negative_slope,
          p.scale,          p.dropout,           1.0 / (1.0 - p.dropout), p.seed,
          p.shared_kv,      std::vector<T>(std::max<int64_t>(p.channels, 0))};
}

// Pointers are checked only where the kernel will read or write through them: the binding
// passes an empty tensor's data pointer, which may be nullptr, for a zero-sized operand.
void check_forward(const AttentionParams& p) {
  const char* kind = kind_name(p.kind);
  GNNIO_CHECK(p.num_dst >= 0 && p.num_src >= 0 && p.nnz >= 0 && p.heads >= 0 && p.channels >= 0,
              ErrorKind::kInvalidArgument, "attention: negative size");
  GNNIO_CHECK(p.dropout >= 0.0 && p.dropout < 1.0, ErrorKind::kInvalidArgument,
              "attention: dropout must be in [0, 1), got ", p.dropout);
  GNNIO_CHECK(p.rowptr, ErrorKind::kInvalidArgument, "attention: rowptr is required");
  const bool rows = p.num_dst * p.heads > 0, edges = p.nnz > 0 && p.heads > 0;
  GNNIO_CHECK(p.stats || !rows, ErrorKind::kInvalidArgument, "attention: stats is required");
  GNNIO_CHECK(p.out || !rows || p.channels == 0, ErrorKind::kInvalidArgument,
              "attention: out is required");
  GNNIO_CHECK(p.col || !edges, ErrorKind::kInvalidArgument, "attention: col is required");
  GNNIO_CHECK(p.value || !edges || p.channels == 0, ErrorKind::kInvalidArgument,
              "attention: value is required");
  if (p.kind == ScoreKind::kGat) {
    GNNIO_CHECK(p.src_score || !edges, ErrorKind::kInvalidArgument,
                "attention(gat) needs src_score");
    GNNIO_CHECK(!p.query && !p.key && !p.edge_key && !p.att, ErrorKind::kInvalidArgument,
                "attention(gat) takes src/dst/edge scores, not query/key/edge_key/att");
    GNNIO_CHECK(!p.score_att, ErrorKind::kInvalidArgument,
                "attention(gat) on the CPU takes the scores (score_att is the CUDA forward's)");
  } else {
    GNNIO_CHECK((p.query && p.key && (p.kind == ScoreKind::kDot || p.att)) || !edges ||
                    p.channels == 0,
                ErrorKind::kInvalidArgument, "attention(", kind, ") needs query and key",
                p.kind == ScoreKind::kGatV2 ? " and att" : "");
    GNNIO_CHECK(!p.src_score && !p.dst_score && !p.edge_score, ErrorKind::kInvalidArgument,
                "attention(", kind, ") takes query/key, not src/dst/edge scores");
  }
  GNNIO_CHECK(!p.shared_kv || p.kind == ScoreKind::kDot, ErrorKind::kInvalidArgument,
              "attention(", kind, "): shared key and value rows (shared_kv) are for kind dot");
}

template <ScoreKind K, typename T, typename index_t>
void forward(const AttentionParams& p) {
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const Operands<T> in = operands<T>(p);
  using acc_t = T;  // stats / weights: float32 for float32, float64 for float64
  auto* out = static_cast<T*>(p.out);
  const auto* bias = static_cast<const T*>(p.bias);
  auto* stats = static_cast<acc_t*>(p.stats);
  auto* weights = static_cast<acc_t*>(p.weights);
  const int64_t H = p.heads, C = p.channels;
  const int64_t nnz = p.num_dst > 0 ? int64_t(rowptr[p.num_dst]) : 0;

#pragma omp parallel for schedule(dynamic, 16) if (worth_threads(nnz * H * C))
  for (int64_t i = 0; i < p.num_dst; ++i) {
    std::vector<double> acc(C);
    const int64_t begin = rowptr[i], end = rowptr[i + 1];
    for (int64_t h = 0; h < H; ++h) {
      double m = -std::numeric_limits<double>::infinity();
      double s = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t k = begin; k < end; ++k) {
        const int64_t j = col[k];
        const double e = in.template score<K>(i, j, k, h);
        if (e > m) {  // new running max: rescale what was summed so far (exp(-inf) = 0 at first)
          const double rescale = std::exp(m - e);
          s *= rescale;
          for (auto& a : acc) a *= rescale;
          m = e;
        }
        const double w = std::exp(e - m);
        s += w;  // a dropped weight still counts in the softmax's sum: dropout acts after it
        const double r = in.keep(k, h);
        if (r == 0) continue;
        const double wr = w * r;
        const T* vj = in.kv(in.value, j, h);
        const T* ev = in.row(in.edge_value, k, h);
        for (int64_t c = 0; c < C; ++c) acc[c] += wr * (double(vj[c]) + double(ev[c]));
      }
      const double denom = s + kSoftmaxEps;
      T* o = out + (i * H + h) * C;
      for (int64_t c = 0; c < C; ++c) o[c] = static_cast<T>(acc[c] / denom);
      if (bias)  // fl(fl(attention) + bias) in T, as PyG's `out + bias`
        for (int64_t c = 0; c < C; ++c) o[c] = o[c] + bias[h * C + c];
      const bool empty = begin == end;
      stats[(i * H + h) * 2] = static_cast<acc_t>(empty ? 0.0 : m);
      stats[(i * H + h) * 2 + 1] = static_cast<acc_t>(denom);
      // The weights need the row's final (m, s), so they take a second walk over the row,
      // recomputing each score: no per-row score buffer.
      if (weights)
        for (int64_t k = begin; k < end; ++k)
          weights[k * H + h] = static_cast<acc_t>(
              std::exp(in.template score<K>(i, col[k], k, h) - m) / denom * in.keep(k, h));
    }
  }
}

// What slot k (edge j -> i, head h) contributes to the backward pass. Passes A and B both get it
// from here, from the same stored stats and D_i, so they agree on every p_k and de_k.
struct SlotGrad {
  double pr;  // p~_k = p_k r_k, the weight the forward applied to v_k
  double de;  // dL/de_k = p_k (r_k dout_i . v_k - D_i)
};

template <ScoreKind K, typename T>
SlotGrad slot_grad(const Operands<T>& in, int64_t i, int64_t j, int64_t k, int64_t h,
                   const T* g_i, double m, double s, double d_i) {
  const double p = std::exp(in.template score<K>(i, j, k, h) - m) / s;
  const double r = in.keep(k, h);
  double gv = 0;
  if (r != 0) {  // a dropped weight has no value term: de_k = -p_k D_i
    const T* vj = in.kv(in.value, j, h);
    const T* ev = in.row(in.edge_value, k, h);
    gv = channel_sum(in.C,
                     [&](int64_t c) { return double(g_i[c]) * (double(vj[c]) + double(ev[c])); });
  }
  return {p * r, p * (r * gv - d_i)};
}

void check_backward(const AttentionBackwardParams& b) {
  const AttentionParams& p = b.fwd;
  check_forward(p);
  const char* kind = kind_name(p.kind);
  GNNIO_CHECK(((b.grad_out || p.channels == 0) && b.delta) || p.num_dst * p.heads == 0,
              ErrorKind::kInvalidArgument, "attention backward: grad_out and delta are required");
  // A gradient of an operand the score does not have is a caller bug, not a zero to write.
  if (p.kind == ScoreKind::kGat)
    GNNIO_CHECK(!b.grad_query && !b.grad_key && !b.grad_edge_key && !b.grad_att_partial,
                ErrorKind::kInvalidArgument,
                "attention(gat) backward: query/key/edge_key/att gradients requested");
  else
    GNNIO_CHECK(!b.grad_src_score && !b.grad_dst_score && !b.grad_edge_score,
                ErrorKind::kInvalidArgument, "attention(", kind,
                ") backward: src/dst/edge score gradients requested");
  GNNIO_CHECK(p.kind == ScoreKind::kGatV2 || !b.grad_att_partial, ErrorKind::kInvalidArgument,
              "attention(", kind, ") backward: grad_att_partial requested");
  if (b.grad_src_score || b.grad_key || b.grad_value)
    GNNIO_CHECK(b.rowptr_t && (p.nnz == 0 || (b.col_t && b.t2c)), ErrorKind::kInvalidArgument,
                "attention backward: source-side gradients need rowptr_t, col_t and t2c");
}

template <ScoreKind K, typename T, typename index_t>
void backward(const AttentionBackwardParams& b) {
  const AttentionParams& p = b.fwd;
  const auto* rowptr = static_cast<const index_t*>(p.rowptr);
  const auto* col = static_cast<const index_t*>(p.col);
  const Operands<T> in = operands<T>(p);
  using acc_t = T;
  const auto* out = static_cast<const T*>(p.out);
  const auto* stats = static_cast<const acc_t*>(p.stats);
  const auto* g = static_cast<const T*>(b.grad_out);
  auto* delta = static_cast<acc_t*>(b.delta);
  auto* d_src_score = static_cast<T*>(b.grad_src_score);
  auto* d_dst_score = static_cast<T*>(b.grad_dst_score);
  auto* d_edge_score = static_cast<T*>(b.grad_edge_score);
  auto* d_query = static_cast<T*>(b.grad_query);
  auto* d_key = static_cast<T*>(b.grad_key);
  auto* d_edge_key = static_cast<T*>(b.grad_edge_key);
  auto* d_att = static_cast<acc_t*>(b.grad_att_partial);
  auto* d_value = static_cast<T*>(b.grad_value);
  auto* d_edge_value = static_cast<T*>(b.grad_edge_value);
  const int64_t H = p.heads, C = p.channels;
  const double slope = p.negative_slope, scale = p.scale;
  const int64_t nnz = p.num_dst > 0 ? int64_t(rowptr[p.num_dst]) : 0;
  const bool threads = worth_threads(nnz * H * C);
  auto dot = [C](const T* a, const T* c) {
    return channel_sum(C, [&](int64_t x) { return double(a[x]) * double(c[x]); });
  };
  // D_i unrounded for both passes (delta, the contract's workspace, gets its rounded copy): with
  // a rounded D a one-edge row's de = p (dout . v - D) is an ulp of D instead of exactly 0.
  std::vector<double> d_exact(p.num_dst * H);
  // Pass A walks its rows' slots only when an output of pass A needs them (delta alone does not).
  const bool slots_a = d_dst_score || d_edge_score || d_query || d_edge_key || d_att || d_edge_value;

  // Pass A, per destination: D_i, then every destination-side and per-edge gradient.
#pragma omp parallel for schedule(dynamic, 16) if (threads)
  for (int64_t i = 0; i < p.num_dst; ++i) {
    std::vector<double> dq(C), da(C);
    for (int64_t h = 0; h < H; ++h) {
      const int64_t ih = i * H + h;
      const T* g_i = g + ih * C;
      d_exact[ih] = dot(g_i, out + ih * C);
      delta[ih] = static_cast<acc_t>(d_exact[ih]);
      if (!slots_a) continue;
      const double d_i = d_exact[ih];
      const double m = double(stats[ih * 2]), s = double(stats[ih * 2 + 1]);
      const T* q = in.vec(in.query, i, h);
      double dd = 0;
      std::fill(dq.begin(), dq.end(), 0.0);
      std::fill(da.begin(), da.end(), 0.0);
      for (int64_t k = rowptr[i]; k < rowptr[i + 1]; ++k) {
        const int64_t j = col[k];
        const SlotGrad sg = slot_grad<K>(in, i, j, k, h, g_i, m, s, d_i);
        if (d_edge_value) {
          T* gev = d_edge_value + (k * H + h) * C;
          for (int64_t c = 0; c < C; ++c) gev[c] = static_cast<T>(sg.pr * double(g_i[c]));
        }
        if constexpr (K == ScoreKind::kGat) {
          const double gk = sg.de * leaky_grad(in.gat_z(i, j, k, h), slope);
          dd += gk;
          if (d_edge_score) d_edge_score[k * H + h] = static_cast<T>(gk);
        } else {
          const T* kj = in.kv(in.key, j, h);
          const T* ek = in.row(in.edge_key, k, h);
          T* gek = d_edge_key ? d_edge_key + (k * H + h) * C : nullptr;
          if constexpr (K == ScoreKind::kGatV2) {
            const T* a = in.att + h * C;
            for (int64_t c = 0; c < C; ++c) {
              const double z = double(q[c]) + double(kj[c]) + double(ek[c]);
              const double dz = sg.de * double(a[c]) * leaky_grad(z, slope);
              dq[c] += dz;
              da[c] += sg.de * leaky(z, slope);
              if (gek) gek[c] = static_cast<T>(dz);
            }
          } else {
            for (int64_t c = 0; c < C; ++c) {
              dq[c] += sg.de * scale * (double(kj[c]) + double(ek[c]));
              if (gek) gek[c] = static_cast<T>(sg.de * scale * double(q[c]));
            }
          }
        }
      }
      if (d_dst_score) d_dst_score[ih] = static_cast<T>(dd);
      if (d_query)
        for (int64_t c = 0; c < C; ++c) d_query[ih * C + c] = static_cast<T>(dq[c]);
      if (d_att)
        for (int64_t c = 0; c < C; ++c) d_att[ih * C + c] = static_cast<acc_t>(da[c]);
    }
  }

  if (!d_src_score && !d_key && !d_value) return;
  GNNIO_CHECK(!b.key_grad_into_value || (p.key == p.value && d_value && !d_key),
              ErrorKind::kInvalidArgument,
              "attention backward: key_grad_into_value needs key == value and grad_value only");
  const bool key_grad = d_key || b.key_grad_into_value;
  const auto* rowptr_t = static_cast<const index_t*>(b.rowptr_t);
  const auto* col_t = static_cast<const index_t*>(b.col_t);
  const auto* t2c = static_cast<const index_t*>(b.t2c);

  // Pass B, per source: the same slots reached through the transpose. t2c gives each transposed
  // slot's csr_by_dst slot k, the index of the per-edge operands and of the dropout mask.
#pragma omp parallel for schedule(dynamic, 16) if (threads)
  for (int64_t j = 0; j < p.num_src; ++j) {
    std::vector<double> dk(C), dv(C);
    // A row of key and value per head, or (shared_kv) one row that sums every head's share.
    auto store = [&](int64_t row) {
      if (d_key)
        for (int64_t c = 0; c < C; ++c) d_key[row * C + c] = static_cast<T>(dk[c]);
      if (b.key_grad_into_value)
        for (int64_t c = 0; c < C; ++c) dv[c] += dk[c];
      if (d_value)
        for (int64_t c = 0; c < C; ++c) d_value[row * C + c] = static_cast<T>(dv[c]);
    };
    for (int64_t h = 0; h < H; ++h) {
      const int64_t jh = j * H + h;
      double ds = 0;
      if (h == 0 || !p.shared_kv) {
        std::fill(dk.begin(), dk.end(), 0.0);
        std::fill(dv.begin(), dv.end(), 0.0);
      }
      for (int64_t t = rowptr_t[j]; t < rowptr_t[j + 1]; ++t) {
        const int64_t i = col_t[t], k = t2c[t];
        const int64_t ih = i * H + h;
        const T* g_i = g + ih * C;
        const SlotGrad sg = slot_grad<K>(in, i, j, k, h, g_i, double(stats[ih * 2]),
                                         double(stats[ih * 2 + 1]), d_exact[ih]);
        if (d_value)
          for (int64_t c = 0; c < C; ++c) dv[c] += sg.pr * double(g_i[c]);
        if constexpr (K == ScoreKind::kGat) {
          ds += sg.de * leaky_grad(in.gat_z(i, j, k, h), slope);
        } else if (key_grad) {
          const T* q = in.vec(in.query, i, h);
          if constexpr (K == ScoreKind::kGatV2) {
            const T* kj = in.kv(in.key, j, h);
            const T* ek = in.row(in.edge_key, k, h);
            const T* a = in.att + h * C;
            for (int64_t c = 0; c < C; ++c)
              dk[c] += sg.de * double(a[c]) *
                       leaky_grad(double(q[c]) + double(kj[c]) + double(ek[c]), slope);
          } else {
            for (int64_t c = 0; c < C; ++c) dk[c] += sg.de * scale * double(q[c]);
          }
        }
      }
      if (d_src_score) d_src_score[jh] = static_cast<T>(ds);
      if (!p.shared_kv) store(jh);
    }
    if (p.shared_kv && H > 0) store(j);
  }
}

}  // namespace

void attention_forward_cpu(const AttentionParams& p) {
  check_forward(p);
  dispatch_cpu(p.scalar_type, p.index_type, "attention", [&](auto scalar, auto index) {
    dispatch_kind(p.kind, [&](auto kind) {
      forward<decltype(kind)::value, decltype(scalar), decltype(index)>(p);
    });
  });
}

void attention_backward_cpu(const AttentionBackwardParams& b) {
  check_backward(b);
  dispatch_cpu(b.fwd.scalar_type, b.fwd.index_type, "attention backward", [&](auto scalar, auto index) {
    dispatch_kind(b.fwd.kind, [&](auto kind) {
      backward<decltype(kind)::value, decltype(scalar), decltype(index)>(b);
    });
  });
}

}  // namespace gnnio
