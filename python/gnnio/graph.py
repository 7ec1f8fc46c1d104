"""gnnio.Graph: a graph structure with every format a layer needs, computed once and cached.

A Graph owns, for one edge_index:
- ``csr_by_dst``: CSR with destinations as rows (what forward aggregations read) and ``perm``,
  the input edge id of each CSR slot (so per-edge inputs given in the caller's order line up);
- ``csr_by_src``: the transpose (sources as rows), built lazily the first time a gradient needs it;
- in/out degrees and statistics for the planner;
- per (dtype, reduce/normalisation) the edge values SpMM multiplies by, in both CSR orders;
- on request, the weighted block-sparse (WSB) tiles of both orders and their values
  (``wsb``, ``wsb_values``, ``wsb_stats``), for the tensor-core SpMM;
- through its ``cache_key``, the cuSPARSE descriptors and workspace of each (dtype, width), which
  the CUDA kernels keep with it and free when the Graph is garbage-collected.

Caches follow torch_sparse's SparseStorage: computed when first needed, reused afterwards, never
keyed on raw pointers of someone else's tensors.
"""
import contextlib
import itertools
import weakref
from typing import NamedTuple, Optional, Tuple

import torch

from gnnio._ops import ops, widened_on_cpu
from gnnio.adjacency import adjacency_edges, is_sparse_adjacency

_INT32_MAX = 2**31 - 1
_cache_keys = itertools.count()


class CSR(NamedTuple):
    rowptr: torch.Tensor  # [num_rows + 1]
    col: torch.Tensor  # [num_edges] column of each CSR slot
    perm: torch.Tensor  # [num_edges] input edge id of each CSR slot


class WSB(NamedTuple):
    """Weighted block-sparse structure: the matrix cut into 16 x 16 tiles, only tiles holding an
    edge stored (csrc/gnnio/wsb/params.h). The values live apart (``Graph.wsb_values``), so one
    structure serves every weighting and dtype."""
    block_rowptr: torch.Tensor  # [ceil(num_rows / 16) + 1] first tile of each block of 16 rows
    block_col: torch.Tensor  # [num_tiles] block column of each tile, increasing in a block row
    pos: torch.Tensor  # int64 [num_edges] slot of each input edge in the flat [num_tiles * 256] values


def _plain(t: torch.Tensor) -> torch.Tensor:
    """Strips tensor subclasses (PyG's EdgeIndex) so plain kernels see a plain Tensor."""
    return t.as_subclass(torch.Tensor) if type(t) is not torch.Tensor else t


def refuse_traced(edge_index) -> None:
    """A Graph is built by reading edge ids on the host (validation, degrees, the planner's
    split), which tracing with fake tensors cannot do: torch.export and make_fx get this error
    instead of torch's about a data pointer. (torch.compile does not reach it: it runs the build
    outside its graph.)"""
    from torch._subclasses.fake_tensor import is_fake

    if isinstance(edge_index, torch.Tensor) and is_fake(edge_index):
        raise NotImplementedError(
            "gnnio builds its Graph from edge ids read on the host, which torch.export and "
            "make_fx cannot trace; exporting gnnio layers is not supported yet (torch.compile is)")


def check_edge_index(edge_index, name: str = "edge_index") -> torch.Tensor:
    if not isinstance(edge_index, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape [2, num_edges], "
                        f"got {type(edge_index).__name__}")
    if edge_index.dtype.is_floating_point or edge_index.dtype.is_complex \
            or edge_index.dtype == torch.bool:
        raise ValueError(f"{name} must have an integer dtype (int32 or int64), got {edge_index.dtype}")
    if edge_index.dim() != 2 or edge_index.size(0) != 2:
        raise ValueError(f"{name} must have shape [2, num_edges], got {list(edge_index.shape)}")
    return _plain(edge_index)


class Graph:
    r"""A (possibly bipartite) directed graph, edges flowing from ``edge_index[0]`` (source j)
    to ``edge_index[1]`` (destination i), as in PyG's ``source_to_target`` flow.

    Args:
        edge_index (Tensor or torch_geometric.EdgeIndex): ``[2, E]`` int32/int64, on CPU or CUDA.
            Duplicate edges and self loops are kept as given; order does not matter. Or a sparse
            adjacency ``adj_t`` (``torch.sparse`` COO, CSR or CSC, ``[num_dst, num_src]``, rows
            are destinations, as PyG takes it): its entries in storage order are the edges, its
            shape the node counts (``gnnio.adjacency``); its values are not read.
        num_nodes (int, optional): number of nodes of a non-bipartite graph. If neither this nor
            ``size`` is given it is ``edge_index.max() + 1`` (one device sync).
        size ((int, int), optional): ``(num_src, num_dst)`` of a bipartite graph.

    Raises ``ValueError`` for a malformed edge_index or size and ``IndexError`` for ids out of
    range, on the host and before any kernel runs.
    """

    def __init__(self, edge_index: torch.Tensor, num_nodes: Optional[int] = None, *,
                 size: Optional[Tuple[int, int]] = None):
        refuse_traced(edge_index)
        original = edge_index
        stored = None
        if is_sparse_adjacency(edge_index):
            fits = max(edge_index.size(0), edge_index.size(1), edge_index._nnz()) <= _INT32_MAX
            stored = adjacency_edges(edge_index, torch.int32 if fits else torch.long)
            given = size if size is not None else (
                None if num_nodes is None else (num_nodes, num_nodes))
            if given is not None and tuple(int(s) for s in given) != stored.size:
                raise ValueError(f"the sparse adjacency adj_t has shape {list(original.shape[:2])}, "
                                 f"i.e. (num_src, num_dst) = {stored.size}, but {given} was given")
            edge_index, size, num_nodes = stored.edge_index, stored.size, None
        if size is None and num_nodes is None and _pyg_sparse_size(edge_index) is not None:
            size = _pyg_sparse_size(edge_index)
        edge_index = check_edge_index(edge_index)
        if size is not None:
            if num_nodes is not None:
                raise ValueError("give either num_nodes or size, not both")
            if len(size) != 2:
                raise ValueError(f"size must be (num_src, num_dst), got {size}")
            num_src, num_dst = (int(s) for s in size)
        elif num_nodes is not None:
            num_src = num_dst = int(num_nodes)
        else:
            num_src = num_dst = int(edge_index.max()) + 1 if edge_index.numel() else 0
        if num_src < 0 or num_dst < 0:
            raise ValueError(f"node counts must be >= 0, got num_src={num_src}, num_dst={num_dst}")

        self.num_src, self.num_dst = num_src, num_dst
        self.num_edges = edge_index.size(1)
        self.device = edge_index.device
        fits32 = max(num_src, num_dst, self.num_edges) <= _INT32_MAX
        self.index_dtype = torch.int32 if fits32 else torch.int64
        # Checked here, on the host and before narrowing to int32, so a bad id raises
        # IndexError before any kernel runs.
        _check_ids(edge_index[0], num_src, "edge_index[0] (source)")
        _check_ids(edge_index[1], num_dst, "edge_index[1] (destination)")
        self._values = {}
        with _normal_tensors():
            # A private copy: .to() is a no-op for an int32 edge_index (and row 0 of a contiguous
            # [2, E] is contiguous), so without copy=True _src/_dst would be views of the caller's
            # tensor, and an in-place change of it would reach the lazily built formats
            # (csr_by_src, self loops, tiles) but not csr_by_dst.
            ei = edge_index.to(self.index_dtype, copy=stored is None)  # (adjacency edges: fresh)
            self._src, self._dst = ei[0].contiguous(), ei[1].contiguous()
            csc = _pyg_csc(original, self.index_dtype, num_dst) if _is_pyg_edge_index(original) else None
            if stored is not None and stored.rows is not None:  # the sparse tensor's own CSR
                csc = CSR(stored.rowptr.to(self.index_dtype).contiguous(),
                          stored.col.to(self.index_dtype).contiguous(),
                          torch.arange(self.num_edges, dtype=self.index_dtype, device=self.device))
            if csc is not None and (stored is None or stored.rows == "dst"):
                self.csr_by_dst = csc  # reuse the EdgeIndex's or the sparse tensor's own sort
            else:
                self.csr_by_dst = self._build(self._dst, self._src, num_dst, num_src)
        self._csr_by_src: Optional[CSR] = csc if stored is not None and stored.rows == "src" else None
        self._register_cache()

    def _register_cache(self) -> None:
        self.cache_key = next(_cache_keys) * 2  # csr_by_dst's plans; +1 for csr_by_src's
        ops.register_cache(self.cache_key)
        ops.register_cache(self.cache_key + 1)
        weakref.finalize(self, _release, self.cache_key)

    def __getstate__(self):
        state = dict(self.__dict__)
        del state["cache_key"]  # the descriptors of this process's copy
        # kept edge weights name their tensor by a weak reference, which does not pickle: a copy
        # gathers them again at first use
        state["_values"] = {k: v for k, v in state["_values"].items()
                            if not (isinstance(v, tuple) and v and isinstance(v[0], weakref.ref))}
        return state

    def __setstate__(self, state):  # a pickled or deep-copied Graph gets descriptors of its own
        self.__dict__.update(state)
        self._register_cache()

    # -- formats ------------------------------------------------------------------------------
    def _build(self, row, col, num_rows, num_cols) -> CSR:
        return CSR(*ops.csr_from_coo(row, col, num_rows, num_cols))

    @property
    def csr_by_src(self) -> CSR:
        """The transpose (rows = sources), built the first time it is asked for."""
        if self._csr_by_src is None:
            with _normal_tensors():
                self._csr_by_src = self._build(self._src, self._dst, self.num_src, self.num_dst)
        return self._csr_by_src

    def backward_csr(self, needed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
        """(rowptr, col) of csr_by_src when a backward pass will read it, else empty
        placeholders, so that a forward without gradients never builds the transpose."""
        if needed:
            return self.csr_by_src.rowptr, self.csr_by_src.col
        empty = self.csr_by_dst.rowptr.new_empty(0)
        return empty, empty

    @property
    def src_slot_to_dst_slot(self) -> torch.Tensor:
        """For each slot of csr_by_src, the slot of the same edge in csr_by_dst (``t2c``): what a
        backward pass over the transpose needs to find the forward's per-slot state."""
        def compute():
            inv = torch.empty_like(self.csr_by_dst.perm)
            inv[self.csr_by_dst.perm.long()] = torch.arange(
                self.num_edges, dtype=inv.dtype, device=self.device)
            return inv[self.csr_by_src.perm.long()]
        return self._cached("t2c", compute)

    @property
    def has_csr_by_src(self) -> bool:
        return self._csr_by_src is not None

    @property
    def edge_index(self) -> torch.Tensor:
        return torch.stack([self._src, self._dst])

    @property
    def is_bipartite(self) -> bool:
        return self.num_src != self.num_dst

    def in_degree(self) -> torch.Tensor:
        """Number of incoming edges of each destination (duplicates counted), int64."""
        return self._cached("in_degree", lambda: self.csr_by_dst.rowptr.diff().long())

    def out_degree(self) -> torch.Tensor:
        return self._cached("out_degree", lambda: self.csr_by_src.rowptr.diff().long())

    def max_out_degree(self) -> int:
        """Largest out-degree (builds the transpose, which a backward pass needs anyway)."""
        return self._cached("max_out_degree", lambda: int(self.out_degree().max().item())
                            if self.num_src > 0 else 0)

    def stats(self) -> dict:
        """Cheap statistics of the in-degree distribution, for the planner and for reports."""
        def compute():
            deg = self.in_degree().double()
            if deg.numel() == 0:
                return {"num_src": self.num_src, "num_dst": self.num_dst, "num_edges": 0,
                        "max_in_degree": 0, "mean_in_degree": 0.0, "in_degree_skew": 0.0,
                        "p99_in_degree": 0.0, "isolated_dst": 0}
            mean = deg.mean().item()
            mx = deg.max().item()
            return {
                "num_src": self.num_src, "num_dst": self.num_dst, "num_edges": self.num_edges,
                "max_in_degree": int(mx), "mean_in_degree": mean,
                # max / mean: how much longer the longest row is than an average one.
                "in_degree_skew": mx / mean if mean > 0 else 0.0,
                "p99_in_degree": deg.quantile(0.99).item() if deg.numel() <= 2**24
                else deg.kthvalue(max(1, int(0.99 * deg.numel()))).values.item(),
                "isolated_dst": int((deg == 0).sum().item()),
            }
        return self._cached("stats", compute)

    # -- reordering ---------------------------------------------------------------------------
    def reorder(self, method: str, **options) -> Tuple["Graph", torch.Tensor]:
        """The graph with its nodes renumbered by ``method`` (``"degree"``, ``"rcm"`` or
        ``"metis"``, see :mod:`gnnio.reorder`), and ``perm`` (int64 [N], on this graph's
        device): node ``i`` of the new graph is node ``perm[i]`` of this one. Edge k of the new
        graph is edge k of this one with both ends renamed, so per-edge inputs still line up;
        features go in as ``x[perm]`` and come back as ``out[inv]`` (``inv[perm] = arange(N)``).
        Cached per method and options. Raises ValueError for an unknown method or a bipartite
        graph. ``options`` go to the order's function (e.g. ``part_size`` for ``metis``)."""
        from gnnio.reorder import reordering

        r = reordering(self, method, **options)
        return r.graph, r.perm

    # -- SpMM operands ------------------------------------------------------------------------
    def _cached(self, key, fn):
        if key not in self._values:
            with _normal_tensors(), _without_autocast(self.device):
                self._values[key] = fn()
        return self._values[key]

    def _inv_in_degree(self, dtype):
        return self._cached(("inv_deg", dtype),
                            lambda: 1.0 / self.in_degree().clamp(min=1).to(dtype))

    def spmm_values(self, dtype: torch.dtype, reduce: str = "sum",
                    edge_weight: Optional[torch.Tensor] = None, need_transpose: bool = True):
        """Edge values (in csr_by_dst order, and in csr_by_src order or None) for
        ``out_i = reduce_j w_ij x_j``; ``mean`` divides by the in-degree (edge count, like PyG)."""
        if reduce not in ("sum", "add", "mean"):
            raise ValueError(f"reduce must be 'sum' or 'mean' for SpMM, got {reduce!r}")
        mean = reduce == "mean"
        if edge_weight is None:
            if not mean:
                ones = self._cached(("ones", dtype),
                                    lambda: torch.ones(self.num_edges, dtype=dtype, device=self.device))
                return ones, ones if need_transpose else None
            value = self._cached(("mean", dtype), lambda: self._inv_in_degree(dtype).repeat_interleave(
                self.in_degree(), output_size=self.num_edges))
            value_t = self._cached(("mean_t", dtype), lambda: self._inv_in_degree(dtype)[
                self.csr_by_src.col.long()]) if need_transpose else None
            return value, value_t
        value = self.slot_weights(edge_weight, dtype)
        value_t = self.slot_weights(edge_weight, dtype, transpose=True) if need_transpose else None
        if mean:
            value = value * self.spmm_values(dtype, "mean")[0]
            if need_transpose:
                value_t = value_t * self._inv_in_degree(dtype)[self.csr_by_src.col.long()]
        return value, value_t

    def slot_weights(self, edge_weight: torch.Tensor, dtype: torch.dtype,
                     transpose: bool = False) -> torch.Tensor:
        """``edge_weight`` (edge_index order) cast to ``dtype``, in csr_by_dst's slot order (or
        csr_by_src's with ``transpose``): the order the kernels read. A weight that needs no
        gradient is kept with its version counter, and the same tensor passed again unmodified
        (a fixed ``data.edge_weight``, every epoch) reuses it instead of a gather of E values per
        call; one entry per order and dtype. Weights that need a gradient, inference tensors
        (no version counter) and calls under torch.compile gather every time."""
        cached = isinstance(edge_weight, torch.Tensor) and not (
            edge_weight.requires_grad or edge_weight.is_inference() or torch.compiler.is_compiling())
        key = ("slot_weights", transpose, dtype)
        if cached:  # a kept entry was checked and cast when it was stored: no cast per call
            hit = self._values.get(key)
            if hit is not None and hit[0]() is edge_weight and hit[1] == edge_weight._version:
                return hit[2]
        w = self._check_edge_weight(edge_weight, dtype)
        perm = (self.csr_by_src if transpose else self.csr_by_dst).perm.long()
        if not cached:
            return w[perm]
        with _normal_tensors():
            value = w[perm]
        # A weak reference: the Graph must not keep its caller's tensor alive (a sparse
        # adjacency's values are a view of it, which kept the adjacency, and with it the layers'
        # shared Graph of it, alive for good: a reviewer's finding).
        self._values[key] = (weakref.ref(edge_weight), edge_weight._version, value)
        return value

    def _check_edge_weight(self, edge_weight, dtype):
        if not isinstance(edge_weight, torch.Tensor):
            raise TypeError(f"edge_weight must be a Tensor, got {type(edge_weight).__name__}")
        if edge_weight.dim() != 1 or edge_weight.numel() != self.num_edges:
            raise ValueError(f"edge_weight must have shape [num_edges] = [{self.num_edges}], "
                             f"got {list(edge_weight.shape)}")
        if edge_weight.device != self.device:
            raise ValueError(f"edge_weight is on {edge_weight.device} but the graph is on {self.device}")
        if not edge_weight.dtype.is_floating_point:
            raise TypeError(f"edge_weight must be floating point, got {edge_weight.dtype}")
        return edge_weight.to(dtype)

    # -- weighted block-sparse tiles ----------------------------------------------------------
    def wsb(self, transpose: bool = False) -> WSB:
        """The WSB structure of csr_by_dst's matrix (rows = destinations, columns = sources) or,
        with ``transpose=True``, of csr_by_src's (what a backward pass reads). Built the first
        time it is asked for (one sort of the edges by tile), then cached."""
        def compute():
            if transpose:
                return WSB(*ops.wsb_from_coo(self._src, self._dst, self.num_src, self.num_dst))
            return WSB(*ops.wsb_from_coo(self._dst, self._src, self.num_dst, self.num_src))
        return self._cached(("wsb", transpose), compute)

    def wsb_values(self, dtype: torch.dtype, reduce: str = "sum",
                   edge_weight: Optional[torch.Tensor] = None, need_transpose: bool = True):
        """Tile values ``[num_tiles, 16, 16]`` in ``dtype`` of the SpMM matrix of
        :meth:`spmm_values` (same ``reduce`` and ``edge_weight``), and of its transpose or None.
        Duplicate edges are summed in float32 (float64 for float64) before the one rounding to
        ``dtype``. Cached per dtype and reduce when edge_weight is None; otherwise
        differentiable in edge_weight (a scatter-add, whose gradient gathers each edge's slot)."""
        if edge_weight is None:
            values = self._cached(("wsb_values", dtype, reduce, False), lambda: self._wsb_pack(
                False, self.spmm_values(dtype, reduce, None, need_transpose=False)[0]))
            values_t = self._cached(("wsb_values", dtype, reduce, True), lambda: self._wsb_pack(
                True, self.spmm_values(dtype, reduce, None)[1])) if need_transpose else None
            return values, values_t
        value, value_t = self.spmm_values(dtype, reduce, edge_weight, need_transpose)
        return self._wsb_pack(False, value), self._wsb_pack(True, value_t) if need_transpose else None

    def wsb_counts(self, transpose: bool = False) -> torch.Tensor:
        """Edges per entry of each WSB tile ``[num_tiles, 16, 16]`` float32 (of the transpose's
        tiles with ``transpose=True``): what GAT attention on tiles weighs each softmax term by
        (a duplicate edge is a second term with the same score). Cached."""
        def compute():
            ones = torch.ones(self.num_edges, dtype=torch.float32, device=self.device)
            return self._wsb_pack(transpose, ones)
        return self._cached(("wsb_counts", transpose), compute)

    def _wsb_pack(self, transpose: bool, value: torch.Tensor) -> torch.Tensor:
        """Per-slot values of csr_by_dst (csr_by_src with ``transpose``) scattered into tiles."""
        w = self.wsb(transpose)
        csr = self.csr_by_src if transpose else self.csr_by_dst
        slot = self._cached(("wsb_slot", transpose), lambda: w.pos[csr.perm.long()])
        acc = torch.float64 if value.dtype == torch.float64 else torch.float32
        tiles = w.block_col.numel()
        # index_put with accumulate: deterministic under torch.use_deterministic_algorithms.
        packed = torch.zeros(tiles * 256, dtype=acc, device=self.device).index_put(
            (slot,), value.to(acc), accumulate=True)
        return packed.to(value.dtype).view(tiles, 16, 16)

    def wsb_stats(self) -> dict:
        """How well 16 x 16 tiles fit this graph (forward matrix): ``num_tiles``,
        ``stored_entries`` (num_tiles x 256), ``nonzeros`` (distinct destination-source pairs),
        ``fill_ratio`` = stored zeros / stored entries (0: every stored entry is an edge;
        255/256: one edge per tile; rows past the graph in the last block count as zeros), and
        ``edges_per_tile``. The tensor-core SpMM multiplies every stored entry, so its work
        relative to a CSR kernel's grows like 1 / (1 - fill_ratio). Cheap and cached: one sort
        of the edges' (tile, entry) keys; it does not build the WSB structure. The planner reads
        it (``edges_per_tile``) on CUDA."""
        def compute():
            block_cols = (self.num_src + 15) // 16
            if ((self.num_dst + 15) // 16) * block_cols * 256 < 2**63:
                dst, src = self._dst.long(), self._src.long()
                # Tile id (block row-major) x 256 + entry (16 (dst % 16) + src % 16): the slot of
                # the flat WSB values. Sorted distinct slots -> entries; their tile ids -> tiles.
                slots = torch.unique(((dst >> 4) * block_cols + (src >> 4)) * 256
                                     + ((dst & 15) << 4) + (src & 15))
                nonzeros = int(slots.numel())
                tiles = int(torch.unique_consecutive(slots >> 8).numel())
            else:  # tile ids past int64: count on the built structure
                w = self.wsb()
                tiles = w.block_col.numel()
                nonzeros = int(torch.unique(w.pos).numel())
            stored = tiles * 256
            return {"num_tiles": tiles, "stored_entries": stored, "nonzeros": nonzeros,
                    "fill_ratio": (stored - nonzeros) / stored if stored else 0.0,
                    "edges_per_tile": self.num_edges / tiles if tiles else 0.0}
        return self._cached("wsb_stats", compute)

    # -- the planner --------------------------------------------------------------------------
    def plan(self, layer, features: int = 128, dtype: torch.dtype = torch.float32, *,
             training: bool = True, backend: Optional[str] = None, heads: Optional[int] = None):
        """What gnnio runs for ``layer`` on this graph, and why: a :class:`gnnio.plan_layer.Plan`
        (``str(plan)`` prints it). ``layer`` is a family (``'spmm'``, ``'reduce'``,
        ``'attention'``), an op (``'spmm(mean)'``, ``'segment_reduce(max)'``,
        ``'graph_attention(gatv2)'``, ``'gcn_propagate'``), a gnnio/PyG layer name
        (``'GCNConv'``, ``'GraphConv(mean)'``, ``'SAGEConv(max)'``, ``'GATConv'``, ``'GATv2Conv'``,
        ``'TransformerConv'``, ``'MaxAggregation'``, ...; any case) or a layer class or instance.
        ``features`` is the aggregated width (heads x channels for attention), ``training``
        (a call whose input needs a gradient) adds the backward pass's split and SpMM's
        small-graph training thresholds, ``backend`` forces the SpMM backend as in
        :func:`gnnio.ops.spmm`, ``heads`` (attention; an attention layer instance gives its own)
        makes the plan see ``features // heads`` channels a head as a call does (GAT on tiles
        has a lower break-even for heads of <= 32 channels and is not picked under 32; without
        heads the plan takes the wider heads' thresholds). The choice reads cheap cached statistics (degrees, tile counts),
        is deterministic and is the same on a CPU graph: ``backend`` says what CUDA runs,
        ``cpu_backend`` what the CPU runs. Layers that add self loops (GCNConv, GATConv,
        GATv2Conv) are planned on the graph with them. Raises ValueError for an unknown name."""
        from gnnio.plan_layer import plan_layer

        return plan_layer(self, layer, features, dtype, training=training, backend=backend,
                          heads=heads)

    # -- GCN normalisation --------------------------------------------------------------------
    def with_remaining_self_loops(self) -> Tuple["Graph", torch.Tensor, torch.Tensor]:
        """PyG's add_remaining_self_loops: existing loops are removed and one loop per node is
        appended (in node order). Returns (graph, kept, loop_edge): ``kept`` are the input ids of
        the non-loop edges (in order); ``loop_edge[v]`` is the input id of v's existing loop
        (the last one, as PyG's scatter keeps) or -1."""
        if self.is_bipartite:
            raise ValueError("self loops need a graph with num_src == num_dst")
        return self.with_self_loops(self.num_dst)

    def with_self_loops(self, num_loops: int) -> Tuple["Graph", torch.Tensor, torch.Tensor]:
        """Existing loops removed, loops 0 -> 0 ... (num_loops-1) -> (num_loops-1) appended (PyG's
        remove_self_loops + add_self_loops; for a bipartite graph GATConv uses
        num_loops = min(num_src, num_dst)). Same return values as with_remaining_self_loops."""
        def compute():
            src, dst = self._src.long(), self._dst.long()
            is_loop = src == dst
            kept = (~is_loop).nonzero().view(-1)
            loops = torch.arange(num_loops, device=self.device)
            ei = torch.cat([torch.stack([src[kept], dst[kept]]), torch.stack([loops, loops])], 1)
            loop_edge = torch.full((num_loops,), -1, dtype=torch.long, device=self.device)
            loop_ids = is_loop.nonzero().view(-1)
            in_range = src[loop_ids] < num_loops
            # Later loops overwrite earlier ones: scatter_reduce('amax') on edge ids is that,
            # deterministically.
            loop_edge.scatter_reduce_(0, src[loop_ids][in_range], loop_ids[in_range], reduce="amax")
            return Graph(ei, size=(self.num_src, self.num_dst)), kept, loop_edge
        return self._cached(("self_loops", num_loops), compute)

    def with_added_self_loops(self) -> "Graph":
        """Loops 0 -> 0 ... (num_nodes-1) -> (num_nodes-1) appended after the edges, existing
        loops kept: PyG's add_self_loops, which gcn_norm applies to a sparse adjacency."""
        if self.is_bipartite:
            raise ValueError("self loops need a graph with num_src == num_dst")

        def compute():
            loops = torch.arange(self.num_dst, device=self.device)
            ei = torch.cat([self.edge_index.long(), torch.stack([loops, loops])], 1)
            return Graph(ei, size=(self.num_src, self.num_dst))
        return self._cached("added_self_loops", compute)

    def gcn_values(self, dtype: torch.dtype, edge_weight: Optional[torch.Tensor] = None,
                   improved: bool = False, add_self_loops: bool = True, normalize: bool = True):
        """(graph, value, value_t) of GCN's propagation matrix D^-1/2 (A [+ I]) D^-1/2, as PyG's
        gcn_norm computes it. Cached per dtype and options when edge_weight is None."""
        if edge_weight is None:
            key = ("gcn", dtype, improved, add_self_loops, normalize)
            return self._cached(key, lambda: self._gcn_values(dtype, None, improved,
                                                              add_self_loops, normalize))
        return self._gcn_values(dtype, self._check_edge_weight(edge_weight, dtype), improved,
                                add_self_loops, normalize)

    def gcn_wsb_values(self, dtype: torch.dtype, edge_weight: Optional[torch.Tensor] = None,
                       improved: bool = False, add_self_loops: bool = True,
                       normalize: bool = True, need_transpose: bool = True):
        """(graph', values, values_t or None): :meth:`gcn_values` packed into the WSB tiles of graph'
        (``[num_tiles, 16, 16]``), for the tensor-core SpMM. Cached when edge_weight is None,
        differentiable in it otherwise."""
        g, value, value_t = self.gcn_values(dtype, edge_weight, improved, add_self_loops, normalize)
        if edge_weight is None:
            key = ("gcn_wsb", dtype, improved, add_self_loops, normalize)
            values = self._cached(key + (False,), lambda: g._wsb_pack(False, value))
            values_t = self._cached(key + (True,), lambda: g._wsb_pack(True, value_t)) \
                if need_transpose else None
            return g, values, values_t
        return g, g._wsb_pack(False, value), g._wsb_pack(True, value_t) if need_transpose else None

    def _gcn_values(self, dtype, w, improved, add_self_loops, normalize):
        with _without_autocast(self.device):
            return self._gcn_values_in(dtype, w, improved, add_self_loops, normalize)

    def _gcn_values_in(self, dtype, w, improved, add_self_loops, normalize):
        graph = self
        if add_self_loops:
            graph, kept, loop_edge = self.with_remaining_self_loops()
            if w is None:
                # PyG 2.8's gcn_norm adds the loops before it fills a missing edge_weight with
                # ones, so every weight, loops included, is 1 and `improved` has no effect.
                # gnnio computes the same so PyG checkpoints give the same outputs.
                w = torch.ones(graph.num_edges, dtype=dtype, device=self.device)
            else:
                loop_w = torch.full((self.num_dst,), 2.0 if improved else 1.0, dtype=dtype,
                                    device=self.device)
                if self.num_edges > 0:  # an existing loop keeps its weight
                    loop_w = torch.where(loop_edge >= 0, w[loop_edge.clamp(min=0)], loop_w)
                w = torch.cat([w[kept], loop_w])
        elif w is None:
            w = torch.ones(self.num_edges, dtype=dtype, device=self.device)
        if normalize:
            # Weighted in-degree as A · 1 with gnnio's own SpMM: deterministic, no atomics.
            ones = torch.ones(graph.num_src, 1, dtype=dtype, device=self.device)
            deg = widened_on_cpu(_spmm_raw, ones)(graph, w[graph.csr_by_dst.perm.long()],
                                                  ones).view(-1)
            dis = deg.pow(-0.5)
            dis = dis.masked_fill(dis == float("inf"), 0.0)
            w = dis[graph._src.long()] * w * dis[graph._dst.long()]
        value = w[graph.csr_by_dst.perm.long()]
        value_t = w[graph.csr_by_src.perm.long()]
        return graph, value, value_t

    def __repr__(self):
        kind = f"num_src={self.num_src}, num_dst={self.num_dst}" if self.is_bipartite \
            else f"num_nodes={self.num_dst}"
        return f"Graph({kind}, num_edges={self.num_edges}, device={self.device})"


def _normal_tensors():
    """Caches filled inside torch.inference_mode must still be usable by training later: build
    them as normal tensors."""
    if torch.is_inference_mode_enabled():
        return torch.inference_mode(False)
    return contextlib.nullcontext()


def _without_autocast(device: torch.device):
    """Values the Graph forms (GCN's normalisation, 1/deg, ...) are in the dtype asked for:
    CUDA autocast would run some of their ops (pow, reciprocal) in float32, and GCN's values
    then came out float32 for 16-bit features (wsb_spmm refused them)."""
    if device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _check_ids(ids, bound, what):
    if ids.numel() == 0:
        return
    lo, hi = torch.aminmax(ids)
    lo, hi = int(lo), int(hi)
    if lo < 0 or hi >= bound:
        raise IndexError(f"{what}: ids must lie in [0, {bound}), found values in [{lo}, {hi}]")


def _spmm_raw(graph: Graph, value: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Forward-only SpMM over csr_by_dst (used for degrees); autograd still flows to value."""
    r = graph.csr_by_dst
    rowptr_t, col_t = graph.backward_csr(False)
    return ops.spmm(r.rowptr, r.col, value, x, graph.num_dst, graph.num_src, -1, rowptr_t, col_t,
                    None, -1)


def _release(key: int) -> None:
    try:
        ops.release_cache(key)
        ops.release_cache(key + 1)
    except Exception:  # interpreter shutdown: the library may be gone already
        pass


def _pyg_sparse_size(edge_index):
    try:
        from torch_geometric import EdgeIndex
    except ImportError:
        return None
    if isinstance(edge_index, EdgeIndex):
        size = edge_index.sparse_size()
        if size[0] is None and size[1] is None:
            return None
        # A partly known size, e.g. (10, None): the unknown side from its own ids, as PyG's
        # EdgeIndex.get_sparse_size does (not both sides from the largest id of either).
        plain = edge_index.as_tensor()
        return tuple(int(size[d]) if size[d] is not None else
                     (int(plain[d].max()) + 1 if plain.numel() else 0) for d in (0, 1))
    return None


def _is_pyg_edge_index(edge_index) -> bool:
    try:
        from torch_geometric import EdgeIndex
    except ImportError:
        return False
    return isinstance(edge_index, EdgeIndex)


def _pyg_csc(edge_index, dtype, num_dst) -> Optional[CSR]:
    """A sorted EdgeIndex's CSC (destination-major) form, which the EdgeIndex caches itself;
    None when it is unsorted or its sparse size is not this Graph's (then gnnio sorts)."""
    if not edge_index.is_sorted or edge_index.sparse_size(1) != num_dst:
        return None
    (colptr, row), perm = edge_index.get_csc()
    if colptr.numel() != num_dst + 1:
        return None
    if perm is None:
        perm = torch.arange(edge_index.size(1), device=edge_index.device)
    return CSR(_plain(colptr).to(dtype).contiguous(), _plain(row).to(dtype).contiguous(),
               _plain(perm).to(dtype).contiguous())
