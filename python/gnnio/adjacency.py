"""Sparse adjacency inputs: a ``torch.sparse`` COO, CSR or CSC tensor ``adj_t`` of shape
``[num_dst, num_src]`` (PyG's transposed adjacency: row i lists the sources j of i's incoming
edges) in place of an edge_index.

An edge's id is its position in the tensor's storage (the order of ``indices()`` for COO, of
``col_indices()`` for CSR, of ``row_indices()`` for CSC), which is the order PyG's
``to_edge_index`` gives and so the order of ``edge_attr`` rows and returned attention weights.
Duplicate entries are separate edges. A CSR tensor (and a coalesced COO one) already is the
destination-major CSR the kernels read, so a Graph built from it sorts nothing; a CSC tensor is
the source-major one a backward pass reads.
"""
from typing import NamedTuple, Optional, Tuple

import torch

_LAYOUTS = (torch.sparse_coo, torch.sparse_csr, torch.sparse_csc)


class Adjacency(NamedTuple):
    edge_index: torch.Tensor  # [2, E] (source, destination) in storage order
    size: Tuple[int, int]  # (num_src, num_dst)
    rows: Optional[str]  # 'dst' or 'src': the storage is that CSR, with rowptr and col below
    rowptr: Optional[torch.Tensor]
    col: Optional[torch.Tensor]


def is_sparse_adjacency(t) -> bool:
    return isinstance(t, torch.Tensor) and t.layout != torch.strided


def _check(adj: torch.Tensor) -> None:
    if adj.layout not in _LAYOUTS:
        raise NotImplementedError(f"sparse adjacency layout {adj.layout} is not supported "
                                  "(supported: sparse_coo, sparse_csr, sparse_csc)")
    if adj.sparse_dim() != 2 or (adj.layout != torch.sparse_coo and adj.dim() - adj.dense_dim() != 2):
        raise ValueError("a sparse adjacency must be a 2-D matrix adj_t [num_dst, num_src], got "
                         f"shape {list(adj.shape)} with {adj.sparse_dim()} sparse dimensions")


def _expand_ptr(ptr: torch.Tensor, num_rows: int, nnz: int, name: str, dtype) -> torch.Tensor:
    """Row id of each stored entry; checks the pointer (torch does not, unless asked)."""
    if ptr.numel() != num_rows + 1:
        raise ValueError(f"{name} has {ptr.numel()} entries, expected {num_rows + 1}")
    counts = ptr.diff()
    if int(ptr[0]) != 0 or int(ptr[-1]) != nnz or bool((counts < 0).any()):
        raise ValueError(f"{name} is not a valid compressed pointer for {nnz} entries")
    return torch.repeat_interleave(torch.arange(num_rows, dtype=dtype, device=ptr.device),
                                   counts.to(dtype), output_size=nnz)


def _edges(src: torch.Tensor, dst: torch.Tensor, dtype) -> torch.Tensor:
    edges = torch.empty(2, src.numel(), dtype=dtype, device=src.device)
    edges[0].copy_(src)
    edges[1].copy_(dst)
    return edges


def adjacency_edges(adj: torch.Tensor, dtype=torch.long) -> Adjacency:
    """The edges of ``adj_t`` in storage order (in ``dtype``, which must hold every id), its
    (num_src, num_dst), and the compressed form its storage already is, if any."""
    _check(adj)
    num_dst, num_src = int(adj.size(0)), int(adj.size(1))
    if adj.layout == torch.sparse_coo:
        dst, src = adj._indices()
        rowptr = None
        if adj.is_coalesced():  # sorted by (row, col): the destination-major CSR
            counts = torch.bincount(dst, minlength=num_dst)
            rowptr = torch.zeros(num_dst + 1, dtype=torch.long, device=dst.device)
            torch.cumsum(counts, 0, out=rowptr[1:])
        return Adjacency(_edges(src, dst, dtype), (num_src, num_dst),
                         None if rowptr is None else "dst", rowptr, src)
    if adj.layout == torch.sparse_csr:
        rowptr, src = adj.crow_indices(), adj.col_indices()
        dst = _expand_ptr(rowptr, num_dst, src.numel(), "crow_indices", dtype)
        return Adjacency(_edges(src, dst, dtype), (num_src, num_dst), "dst", rowptr, src)
    colptr, dst = adj.ccol_indices(), adj.row_indices()
    src = _expand_ptr(colptr, num_src, dst.numel(), "ccol_indices", dtype)
    return Adjacency(_edges(src, dst, dtype), (num_src, num_dst), "src", colptr, dst)


def adjacency_values(adj: torch.Tensor) -> torch.Tensor:
    """The stored values in storage order, differentiable where torch makes them so."""
    _check(adj)
    if adj.layout == torch.sparse_coo and not adj.is_coalesced():
        if adj.requires_grad:
            raise NotImplementedError("gradients through the values of an uncoalesced sparse COO "
                                      "adjacency are not supported; call .coalesce() first")
        return adj._values()
    return adj.values()


def adjacency_values_2d(adj: torch.Tensor) -> Optional[torch.Tensor]:
    """The values when they have dense dimensions ([E, D]: PyG's message passing then takes
    them as edge_attr where none is given), else None."""
    values = adjacency_values(adj)
    return values if values.dim() > 1 else None


def adjacency_key(adj: torch.Tensor) -> tuple:
    """What identifies adj_t for a cache: its index storage and the version counter its
    components share, which in-place changes through the tensor's own accessors (``values()``,
    ``col_indices()``, ...) bump. Changes through the tensors it was built from are not seen
    (torch gives the sparse tensor a version counter of its own)."""
    if adj.layout == torch.sparse_coo:
        parts = (adj._indices(),)
    elif adj.layout == torch.sparse_csr:
        parts = (adj.crow_indices(), adj.col_indices())
    else:
        parts = (adj.ccol_indices(), adj.row_indices())
    # An inference tensor has no version counter (and can be changed in place inside inference
    # mode): a new object, equal to no earlier key, so nothing cached from it is reused.
    version = object() if adj.is_inference() else adj._version
    return (adj.layout, tuple(adj.shape), version) + tuple(
        (p.data_ptr(), p.numel()) for p in parts)


def set_values(adj: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """adj_t's own structure holding ``values`` (one row per stored entry, in storage order),
    as PyG's ``set_sparse_value`` builds it. (PyG coalesces a COO result: a no-op for the
    coalesced COO it takes; an uncoalesced one keeps its entries, so each holds its own row.)"""
    shape = tuple(adj.shape[:2]) + tuple(values.shape[1:])
    if adj.layout == torch.sparse_coo:
        return torch.sparse_coo_tensor(adj._indices(), values, shape,
                                       is_coalesced=adj.is_coalesced())
    if adj.layout == torch.sparse_csr:
        return torch.sparse_csr_tensor(adj.crow_indices(), adj.col_indices(), values, shape)
    return torch.sparse_csc_tensor(adj.ccol_indices(), adj.row_indices(), values, shape)


def sorted_adjacency(edges: torch.Tensor, size: Tuple[int, int], values: torch.Tensor,
                     layout) -> Tuple[torch.Tensor, torch.Tensor]:
    """A sparse adj_t ``[num_dst, num_src, *values.shape[1:]]`` of the given layout holding
    ``values`` on the edges (source, destination) ``edges``, its entries sorted by (row, column)
    (by (column, row) for CSC): the form PyG's loop utilities give a coalesced input. Returns
    (adj_t, values in the new entry order)."""
    src, dst = edges[0].long(), edges[1].long()
    num_src, num_dst = size
    shape = (num_dst, num_src) + tuple(values.shape[1:])
    major, minor, n_major = (src, dst, num_src) if layout == torch.sparse_csc else (dst, src, num_dst)
    keys = major * max(num_src, num_dst, 1) + minor
    order = torch.argsort(keys, stable=True)
    values = values[order]
    if layout == torch.sparse_coo:
        unique = keys.numel() < 2 or not bool((keys[order].diff() == 0).any())
        adj = torch.sparse_coo_tensor(torch.stack([dst[order], src[order]]), values, shape,
                                      is_coalesced=unique)
        return adj, values
    ptr = torch.zeros(n_major + 1, dtype=torch.long, device=src.device)
    torch.cumsum(torch.bincount(major, minlength=n_major), 0, out=ptr[1:])
    make = torch.sparse_csc_tensor if layout == torch.sparse_csc else torch.sparse_csr_tensor
    return make(ptr, minor[order], values, shape), values
