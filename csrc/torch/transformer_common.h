// Shared by the CPU and CUDA bindings of gnnio::transformer_fused_forward: checks, outputs and
// the params struct (gnnio/transformer/params.h).
#pragma once

#include <ATen/MemoryOverlap.h>

#include <cstdint>

#include "spmm_common.h"
#include "gnnio/transformer/params.h"

namespace gnnio::binding {

// Operands as the layer passes them: x [N_src, F], query [N_dst, H, C], w_key [H C, F],
// w_value_t [F, H C], b_value [H C], residual [N_dst, H C]; all of one floating dtype and device,
// contiguous (the caller's .contiguous(), alive while the kernel runs). out [N_dst, H, C] (the
// layout of [N_dst, H C]) and stats [N_dst, H, 2] are allocated here; or, into_residual (the
// inference op), out is residual itself, written in place, and no stats are formed (p.stats null).
inline TransformerFusedParams transformer_fused_params(
    const at::Tensor& rowptr, const at::Tensor& col, const at::Tensor& x, const at::Tensor& query,
    const at::Tensor& w_key, const at::Tensor& w_value_t, const c10::optional<at::Tensor>& b_value,
    const c10::optional<at::Tensor>& residual, const c10::optional<at::Tensor>& b_key, double scale,
    at::Tensor& out, at::Tensor& stats, bool into_residual = false) {
  const char* what = into_residual ? "transformer_fused_inference" : "transformer_fused_forward";
  TORCH_CHECK_VALUE(query.dim() == 3, text(what, ": query must be [N_dst, H, C], got ",
                                           sizes_text(query.sizes())));
  const int64_t num_dst = query.size(0), H = query.size(1), C = query.size(2);
  check_csr(rowptr, col, num_dst, what);
  TORCH_CHECK_VALUE(x.dim() == 2, text(what, ": x must be [N_src, F], got ", sizes_text(x.sizes())));
  const int64_t F = x.size(1);
  TORCH_CHECK_VALUE(w_key.dim() == 2 && w_key.size(0) == H * C && w_key.size(1) == F,
                    text(what, ": w_key must be [H C, F] = [", H * C, ", ", F, "], got ",
                         sizes_text(w_key.sizes())));
  TORCH_CHECK_VALUE(w_value_t.dim() == 2 && w_value_t.size(0) == F && w_value_t.size(1) == H * C,
                    text(what, ": w_value_t must be [F, H C] = [", F, ", ", H * C, "], got ",
                         sizes_text(w_value_t.sizes())));
  TORCH_CHECK_VALUE(!b_value || (b_value->dim() == 1 && b_value->size(0) == H * C),
                    text(what, ": b_value must be [H C]"));
  TORCH_CHECK_VALUE(!b_key || (b_key->dim() == 1 && b_key->size(0) == H * C),
                    text(what, ": b_key must be [H C]"));
  TORCH_CHECK_VALUE(!residual || (residual->dim() == 2 && residual->size(0) == num_dst &&
                                  residual->size(1) == H * C),
                    text(what, ": residual must be [N_dst, H C]"));
  const ScalarType st = scalar_type_of(x, text(what, ": x").c_str());
  for (const at::Tensor* t : {&query, &w_key, &w_value_t}) {
    TORCH_CHECK_TYPE(t->scalar_type() == x.scalar_type(), text(what, ": every operand must be ",
                                                               dtype_text(x.scalar_type())));
    check_same_device(*t, "an operand", x, "x");
    TORCH_INTERNAL_ASSERT(t->is_contiguous());
  }
  for (const auto* t : {&b_value, &residual, &b_key}) {
    if (!t->has_value()) continue;
    TORCH_CHECK_TYPE((*t)->scalar_type() == x.scalar_type(), text(what, ": every operand must be ",
                                                                  dtype_text(x.scalar_type())));
    check_same_device(**t, "an operand", x, "x");
    TORCH_INTERNAL_ASSERT((*t)->is_contiguous());
  }
  TORCH_INTERNAL_ASSERT(x.is_contiguous());
  check_same_device(rowptr, "rowptr", x, "x");
  check_same_device(col, "col", x, "x");
  if (into_residual) {
    TORCH_INTERNAL_ASSERT(residual.has_value());
    // other threads read the operands while residual is written
    for (const at::Tensor* t : {&x, &query, &w_key, &w_value_t}) at::assert_no_overlap(*residual, *t);
    if (b_value) at::assert_no_overlap(*residual, *b_value);
    out = *residual;
  } else {
    out = at::empty({num_dst, H, C}, x.options());
    stats = at::empty({num_dst, H, 2}, x.options());
  }
  TransformerFusedParams p;
  p.rowptr = rowptr.data_ptr();
  p.col = col.data_ptr();
  p.index_type = index_type_of(rowptr, "rowptr");
  p.scalar_type = st;
  p.num_dst = num_dst;
  p.num_src = x.size(0);
  p.heads = H;
  p.channels = C;
  p.features = F;
  p.x = x.data_ptr();
  p.query = query.data_ptr();
  p.w_key = w_key.data_ptr();
  p.w_value_t = w_value_t.data_ptr();
  p.b_value = b_value ? b_value->data_ptr() : nullptr;
  p.residual = residual ? residual->data_ptr() : nullptr;
  p.b_key = b_key ? b_key->data_ptr() : nullptr;
  p.scale = scale;
  p.out = out.data_ptr();
  p.stats = into_residual ? nullptr : stats.data_ptr();
  return p;
}

// The operands made contiguous, kept alive for the kernel's call. align16 (CUDA): an operand
// whose data is not 16-byte aligned (a contiguous view at an odd offset: x[:, 1:] of one row,
// a slice of a flat buffer) is copied, as the kernel reads float4s
// (transformer_fused_cuda_supported), rather than refused where the layer planned the fused form.
struct TransformerFusedOperands {
  at::Tensor x, query, w_key, w_value_t;
  c10::optional<at::Tensor> b_value, residual, b_key;
  TransformerFusedOperands(const at::Tensor& x_, const at::Tensor& query_, const at::Tensor& w_key_,
                           const at::Tensor& w_value_t_, const c10::optional<at::Tensor>& b_value_,
                           const c10::optional<at::Tensor>& residual_,
                           const c10::optional<at::Tensor>& b_key_, bool align16 = false) {
    auto prepare = [align16](const at::Tensor& t) {
      at::Tensor c = t.contiguous();
      if (align16 && c.numel() > 0 && reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0)
        c = c.clone(at::MemoryFormat::Contiguous);
      return c;
    };
    x = prepare(x_);
    query = prepare(query_);
    w_key = prepare(w_key_);
    w_value_t = prepare(w_value_t_);
    if (b_value_) b_value = prepare(*b_value_);
    if (residual_) residual = prepare(*residual_);
    if (b_key_) b_key = prepare(*b_key_);
  }
};

// The inference op writes out into residual: it must be the tensor the kernel writes (contiguous,
// and 16-byte aligned on CUDA), not a copy that TransformerFusedOperands would make of it.
// (transformer_fused_params checks that it shares no memory with the operands.)
inline void check_residual_in_place(const at::Tensor& residual, bool align16) {
  TORCH_CHECK_VALUE(residual.is_contiguous() &&
                        (!align16 || reinterpret_cast<uintptr_t>(residual.data_ptr()) % 16 == 0),
                    "transformer_fused_inference: residual must be contiguous",
                    align16 ? " and 16-byte aligned" : "", " (out is written into it in place)");
}

}  // namespace gnnio::binding
