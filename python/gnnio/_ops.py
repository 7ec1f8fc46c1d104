"""Loads the compiled operators and registers their fake (meta) kernels and autograd.

The C++ side declares the schemas (csrc/torch/registration.cpp) and the CPU / CUDA kernels;
this module adds what torch.compile and autograd need, with torch.library.
"""
import glob
import os

import torch


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


# ---------------------------------------------------------------------------------------------
# Fake kernels: output shapes follow from input shapes and int arguments only.

@torch.library.register_fake("gnnio::csr_from_coo")
def _csr_from_coo_fake(row, col, num_rows, num_cols):
    return row.new_empty(num_rows + 1), row.new_empty(row.numel()), row.new_empty(row.numel())


@torch.library.register_fake("gnnio::spmm")
def _spmm_fake(rowptr, col, value, x, num_rows, num_cols, cache_key, rowptr_t, col_t, value_t,
               cache_key_t):
    torch._check(x.dim() == 2, lambda: "spmm: x must be 2-D")
    return x.new_empty(num_rows, x.size(1))


@torch.library.register_fake("gnnio::sddmm")
def _sddmm_fake(rowptr, col, a, b):
    return a.new_empty(col.numel())


# ---------------------------------------------------------------------------------------------
# Autograd of spmm: out = A x, so dx = Aᵀ dout through the cached transpose (never rebuilt),
# and dA's values are SDDMM(dout, x) on A's own pattern.

def _spmm_setup_context(ctx, inputs, output):
    rowptr, col, value, x, num_rows, num_cols, key, rowptr_t, col_t, value_t, key_t = inputs
    ctx.save_for_backward(rowptr, col, value, x, rowptr_t, col_t, value_t)
    ctx.shape = (num_rows, num_cols, key, key_t)


def _spmm_backward(ctx, grad_out):
    rowptr, col, value, x, rowptr_t, col_t, value_t = ctx.saved_tensors
    num_rows, num_cols, key, key_t = ctx.shape
    grad_out = grad_out.contiguous()
    grad_x = grad_value = None
    if ctx.needs_input_grad[3]:
        torch._check(rowptr_t.numel() == num_cols + 1,
                     lambda: "spmm backward needs the transposed CSR (rowptr_t)")
        grad_x = ops.spmm(rowptr_t, col_t, value_t, grad_out, num_cols, num_rows, key_t,
                          rowptr, col, value, key)
    if ctx.needs_input_grad[2]:
        grad_value = ops.sddmm(rowptr, col, grad_out, x.contiguous())
    return None, None, grad_value, grad_x, None, None, None, None, None, None, None


torch.library.register_autograd("gnnio::spmm", _spmm_backward, setup_context=_spmm_setup_context)
