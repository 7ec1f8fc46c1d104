// The one place where gnnio's operators are declared. Implementations register per device in
// graph_ops.cpp / spmm_ops.cpp / ... (CPU) and cuda/*.cpp (CUDA); autograd and fake (meta) kernels
// are registered from Python (gnnio/_ops.py) with torch.library.
#include <Python.h>
#include <torch/library.h>

#include <mutex>
#include <unordered_set>
#include <vector>

#include "cache_registry.h"

namespace gnnio::binding {
namespace {

std::mutex& hooks_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::function<void(int64_t)>>& hooks() {
  static std::vector<std::function<void(int64_t)>> h;
  return h;
}

std::unordered_set<int64_t>& live_keys() {
  static std::unordered_set<int64_t> keys;
  return keys;
}

void register_cache(int64_t cache_key) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  live_keys().insert(cache_key);
}

void release_cache(int64_t cache_key) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  live_keys().erase(cache_key);
  for (auto& hook : hooks()) hook(cache_key);
}

}  // namespace

bool cache_is_live(int64_t cache_key) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  return live_keys().count(cache_key) > 0;
}

void register_cache_release_hook(std::function<void(int64_t)> hook) {
  std::lock_guard<std::mutex> lock(hooks_mutex());
  hooks().push_back(std::move(hook));
}

}  // namespace gnnio::binding

// The raw ops check shapes, dtypes, devices and contiguity, and trust the structure they are
// given (monotone rowptr ending at col.numel(), ids in range): a CSR built by gnnio.Graph, whose
// constructor validates the user's edge_index. gnnio.ops is the checked entry point.
TORCH_LIBRARY(gnnio, m) {
  // CSR over num_rows rows from a COO list (stable: each row keeps its edges' input order).
  m.def("csr_from_coo(Tensor row, Tensor col, int num_rows, int num_cols) -> "
        "(Tensor rowptr, Tensor col_sorted, Tensor perm)");
  // out[num_rows, F] = A · x with A the CSR (rowptr, col, value); x is [num_cols, F].
  // (rowptr_t, col_t, value_t) is A's transpose, read only by the backward pass. cache_key
  // names the gnnio.Graph that owns the CSR, so cuSPARSE descriptors and workspace are kept
  // with it (-1: no caching).
  m.def("spmm(Tensor rowptr, Tensor col, Tensor? value, Tensor x, int num_rows, int num_cols, "
        "int cache_key, Tensor rowptr_t, Tensor col_t, Tensor? value_t, int cache_key_t) -> Tensor");
  // out[k] = <a[row(k)], b[col[k]]> for each CSR slot k: the gradient of SpMM's values.
  m.def("sddmm(Tensor rowptr, Tensor col, Tensor a, Tensor b) -> Tensor");
  // Weighted block-sparse tiles (gnnio/wsb/params.h) of the matrix whose edges are (row, col):
  // block_rowptr [ceil(num_rows / 16) + 1] and block_col [num_tiles] in row's dtype, and pos
  // int64 [num_edges], each edge's slot in the flattened [num_tiles, 16, 16] tile values.
  m.def("wsb_from_coo(Tensor row, Tensor col, int num_rows, int num_cols) -> "
        "(Tensor block_rowptr, Tensor block_col, Tensor pos)");
  // out[num_rows, F] = A · x with A the WSB (block_rowptr, block_col, values [num_tiles, 16, 16]
  // in x's dtype) and x [num_cols, F]; tensor cores on CUDA. (block_rowptr_t, block_col_t,
  // values_t) is the WSB of A's transpose, read only by the backward pass.
  m.def("wsb_spmm(Tensor block_rowptr, Tensor block_col, Tensor values, Tensor x, int num_rows, "
        "int num_cols, Tensor block_rowptr_t, Tensor block_col_t, Tensor? values_t) -> Tensor");
  // out[t, r, c] = <a[16 b + r], b[16 c0 + c]> for tile t of block row b and block column c0:
  // the gradient of wsb_spmm's values (a: the output gradient, b: the features).
  m.def("wsb_sddmm(Tensor block_rowptr, Tensor block_col, Tensor a, Tensor b) -> Tensor");
  // GAT attention on WSB tiles (gnnio/wsb/attention.h): count [num_tiles, 16, 16] float32 holds
  // the edges of each tile entry; value and src_score have num_src rows (the tiles' columns). out [num_dst, H, C], stats [num_dst, H, 2] (the CSR kernels'
  // (max, sum)), out_acc [num_dst, H, C] float32 when save_out_acc and value is 16-bit (else
  // empty). The backward takes the transpose's WSB and count, out (or out_acc) and stats, and
  // needs = (src_score, dst_score, value); a gradient not needed is returned undefined (None).
  m.def("wsb_gat_attention(Tensor block_rowptr, Tensor block_col, Tensor count, Tensor src_score, "
        "Tensor? dst_score, Tensor value, int num_src, int num_dst, float negative_slope, "
        "bool save_out_acc) -> "
        "(Tensor out, Tensor stats, Tensor out_acc)");
  m.def("wsb_gat_attention_backward(Tensor block_rowptr, Tensor block_col, Tensor count, "
        "Tensor block_rowptr_t, Tensor block_col_t, Tensor count_t, Tensor src_score, "
        "Tensor? dst_score, Tensor value, Tensor out, Tensor stats, Tensor grad_out, "
        "float negative_slope, int[] needs) -> (Tensor, Tensor, Tensor)");
  // out[r, f] = max (or min) of x[col[k], f] over the slots k of row r, and arg[r, f] = the
  // winning slot (-1 for empty rows, whose out is 0). The transposed CSR and t2c (forward slot
  // of each transposed slot) are read only by the backward pass. weight [nnz] (slot order, x's
  // dtype), when given, makes each candidate weight[k] * x[col[k], f] rounded to x's dtype
  // (PyG's message edge_weight * x_j), differentiable in both.
  // heavy_rows / heavy_items / light_max_degree are the planner's degree-aware split (CUDA;
  // gnnio.plan.plan_reduce): rows above light_max_degree are reduced by 2-D tiles. heavy_src /
  // heavy_src_items / light_max_out_degree split the transpose the same way for the backward.
  m.def("segment_reduce(Tensor rowptr, Tensor col, Tensor x, int num_rows, int num_cols, "
        "str reduce, Tensor rowptr_t, Tensor col_t, Tensor t2c, Tensor? heavy_rows=None, "
        "Tensor? heavy_items=None, int light_max_degree=4611686018427387904, "
        "Tensor? heavy_src=None, Tensor? heavy_src_items=None, "
        "int light_max_out_degree=4611686018427387904, Tensor? weight=None) -> (Tensor out, Tensor arg)");
  m.def("segment_reduce_backward(Tensor rowptr_t, Tensor col_t, Tensor t2c, Tensor arg, "
        "Tensor grad_out, int num_src, Tensor? heavy_src=None, Tensor? heavy_src_items=None, "
        "int light_max_out_degree=4611686018427387904, Tensor? weight=None) -> Tensor");
  // segment_reduce_backward's weight: the forward's in transposed slot order (weight[t2c]).
  // The weights' gradient of a weighted segment_reduce: [nnz] in x's dtype, each slot's sum of
  // grad_out * x over the features it won (0 where it won none). arg must be the forward's
  // (its slots are not checked again).
  m.def("segment_reduce_weight_backward(Tensor col, Tensor x, Tensor arg, Tensor grad_out) -> Tensor");
  // Fused graph attention over csr_by_dst (online softmax; gnnio/attention/params.h): kind
  // 0 = GAT, 1 = GATv2, 2 = dot product (Transformer). out [num_dst, H, C], stats [num_dst, H, 2]
  // = (max, sum) of each softmax, weights [E, H] in slot order when need_weights (else empty),
  // out_acc [num_dst, H, C] float32 = out before rounding and before the bias when save_out_acc
  // and the values are bf16/fp16, or float32 on CUDA (else empty; the autograd asks for it to
  // form the backward's D_i from the attention output alone, unrounded).
  // (rowptr_t, col_t, t2c) is the transpose, read only by the backward pass; the heavy_* and
  // light_max_* arguments are the planner's super-node split (CUDA; gnnio.plan.plan_attention).
  // bias [H * C] (value's dtype), when given, is added to every row of out (not of out_acc): a
  // layer's output bias, in the kernel's store of out rather than a second pass over it.
  // backward_in_place (CUDA, kind dot): the backward may write d value and d key into value's
  // and key's own memory, for a caller that owns them and reads them no more (a layer's private
  // projections; see the autograd's conditions). The forward ignores it.
  m.def("graph_attention(Tensor rowptr, Tensor col, int kind, Tensor value, Tensor? src_score, "
        "Tensor? dst_score, Tensor? edge_score, Tensor? query, Tensor? key, Tensor? edge_key, "
        "Tensor? att, Tensor? edge_value, int num_dst, float negative_slope, float scale, "
        "float dropout, SymInt seed, bool need_weights, Tensor rowptr_t, Tensor col_t, Tensor t2c, "
        "Tensor? heavy_rows=None, Tensor? heavy_items=None, int light_max_degree=4611686018427387904, "
        "Tensor? heavy_src=None, Tensor? heavy_src_items=None, "
        "int light_max_out_degree=4611686018427387904, bool save_out_acc=False, "
        "Tensor? bias=None, bool backward_in_place=False) -> (Tensor out, Tensor stats, "
        "Tensor weights, Tensor out_acc)");
  // Gradients [value, src_score, dst_score, edge_score, query, key, edge_key, att, edge_value]
  // (empty tensors where needs[i] is 0; needs[5] == 2: key is value, whose gradient then holds
  // both and key's is empty). operands in that order without value; coeffs =
  // (negative_slope, scale, dropout); splits = (heavy_rows, heavy_items, heavy_src,
  // heavy_src_items); light_max = (light_max_degree, light_max_out_degree). out is the forward's
  // out, or its out_acc for bf16/fp16 values.
  m.def("graph_attention_backward(Tensor rowptr, Tensor col, int kind, Tensor value, "
        "Tensor?[] operands, int num_dst, float[] coeffs, SymInt seed, Tensor rowptr_t, Tensor col_t, "
        "Tensor t2c, Tensor?[] splits, int[] light_max, Tensor out, Tensor stats, "
        "Tensor grad_out, int[] needs) -> Tensor[]");
  // GAT's per-node scores, fused (gnnio/attention/head_scores.h): score[a, n, h] = sum_c
  // x[n, h, c] * att[a, h, c] for 1 to 4 vectors a; att and score in the accumulator type
  // (float64 for float64 x, else float32). The backward returns (d x, d att), each an empty
  // tensor when not asked for; d att is summed per chunk of rows and the chunks in a fixed order.
  // With grad_x_into (x's shape and dtype) d x is added into it, fl(grad_x_into + fl(d x)), and
  // grad_x is returned empty: a caller summing d x with another gradient of x needs no buffer
  // for d x alone.
  m.def("head_scores(Tensor x, Tensor att) -> Tensor");
  m.def("head_scores_backward(Tensor x, Tensor att, Tensor grad_score, bool x_grad, "
        "bool att_grad, Tensor(a!)? grad_x_into=None) -> (Tensor grad_x, Tensor grad_att)");
  // D_i = grad_out_i . out_i per (destination, head), [num_dst, H] float32, in the CUDA
  // backward's summation order (out: the forward's out, or its float32 out_acc for bf16/fp16
  // grad_out). graph_attention_backward takes it in place of out, so the autograd can free out
  // before the gradients are allocated. CUDA only.
  m.def("graph_attention_delta(Tensor out, Tensor grad_out) -> Tensor");
  // TransformerConv's attention in the reassociated form, fused (gnnio/transformer/params.h):
  // out [N_dst, H, C] = W_v,h softmax_j(scale (W_k,h^T q_i,h) . x_j) x_j (+ b_value on rows with
  // edges) (+ residual), and stats [N_dst, H, 2] as graph_attention's, from x [N_src, F], query
  // [N_dst, H, C], w_key [H C, F] and w_value_t [F, H C]. The split (CUDA) walks heavy rows in
  // items. b_key: stats' max gets scale q . b_k (the direct scores' max, which the direct
  // backward reads). No autograd: the
  // layer's backward is the direct form's (gnnio/nn/conv/_reassociated.py).
  m.def("transformer_fused_forward(Tensor rowptr, Tensor col, Tensor x, Tensor query, "
        "Tensor w_key, Tensor w_value_t, Tensor? b_value, Tensor? residual, float scale, "
        "Tensor? heavy_rows=None, Tensor? heavy_items=None, "
        "int light_max_degree=4611686018427387904, Tensor? b_key=None) -> (Tensor out, Tensor stats)");
  // The same out written into residual ([N_dst, H C], contiguous) in place, and no stats: for a
  // call without a backward (nothing reads them), which then needs no [N_dst, H C] buffer of its
  // own and nothing written for rows without edges (out = residual there).
  m.def("transformer_fused_inference(Tensor rowptr, Tensor col, Tensor x, Tensor query, "
        "Tensor w_key, Tensor w_value_t, Tensor? b_value, Tensor(a!) residual, float scale, "
        "Tensor? heavy_rows=None, Tensor? heavy_items=None, "
        "int light_max_degree=4611686018427387904) -> ()");
  // out[c] = sum_r x[r, c] for a [rows, cols] x, in x's dtype, summed in float64 in a fixed
  // order (gnnio/dense/column_sum.h): the bias gradients.
  m.def("column_sum(Tensor x) -> Tensor");
  // Parses the bytes of a Matrix Market file (uint8 tensor).
  m.def("parse_mtx(Tensor text) -> (Tensor row, Tensor col, Tensor value, int num_rows, "
        "int num_cols, bool symmetric)");
  // A Graph registers its cache keys when it is built and releases them when it is
  // garbage-collected; plans are cached only for live keys (a backward pass that outlives its
  // Graph runs uncached instead of leaking a plan under a released key).
  m.def("register_cache(int cache_key) -> ()", &gnnio::binding::register_cache);
  m.def("release_cache(int cache_key) -> ()", &gnnio::binding::release_cache);
}

// The library is loaded with torch.ops.load_library; this stub only lets `import gnnio._C`
// find the shared object.
extern "C" PyObject* PyInit__C(void) {
  static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module);
}
