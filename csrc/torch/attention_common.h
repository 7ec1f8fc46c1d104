// Validation and params filling for the attention family (shared by the CPU and CUDA bindings
// and by the autograd function, which saves AttentionInputs between the passes).
#pragma once

#include <array>
#include <vector>

#include <ATen/core/dispatch/Dispatcher.h>

#include "common.h"
#include "column_sum_common.h"
#include "gnnio/attention/params.h"
#include "spmm_common.h"

namespace gnnio::binding {

using OptTensor = c10::optional<at::Tensor>;

// Every operand of gnnio::graph_attention, in schema order.
struct AttentionInputs {
  at::Tensor rowptr, col;
  int64_t kind = 0;
  at::Tensor value;
  // src_score, dst_score, edge_score, query, key, edge_key, att, edge_value
  std::array<OptTensor, 8> operands;
  int64_t num_dst = 0;
  double negative_slope = 0.2, scale = 1.0, dropout = 0.0;
  int64_t seed = 0;
  at::Tensor rowptr_t, col_t, t2c;
  OptTensor heavy_rows, heavy_items;
  int64_t light_max_degree = INT64_MAX;
  OptTensor heavy_src, heavy_src_items;
  int64_t light_max_out_degree = INT64_MAX;
};

enum Operand { kSrcScore, kDstScore, kEdgeScore, kQuery, kKey, kEdgeKey, kAtt, kEdgeValue };
inline constexpr const char* kOperandNames[8] = {"src_score", "dst_score", "edge_score", "query",
                                                 "key", "edge_key", "att", "edge_value"};

inline at::ScalarType accumulator_dtype(const at::Tensor& value) {
  return value.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
}

inline const void* ptr_or_null(const OptTensor& t) { return t.has_value() ? t->data_ptr() : nullptr; }

// Kind dot with value [num_src, 1, C] and a query of more heads: every head reads the one key
// and value row of a source (params.h's shared_kv); the heads are the query's.
inline bool shared_rows(int64_t kind, const at::Tensor& value, const OptTensor& query) {
  return kind == static_cast<int64_t>(ScoreKind::kDot) && value.dim() == 3 && value.size(1) == 1 &&
         query.has_value() && query->dim() == 3 && query->size(1) > 1;
}
inline bool shared_rows(const AttentionInputs& in) {
  return shared_rows(in.kind, in.value, in.operands[kQuery]);
}

// Whether a is b's memory seen the same way (key passed as value: one row per slot serves both).
inline bool same_view(const at::Tensor& a, const at::Tensor& b) {
  return a.data_ptr() == b.data_ptr() && a.sizes() == b.sizes() && a.strides() == b.strides();
}

// in with its shared key and value rows copied per head ([num_src, heads, C], contiguous; one
// copy when key is value): for the per-head kernels. Differentiating through the copies is the
// caller's: the gradients of the copies summed over heads are the shared rows'.
inline AttentionInputs with_rows_per_head(AttentionInputs in) {
  TORCH_CHECK_VALUE(in.operands[kKey].has_value(), "graph_attention: kind dot needs key");
  const int64_t heads = in.operands[kQuery]->size(1);
  auto copy = [heads](const at::Tensor& t) { return t.expand({t.size(0), heads, t.size(2)}).contiguous(); };
  const bool key_is_value = same_view(*in.operands[kKey], in.value);
  in.value = copy(in.value);
  in.operands[kKey] = key_is_value ? in.value : copy(*in.operands[kKey]);
  return in;
}

inline AttentionParams attention_params(const AttentionInputs& in) {
  check_csr(in.rowptr, in.col, in.num_dst, "graph_attention");
  TORCH_CHECK_VALUE(in.kind >= 0 && in.kind <= 2, text("graph_attention: kind must be 0, 1 or 2, got ", in.kind));
  const at::Tensor& v = in.value;
  TORCH_CHECK_VALUE(v.dim() == 3 && v.is_contiguous(),
                    text("graph_attention: value must be contiguous [num_src, heads, channels], got ",
                         sizes_text(v.sizes())));
  TORCH_CHECK_VALUE(in.dropout >= 0.0 && in.dropout < 1.0, "graph_attention: dropout must be in [0, 1)");
  const auto kind = static_cast<ScoreKind>(in.kind);
  const bool shared_kv = shared_rows(in);
  const int64_t ns = v.size(0), H = shared_kv ? in.operands[kQuery]->size(1) : v.size(1), C = v.size(2),
                nd = in.num_dst, nnz = in.col.numel();
  const int64_t kv_heads = shared_kv ? 1 : H;
  // att: GATv2's [H, C]; for GAT, (a_src, a_dst) [2, H, C] in place of the scores (params.h's
  // score_att: the scores are formed from value's rows).
  const bool gat = kind == ScoreKind::kGat;
  const std::vector<int64_t> att_shape = gat ? std::vector<int64_t>{2, H, C} : std::vector<int64_t>{H, C};
  const std::vector<int64_t> shapes[8] = {{ns, H}, {nd, H}, {nnz, H}, {nd, H, C},
                                          {ns, kv_heads, C}, {nnz, H, C}, att_shape, {nnz, H, C}};
  for (int i = 0; i < 8; ++i) {
    const OptTensor& t = in.operands[i];
    if (!t.has_value()) continue;
    TORCH_CHECK_VALUE(t->sizes() == at::IntArrayRef(shapes[i]) && t->is_contiguous(),
                      text("graph_attention: ", kOperandNames[i], " must be contiguous ",
                           sizes_text(shapes[i]), ", got ", sizes_text(t->sizes())));
    TORCH_CHECK_TYPE(t->scalar_type() == v.scalar_type(),
                     text("graph_attention: ", kOperandNames[i], " must have value's dtype"));
    check_same_device(*t, kOperandNames[i], v, "value");
  }
  const auto& op = in.operands;
  if (gat) {
    TORCH_CHECK_VALUE(op[kSrcScore].has_value() != op[kAtt].has_value(),
                      "graph_attention: kind gat needs src_score (and optionally dst_score), or "
                      "att [2, heads, channels] in their place, not both");
    TORCH_CHECK_VALUE(!op[kAtt].has_value() || (!op[kDstScore].has_value() && nd <= ns),
                      "graph_attention: kind gat with att takes no dst_score (att's second vector "
                      "scores the destinations, value's first num_dst rows: num_dst <= num_src)");
  } else {
    TORCH_CHECK_VALUE(op[kQuery].has_value() && op[kKey].has_value(),
                      "graph_attention: kinds gatv2 and dot need query and key");
    TORCH_CHECK_VALUE(kind != ScoreKind::kGatV2 || op[kAtt].has_value(),
                      "graph_attention: kind gatv2 needs att");
  }
  check_same_device(in.rowptr, "rowptr", v, "value");
  check_same_device(in.col, "col", v, "value");
  AttentionParams p;
  p.rowptr = in.rowptr.data_ptr();
  p.col = in.col.data_ptr();
  p.index_type = index_type_of(in.rowptr, "rowptr");
  p.kind = kind;
  p.scalar_type = scalar_type_of(v, "value");
  p.num_dst = nd;
  p.num_src = ns;
  p.nnz = nnz;
  p.heads = H;
  p.channels = C;
  p.shared_kv = shared_kv;
  p.src_score = ptr_or_null(op[kSrcScore]);
  p.dst_score = ptr_or_null(op[kDstScore]);
  p.edge_score = ptr_or_null(op[kEdgeScore]);
  p.query = ptr_or_null(op[kQuery]);
  p.key = ptr_or_null(op[kKey]);
  p.edge_key = ptr_or_null(op[kEdgeKey]);
  (gat ? p.score_att : p.att) = ptr_or_null(op[kAtt]);
  p.edge_value = ptr_or_null(op[kEdgeValue]);
  p.value = v.data_ptr();
  p.negative_slope = in.negative_slope;
  p.scale = in.scale;
  p.dropout = in.dropout;
  p.seed = static_cast<uint64_t>(in.seed);
  p.split = row_split_of(in.heavy_rows, in.heavy_items, in.light_max_degree, v, "graph_attention");
  return p;
}

inline bool low_precision(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
}

// Kind gat with att [2, H, C] in place of its scores (the scores from rows).
inline bool gat_att_given(const AttentionInputs& in) {
  return in.kind == static_cast<int64_t>(ScoreKind::kGat) && in.operands[kAtt].has_value();
}

// GAT's scores [2, num_src, H] in value's dtype for att [2, H, C] (value's dtype):
// gnnio::head_scores as gnnio.ops.head_scores calls it, so the same bits as the layer's scores
// and as the CUDA forward's scores from rows (attention_forward_cuda_gat_scores_from_rows).
// value as gnnio::head_scores takes it: its CPU kernels are float32 / float64, so bf16 / fp16
// rows are upcast exactly there, as the Python op does.
inline bool head_scores_upcasts(const at::Tensor& value) { return value.is_cpu() && low_precision(value); }
inline at::Tensor head_scores_rows(const at::Tensor& value) {
  return head_scores_upcasts(value) ? value.to(at::kFloat) : value;
}

inline at::Tensor gat_scores_of(const at::Tensor& value, const at::Tensor& att) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::head_scores", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
  at::AutoDispatchBelowADInplaceOrView guard;
  return op.call(head_scores_rows(value), att.to(accumulator_dtype(value)).contiguous())
      .to(value.scalar_type());
}

// The op's src_score and dst_score from scores [2, num_src, H] (gat_scores_of, or their
// gradients' layout): scores[0], and scores[1]'s first num_dst rows (contiguous).
inline std::array<at::Tensor, 2> gat_src_dst(const at::Tensor& scores, int64_t num_dst) {
  return {scores.select(0, 0), scores.select(0, 1).narrow(0, 0, num_dst)};
}

// in with GAT's scores (gat_scores_of) in place of att.
inline AttentionInputs with_gat_scores(AttentionInputs in, const at::Tensor& scores) {
  const auto src_dst = gat_src_dst(scores, in.num_dst);
  in.operands[kSrcScore] = src_dst[0];
  in.operands[kDstScore] = src_dst[1];
  in.operands[kAtt] = c10::nullopt;
  return in;
}

// The output bias the op adds to out (params.h's bias): contiguous [H * C] in value's dtype,
// on value's device.
inline void set_output_bias(AttentionParams& p, const at::Tensor& value, const OptTensor& bias) {
  if (!bias.has_value()) return;
  const int64_t HC = p.heads * p.channels;
  TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == HC,
                    text("graph_attention: bias must be [heads * channels] = [", HC, "], got ",
                         sizes_text(bias->sizes())));
  TORCH_CHECK_VALUE(bias->is_contiguous(), "graph_attention: bias must be contiguous");
  TORCH_CHECK_TYPE(bias->scalar_type() == value.scalar_type(),
                   "graph_attention: bias must have value's dtype");
  check_same_device(*bias, "bias", value, "value");
  p.bias = bias->data_ptr();
}

// Whether the CUDA forward can store out_acc for these values: bf16/fp16 (out before rounding)
// and float32 (out before the output bias; the kernel's out_acc store is float32).
inline bool out_acc_available(const at::Tensor& value) {
  return low_precision(value) || (value.is_cuda() && value.scalar_type() == at::kFloat);
}

// Forward outputs: out [num_dst, H, C] (value's dtype), stats [num_dst, H, 2], when asked for
// weights [nnz, H] (accumulator dtype), and with save_out_acc (where out_acc_available) out_acc
// [num_dst, H, C] float32, the attention output before rounding and before the bias (for the
// backward's D); empty tensors otherwise.
inline std::array<at::Tensor, 4> attention_outputs(AttentionParams& p, const at::Tensor& value,
                                                   bool need_weights, bool save_out_acc) {
  const auto acc = value.options().dtype(accumulator_dtype(value));
  auto out = at::empty({p.num_dst, p.heads, p.channels}, value.options());
  auto stats = at::empty({p.num_dst, p.heads, 2}, acc);
  auto weights = at::empty({need_weights ? p.nnz : 0, p.heads}, acc);
  const bool keep_acc = save_out_acc && out_acc_available(value);
  auto out_acc = keep_acc ? at::empty({p.num_dst, p.heads, p.channels}, acc) : at::empty({0}, acc);
  p.out = out.data_ptr();
  p.stats = stats.data_ptr();
  p.weights = need_weights ? weights.data_ptr() : nullptr;
  p.out_acc = keep_acc ? out_acc.data_ptr() : nullptr;
  return {out, stats, weights, out_acc};
}

// Backward params and the gradient tensors (the nine of AttentionInputs' operands plus value,
// order: value, then operands; empty tensors where not needed). grad_att is returned as the
// per-destination partial; attention_finish_grads reduces it.
struct AttentionGrads {
  at::Tensor value;
  std::array<at::Tensor, 8> operands;
  at::Tensor att_partial, delta;
};

inline AttentionBackwardParams attention_backward_params(const AttentionInputs& in,
                                                         const at::Tensor& out, const at::Tensor& stats,
                                                         const at::Tensor& grad_out,
                                                         at::IntArrayRef needs, AttentionGrads& g) {
  AttentionBackwardParams b;
  TORCH_CHECK_VALUE(!gat_att_given(in), "graph_attention backward: kind gat takes its scores "
                    "(the autograd forms them from att)");
  b.fwd = attention_params(in);
  const auto& v = in.value;
  TORCH_CHECK_VALUE(needs.size() == 9, "graph_attention backward: needs must have 9 entries");
  // 3 (value and key only): the gradient is written into the operand's own memory, which the
  // caller gives up (the autograd's backward_in_place). Safe for the CUDA dot kernels as they
  // are: pass B reads source j's key and value rows only in source j's own tasks, at their start,
  // and writes d key_j and d value_j at their end (a heavy source's items write partials that a
  // later launch merges); pass A, the other reader of key and value, is an earlier launch.
  for (size_t i = 0; i < needs.size(); ++i) {
    const bool in_place_ok = (i == 0 || i == 1 + kKey) && needs[i] == 3;
    TORCH_CHECK_VALUE(needs[i] == 0 || needs[i] == 1 || (i == 1 + kKey && needs[i] == 2) || in_place_ok,
                      "graph_attention backward: needs entries are 0 or 1 (2 only for key: into "
                      "value's gradient; 3 for value and key: in place), got ", needs[i], " at ", i);
    if (in_place_ok) {
      const at::Tensor& own = i == 0 ? v : *in.operands[kKey];
      TORCH_CHECK_VALUE(v.is_cuda() && in.kind == static_cast<int64_t>(ScoreKind::kDot) &&
                            own.is_contiguous() && (i == 0 || !in.operands[kKey]->is_same(v)),
                        "graph_attention backward: an in-place gradient (needs 3) is for value and "
                        "key of kind dot on CUDA, contiguous, key not value");
    }
  }
  // out is the forward's out, its float32 out_acc (bf16/fp16 values), or (CUDA) D_i itself,
  // [num_dst, H] float32 from graph_attention_delta: the autograd then frees out early; or
  // (CUDA GATv2 and dot, attention_backward_cuda_delta_in_pass_a) a 1-d empty tensor: no out at all,
  // pass A forms D_i.
  const bool out_is_delta = out.dim() == 2;
  const bool no_out = out.dim() == 1 && out.numel() == 0;
  const std::vector<int64_t> out_shape = {b.fwd.num_dst, b.fwd.heads, b.fwd.channels};
  TORCH_CHECK_VALUE(grad_out.sizes() == at::IntArrayRef(out_shape) && grad_out.is_contiguous() &&
                        out.is_contiguous() &&
                        (no_out || (out_is_delta ? out.sizes() == at::IntArrayRef({b.fwd.num_dst, b.fwd.heads})
                                                 : out.sizes() == at::IntArrayRef(out_shape))),
                    "graph_attention backward: grad_out and out must be contiguous [num_dst, H, C] "
                    "(out may be D_i [num_dst, H] on CUDA, or empty for GATv2 and dot on CUDA)");
  TORCH_CHECK_VALUE(!out_is_delta || (v.is_cuda() && out.scalar_type() == at::kFloat),
                    "graph_attention backward: D_i in place of out is float32 and CUDA only");
  TORCH_CHECK_VALUE(!no_out || (v.is_cuda() && (in.kind == static_cast<int64_t>(ScoreKind::kGatV2) ||
                                                in.kind == static_cast<int64_t>(ScoreKind::kDot))),
                    "graph_attention backward: an empty out (D_i formed by pass A) is for GATv2 "
                    "and dot on CUDA only");
  TORCH_CHECK_TYPE(grad_out.scalar_type() == v.scalar_type(),
                   "graph_attention backward: grad_out must have value's dtype ", v.scalar_type(),
                   ", got ", grad_out.scalar_type());
  TORCH_CHECK_VALUE(grad_out.device() == v.device() && out.device() == v.device(),
                    "graph_attention backward: grad_out and out must be on value's device");
  // out is the forward's out, or its float32 out_acc when the values are bf16/fp16.
  const bool out_is_acc = !out_is_delta && low_precision(v) && out.scalar_type() == at::kFloat;
  TORCH_CHECK_VALUE(out.scalar_type() == v.scalar_type() || out_is_acc || out_is_delta || no_out,
                    "graph_attention backward: out must have value's dtype (or be the float32 "
                    "out_acc of bf16/fp16 values)");
  TORCH_CHECK_VALUE(stats.is_contiguous() && stats.scalar_type() == accumulator_dtype(v) &&
                        stats.sizes() == at::IntArrayRef({b.fwd.num_dst, b.fwd.heads, 2}),
                    "graph_attention backward: stats must be the forward's [num_dst, H, 2]");
  check_csr(in.rowptr_t, in.col_t, b.fwd.num_src, "graph_attention backward");
  // The kernels read the transpose and t2c with the forward CSR's index type.
  TORCH_CHECK_VALUE(in.rowptr_t.scalar_type() == in.rowptr.scalar_type(),
                    text("graph_attention backward: rowptr_t, col_t and t2c must have rowptr's dtype ",
                         dtype_text(in.rowptr.scalar_type()), ", got ",
                         dtype_text(in.rowptr_t.scalar_type())));
  TORCH_CHECK_VALUE(in.col_t.numel() == b.fwd.nnz && in.t2c.numel() == b.fwd.nnz &&
                        in.t2c.scalar_type() == in.col_t.scalar_type() && in.t2c.is_contiguous(),
                    "graph_attention backward needs the transposed CSR (rowptr_t, col_t) and t2c");
  if (!out_is_delta && !no_out) (out_is_acc ? b.fwd.out_acc : b.fwd.out) = const_cast<void*>(out.data_ptr());
  b.fwd.stats = const_cast<void*>(stats.data_ptr());
  b.grad_out = grad_out.data_ptr();
  b.rowptr_t = in.rowptr_t.data_ptr();
  b.col_t = in.col_t.data_ptr();
  b.t2c = in.t2c.data_ptr();
  b.split_t = row_split_of(in.heavy_src, in.heavy_src_items, in.light_max_out_degree, v,
                           "graph_attention backward");
  const auto acc = v.options().dtype(accumulator_dtype(v));
  auto alloc = [&](bool need, const at::Tensor& like) {
    return need ? at::empty_like(like) : at::empty({0}, v.options());
  };
  g.value = needs[0] == 3 ? v : alloc(needs[0], v);
  b.grad_value = needs[0] ? g.value.data_ptr() : nullptr;
  // needs[1 + kKey] == 2: key is value, its gradient goes into value's (params.h).
  b.key_grad_into_value = needs[1 + kKey] == 2;
  if (b.key_grad_into_value) {
    const auto& key = in.operands[kKey];
    TORCH_CHECK_VALUE(needs[0] && key.has_value() && same_view(*key, v),
                      "graph_attention backward: needs[key] == 2 (into value's gradient) needs "
                      "key to be value and value's gradient");
  }
  void** slots[8] = {&b.grad_src_score, &b.grad_dst_score, &b.grad_edge_score, &b.grad_query,
                     &b.grad_key, &b.grad_edge_key, &b.grad_att_partial, &b.grad_edge_value};
  for (int i = 0; i < 8; ++i) {
    const bool need = needs[i + 1] && in.operands[i].has_value() && !(i == kKey && b.key_grad_into_value);
    if (i == kAtt) {
      int64_t rows = b.fwd.num_dst;  // per-destination shares, or per-block sums on CUDA
#ifdef GNNIO_WITH_CUDA
      if (need && v.is_cuda()) {
        b.att_blocks = attention_backward_cuda_att_blocks(b);
        if (b.att_blocks > 0) rows = b.att_blocks + b.fwd.split.num_heavy;
      }
#endif
      g.att_partial = need ? at::empty({rows, b.fwd.heads, b.fwd.channels}, acc)
                           : at::empty({0}, acc);
      *slots[i] = need ? g.att_partial.data_ptr() : nullptr;
      continue;
    }
    g.operands[i] = !need ? at::empty({0}, v.options())
                    : (i == kKey && needs[i + 1] == 3) ? *in.operands[i] : at::empty_like(*in.operands[i]);
    *slots[i] = need ? g.operands[i].data_ptr() : nullptr;
  }
  g.delta = out_is_delta ? out : at::empty({b.fwd.num_dst, b.fwd.heads}, acc);
  b.delta = g.delta.data_ptr();
  b.delta_ready = out_is_delta;
  b.delta_in_pass_a = no_out;
  return b;
}

// [grad_value, grad_src_score, ..., grad_edge_value], grad_att summed over destinations (in
// a fixed order: deterministic).
inline std::vector<at::Tensor> attention_finish_grads(const AttentionInputs& in, AttentionGrads& g) {
  std::vector<at::Tensor> grads{g.value};
  for (int i = 0; i < 8; ++i) {
    if (i == kAtt) {
      grads.push_back(g.att_partial.dim() == 3
                          ? column_sum_of_rows(g.att_partial).view({g.att_partial.size(1), g.att_partial.size(2)})
                                .to(in.value.scalar_type())
                          : at::empty({0}, in.value.options()));
      continue;
    }
    grads.push_back(g.operands[i]);
  }
  return grads;
}

}  // namespace gnnio::binding

namespace gnnio::binding {

// The forward schema's arguments, gathered (every implementation and the autograd start here).
inline AttentionInputs attention_inputs(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const OptTensor& src_score, const OptTensor& dst_score, const OptTensor& edge_score,
    const OptTensor& query, const OptTensor& key, const OptTensor& edge_key, const OptTensor& att,
    const OptTensor& edge_value, int64_t num_dst, double negative_slope, double scale,
    double dropout, int64_t seed, const at::Tensor& rowptr_t, const at::Tensor& col_t,
    const at::Tensor& t2c, const OptTensor& heavy_rows, const OptTensor& heavy_items,
    int64_t light_max_degree, const OptTensor& heavy_src, const OptTensor& heavy_src_items,
    int64_t light_max_out_degree) {
  AttentionInputs in;
  in.rowptr = rowptr;
  in.col = col;
  in.kind = kind;
  in.value = value;
  in.operands = {src_score, dst_score, edge_score, query, key, edge_key, att, edge_value};
  in.num_dst = num_dst;
  in.negative_slope = negative_slope;
  in.scale = scale;
  in.dropout = dropout;
  in.seed = seed;
  in.rowptr_t = rowptr_t;
  in.col_t = col_t;
  in.t2c = t2c;
  in.heavy_rows = heavy_rows;
  in.heavy_items = heavy_items;
  in.light_max_degree = light_max_degree;
  in.heavy_src = heavy_src;
  in.heavy_src_items = heavy_src_items;
  in.light_max_out_degree = light_max_out_degree;
  return in;
}

// The backward schema's arguments, gathered.
inline AttentionInputs attention_backward_inputs(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const c10::List<OptTensor>& operands, int64_t num_dst, at::ArrayRef<double> coeffs, int64_t seed,
    const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
    const c10::List<OptTensor>& splits, at::IntArrayRef light_max) {
  TORCH_CHECK_VALUE(operands.size() == 8 && coeffs.size() == 3 && splits.size() == 4 &&
                        light_max.size() == 2,
                    "graph_attention backward: 8 operands, 3 coefficients, 4 split tensors, 2 thresholds");
  AttentionInputs in;
  in.rowptr = rowptr;
  in.col = col;
  in.kind = kind;
  in.value = value;
  for (int i = 0; i < 8; ++i) in.operands[i] = operands.get(i);
  in.num_dst = num_dst;
  in.negative_slope = coeffs[0];
  in.scale = coeffs[1];
  in.dropout = coeffs[2];
  in.seed = seed;
  in.rowptr_t = rowptr_t;
  in.col_t = col_t;
  in.t2c = t2c;
  in.heavy_rows = splits.get(0);
  in.heavy_items = splits.get(1);
  in.light_max_degree = light_max[0];
  in.heavy_src = splits.get(2);
  in.heavy_src_items = splits.get(3);
  in.light_max_out_degree = light_max[1];
  return in;
}

}  // namespace gnnio::binding
