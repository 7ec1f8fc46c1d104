"""Graph.plan: the planner's choices for one layer (or kernel family) on one graph, gathered
into a :class:`Plan` with the reason as text. The choices themselves are gnnio.plan's (policy);
this module only asks it and explains. It calls through the module (``_policy.x``) so that what
a test or a user patches there is what it reports."""
from typing import NamedTuple, Optional

import torch

from gnnio import plan as _policy
from gnnio.plan import _DTYPE_NAMES


class Plan(NamedTuple):
    """What gnnio runs for one layer (or kernel family) on one graph, and why.

    ``backend`` is what CUDA runs: spmm ``'cusparse'``, ``'rowwarp'`` or ``'wsb'``; reduce
    ``'degree-aware'`` or ``'node-parallel'``; attention ``'csr-split'`` or ``'csr'``, or
    ``'wsb'`` for GAT-kind attention on the tiles (forced by ``GNNIO_ATTENTION_BACKEND=wsb``, or
    auto's rule, gnnio.plan.attention_backend).
    ``cpu_backend`` is what the CPU runs. The split fields are the light/heavy split of the
    reduce and attention planners (None / 0 when there is none, and for spmm)."""
    layer: str  # the name asked for, canonical ('SAGEConv(max)', 'spmm', ...)
    family: str  # 'spmm' | 'reduce' | 'attention'
    backend: str
    cpu_backend: str
    features: int
    dtype: torch.dtype
    reason: str
    self_loops: bool = False  # planned on the graph with self loops, as the layer adds them
    wsb_threshold: Optional[float] = None  # spmm: edges per tile from which WSB is picked
    light_max_degree: Optional[int] = None  # destinations with more slots are heavy
    chunk: Optional[int] = None  # slots per heavy work item
    heavy_rows: int = 0
    heavy_items: int = 0
    light_max_out_degree: Optional[int] = None  # backward: sources with more out-edges are heavy
    heavy_sources: int = 0
    heavy_source_items: int = 0
    stats: Optional[dict] = None  # the statistics the choice read

    def __str__(self):
        lines = [f"{self.layer} ({self.family}), {self.features} features, "
                 f"{_DTYPE_NAMES.get(self.dtype, str(self.dtype))}"
                 + (", graph with self loops" if self.self_loops else "")]
        lines.append(f"  CUDA: {self.backend}")
        lines.append(f"  CPU:  {self.cpu_backend} ({_CPU_NOTE[self.family, self.cpu_backend]})")
        if self.wsb_threshold is not None:
            lines.append(f"  WSB threshold: {self.wsb_threshold:.1f} edges per 16x16 tile")
        if self.light_max_degree is not None:
            lines.append(f"  split: {self.heavy_rows} destinations above {self.light_max_degree}"
                         f" slots -> {self.heavy_items} items of <= {self.chunk}")
        if self.light_max_out_degree is not None:
            lines.append(f"  backward split: {self.heavy_sources} sources above "
                         f"{self.light_max_out_degree} out-edges -> {self.heavy_source_items} items")
        if self.stats:
            lines.append("  stats: " + ", ".join(f"{k} {_fmt(v)}" for k, v in self.stats.items()))
        lines.append(f"  why: {self.reason}")
        return "\n".join(lines)


_CPU_NOTE = {
    ("spmm", "csr"): "the planner keeps CSR on the CPU; its WSB kernel is a reference",
    ("spmm", "wsb"): "forced: the tiled reference kernel",
    ("reduce", "node-parallel"): "rows in parallel, no split",
    ("attention", "csr"): "rows in parallel, no split",
    ("attention", "wsb"): "forced: the tiled algorithm in float32 / float64",
}


def _fmt(v):
    return f"{v:.3g}" if isinstance(v, float) else str(v)


# Canonical lower-case name -> (display name, family, reduce or attention kind, self loops).
_FAMILIES = {
    "spmm": ("spmm", "spmm", "sum", False),
    "reduce": ("reduce", "reduce", "max", False),
    "attention": ("attention", "attention", "gat", False),
}
_NAMES = dict(_FAMILIES)
for _r in ("sum", "add", "mean"):
    _NAMES[f"spmm({_r})"] = (f"spmm({_r})", "spmm", _r, False)
    _NAMES[f"segment_reduce({_r})"] = (f"segment_reduce({_r})", "spmm", _r, False)
    _NAMES[f"graphconv({_r})"] = (f"GraphConv({_r})", "spmm", _r, False)
for _r in ("sum", "add"):  # SAGEConv(aggr='add' / 'sum'): one SpMM, as the layer runs it
    _NAMES[f"sageconv({_r})"] = (f"SAGEConv({_r})", "spmm", _r, False)
for _r in ("max", "min"):
    _NAMES[f"segment_reduce({_r})"] = (f"segment_reduce({_r})", "reduce", _r, False)
    _NAMES[f"graphconv({_r})"] = (f"GraphConv({_r})", "reduce", _r, False)
    _NAMES[f"sageconv({_r})"] = (f"SAGEConv({_r})", "reduce", _r, False)
    _NAMES[f"{_r}aggregation"] = (f"{_r.capitalize()}Aggregation", "reduce", _r, False)
for _k in ("gat", "gatv2", "dot"):
    _NAMES[f"graph_attention({_k})"] = (f"graph_attention({_k})", "attention", _k, False)
_NAMES.update({
    "segment_reduce": ("segment_reduce(max)", "reduce", "max", False),
    "graph_attention": ("graph_attention(gat)", "attention", "gat", False),
    "gcn_propagate": ("gcn_propagate", "spmm", "gcn", True),
    "gcnconv": ("GCNConv", "spmm", "gcn", True),
    "graphconv": ("GraphConv(add)", "spmm", "add", False),
    "sageconv": ("SAGEConv(mean)", "spmm", "mean", False),
    "sageconv(mean)": ("SAGEConv(mean)", "spmm", "mean", False),
    "gatconv": ("GATConv", "attention", "gat", True),
    "gatv2conv": ("GATv2Conv", "attention", "gatv2", True),
    "transformerconv": ("TransformerConv", "attention", "dot", False),
})
del _r, _k
PLAN_NAMES = tuple(sorted({v[0] for v in _NAMES.values()}))


def _resolve_name(layer):
    """The _NAMES entry of a name, a layer class or a layer instance (its ``aggr`` included)."""
    if isinstance(layer, type):
        name = layer.__name__
    elif isinstance(layer, torch.nn.Module):
        name = type(layer).__name__
        aggr = getattr(layer, "aggr", None)
        if name in ("GraphConv", "SAGEConv") and isinstance(aggr, str):
            name = f"{name}({aggr})"
    elif isinstance(layer, str):
        name = layer
    else:
        raise ValueError(f"plan() takes a layer or family name, a layer class or a layer, got "
                         f"{type(layer).__name__}")
    key = "".join(name.split()).lower().replace("'", "").replace('"', "").replace("aggr=", "")
    if key not in _NAMES:
        raise ValueError(f"unknown layer or family {name!r} for plan(); accepted (case does not "
                         f"matter): {', '.join(PLAN_NAMES)}")
    return _NAMES[key]


def _check_dtype(dtype) -> torch.dtype:
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None) if dtype.isidentifier() else None
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def plan_layer(graph, layer, features: int = 128, dtype=torch.float32, *,
               training: bool = True, backend: Optional[str] = None,
               heads: Optional[int] = None) -> Plan:
    """:meth:`gnnio.Graph.plan`."""
    display, family, kind, loops = _resolve_name(layer)
    dtype = _check_dtype(dtype)
    if isinstance(features, bool) or not isinstance(features, int) or features < 0:
        raise ValueError(f"features must be an int >= 0, got {features!r}")
    if backend is not None and family != "spmm":
        raise ValueError(f"backend= forces the SpMM backend; {display} is in the {family} family")
    channels = None  # a head's, for the attention rule
    if heads is not None:
        if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
            raise ValueError(f"heads must be an int >= 1, got {heads!r}")
        if family != "attention":
            raise ValueError(f"heads= is an attention layer's; {display} is in the {family} family")
        if features < heads or features % heads:
            raise ValueError(f"features ({features}) must be heads ({heads}) x the channels a head")
        channels = features // heads
    if isinstance(layer, torch.nn.Module) and family == "attention":
        # An attention layer knows its heads and channels a head (the attention runs on
        # heads x out_channels whatever concat does to its output).
        own = (getattr(layer, "heads", None), getattr(layer, "out_channels", None))
        if all(isinstance(v, int) for v in own):
            if heads is not None and (heads, channels) != own:
                raise ValueError(f"heads={heads} and features={features} ({channels} channels a "
                                 f"head) contradict the layer's {own[0]} heads of {own[1]} channels")
            heads, channels = own
            features = heads * channels
    # The graph the layer runs on: GCNConv adds a loop per node (square graphs only); GATConv and
    # GATv2Conv add min(num_src, num_dst) loops, also to a bipartite graph (PyG's rule).
    if loops and isinstance(layer, torch.nn.Module) and getattr(layer, "add_self_loops", True) is False:
        loops = False  # an instance built with add_self_loops=False runs on the graph as given
    self_loops = loops and (family == "attention" or not graph.is_bipartite)
    if not self_loops:
        g = graph
    elif graph.is_bipartite:
        g = graph.with_self_loops(min(graph.num_src, graph.num_dst))[0]
    else:
        g = graph.with_remaining_self_loops()[0]
    common = dict(layer=display, family=family, features=features, dtype=dtype,
                  self_loops=self_loops)
    if family == "spmm":
        return _plan_spmm(g, features, dtype, backend, training, common)
    if family == "reduce":
        return _plan_reduce_layer(g, dtype, training, common)
    return _plan_attention_layer(g, features, training, common, kind, channels)


def _csr_algorithm(graph, width: int):
    """What csrc/gnnio/spmm/policy.h's choose_spmm_algorithm picks for the CSR path."""
    if torch.are_deterministic_algorithms_enabled():
        return "rowwarp", ("row-warp (torch.use_deterministic_algorithms(True): bitwise "
                           "repeatable)")
    if graph.num_edges > graph.num_dst * graph.num_src:
        return "rowwarp", f"row-warp (cuSPARSE rejects nnz {graph.num_edges} > rows x cols)"
    if width == 1:
        return "rowwarp", "row-warp (one-column product)"
    if _policy._env("GNNIO_SPMM_ALG") == "rowwarp":
        return "rowwarp", "row-warp (GNNIO_SPMM_ALG=rowwarp)"
    alg = "ALG_DEFAULT" if _policy._env("GNNIO_SPMM_ALG") == "default" else "CSR_ALG2"
    return "cusparse", f"cuSPARSE {alg}"


def _plan_spmm(graph, features, dtype, backend, training, common) -> Plan:
    forced = _policy._forced_spmm_backend(backend)
    rule = _policy._spmm_rule(graph, features, dtype, want_stats=True, training=training)
    threshold = None if rule.threshold == float("inf") else rule.threshold
    stats, tiles = {}, ""
    if rule.stats is not None:
        s = rule.stats
        stats = {"edges_per_tile": s["edges_per_tile"], "fill_ratio": s["fill_ratio"],
                 "num_tiles": s["num_tiles"]}
        tiles = (f"{s['edges_per_tile']:.1f} edges per 16x16 tile (fill ratio "
                 f"{s['fill_ratio']:.2f})")
        above = s["edges_per_tile"] >= rule.threshold
        compare = f"{tiles} {'>=' if above else '<'} threshold {rule.threshold:.1f}"
        if rule.small:
            compare += (f" (the small-graph{' training' if training else ''} threshold: "
                        f"{graph.num_dst:,} rows <= {_policy.WSB_SMALL_ROWS:,}; above that rows count "
                        f"it is {_policy.wsb_threshold(features, dtype):.1f})")
    name = _DTYPE_NAMES.get(dtype, str(dtype))
    if forced is not None:
        choice = cpu = forced[0]
        why = f"{choice.upper()}: forced by {forced[1]}"
        if rule.why == "tiles":
            why += f" (unforced: {compare}, {'WSB' if rule.wsb else 'CSR'})"
        elif rule.why == "tf32":
            why += f" (unforced: CSR, float32 without tf32 allowed; {compare})"
    else:
        choice, cpu = ("wsb" if rule.wsb else "csr"), "csr"
        if rule.why == "dtype":
            why = f"CSR: {name} has no tensor-core WSB kernel on CUDA"
        elif rule.why == "empty":
            why = "CSR: no edges or no features to tile"
        elif rule.why == "tf32":
            why = (f"CSR: float32 on WSB runs as tf32 (~1e-3 relative), which is not allowed "
                   f"(torch.backends.cuda.matmul.fp32_precision "
                   f"{torch.backends.cuda.matmul.fp32_precision!r}); with tf32 allowed, "
                   f"{compare} would pick {'WSB' if above else 'CSR'}")
        else:
            why = (f"{'WSB' if rule.wsb else 'CSR'}: {compare} for {name} at {features} "
                   f"features; {_policy._nearest_measurement(stats['edges_per_tile'], dtype)}")
    if choice == "csr":
        choice, alg_why = _csr_algorithm(graph, features)
        why += f". The CSR kernel: {alg_why}"
    return Plan(backend=choice, cpu_backend=cpu, reason=why + ".", wsb_threshold=threshold,
                stats=stats, **common)


def _count(t) -> int:
    return 0 if t is None else int(t.size(0))


def _split_fields(graph, p, chunk, training) -> dict:
    """The Plan fields of a reduce or attention split plan p (ReducePlan / AttentionPlan, which
    share their split fields), chunk its work items' size, and the statistics it read."""
    split = p.heavy_rows is not None or p.heavy_src is not None
    stats = graph.stats()
    deciding = {"max_in_degree": stats["max_in_degree"],
                "mean_in_degree": stats["mean_in_degree"]}
    if training:
        deciding["max_out_degree"] = graph.max_out_degree()
    return dict(light_max_degree=p.light_max_degree if p.heavy_rows is not None else None,
                chunk=chunk if split else None, heavy_rows=_count(p.heavy_rows),
                heavy_items=_count(p.heavy_items),
                light_max_out_degree=p.light_max_out_degree if p.heavy_src is not None else None,
                heavy_sources=_count(p.heavy_src), heavy_source_items=_count(p.heavy_src_items),
                stats=deciding)


def _plan_reduce_layer(graph, dtype, training, common) -> Plan:
    p = _policy.plan_reduce(graph, dtype, backward=training)
    fields = _split_fields(graph, p, p.edge_chunk, training)
    split = fields["chunk"] is not None
    why = p.reason
    if split:
        why += ("; measured on the H200 (float32 forward): degree-aware 238x node-parallel on "
                "powerlaw-1M-16M, 1.00x on uniform-1M-16M")
    return Plan(backend="degree-aware" if split else "node-parallel", cpu_backend="node-parallel",
                reason=why + ".", **fields, **common)


def _plan_attention_layer(graph, width, training, common, kind, channels) -> Plan:
    # With the channels a head, the rule sees what a call does (the narrow build's break-even
    # for heads of <= 32 channels, none under 32 or over 128); without them, the wide build's
    # thresholds, the conservative side, and the channels-a-head conditions are left to the call.
    backend, why = _policy.attention_backend(
        None, graph=graph if kind == "gat" else None, dtype=common["dtype"], training=training,
        device_type="cuda", channels=channels)
    forced = _policy._forced_backend(None, "GNNIO_ATTENTION_BACKEND") is not None
    tiles = backend == "wsb" and kind == "gat"
    float64 = common["dtype"] == torch.float64
    if tiles and not float64:
        stats = graph.wsb_stats()
        # Forced tiles run on the CPU too; auto's choice is CUDA's (the CPU keeps the CSR kernels).
        return Plan(backend="wsb", cpu_backend="wsb" if forced else "csr",
                    reason=f"{why}: GAT attention on 16 x 16 tiles ({stats['edges_per_tile']:.1f} "
                           f"edges per tile); calls with dropout, edge terms, returned weights or "
                           f"more than 128 channels a head stay on the CSR kernels.",
                    stats={k: stats[k] for k in ("num_tiles", "edges_per_tile", "fill_ratio")},
                    **common)
    p = _policy.plan_attention(graph, width, backward=training)
    fields = _split_fields(graph, p, _policy.ATTENTION_CHUNK, training)
    if forced and backend == "wsb":  # but not for this call on CUDA
        why = (f"{why} takes kind 'gat' only: kind {kind!r} runs on the CSR kernels" if not tiles
               else f"{why}, but CUDA runs float64 on the CSR kernels (the tiles are tensor-core "
                    f"products; the CPU runs float64 on them)")
    return Plan(backend="csr-split" if fields["chunk"] is not None else "csr",
                cpu_backend="wsb" if tiles else "csr", reason=f"{p.reason}; {why}.", **fields,
                **common)
