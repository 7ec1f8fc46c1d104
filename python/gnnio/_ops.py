"""Loads the compiled operators and registers their fake (meta) kernels and autograd.

The C++ side declares the schemas (csrc/torch/registration.cpp) and the CPU / CUDA kernels;
this module adds what torch.compile and autograd need, with torch.library.
"""
import functools
import glob
import os

import torch
from torch.utils._pytree import tree_leaves


def _load_library():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = sorted(glob.glob(os.path.join(here, "_C*.so")))
    if not candidates:
        raise ImportError(
            "gnnio's compiled extension (gnnio/_C*.so) was not found; build it with "
            "`pip install --no-build-isolation -e .` from the repository root")
    torch.ops.load_library(candidates[0])


_load_library()
ops = torch.ops.gnnio

HAS_CUDA_KERNELS = torch._C._dispatch_has_kernel_for_dispatch_key("gnnio::spmm", "CUDA")


HALF_TYPES = (torch.float16, torch.bfloat16)


def widened_on_cpu(call, like: torch.Tensor):
    """``call`` itself, unless ``like`` (the features) is 16-bit on the CPU, whose kernels take
    float32 and float64. Then a wrapper of ``call``: its 16-bit tensors go in as float32 copies
    (exact) and its floating results come back rounded once to ``like``'s dtype. That is the CUDA
    kernels' precision model (16-bit operands, float32 inside, each result rounded once), so a
    16-bit model or ``torch.autocast`` runs on the CPU as on CUDA; the copies cost memory, not
    accuracy. Autograd sees the casts: gradients come back in the dtype the same way.
    (Returning ``call`` itself keeps every other call as it was under torch.compile: a wrapper
    around the op in between put each op in a graph of its own.)"""
    if like.dtype not in HALF_TYPES or like.device.type != "cpu":
        return call
    dtype = like.dtype

    def up(v):
        return v.float() if isinstance(v, torch.Tensor) and v.dtype in HALF_TYPES else v

    def down(v):
        if isinstance(v, torch.Tensor) and v.dtype.is_floating_point:
            return v.to(dtype)
        return tuple(down(t) for t in v) if isinstance(v, tuple) else v

    def in_float32(*args, **kwargs):
        return down(call(*[up(a) for a in args], **{k: up(v) for k, v in kwargs.items()}))
    return in_float32


# ---------------------------------------------------------------------------------------------
# Fake kernels: output shapes follow from input shapes and int arguments only.

def _register_fake(name):
    """torch.library.register_fake, refusing real tensors mixed with meta ones.

    The dispatcher sends a call to the Meta kernel when any one input is on the meta device, so
    without this a raw op given one meta tensor and the rest on the CPU (or CUDA) would return
    uninitialised memory instead of the device error the real kernels raise. Under
    torch.compile the inputs are fake tensors that report their real device, so this never
    fires there."""
    def wrap(fake):
        @functools.wraps(fake)
        def checked(*args, **kwargs):
            devices = {t.device for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
            if len(devices) > 1 and any(d.type == "meta" for d in devices):
                raise ValueError(f"{name}: inputs are on different devices "
                                 f"({', '.join(sorted(str(d) for d in devices))}); "
                                 "move them to one device")
            return fake(*args, **kwargs)
        return torch.library.register_fake(name)(checked)
    return wrap


@_register_fake("gnnio::csr_from_coo")
def _csr_from_coo_fake(row, col, num_rows, num_cols):
    return row.new_empty(num_rows + 1), row.new_empty(row.numel()), row.new_empty(row.numel())


@_register_fake("gnnio::spmm")
def _spmm_fake(rowptr, col, value, x, num_rows, num_cols, cache_key, rowptr_t, col_t, value_t,
               cache_key_t):
    torch._check(x.dim() == 2, lambda: "spmm: x must be 2-D")
    return x.new_empty(num_rows, x.size(1))


@_register_fake("gnnio::sddmm")
def _sddmm_fake(rowptr, col, a, b):
    return a.new_empty(col.numel())


@_register_fake("gnnio::wsb_from_coo")
def _wsb_from_coo_fake(row, col, num_rows, num_cols):
    num_tiles = torch.library.get_ctx().new_dynamic_size()  # known only once the tiles are counted
    return (row.new_empty((num_rows + 15) // 16 + 1), row.new_empty(num_tiles),
            row.new_empty(row.numel(), dtype=torch.int64))


@_register_fake("gnnio::wsb_spmm")
def _wsb_spmm_fake(block_rowptr, block_col, values, x, num_rows, num_cols, block_rowptr_t,
                   block_col_t, values_t):
    torch._check(x.dim() == 2, lambda: "wsb_spmm: x must be 2-D")
    return x.new_empty(num_rows, x.size(1))


@_register_fake("gnnio::wsb_sddmm")
def _wsb_sddmm_fake(block_rowptr, block_col, a, b):
    return a.new_empty(block_col.numel(), 16, 16)


@_register_fake("gnnio::segment_reduce")
def _segment_reduce_fake(rowptr, col, x, num_rows, num_cols, reduce, rowptr_t, col_t, t2c,
                         heavy_rows=None, heavy_items=None, light_max_degree=2**62,
                         heavy_src=None, heavy_src_items=None, light_max_out_degree=2**62,
                         weight=None):
    return x.new_empty(num_rows, x.size(1)), rowptr.new_empty(num_rows, x.size(1))


@_register_fake("gnnio::segment_reduce_backward")
def _segment_reduce_backward_fake(rowptr_t, col_t, t2c, arg, grad_out, num_src, heavy_src=None,
                                  heavy_src_items=None, light_max_out_degree=2**62, weight=None):
    return grad_out.new_empty(num_src, grad_out.size(1))


@_register_fake("gnnio::segment_reduce_weight_backward")
def _segment_reduce_weight_backward_fake(col, x, arg, grad_out):
    return x.new_empty(col.numel())


@_register_fake("gnnio::wsb_gat_attention")
def _wsb_gat_attention_fake(block_rowptr, block_col, count, src_score, dst_score, value, num_src,
                            num_dst, negative_slope, save_out_acc):
    heads, channels = value.size(1), value.size(2)
    stats_dtype = torch.float64 if value.dtype == torch.float64 else torch.float32
    acc = save_out_acc and value.element_size() == 2
    return (value.new_empty(num_dst, heads, channels),
            value.new_empty(num_dst, heads, 2, dtype=stats_dtype),
            value.new_empty(*((num_dst, heads, channels) if acc else (0,)), dtype=torch.float32))


@_register_fake("gnnio::wsb_gat_attention_backward")
def _wsb_gat_attention_backward_fake(block_rowptr, block_col, count, block_rowptr_t, block_col_t,
                                     count_t, src_score, dst_score, value, out, stats, grad_out,
                                     negative_slope, needs):
    return (src_score.new_empty(src_score.shape) if needs[0] else None,
            dst_score.new_empty(dst_score.shape) if needs[1] and dst_score is not None else None,
            value.new_empty(value.shape) if needs[2] else None)


@_register_fake("gnnio::graph_attention")
def _graph_attention_fake(rowptr, col, kind, value, src_score, dst_score, edge_score, query, key,
                          edge_key, att, edge_value, num_dst, negative_slope, scale, dropout, seed,
                          need_weights, rowptr_t, col_t, t2c, heavy_rows=None, heavy_items=None,
                          light_max_degree=2**62, heavy_src=None, heavy_src_items=None,
                          light_max_out_degree=2**62, save_out_acc=False, bias=None,
                          backward_in_place=False):
    acc = torch.float64 if value.dtype == torch.float64 else torch.float32
    heads, channels = value.size(1), value.size(2)
    if kind == 2 and heads == 1 and query is not None and query.size(1) > 1:
        heads = query.size(1)  # shared key and value rows (attention_common.h)
    # attention_common.h's out_acc_available: bf16/fp16, or float32 on CUDA (out before the bias)
    keep_acc = save_out_acc and (value.dtype in (torch.float16, torch.bfloat16)
                                 or (value.dtype == torch.float32 and value.device.type == "cuda"))
    return (value.new_empty(num_dst, heads, channels), value.new_empty(num_dst, heads, 2, dtype=acc),
            value.new_empty(col.numel() if need_weights else 0, heads, dtype=acc),
            value.new_empty((num_dst, heads, channels) if keep_acc else (0,), dtype=acc))


@_register_fake("gnnio::graph_attention_delta")
def _graph_attention_delta_fake(out, grad_out):
    return grad_out.new_empty(grad_out.size(0), grad_out.size(1), dtype=torch.float32)


@_register_fake("gnnio::graph_attention_backward")
def _graph_attention_backward_fake(rowptr, col, kind, value, operands, num_dst, coeffs, seed,
                                   rowptr_t, col_t, t2c, splits, light_max, out, stats,
                                   grad_out, needs):
    # need 1: a gradient; 3: one written in place of the operand (backward_in_place), which the
    # op returns as that gradient; 0, and 2 (key's summed into value's): an empty placeholder
    grads = [value.new_empty(value.shape) if needs[0] else value.new_empty(0)]
    for need, t in zip(needs[1:], operands):
        grads.append(t.new_empty(t.shape) if need in (1, 3) and t is not None else value.new_empty(0))
    return grads


@_register_fake("gnnio::head_scores")
def _head_scores_fake(x, att):
    return att.new_empty(att.size(0), x.size(0), x.size(1))


@_register_fake("gnnio::head_scores_backward")
def _head_scores_backward_fake(x, att, grad_score, x_grad, att_grad, grad_x_into=None):
    return (x.new_empty(x.shape) if x_grad and grad_x_into is None else x.new_empty(0),
            att.new_empty(att.shape) if att_grad else att.new_empty(0))


@_register_fake("gnnio::transformer_fused_forward")
def _transformer_fused_forward_fake(rowptr, col, x, query, w_key, w_value_t, b_value, residual,
                                    scale, heavy_rows=None, heavy_items=None, light_max_degree=2**62,
                                    b_key=None):
    n, h, c = query.shape
    return x.new_empty(n, h, c), x.new_empty(n, h, 2)


@_register_fake("gnnio::transformer_fused_inference")
def _transformer_fused_inference_fake(rowptr, col, x, query, w_key, w_value_t, b_value, residual,
                                      scale, heavy_rows=None, heavy_items=None,
                                      light_max_degree=2**62):
    return None


@_register_fake("gnnio::column_sum")
def _column_sum_fake(x):
    return x.new_empty(x.size(1))


def _column_sum_setup(ctx, inputs, output):
    ctx.rows = inputs[0].size(0)


def _column_sum_backward(ctx, grad):
    return grad.unsqueeze(0).expand(ctx.rows, -1)


# d x of a column sum is d out on every row: registered here (one line), so a bias gradient
# that a second-order loss reads stays differentiable.
torch.library.register_autograd("gnnio::column_sum", _column_sum_backward,
                                setup_context=_column_sum_setup)


# Autograd of spmm, wsb_spmm, segment_reduce, graph_attention and head_scores is registered in C++ (csrc/torch/*_autograd.cpp): no Python per call.
