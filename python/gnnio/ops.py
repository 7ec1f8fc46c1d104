"""Functional operators. Each takes a gnnio.Graph (or an edge_index, see ``as_graph``)."""
from typing import Optional

import torch

from gnnio._ops import ops as _ops, widened_on_cpu
from gnnio.graph import Graph
from gnnio.plan import attention_backend, plan_attention, plan_reduce, spmm_backend
from gnnio.wsb_attention import wsb_attention_blockers, wsb_gat_attention

__all__ = ["spmm", "gcn_propagate", "segment_reduce", "graph_attention", "attention_weights",
           "head_scores", "column_sum", "check_features"]


def check_features(x, num_rows: int, graph: Graph, name: str = "x") -> torch.Tensor:
    """Validates a node-feature matrix and returns it with unit feature stride."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a Tensor, got {type(x).__name__}")
    if x.dim() != 2:
        raise ValueError(f"{name} must be 2-D [num_nodes, features], got shape {list(x.shape)}")
    if not x.dtype.is_floating_point:
        raise TypeError(f"{name} must be floating point, got {x.dtype}")
    if x.size(0) != num_rows:
        raise ValueError(f"{name} has {x.size(0)} rows but the graph has {num_rows} nodes on that side")
    if x.device != graph.device:
        raise ValueError(f"{name} is on {x.device} but the graph is on {graph.device}")
    return x if x.stride(-1) == 1 or x.size(-1) <= 1 else x.contiguous()


def spmm(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
         reduce: str = "sum", backend: Optional[str] = None) -> torch.Tensor:
    r"""Neighbourhood aggregation :math:`\mathbf{out}_i = \mathrm{reduce}_{j \in N(i)} w_{ji}\,
    \mathbf{x}_j` for ``reduce`` in ``{'sum', 'mean'}`` (mean divides by the number of incoming
    edges; isolated destinations give 0), as PyG's ``propagate`` with that aggregation.

    Args:
        graph: the structure (``x`` has ``graph.num_src`` rows, the output ``graph.num_dst``).
        x: ``[num_src, F]`` float32/float64/float16/bfloat16 (on the CPU the 16-bit types run
            as float32 copies, each result rounded once: the CUDA precision model).
        edge_weight: ``[E]`` in the order of the edge_index the graph was built from.
        backend: ``None`` (default): ``GNNIO_SPMM_BACKEND`` (``csr``, ``wsb`` or ``auto``)
            if set, else ``'auto'``. ``'auto'``: the planner's choice
            (``graph.plan('spmm', training=...)``): on CUDA WSB where a 16 x 16 tile holds
            enough edges (``graph.wsb_stats()['edges_per_tile']`` at or above
            ``gnnio.plan.wsb_threshold(F, dtype, num_dst, training)``, where ``training``,
            lower on small graphs, applies when ``x`` needs a gradient; float32 only where tf32
            is allowed), else CSR; on the CPU always CSR. ``'csr'``: cuSPARSE / gnnio's CSR
            kernels. ``'wsb'``: the weighted block-sparse tiles of ``graph.wsb()`` on tensor
            cores (CUDA: float32 as tf32, float16, bfloat16, all accumulated in float32;
            float64 raises, use 'csr').
            WSB pays for every stored zero of a tile, so it is for locally dense graphs. The
            CPU runs the same tiled algorithm in float32/float64 (a reference). With WSB a
            non-finite entry of ``x`` reaches, through the zeros of its tile, every row of
            that tile's block row (0 x inf = nan).

    Differentiable in ``x`` (through the cached transpose) and ``edge_weight`` (SDDMM; for
    'wsb' the dense gradient of each tile, gathered at each edge's slot).
    """
    if backend is not None and backend not in ("csr", "wsb", "auto"):
        raise ValueError(f"backend must be 'csr', 'wsb', 'auto' or None, got {backend!r}")
    x = check_features(x, graph.num_src, graph)
    need_t = torch.is_grad_enabled() and x.requires_grad
    if spmm_backend(graph, x, backend, need_t) == "wsb":
        values, values_t = graph.wsb_values(x.dtype, reduce, edge_weight, need_transpose=need_t)
        return _spmm_wsb(graph, values, values_t, x, need_t)
    value, value_t = graph.spmm_values(x.dtype, reduce, edge_weight, need_transpose=need_t)
    return _spmm_csr(graph, value, value_t, x, need_t)


def _spmm_csr(graph: Graph, value, value_t, x, need_t: bool) -> torch.Tensor:
    fwd = graph.csr_by_dst
    rowptr_t, col_t = graph.backward_csr(need_t)
    return widened_on_cpu(_ops.spmm, x)(fwd.rowptr, fwd.col, value, x, graph.num_dst,
                                        graph.num_src, graph.cache_key, rowptr_t, col_t,
                                        value_t if need_t else None, graph.cache_key + 1)


def _spmm_wsb(graph: Graph, values, values_t, x, need_t: bool) -> torch.Tensor:
    fwd = graph.wsb()
    if need_t:
        t = graph.wsb(transpose=True)
        rowptr_t, col_t = t.block_rowptr, t.block_col
    else:  # empty placeholders: a forward without gradients never builds the transpose
        rowptr_t = col_t = fwd.block_rowptr.new_empty(0)
    return widened_on_cpu(_ops.wsb_spmm, x)(fwd.block_rowptr, fwd.block_col, values, x,
                                            graph.num_dst, graph.num_src, rowptr_t, col_t,
                                            values_t if need_t else None)


def gcn_propagate(graph: Graph, x: torch.Tensor, edge_weight: Optional[torch.Tensor] = None,
                  improved: bool = False, add_self_loops: bool = True,
                  normalize: bool = True, backend: Optional[str] = None) -> torch.Tensor:
    """GCN's propagation D^-1/2 (A [+ I]) D^-1/2 x with PyG's gcn_norm conventions. ``backend``
    as in :func:`spmm`; the planner looks at the graph with the self loops."""
    if backend is not None and backend not in ("csr", "wsb", "auto"):
        raise ValueError(f"backend must be 'csr', 'wsb', 'auto' or None, got {backend!r}")
    x = check_features(x, graph.num_src, graph)
    g, value, value_t = graph.gcn_values(x.dtype, edge_weight, improved, add_self_loops, normalize)
    need_t = torch.is_grad_enabled() and x.requires_grad
    if spmm_backend(g, x, backend, need_t) == "wsb":
        if edge_weight is None:  # cached tiles
            _, values, values_t = graph.gcn_wsb_values(x.dtype, None, improved, add_self_loops,
                                                       normalize, need_transpose=need_t)
        else:  # the values just computed, differentiable in edge_weight
            values = g._wsb_pack(False, value)
            values_t = g._wsb_pack(True, value_t) if need_t else None
        return _spmm_wsb(g, values, values_t, x, need_t)
    return _spmm_csr(g, value, value_t, x, need_t)


def _split_args(plan) -> tuple:
    """A ReducePlan's or AttentionPlan's super-node split as the ops take it after t2c: heavy_rows,
    heavy_items, light_max_degree, heavy_src, heavy_src_items, light_max_out_degree (none: the
    ops' defaults, no split)."""
    if plan is None:
        return ()
    return (plan.heavy_rows, plan.heavy_items, plan.light_max_degree, plan.heavy_src,
            plan.heavy_src_items, plan.light_max_out_degree)


def segment_reduce(graph: Graph, x: torch.Tensor, reduce: str = "max",
                   return_arg: bool = False, degree_aware: Optional[bool] = None,
                   edge_weight: Optional[torch.Tensor] = None):
    r"""Neighbourhood reduction :math:`\mathbf{out}_i = \mathrm{reduce}_{j \in N(i)} \mathbf{x}_j`
    for ``reduce`` in ``{'max', 'min', 'sum', 'mean'}``, as PyG's aggregation with that name:
    a destination without neighbours gets 0.

    With ``edge_weight`` (``[E]``, the edge_index order of the graph; cast to ``x``'s dtype)
    each message is :math:`w_{ji} \mathbf{x}_j` rounded to ``x``'s dtype, as PyG's GraphConv
    message ``edge_weight * x_j`` and ``torch.sparse.mm(adj, x, 'amax')``; max/min then keep
    the winning product, differentiable in ``x`` and in ``edge_weight`` (each edge gets the sum
    of ``grad_out * x_j`` over the features it won). Sum and mean go to :func:`spmm`.

    For max/min the winner of each (node, feature) is kept as its CSR slot (``arg``, -1 where
    there is none), and the backward pass routes the gradient to that one input through the
    cached transpose: no E x F buffer, no atomics, the same result every run. Ties go to the
    earliest edge of the edge_index order (torch's scatter_reduce splits them evenly instead).
    ``return_arg=True`` also returns ``arg`` (max/min only). On CUDA the planner
    (``gnnio.plan.plan_reduce``) splits high-degree rows into 2-D tiles; ``degree_aware=False``
    forces the plain node-parallel kernel.
    """
    if reduce in ("sum", "add", "mean"):
        if return_arg:
            raise ValueError("return_arg is only defined for reduce='max' or 'min'")
        return spmm(graph, x, edge_weight, reduce)
    if reduce not in ("max", "min"):
        raise ValueError(f"reduce must be one of 'max', 'min', 'sum', 'mean', got {reduce!r}")
    x = check_features(x, graph.num_src, graph)
    fwd = graph.csr_by_dst
    weight = None
    if edge_weight is not None:
        weight = graph.slot_weights(edge_weight, x.dtype)
    need_t = torch.is_grad_enabled() and x.requires_grad
    rowptr_t, col_t = graph.backward_csr(need_t)
    t2c = graph.src_slot_to_dst_slot if need_t else col_t  # col_t is the empty placeholder then
    split = _split_args(plan_reduce(graph, x.dtype, degree_aware, backward=need_t) if x.is_cuda else None)
    out, arg = widened_on_cpu(_ops.segment_reduce, x)(
        fwd.rowptr, fwd.col, x, graph.num_dst, graph.num_src, reduce, rowptr_t, col_t, t2c, *split,
        weight=weight)
    return (out, arg) if return_arg else out


_KINDS = {"gat": 0, "gatv2": 1, "dot": 2}



def _edge_term(t, graph, name, shape):
    """A per-edge operand given in the graph's edge order, moved to csr_by_dst slot order."""
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be a Tensor of shape {list(shape)} (edges in the graph's "
                         f"edge_index order), got {list(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    return t[graph.csr_by_dst.perm.long()]


def _node_term(t, name, shape):
    if t is None:
        return None
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be a Tensor of shape {list(shape)}, got "
                         f"{list(t.shape) if isinstance(t, torch.Tensor) else type(t)}")
    return t.contiguous()


def graph_attention(graph: Graph, kind: str, value: torch.Tensor, *,
                    src_score: Optional[torch.Tensor] = None,
                    dst_score: Optional[torch.Tensor] = None,
                    edge_score: Optional[torch.Tensor] = None,
                    query: Optional[torch.Tensor] = None, key: Optional[torch.Tensor] = None,
                    edge_key: Optional[torch.Tensor] = None, att: Optional[torch.Tensor] = None,
                    edge_value: Optional[torch.Tensor] = None, negative_slope: float = 0.2,
                    scale: float = 1.0, dropout: float = 0.0, seed: Optional[int] = None,
                    return_weights: bool = False, degree_aware: Optional[bool] = None,
                    bias: Optional[torch.Tensor] = None, backward_in_place: bool = False,
                    backend: Optional[str] = None):
    r"""Fused graph attention, one streaming pass per destination and head (online softmax).

    For each destination :math:`i`, head :math:`h` and edge :math:`j \to i` (index :math:`k`):

    - ``kind='gat'``: :math:`e = \mathrm{LeakyReLU}(s^{src}_{j,h} + s^{dst}_{i,h} + s^{edge}_{k,h})`
      (``src_score [num_src, H]``, ``dst_score [num_dst, H]`` optional, ``edge_score [E, H]`` optional),
      or, with ``att [2, H, C]`` in place of ``src_score`` and ``dst_score``,
      :math:`s^{src}_{j,h} = a_{0,h} \cdot V_{j,h}` and :math:`s^{dst}_{i,h} = a_{1,h} \cdot V_{i,h}`
      (value's first ``num_dst`` rows are the destinations' features, as in a GATConv whose
      source and destination share the projection): the scores of :func:`head_scores`, which on
      CUDA the kernel forms from the value rows it gathers anyway, so the forward makes no pass
      over value for them and no per-edge score load;
    - ``kind='gatv2'``: :math:`e = \sum_c a_{h,c}\,\mathrm{LeakyReLU}(K_{j,h,c} + Q_{i,h,c} +
      K^{edge}_{k,h,c})` (``key [num_src, H, C]``, ``query [num_dst, H, C]``, ``att [H, C]``,
      ``edge_key [E, H, C]`` optional);
    - ``kind='dot'``: :math:`e = \mathrm{scale}\sum_c Q_{i,h,c}(K_{j,h,c} + K^{edge}_{k,h,c})`;
      with ``key`` and ``value`` of shape ``[num_src, 1, C]`` and a query of more heads, every
      head reads the one key and value row of a source (multi-query attention; their gradients
      sum the heads'): TransformerConv's reassociated form. The kernels read each shared row
      once per edge for all heads (on CUDA: key is value, up to 8 heads of up to 128 channels,
      or 4 of up to 256, without edge terms or returned weights; otherwise, and for the CUDA
      backward, the rows are copied per head for the per-head kernels, whose sums they are);

    then :math:`\alpha = \mathrm{softmax}_j(e)` (PyG's softmax), dropout on :math:`\alpha` with
    probability ``dropout`` (a counter-based mask of (seed, edge, head): the backward pass uses the
    same mask; ``seed=None`` draws one from torch's default generator), and
    :math:`\mathbf{out}_{i,h} = \sum_j \alpha_{ij} (V_{j,h} + V^{edge}_{k,h})`
    (``value [num_src, H, C]``, ``edge_value [E, H, C]`` optional), plus ``bias [H * C]``
    (optional, value's dtype) on every row: a layer's output bias, added in the kernel's store of
    out (the same fl(out + bias) as a separate add, without a second pass over out).

    Per-edge operands are in the order of the edge_index the graph was built from. Only
    ``out [num_dst, H, C]`` and a per-(node, head) (max, sum) are stored; the backward pass
    recomputes the weights. Differentiable in every tensor operand. ``return_weights=True`` also
    returns the weights ``[E, H]`` (after dropout, edge order): the one case that writes E x H
    values. When an operand requires grad they are recomputed differentiably
    (:func:`attention_weights`, E x H memory as in PyG) so that a loss on them has a gradient. On CUDA the planner (``gnnio.plan.plan_attention``) splits
    super nodes into chunks; ``degree_aware=False`` (or ``GNNIO_ATTENTION=node``) turns that off.

    ``backend='wsb'`` (or ``GNNIO_ATTENTION_BACKEND=wsb``) runs kind ``'gat'`` on the graph's
    16 x 16 WSB tiles (:func:`gnnio.wsb_attention.wsb_gat_attention`: tensor cores on CUDA,
    float32 as tf32), without edge terms, dropout or returned weights and with at most 128
    channels a head; the argument raises for a call it cannot run, the variable leaves such a
    call on the CSR kernels. ``'csr'``: the CSR kernels. ``'auto'`` / None: on CUDA the tiles
    for kind ``'gat'`` where the graph's edges per tile reach the measured break-even
    (:func:`gnnio.plan.attention_backend`; float32 only where tf32 matmuls are allowed), else
    the CSR kernels.

    ``backward_in_place=True`` (kind ``'dot'`` on CUDA; ignored elsewhere) lets the backward pass
    write the gradients of ``value`` and ``key`` into their own memory: for a caller that owns
    both and reads them no more after this call, as TransformerConv's private projections (two
    N x H x C buffers less at the backward's peak). It applies only to the graph's last backward
    (not with ``retain_graph=True``), not with saved-tensor hooks, not with ``return_weights``
    (whose recomputed weights read key) and not under ``torch.compile``; value's and key's
    version counters are bumped, so another saved reference to them fails loudly.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    if not isinstance(value, torch.Tensor) or value.dim() != 3 or value.size(0) != graph.num_src:
        raise ValueError(f"value must be a [num_src={graph.num_src}, heads, channels] Tensor, got "
                         f"{list(value.shape) if isinstance(value, torch.Tensor) else type(value)}")
    if not value.dtype.is_floating_point:
        raise TypeError(f"value must be floating point, got {value.dtype}")
    if value.device != graph.device:
        raise ValueError(f"value is on {value.device} but the graph is on {graph.device}")
    if not 0.0 <= dropout < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    if isinstance(seed, int) and not -2**63 <= seed < 2**63:
        raise ValueError(f"seed must fit in a signed 64-bit integer, got {seed}")
    ns, nd, e = graph.num_src, graph.num_dst, graph.num_edges
    heads, channels = value.size(1), value.size(2)
    # key and value rows shared by the query's heads (kind dot): the heads are the query's.
    shared_kv = (kind == "dot" and heads == 1 and isinstance(query, torch.Tensor)
                 and query.dim() == 3 and query.size(1) > 1)
    if shared_kv:
        heads = query.size(1)
    if kind == "gat":
        if (src_score is None) == (att is None):
            raise ValueError("kind='gat' needs src_score [num_src, heads] (and optionally "
                             "dst_score), or att [2, heads, channels] in their place")
        if query is not None or key is not None or edge_key is not None:
            raise ValueError("kind='gat' takes src_score / dst_score / edge_score (or att), not "
                             "query/key/edge_key")
        if att is not None:
            if dst_score is not None:
                raise ValueError("kind='gat' with att takes no dst_score (att[1] scores the destinations)")
            if not isinstance(att, torch.Tensor) or att.shape != (2, heads, channels):
                raise ValueError(f"kind='gat' takes att as [2, heads={heads}, channels={channels}], got "
                                 f"{list(att.shape) if isinstance(att, torch.Tensor) else type(att)}")
            if nd > ns:
                raise ValueError(f"kind='gat' with att scores destinations by value's first num_dst "
                                 f"rows: num_dst={nd} must not exceed num_src={ns}")
            if return_weights:  # attention_weights takes the scores
                scores = head_scores(value, att)
                src_score, dst_score, att = scores[0], scores[1, :nd], None
    else:
        if query is None or key is None:
            raise ValueError(f"kind={kind!r} needs query [num_dst, H, C] and key [num_src, H, C]")
        if src_score is not None or dst_score is not None or edge_score is not None:
            raise ValueError(f"kind={kind!r} takes query / key (/ edge_key), not *_score")
        if kind == "gatv2" and att is None:
            raise ValueError("kind='gatv2' needs att [heads, channels]")
    edge_order = dict(edge_score=edge_score, edge_key=edge_key)  # before the move to slot order
    src_score = _node_term(src_score, "src_score", (ns, heads))
    dst_score = _node_term(dst_score, "dst_score", (nd, heads))
    query = _node_term(query, "query", (nd, heads, channels))
    key = _node_term(key, "key", (ns, 1 if shared_kv else heads, channels))
    if att is not None and kind == "gat":
        att = _node_term(att, "att", (2, heads, channels))
    elif att is not None:
        att = _node_term(att.reshape(heads, channels)
                         if isinstance(att, torch.Tensor) and att.numel() == heads * channels else att,
                         "att", (heads, channels))
    edge_score = _edge_term(edge_score, graph, "edge_score", (e, heads))
    edge_key = _edge_term(edge_key, graph, "edge_key", (e, heads, channels))
    edge_value = _edge_term(edge_value, graph, "edge_value", (e, heads, channels))
    for name, t in (("src_score", src_score), ("dst_score", dst_score), ("query", query),
                    ("key", key), ("att", att), ("edge_score", edge_score),
                    ("edge_key", edge_key), ("edge_value", edge_value)):
        if t is not None and t.device != value.device:
            raise ValueError(f"{name} is on {t.device} but value is on {value.device}")
        if t is not None and t.dtype != value.dtype:
            raise TypeError(f"{name} must have value's dtype {value.dtype}, got {t.dtype}")
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.numel() != heads * channels:
            raise ValueError(f"bias must be a Tensor of heads * channels = {heads * channels} "
                             f"values, got {list(bias.shape) if isinstance(bias, torch.Tensor) else type(bias)}")
        if bias.device != value.device or bias.dtype != value.dtype:
            raise TypeError(f"bias must have value's dtype and device ({value.dtype}, "
                            f"{value.device}), got {bias.dtype}, {bias.device}")
        bias = bias.reshape(-1).contiguous()
    operands = (value, src_score, dst_score, edge_score, query, key, edge_key, att, edge_value)
    needs_grad = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in operands)
    # Calls the tiles cannot run skip auto's rule (and its statistics) altogether.
    blockers = wsb_attention_blockers(kind, value, edge_score=edge_score, edge_value=edge_value,
                                      dropout=dropout, return_weights=return_weights)
    if attention_backend(backend, graph=None if blockers else graph, dtype=value.dtype,
                         training=needs_grad, channels=channels)[0] == "wsb":
        if blockers and backend == "wsb":
            raise ValueError("backend='wsb' cannot run this call: " + "; ".join(blockers))
        if not blockers:
            if att is not None:
                scores = head_scores(value, att)
                src_score, dst_score = scores[0], scores[1, :nd]
            out = wsb_gat_attention(graph, value, src_score, dst_score, negative_slope)
            return out if bias is None else out + bias.view(heads, channels)
    if dropout > 0 and seed is None:
        # (no int(): under torch.compile the drawn seed is a symbolic int, which the op's SymInt
        # seed takes, so a compiled training step draws a fresh mask each call)
        seed = torch.randint(0, 2**62, (1,)).item()
    elif not isinstance(seed, torch.SymInt):
        seed = int(seed or 0)
    fwd = graph.csr_by_dst
    rowptr_t, col_t = graph.backward_csr(needs_grad)
    t2c = graph.src_slot_to_dst_slot if needs_grad else col_t
    split = _split_args(plan_attention(graph, heads * channels, backward=needs_grad,
                                      degree_aware=degree_aware) if value.is_cuda else None)
    # With gradients the weights are recomputed below; the kernel's are then needed only for
    # the dropout mask.
    kernel_weights = bool(return_weights) and (not needs_grad or dropout > 0)
    in_place = (bool(backward_in_place) and kind == "dot" and needs_grad and not return_weights
                and value.is_cuda and not shared_kv and not torch.compiler.is_compiling())
    out, stats, weights, _ = widened_on_cpu(_ops.graph_attention, value)(
        fwd.rowptr, fwd.col, _KINDS[kind], value.contiguous(), src_score, dst_score, edge_score,
        query, key, edge_key, att, edge_value, nd, float(negative_slope), float(scale),
        float(dropout), seed, kernel_weights, rowptr_t, col_t, t2c, *split,
        **({} if bias is None else dict(bias=bias)),
        **({} if not in_place else dict(backward_in_place=True)))
    if not return_weights:
        return out
    if kernel_weights:
        in_edge_order = torch.empty_like(weights)
        in_edge_order[fwd.perm.long()] = weights
    if not needs_grad:
        return out, in_edge_order.to(value.dtype)
    # The weights the kernel writes carry no graph: recompute them differentiably (E x H, as PyG
    # does in this case), with the kernel's dropout mask (a dropped weight is exactly 0).
    alpha = attention_weights(graph, kind, src_score=src_score, dst_score=dst_score, query=query,
                              key=key, att=att, negative_slope=negative_slope, scale=scale,
                              **edge_order)
    if dropout > 0:
        alpha = alpha * (in_edge_order != 0).to(alpha.dtype) / (1.0 - dropout)
    return out, alpha


def attention_weights(graph: Graph, kind: str, *, src_score=None, dst_score=None,
                      edge_score=None, query=None, key=None, edge_key=None, att=None,
                      negative_slope: float = 0.2, scale: float = 1.0) -> torch.Tensor:
    """The softmax weights ``[E, H]`` of :func:`graph_attention` (before dropout, edge order),
    materialised with differentiable PyTorch operations: what ``return_attention_weights`` needs
    when a loss reads the weights. Costs E x H (E x H x C for 'gatv2' and 'dot') memory, like PyG."""
    ei = graph.edge_index.long()
    src, dst = ei[0], ei[1]
    if kind == "gat":
        raw = src_score[src]
        if dst_score is not None:
            raw = raw + dst_score[dst]
        if edge_score is not None:
            raw = raw + edge_score
        e = torch.nn.functional.leaky_relu(raw, negative_slope)
    elif kind == "gatv2":
        z = key[src] + query[dst] + (edge_key if edge_key is not None else 0)
        e = (att.reshape(1, *att.shape[-2:]) * torch.nn.functional.leaky_relu(z, negative_slope)).sum(-1)
    elif kind == "dot":
        e = (query[dst] * (key[src] + (edge_key if edge_key is not None else 0))).sum(-1) * scale
    else:
        raise ValueError(f"kind must be one of {sorted(_KINDS)}, got {kind!r}")
    heads = e.size(1)
    index = dst[:, None].expand(-1, heads)
    # The max only shifts the softmax: detached, as in PyG's softmax.
    m = torch.full((graph.num_dst, heads), float("-inf"), dtype=e.dtype, device=e.device)
    m = m.scatter_reduce(0, index, e.detach(), "amax")
    w = torch.exp(e - m[dst])
    s = torch.zeros(graph.num_dst, heads, dtype=e.dtype, device=e.device).index_add(0, dst, w)
    return w / (s[dst] + 1e-16)


def head_scores(x: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    r"""GAT's per-node scores :math:`s_{a,n,h} = \sum_c x_{n,h,c}\, a_{a,h,c}`, i.e. PyG's
    ``(x * att).sum(-1)`` for up to four vectors at once, fused: the forward reads ``x`` once
    and writes only the scores; the backward reads ``x`` once, writes ``d x`` once and sums
    ``d att`` per chunk of 64 rows, then over the chunks in a fixed order (deterministic). No
    N x H x C product is stored in either pass.

    Args:
        x: ``[N, H, C]`` float32, float64, float16 or bfloat16 (on the CPU the 16-bit types
            are upcast to float32 first: the same products and fp32 sums as the CUDA kernel).
        att: ``[A, H, C]`` with A from 1 to 4 (PyG's ``att_src`` is ``[1, H, C]``), any float
            dtype; the products are summed in float32 (float64 for float64 ``x``).

    Returns ``[A, N, H]`` in ``torch.promote_types(x.dtype, att.dtype)`` (PyG's dtype), so ``out[a]`` is
    vector a's ``[N, H]`` score. Differentiable in ``x`` and ``att``.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or not x.dtype.is_floating_point:
        raise ValueError(f"head_scores: x must be a floating-point [N, heads, channels] Tensor, got "
                         f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if (not isinstance(att, torch.Tensor) or att.dim() != 3 or not 1 <= att.size(0) <= 4
            or att.shape[1:] != x.shape[1:] or not att.dtype.is_floating_point):
        raise ValueError(f"head_scores: att must be a floating-point [1 to 4, {x.size(1)}, {x.size(2)}] Tensor, got "
                         f"{list(att.shape) if isinstance(att, torch.Tensor) else type(att).__name__}")
    if att.device != x.device:
        raise ValueError(f"head_scores: att is on {att.device} but x is on {x.device}")
    acc = torch.float64 if x.dtype == torch.float64 else torch.float32
    out_dtype = torch.promote_types(x.dtype, att.dtype)  # PyG's; traceable by torch.compile
    if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
        x = x.float()  # the CPU kernels are fp32/fp64: an exact upcast, the CUDA precision model
    score = _ops.head_scores(x.contiguous(), att.to(acc).contiguous())
    return score if out_dtype == acc else score.to(out_dtype)


def column_sum(x: torch.Tensor) -> torch.Tensor:
    """``x.sum(0)`` of a 2-D ``[rows, cols]`` tensor, in x's dtype: what a bias gradient is.
    Summed in float64 in a fixed order of slabs of rows, the same on the CPU and on CUDA
    (``csrc/gnnio/dense/column_sum.h``); on CUDA it reads x once at close to the copy rate, where
    ``x.sum(0)`` of a 1M x 128 float32 gradient took 2.4x that on an H200. Differentiable.
    16-bit types on the CPU and other devices use ``x.sum(0)``."""
    if not isinstance(x, torch.Tensor) or x.dim() != 2 or not x.dtype.is_floating_point:
        raise ValueError("column_sum: x must be a 2-D floating-point Tensor, got "
                         f"{list(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
    if x.device.type == "cuda" or (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64)):
        return _ops.column_sum(x)
    return x.sum(0)
