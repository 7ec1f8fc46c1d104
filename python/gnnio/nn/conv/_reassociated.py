"""TransformerConv's attention in the reassociated form (see gnnio.nn.TransformerConv and
gnnio.plan.plan_transformer), as one autograd node:

- forward: q~_i,h = W_k,h^T q_i,h (a GEMM per head), the op with x as the key and value row
  every head shares (each source row read once per edge for all heads), then
  m_i,h = W_v,h x~_i,h + b_v (a GEMM per head; no b_v on a row without neighbours). No keys or
  values are projected.
- backward: the direct form's, which needs no [N, H, F] tensor: k = W_k x + b_k and v = W_v x + b_v
  projected here, the per-head backward kernels with the forward's softmax statistics (their
  max shifted by the key bias's term scale q_i . b_k,h, which the reassociated scores drop and
  the direct ones keep), then the linears' own gradients. Per (edge, head) the direct backward
  gathers C channels; a reassociated one would gather F per head (q~ and the gradient of x~).

Its gradients are the direct form's sums on the forward's weights (which equal the direct
weights up to rounding), so lin_key.bias gets the direct form's gradient: zero up to rounding."""
import os
from typing import Optional

import torch
from torch import Tensor

from gnnio._ops import ops as _ops
from gnnio.ops import _split_args, column_sum


def headwise(x: Tensor, w: Tensor) -> Tensor:
    """y[n, h] = x[n, h] @ w[h] for x [N, H, A], w [H, A, B]: one batched GEMM written straight
    into [N, H, B] (no permuted copy of the [N, H, F] operands)."""
    out = x.new_empty(x.size(0), x.size(1), w.size(2))
    torch.bmm(x.transpose(0, 1), w, out=out.transpose(0, 1))
    return out


def _fused_forward(graph, x_src: Tensor, query: Tensor, w_key: Tensor, b_key: Optional[Tensor],
                   w_value: Tensor, b_value: Optional[Tensor], residual: Optional[Tensor],
                   scale: float, plan, into_residual: bool = False):
    """gnnio::transformer_fused_forward with the planner's split (CUDA): (out [N_dst, H, C],
    stats [N_dst, H, 2], their max shifted by the key bias's term as the direct form's).
    into_residual (a call without a backward; residual contiguous, [N_dst, H C]):
    gnnio::transformer_fused_inference writes out into residual itself and forms no stats:
    (residual itself, [N_dst, H C]: not a view, which a later in-place op under grad mode
    would refuse, None)."""
    fwd = graph.csr_by_dst
    split = (None, None, 2**62)
    if plan is not None and plan.heavy_rows is not None:
        split = (plan.heavy_rows, plan.heavy_items, plan.light_max_degree)
    operands = (fwd.rowptr, fwd.col, x_src.contiguous(), query, w_key.contiguous(),
                w_value.t().contiguous(), b_value)
    if into_residual:
        _ops.transformer_fused_inference(*operands, residual, float(scale), *split)
        return residual, None
    return _ops.transformer_fused_forward(
        *operands, None if residual is None else residual.contiguous(),
        float(scale), *split, b_key)


class ReassociatedAttention(torch.autograd.Function):
    """(x_src [N_src, F], query [N_dst, H, C], W_k [H C, F], b_k, W_v [H C, F], b_v, graph,
    scale, plan, need_grad) -> the attention output [N_dst, H, C] (plan: gnnio.plan.plan_attention's,
    on CUDA; None on the CPU). need_grad: whether a backward can follow (grad mode on and an
    input that requires grad: needs_input_grad ignores the grad mode); without it nothing is
    kept or built for one."""

    @staticmethod
    def delta_in_pass_a() -> bool:
        """Whether the CUDA backward forms D_i in its pass A (when query needs a gradient), so
        that the forward keeps no out (GNNIO_DOT_DELTA_IN_PASS_A=0 turns it off)."""
        return os.environ.get("GNNIO_DOT_DELTA_IN_PASS_A", "1")[:1] != "0"

    @staticmethod
    def forward(ctx, x_src: Tensor, query: Tensor, w_key: Tensor, b_key: Optional[Tensor],
                w_value: Tensor, b_value: Optional[Tensor], graph, scale: float, plan,
                need_grad: bool, fused: bool = False, residual: Optional[Tensor] = None) -> Tensor:
        heads, channels = query.shape[1:]
        features = x_src.size(1)
        query = query.contiguous()
        fwd = graph.csr_by_dst
        if fused:
            # out [N_dst, H, C] as the op allocates it: a view made here would be an output view
            # of a custom Function, which autograd forbids the caller to change in place
            out, stats = _fused_forward(graph, x_src, query, w_key, b_key, w_value, b_value,
                                        residual, scale, plan)
            if need_grad:  # what the backward reads, built here as the unfused form's op does
                graph.backward_csr(True)
                graph.src_slot_to_dst_slot
        else:
            assert residual is None
            query_t = headwise(query, w_key.view(heads, channels, features))  # [N_dst, H, F]
            rows = x_src.contiguous().unsqueeze(1)  # [N_src, 1, F]: every head's key and value
            rowptr_t, col_t = graph.backward_csr(need_grad)  # (empty without a backward)
            t2c = graph.src_slot_to_dst_slot if need_grad else col_t
            mixed, stats, _, _ = _ops.graph_attention(
                fwd.rowptr, fwd.col, 2, rows, None, None, None, query_t, rows, None, None, None,
                graph.num_dst, 0.2, float(scale), 0.0, 0, False, rowptr_t, col_t, t2c,
                *_split_args(plan))
            del query_t
            out = headwise(mixed, w_value.view(heads, channels, features).transpose(1, 2))
            del mixed
            if b_value is not None:
                has_rows = (graph.in_degree() > 0).to(out.dtype).view(-1, 1, 1)
                out.addcmul_(has_rows, b_value.view(1, heads, channels))
        if b_key is not None and not fused:  # the direct scores' max: + scale q_i . b_k,h
            shift = (query.to(stats.dtype) * b_key.to(stats.dtype).view(1, heads, channels)).sum(-1)
            stats[..., 0] += float(scale) * shift
        # The CUDA backward forms D_i = dout_i . out_i in its pass A when it walks the rows for d
        # query (attention_backward_cuda_delta_in_pass_a; GNNIO_DOT_DELTA_IN_PASS_A=0 turns it
        # off); otherwise it reads out, as the CPU one does: a copy, since the caller may change
        # the returned out in place (an activation after the layer). Nothing without a backward.
        in_pass_a = out.is_cuda and ctx.needs_input_grad[1] and ReassociatedAttention.delta_in_pass_a()
        if not need_grad:
            kept = out.new_empty(0)
        elif in_pass_a:
            kept = out.new_empty(0, dtype=torch.float32)
        else:
            assert residual is None  # (the layer fuses the skip only where out is not kept)
            kept = out.clone()
        ctx.save_for_backward(x_src, query, w_key, b_key, w_value, b_value, stats, kept)
        ctx.graph, ctx.scale, ctx.plan = graph, float(scale), plan
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x_src, query, w_key, b_key, w_value, b_value, stats, kept = ctx.saved_tensors
        graph = ctx.graph
        n_src, features = x_src.shape
        heads, channels = query.shape[1:]
        need_x, need_q, need_wk, need_bk, need_wv, need_bv = ctx.needs_input_grad[:6]
        need_key = need_x or need_wk or (need_bk and b_key is not None)
        need_value = need_x or need_wv or (need_bv and b_value is not None)
        key = torch.nn.functional.linear(x_src, w_key, b_key).view(n_src, heads, channels)
        value = torch.nn.functional.linear(x_src, w_value, b_value).view(n_src, heads, channels)
        # key and value are this backward's own: on CUDA their gradients may take their memory (3).
        own = 3 if x_src.is_cuda else 1
        needs = [own if need_value else 0, 0, 0, 0, int(need_q), own if need_key else 0, 0, 0, 0]
        fwd = graph.csr_by_dst
        rowptr_t, col_t = graph.backward_csr(True)
        plan = ctx.plan  # the backward op's form of the split (graph_attention_backward's schema)
        splits = [None] * 4 if plan is None else [plan.heavy_rows, plan.heavy_items, plan.heavy_src,
                                                  plan.heavy_src_items]
        light_max = [2**62] * 2 if plan is None else [plan.light_max_degree, plan.light_max_out_degree]
        grads = _ops.graph_attention_backward(
            fwd.rowptr, fwd.col, 2, value, [None, None, None, query, key, None, None, None],
            graph.num_dst, [0.2, ctx.scale, 0.0], 0, rowptr_t, col_t, graph.src_slot_to_dst_slot,
            splits, light_max, kept, stats, grad_out.contiguous(), needs)
        d_value = grads[0].view(n_src, heads * channels) if need_value else None
        d_query = grads[4] if need_q else None
        d_key = grads[5].view(n_src, heads * channels) if need_key else None
        d_x = None
        if need_x:
            d_x = d_key @ w_key
            d_x.addmm_(d_value, w_value)
        d_wk = d_key.t() @ x_src if need_wk else None
        # (column_sum: 0.13 ms where .sum(0) took 0.30 on an H200 at 1M x 128; bench/NOTES.md v25)
        d_bk = column_sum(d_key) if need_bk and b_key is not None else None
        d_wv = d_value.t() @ x_src if need_wv else None
        d_bv = column_sum(d_value) if need_bv and b_value is not None else None
        need_residual = len(ctx.needs_input_grad) > 11 and ctx.needs_input_grad[11]
        d_residual = grad_out.reshape(-1, heads * channels) if need_residual else None
        return (d_x, d_query, d_wk, d_bk, d_wv, d_bv, None, None, None, None, None, d_residual)[
            :len(ctx.needs_input_grad)]
