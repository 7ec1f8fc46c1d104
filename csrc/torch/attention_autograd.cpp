// Autograd of gnnio::graph_attention: the forward saves only its inputs, out (float32 out_acc for
// bf16/fp16 values) and the softmax stats (O(N x H x C) and O(N x H));
// graph_attention_backward recomputes the weights from them. On CUDA the backward reads out only
// for D_i = dout_i . out_i: it forms D first (graph_attention_delta) and, unless the graph is
// kept for another backward, lets go of out before the gradients are allocated (one N x H x C
// buffer less at the backward's peak). GATv2 and the dot kind (TransformerConv) on CUDA keep no
// out at all (unless GNNIO_GATV2_DELTA_IN_PASS_A=0 / GNNIO_DOT_DELTA_IN_PASS_A=0 or a per-slot
// gradient is needed): the backward's pass A forms D_i while it walks each row
// (attention_backward_cuda_delta_in_pass_a).
#include <cstdlib>

#include <ATen/SavedTensorHooks.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/grad_mode.h>
#include <torch/autograd.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/library.h>

#include "attention_common.h"
#include "column_sum_common.h"

namespace gnnio::binding {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int kValueArg = 3;     // schema position of value; the 8 operands follow it
constexpr int kBiasArg = 28;     // schema position of bias (the output bias)
constexpr int kNumArgs = 31;     // the schema's 30 and grad_enabled
constexpr int kKeyNeedIndex = 5;  // needs[]: value, then the 8 operands (key the fifth)
constexpr int kKeySaved = 7;      // saved: rowptr, col, value, then the 8 operands

using ForwardSig = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, const OptTensor&, int64_t, double, double, double, c10::SymInt, bool,
    const at::Tensor&, const at::Tensor&, const at::Tensor&, const OptTensor&, const OptTensor&,
    int64_t, const OptTensor&, const OptTensor&, int64_t, bool, const OptTensor&, bool);
using BackwardSig = std::vector<at::Tensor>(
    const at::Tensor&, const at::Tensor&, int64_t, const at::Tensor&, const c10::List<OptTensor>&,
    int64_t, at::ArrayRef<double>, c10::SymInt, const at::Tensor&, const at::Tensor&, const at::Tensor&,
    const c10::List<OptTensor>&, at::IntArrayRef, const at::Tensor&, const at::Tensor&,
    const at::Tensor&, at::IntArrayRef);

OptTensor opt(const at::Tensor& t) { return t.defined() ? OptTensor(t) : c10::nullopt; }
at::Tensor plain(const OptTensor& t) { return t.has_value() ? *t : at::Tensor(); }

// GAT with att [2, H, C] in place of its scores: g's score gradients (g[1 + kSrcScore] for
// value's rows, g[1 + kDstScore] for its first num_dst) through head_scores' backward, into
// g[0] (added: value's own gradient and the scores') and g[1 + kAtt], as needs asks.
void gat_score_grads_to_rows(const at::Tensor& value, const at::Tensor& att, int64_t num_dst,
                             const std::vector<int64_t>& needs, std::vector<at::Tensor>& g) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("gnnio::head_scores_backward", "")
                       .typed<std::tuple<at::Tensor, at::Tensor>(
                           const at::Tensor&, const at::Tensor&, const at::Tensor&, bool, bool,
                           const c10::optional<at::Tensor>&)>();
  const auto acc = accumulator_dtype(value);
  auto grad_scores = at::zeros({2, value.size(0), value.size(1)}, value.options().dtype(acc));
  const auto grad_src_dst = gat_src_dst(grad_scores, num_dst);
  grad_src_dst[0].copy_(g[1 + kSrcScore]);
  grad_src_dst[1].copy_(g[1 + kDstScore]);
  g[1 + kSrcScore] = g[1 + kDstScore] = at::Tensor();  // not returned: free before grad_x
  const bool upcast = head_scores_upcasts(value);
  const at::Tensor x = head_scores_rows(value);
  const bool x_grad = needs[0] != 0, att_grad = needs[1 + kAtt] != 0;
  // d x is added into g[0], the backward op's own new tensor, as fl(g + fl(d x)): autograd's
  // sum of the two gradients, with no [N, H, C] buffer for d x alone (a separate sum into a new
  // tensor raised GATConv's backward peak on powerlaw-1M-16M from 1.98 to 2.52 GiB, NOTES v16).
  const bool into = x_grad && !upcast;
  at::Tensor grad_x, grad_att;
  {
    at::AutoDispatchBelowADInplaceOrView guard;  // g[0] is no autograd variable of anyone's yet
    std::tie(grad_x, grad_att) = op.call(x, att.to(acc).contiguous(), grad_scores, x_grad, att_grad,
                                         into ? c10::optional<at::Tensor>(g[0]) : c10::nullopt);
  }
  if (x_grad && !into) g[0].add_(grad_x.to(value.scalar_type()));
  if (att_grad) g[1 + kAtt] = grad_att.to(att.scalar_type());
}

class GraphAttentionFunction : public torch::autograd::Function<GraphAttentionFunction> {
 public:
  static variable_list forward(
      AutogradContext* ctx, const at::Tensor& rowptr, const at::Tensor& col, int64_t kind,
      const at::Tensor& value, const OptTensor& src_score, const OptTensor& dst_score,
      const OptTensor& edge_score, const OptTensor& query, const OptTensor& key,
      const OptTensor& edge_key, const OptTensor& att, const OptTensor& edge_value, int64_t num_dst,
      double negative_slope, double scale, double dropout, c10::SymInt seed, bool need_weights,
      const at::Tensor& rowptr_t, const at::Tensor& col_t, const at::Tensor& t2c,
      const OptTensor& heavy_rows, const OptTensor& heavy_items, int64_t light_max_degree,
      const OptTensor& heavy_src, const OptTensor& heavy_src_items, int64_t light_max_out_degree,
      bool save_out_acc, const OptTensor& bias, bool backward_in_place, bool grad_enabled) {
    // Only out has a gradient. Materialised, the undefined gradients of stats, weights and
    // out_acc would be zero tensors of their sizes, alive through the backward: out_acc's
    // [N, H, C] float32 is 0.48 GiB at powerlaw-1M-16M (found in a memory snapshot of GATConv's
    // backward peak). The backward tests grads[0] itself.
    ctx->set_materialize_grads(false);
    // Which gradients to compute, from the inputs themselves (needs_input_grad counts only
    // tensor arguments, which would make the indices depend on the schema's scalar positions).
    std::vector<int64_t> needs{value.requires_grad()};
    for (const OptTensor* t : {&src_score, &dst_score, &edge_score, &query, &key, &edge_key, &att,
                               &edge_value})
      needs.push_back(t->has_value() && (*t)->requires_grad());
    // key is value (GATv2's x_l): one gradient, written by the kernel into value's slot, and
    // none for key's (autograd sums a tensor's gradients over the argument slots it fills).
    constexpr int kKeyNeed = kKeyNeedIndex;
    const bool merge_off = env_flag_off("GNNIO_KEY_MERGE");  // measurement knob: two gradients
    if (!merge_off && needs[0] && needs[kKeyNeed] && key.has_value() && key->is_same(value))
      needs[kKeyNeed] = 2;
    bool any = false;
    for (int64_t n : needs) any |= n != 0;
    // grad_enabled: the caller's grad mode (inside forward it is always off).
    // CUDA GATv2 and dot (policy: attention_backward_cuda_delta_in_pass_a): the backward's pass A forms
    // D_i itself, so neither out nor out_acc is kept.
    bool delta_in_pass_a = false;
#ifdef GNNIO_WITH_CUDA
    if (value.is_cuda() && grad_enabled && any)
      delta_in_pass_a = attention_backward_cuda_delta_in_pass_a(
          static_cast<ScoreKind>(kind), needs[1 + kQuery] != 0, needs[1 + kAtt] != 0,
          needs[1 + kEdgeKey] != 0, needs[1 + kEdgeValue] != 0);
#endif
    // The backward's D_i needs the attention output alone, unrounded: for bf16/fp16 values the
    // kernel keeps it in out_acc (float32). So it does for float32 values on CUDA with an
    // output bias: out_acc is then out before the bias, and the bias still goes into the
    // store of out (a 4-byte store per channel against a separate add's read and write of
    // out: 0.38 ms at 1M x 128 on an H200).
    const bool keep_acc = grad_enabled && any && !delta_in_pass_a &&
                          (low_precision(value) || (bias.has_value() && out_acc_available(value)));
    // Otherwise, when out itself is kept for D_i, the kept out must stay the attention output,
    // and the caller may change the returned one in place (an in-place activation after the
    // layer), so the sum with the bias is a new tensor.
    const bool out_kept = grad_enabled && any && !delta_in_pass_a && !keep_acc;
    const OptTensor op_bias = out_kept ? c10::nullopt : bias;
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("gnnio::graph_attention", "")
                         .typed<ForwardSig>();
    // For bf16/fp16 values the backward forms D_i from the unrounded out (params.h), which the
    // forward then keeps (float32) in place of the rounded one, whatever the caller asked.
    // (The dispatch guard is scoped to the call: the detach() below must share out's version
    // counter, which the ADInplaceOrView kernel sets up.)
    auto [out, stats, weights, out_acc] = [&] {
      at::AutoDispatchBelowADInplaceOrView guard;
      return op.call(rowptr, col, kind, value, src_score, dst_score, edge_score, query, key,
                     edge_key, att, edge_value, num_dst, negative_slope, scale, dropout, seed,
                     need_weights, rowptr_t, col_t, t2c, heavy_rows, heavy_items, light_max_degree,
                     heavy_src, heavy_src_items, light_max_out_degree, save_out_acc || keep_acc,
                     op_bias, false);
    }();
    ctx->mark_non_differentiable({stats, weights, out_acc});
    const at::Tensor& kept = keep_acc ? out_acc : out;
    const bool hooked = at::SavedTensorDefaultHooks::get_hooks().has_value();
    ctx->save_for_backward({rowptr, col, value, plain(src_score), plain(dst_score),
                            plain(edge_score), plain(query), plain(key), plain(edge_key),
                            plain(att), plain(edge_value), rowptr_t, col_t, t2c, plain(heavy_rows),
                            plain(heavy_items), plain(heavy_src), plain(heavy_src_items), stats,
                            hooked && !delta_in_pass_a ? kept : at::Tensor()});
    // Without saved-tensor hooks, out is kept outside the saved variables so that the backward
    // can drop it early: a detached alias (no reference back to this node) with the version
    // counter it shares, checked in the backward as autograd checks a saved variable. With hooks
    // (checkpointing, offloading) it is a saved variable as any other, so that they see it.
    ctx->saved_data["delta_in_pass_a"] = delta_in_pass_a;
    if (!hooked && !delta_in_pass_a) {
      ctx->saved_data["out"] = kept.detach();
      ctx->saved_data["out_version"] = static_cast<int64_t>(kept._version());
    }
    ctx->saved_data["kind"] = kind;
    ctx->saved_data["num_dst"] = num_dst;
    ctx->saved_data["coeffs"] = std::vector<double>{negative_slope, scale, dropout};
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["light_max"] = std::vector<int64_t>{light_max_degree, light_max_out_degree};
    ctx->saved_data["needs"] = needs;
    ctx->saved_data["bias_grad"] = bias.has_value() && bias->requires_grad();
    // The caller gives up value's and key's memory (backward_in_place): the backward writes
    // their gradients there when nothing else can read them afterwards (see backward). Only for
    // the CUDA dot kernels (attention_common.h's needs 3), and not with saved-tensor hooks
    // (checkpointing, offloading: the unpacked tensors are theirs).
    // Not with shared key and value rows: the backward works on copies of them per head.
    ctx->saved_data["in_place"] = backward_in_place && !hooked && value.is_cuda() &&
                                  kind == static_cast<int64_t>(ScoreKind::kDot) && key.has_value() &&
                                  !key->is_same(value) && key->is_contiguous() &&
                                  value.is_contiguous() && !shared_rows(kind, value, query);
    if (bias.has_value() && out_kept) {
      auto with_bias = out + bias->view({1, out.size(1), out.size(2)});
      return {with_bias, stats, weights, out_acc};
    }
    return {out, stats, weights, out_acc};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto s = ctx->get_saved_variables();
    variable_list result(kNumArgs);
    const std::vector<int64_t> needs = ctx->saved_data["needs"].toIntVector();
    bool any = false;
    for (int64_t n : needs) any |= n != 0;
    // The detached out is this node's to release once the graph is not kept (autograd releases
    // only the saved variables): taken out of saved_data here, on every path.
    const bool keep_graph = torch::autograd::get_current_graph_task_keep_graph();
    const bool delta_in_pass_a = ctx->saved_data["delta_in_pass_a"].toBool();
    at::Tensor out = s[19];
    if (delta_in_pass_a) {  // no out: an empty one tells the backward op to form D_i in pass A
      out = at::empty({0}, s[2].options().dtype(at::kFloat));
    } else if (!out.defined()) {
      TORCH_CHECK(ctx->saved_data.count("out"),
                  "graph_attention: out was released by an earlier backward (a second backward "
                  "needs retain_graph=True the first time; or the first one failed part-way)");
      out = ctx->saved_data["out"].toTensor();
      TORCH_CHECK(out._version() == ctx->saved_data["out_version"].toInt(),
                  "one of the variables needed for gradient computation has been modified by an "
                  "inplace operation: the output of gnnio::graph_attention");
      if (!keep_graph) ctx->saved_data.erase("out");
    }
    if (!grads[0].defined()) return result;
    if (ctx->saved_data["bias_grad"].toBool())  // the bias is on every row of out
      result[kBiasArg] = column_sum_of_rows(grads[0]);
    if (!any) return result;
    // sym_numel: under torch.compile the saved tensors have symbolic sizes.
    TORCH_CHECK_VALUE(s[11].sym_numel() != 0,
                      "graph_attention backward needs the transposed CSR (built when the forward "
                      "saw an input that requires grad)");
    static auto op = c10::Dispatcher::singleton()
                         .findSchemaOrThrow("gnnio::graph_attention_backward", "")
                         .typed<BackwardSig>();
    c10::List<OptTensor> operands;
    for (int i = 3; i < 11; ++i) operands.push_back(opt(s[i]));
    // GAT with att in place of its scores: the scores again, by head_scores (the forward's
    // bits), for the backward op, whose score gradients head_scores' backward then carries into
    // value and att, as the layer's autograd did when it passed the scores itself.
    const at::Tensor& value = s[2];
    const at::Tensor& att = s[3 + kAtt];
    const bool gat_att = ctx->saved_data["kind"].toInt() == static_cast<int64_t>(ScoreKind::kGat) &&
                         att.defined();
    const int64_t num_dst = ctx->saved_data["num_dst"].toInt();
    at::Tensor scores;
    if (gat_att) {
      scores = gat_scores_of(value, att);
      const auto src_dst = gat_src_dst(scores, num_dst);
      operands.set(kSrcScore, src_dst[0]);
      operands.set(kDstScore, src_dst[1]);
      operands.set(kAtt, c10::nullopt);
    }
    c10::List<OptTensor> splits;
    for (int i = 14; i < 18; ++i) splits.push_back(opt(s[i]));
    const auto coeffs = ctx->saved_data["coeffs"].toDoubleVector();
    const at::Tensor grad_out = grads[0].contiguous();
    if (s[2].is_cuda() && !delta_in_pass_a) {
      static auto delta_op = c10::Dispatcher::singleton()
                                 .findSchemaOrThrow("gnnio::graph_attention_delta", "")
                                 .typed<at::Tensor(const at::Tensor&, const at::Tensor&)>();
      // Once D_i is formed this is the last reference to out (unless the graph is kept, a hook
      // holds it, or the caller does): the gradients below can reuse its memory.
      out = delta_op.call(out, grad_out);
    }
    // In place only when this is the graph's last backward (retain_graph would run it again on
    // the overwritten operands). value's and key's version counters are bumped afterwards, so
    // that any other saved reference to them (which the caller promised away) fails loudly.
    std::vector<int64_t> call_needs = needs;
    const bool score_grads = gat_att && (needs[0] || needs[1 + kAtt]);
    if (gat_att) {
      call_needs[1 + kSrcScore] = call_needs[1 + kDstScore] = score_grads;
      call_needs[1 + kAtt] = 0;
    }
    const bool in_place = ctx->saved_data["in_place"].toBool() && !keep_graph;
    if (in_place) {
      if (call_needs[0] == 1) call_needs[0] = 3;
      if (call_needs[kKeyNeedIndex] == 1) call_needs[kKeyNeedIndex] = 3;
    }
    auto g = op.call(s[0], s[1], ctx->saved_data["kind"].toInt(), s[2], operands, num_dst, coeffs,
                     ctx->saved_data["seed"].toSymInt(), s[11], s[12], s[13], splits,
                     ctx->saved_data["light_max"].toIntVector(), out, s[18], grad_out, call_needs);
    operands.clear();  // the scores' last references: freed before head_scores' backward
    scores.reset();
    if (score_grads) gat_score_grads_to_rows(value, att, num_dst, needs, g);
    if (in_place) {
      if (call_needs[0] == 3) s[2].unsafeGetTensorImpl()->bump_version();
      if (call_needs[kKeyNeedIndex] == 3) s[kKeySaved].unsafeGetTensorImpl()->bump_version();
    }
    for (int i = 0; i < 9; ++i)
      if (needs[i] == 1) result[kValueArg + i] = g[i];
    return result;
  }
};

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> graph_attention_autograd(
    const at::Tensor& rowptr, const at::Tensor& col, int64_t kind, const at::Tensor& value,
    const OptTensor& src_score, const OptTensor& dst_score, const OptTensor& edge_score,
    const OptTensor& query, const OptTensor& key, const OptTensor& edge_key, const OptTensor& att,
    const OptTensor& edge_value, int64_t num_dst, double negative_slope, double scale,
    double dropout, c10::SymInt seed, bool need_weights, const at::Tensor& rowptr_t,
    const at::Tensor& col_t, const at::Tensor& t2c, const OptTensor& heavy_rows,
    const OptTensor& heavy_items, int64_t light_max_degree, const OptTensor& heavy_src,
    const OptTensor& heavy_src_items, int64_t light_max_out_degree, bool save_out_acc,
    const OptTensor& bias, bool backward_in_place) {
  auto outs = GraphAttentionFunction::apply(
      rowptr, col, kind, value, src_score, dst_score, edge_score, query, key, edge_key, att,
      edge_value, num_dst, negative_slope, scale, dropout, seed, need_weights, rowptr_t, col_t, t2c,
      heavy_rows, heavy_items, light_max_degree, heavy_src, heavy_src_items, light_max_out_degree,
      save_out_acc, bias, backward_in_place, at::GradMode::is_enabled());
  return {outs[0], outs[1], outs[2], outs[3]};
}

}  // namespace

TORCH_LIBRARY_IMPL(gnnio, Autograd, m) {
  m.impl("graph_attention", &graph_attention_autograd);
  m.impl("graph_attention_backward", torch::autograd::autogradNotImplementedFallback());
  m.impl("graph_attention_delta", torch::autograd::autogradNotImplementedFallback());
}

}  // namespace gnnio::binding
