import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from gnnio.nn._base import LayerBase
from gnnio.nn._common import (GraphCache, _plain_linear, check_channels, check_in_channels,
                               check_sum_kwargs, linear,
                               linears_of_one_input, materialise_lazy, reset_linear, split_pair)
from gnnio.nn.conv.gat_conv import _check_edge_attr, _edge_attr_of, _returned_edge_index
from gnnio.ops import attention_weights, graph_attention
from gnnio.nn.conv import _reassociated
from gnnio.nn.conv._reassociated import ReassociatedAttention
from gnnio.plan import plan_attention, plan_transformer


class TransformerConv(LayerBase):
    r"""The graph transformer operator from `"Masked Label Prediction: Unified Message Passing
    Model for Semi-Supervised Classification" <https://arxiv.org/abs/2009.03509>`_, drop-in for
    ``torch_geometric.nn.TransformerConv`` (PyG 2.8).

    .. math::
        \mathbf{x}^{\prime}_i = \mathbf{W}_1 \mathbf{x}_i + \sum_{j \in \mathcal{N}(i)}
        \alpha_{i,j} \left(\mathbf{W}_2 \mathbf{x}_{j} + \mathbf{W}_6 \mathbf{e}_{ij}\right),
        \qquad \alpha_{i,j} = \mathrm{softmax}_j\left(\frac{(\mathbf{W}_3\mathbf{x}_i)^{\top}
        (\mathbf{W}_4\mathbf{x}_j + \mathbf{W}_6 \mathbf{e}_{ij})}{\sqrt{d}}\right)

    per head (``lin_skip`` = W1, ``lin_value`` = W2, ``lin_query`` = W3, ``lin_key`` = W4,
    ``lin_edge`` = W6). With ``beta``, :math:`\mathbf{x}^{\prime}_i = \beta_i \mathbf{W}_1
    \mathbf{x}_i + (1 - \beta_i) \mathbf{m}_i`, :math:`\beta_i = \sigma(\mathbf{w}_5^{\top}
    [\mathbf{W}_1 \mathbf{x}_i, \mathbf{m}_i, \mathbf{W}_1 \mathbf{x}_i - \mathbf{m}_i])`.
    The attention is one fused pass per destination and head
    (``gnnio.ops.graph_attention(kind='dot', scale=1/sqrt(out_channels))``, the edge term as
    both edge key and edge value); no E x H x C keys or messages are stored.

    Args:
        in_channels (int or (int, int)), out_channels (int), heads (int, default ``1``),
        concat (bool, default ``True``), beta (bool, default ``False``; only with
        root_weight), dropout (float, default ``0.0``; the mask is drawn in the kernel from a
        seed taken from torch's default generator), edge_dim (int, optional), bias (bool,
        default ``True``: of lin_key, lin_query, lin_value and lin_skip), root_weight (bool,
        default ``True``): as PyG's. No self loops are added.

    The attention runs in one of three forms (``gnnio.plan.plan_transformer``; the
    ``GNNIO_TRANSFORMER_FORM`` environment variable forces one): PyG's (``direct``), or with
    :math:`\mathbf{W}_4` and :math:`\mathbf{W}_2` moved around the aggregation
    (``reassociated``): :math:`\alpha_{i,j} = \mathrm{softmax}_j(\tilde{\mathbf{q}}_i^{\top}
    \mathbf{x}_j / \sqrt{d})` with :math:`\tilde{\mathbf{q}}_i = \mathbf{W}_4^{\top}
    \mathbf{W}_3 \mathbf{x}_i` per head (the key bias shifts every score of a row equally, so
    the softmax drops it: its gradient is exactly zero), and :math:`\mathbf{m}_i = \mathbf{W}_2
    \sum_j \alpha_{i,j} \mathbf{x}_j + \mathbf{b}_2` (no bias on a row without neighbours,
    as PyG's empty sum): one input row gathered per edge for all heads, in place of a key and a
    value row per edge and head. The same sums in another order; without dropout, edge_dim or
    returned weights. ``fused`` runs the reassociated form in one op per tile of destinations
    (``gnnio::transformer_fused_forward``: q~, the walk and W_2 in one CUDA kernel, the value
    bias and the skip added in its store; on CUDA float32 with 128 input features = heads x
    out_channels and 1, 2 or 4 heads). Both keep PyG's backward (the direct form's).

    Shapes: x ``[N, F]`` or ``([N_src, F_src], [N_dst, F_dst])``; edge_attr ``[E, edge_dim]``;
    output ``[N_dst, heads * out_channels]`` (concat) or ``[N_dst, out_channels]``. When
    ``return_attention_weights`` is a bool (``False`` included, as PyG checks ``isinstance``):
    ``(out, (edge_index, alpha))`` with alpha ``[E, heads]`` from before dropout (not
    differentiable).
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int,
                 heads: int = 1, concat: bool = True, beta: bool = False, dropout: float = 0.0,
                 edge_dim: Optional[int] = None, bias: bool = True, root_weight: bool = True,
                 **kwargs):
        check_sum_kwargs("TransformerConv", kwargs)
        pair = (in_channels, in_channels) if isinstance(in_channels, int) else tuple(in_channels)
        check_in_channels("TransformerConv", *pair)
        check_channels("TransformerConv", out_channels, heads)
        if edge_dim is not None:
            check_channels("TransformerConv", edge_dim)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"gnnio.nn.TransformerConv: dropout must be in [0, 1), got {dropout}")
        super().__init__(aggr="add", node_dim=0)  # PyG's layer's, which user code reads
        self.in_channels, self.out_channels, self.heads = in_channels, out_channels, heads
        self.beta = beta and root_weight
        self.root_weight, self.concat, self.dropout, self.edge_dim = root_weight, concat, dropout, edge_dim
        self.lin_key = linear(pair[0], heads * out_channels, bias)
        self.lin_query = linear(pair[1], heads * out_channels, bias)
        self.lin_value = linear(pair[0], heads * out_channels, bias)
        if edge_dim is not None:
            self.lin_edge = torch.nn.Linear(edge_dim, heads * out_channels, bias=False)
        else:
            self.register_parameter("lin_edge", None)
        skip = heads * out_channels if concat else out_channels
        self.lin_skip = linear(pair[1], skip, bias)
        if self.beta:
            self.lin_beta = torch.nn.Linear(3 * skip, 1, bias=False)
        else:
            self.register_parameter("lin_beta", None)
        self._graphs = GraphCache()
        self.reset_parameters()

    def reset_parameters(self):
        for lin in (self.lin_key, self.lin_query, self.lin_value, self.lin_edge, self.lin_skip,
                    self.lin_beta):
            if lin is not None:
                reset_linear(lin)
        self._graphs.clear()

    def forward(self, x, edge_index, edge_attr: Optional[Tensor] = None,
                return_attention_weights=None):
        H, C = self.heads, self.out_channels
        x_src, x_dst = split_pair(x)
        if x_dst is None:
            raise ValueError("gnnio.nn.TransformerConv needs destination features: pass "
                             "(x_src, x_dst), not (x_src, None)")
        if x_src.dim() != 2 or x_dst.dim() != 2:
            raise ValueError("gnnio.nn.TransformerConv: node features must be 2-D "
                             "[num_nodes, features]")
        # (lin_skip only with root_weight: PyG never calls it otherwise, so it stays lazy there)
        materialise_lazy((self.lin_query, x_dst), (self.lin_key, x_src), (self.lin_value, x_src),
                         (self.lin_skip, x_dst if self.root_weight else None))
        want_weights = isinstance(return_attention_weights, bool)
        dropout = self.dropout if self.training else 0.0
        graph = self._graphs.get(edge_index, x_src.size(0), x_dst.size(0))
        # (whether a backward can follow: 'auto' runs the fused form only without one)
        grad = torch.is_grad_enabled() and (x_src.requires_grad or x_dst.requires_grad or any(
            p.requires_grad for p in self.parameters()))
        form, _ = plan_transformer(
            x_src.device, edge_term=self.lin_edge is not None, dropout=dropout > 0,
            weights=want_weights, plain=_plain_linear(self.lin_key) and _plain_linear(self.lin_value),
            autocast=torch.is_autocast_enabled(x_src.device.type), heads=H, features=x_src.size(1),
            channels=C, dtype=x_src.dtype, grad=grad, num_edges=graph.num_edges,
            num_dst=graph.num_dst)
        reassociated = form in ("reassociated", "fused")
        # The skip first: autograd runs a later node's backward first, so lin_skip's backward
        # (an [N_dst, F] gradient of x_dst, held until every use of x_dst is done) runs after the
        # attention's instead of being alive across it; and without beta the output is written
        # into the skip's own buffer (addmm's backward does not need its output). Same values.
        # One input (not bipartite): the linears in one autograd node, with one d x buffer
        # in the backward (linears_of_one_input); its backward runs after the attention's, so
        # the skip's gradient is not alive across it either. The reassociated form projects
        # no keys or values.
        # (The skip listed first, for the fallback to the modules' own calls.)
        kv = () if reassociated else (self.lin_key, self.lin_value)
        if x_dst is x_src:
            lins = ((self.lin_skip,) if self.root_weight else ()) + (self.lin_query,) + kv
            projected = linears_of_one_input(x_src, *lins)
            x_r = projected[0] if self.root_weight else None
            query, *key_value = projected[1 if self.root_weight else 0:]
        else:
            x_r = self.lin_skip(x_dst) if self.root_weight else None
            query = self.lin_query(x_dst)
            key_value = [lin(x_src) for lin in kv]
        query = query.view(-1, H, C)
        edge_attr = _edge_attr_of(edge_index, edge_attr, self.lin_edge)
        if reassociated:
            if edge_attr is not None:
                raise ValueError("gnnio.nn.TransformerConv: edge_attr was given but the layer has "
                                 "no edge_dim")
            if form == "fused" and self._residual_fusable(x_r, x_src, query):
                # the skip added in the kernel's store (out = x_r + attention, as _finish adds)
                out = self._reassociated(graph, x_src, query, True, x_r)
                return out if out.dim() == 2 else out.view(-1, H * C)  # (2-D: x_r itself)
            return self._finish(self._reassociated(graph, x_src, query, form == "fused"), x_r)
        key, value = (t.view(-1, H, C) for t in key_value)
        edge = None
        if self.lin_edge is not None:
            if edge_attr is None:
                raise ValueError("gnnio.nn.TransformerConv: the layer has edge_dim="
                                 f"{self.edge_dim}, so forward needs edge_attr")
            edge_attr = _check_edge_attr("TransformerConv", edge_attr, graph.num_edges,
                                         self.edge_dim, allow_1d=False)
            edge = self.lin_edge(edge_attr).view(-1, H, C)
        elif edge_attr is not None:
            raise ValueError("gnnio.nn.TransformerConv: edge_attr was given but the layer has "
                             "no edge_dim")
        kwargs = dict(query=query, key=key, edge_key=edge, edge_value=edge,
                      scale=1.0 / math.sqrt(C))
        # key and value are this call's own projections, read by nothing after the attention
        # (unless a module hook saw them): their memory may take their gradients (-2 N x H x C
        # at the backward's peak; graph_attention says when it applies).
        private = not want_weights and _plain_linear(self.lin_key) and _plain_linear(self.lin_value)
        result = graph_attention(graph, "dot", value, dropout=dropout,
                                 return_weights=want_weights and dropout == 0,
                                 backward_in_place=private, **kwargs)
        out, alpha = result if want_weights and dropout == 0 else (result, None)
        if want_weights and dropout > 0:
            # PyG returns the weights from before dropout; the op returns them after it.
            alpha = attention_weights(graph, "dot", query=query, key=key, edge_key=edge,
                                      scale=kwargs["scale"])
        out = self._finish(out, x_r)
        if want_weights:
            return out, (_returned_edge_index(edge_index, graph, False), alpha)
        return out

    def _reassociated(self, graph, x_src: Tensor, query: Tensor, fused: bool = False,
                      residual: Optional[Tensor] = None) -> Tensor:
        """The attention output [N_dst, H, C] with W_k and W_v around the aggregation (one
        autograd node: gnnio.nn.conv._reassociated); fused: in one kernel per tile
        (gnnio::transformer_fused_forward), with ``residual`` added in its store; without a
        backward, into ``residual`` itself (lin_skip's own output, which nothing else holds:
        gnnio::transformer_fused_inference, no buffer of its own and no softmax statistics),
        returned as it is: [N_dst, H C]."""
        params = (self.lin_key.weight, self.lin_key.bias, self.lin_value.weight, self.lin_value.bias)
        need_grad = self._needs_grad(x_src, query, residual)
        scale = 1.0 / math.sqrt(self.out_channels)
        # (the sources' split, and the transposed CSR it reads, only for a backward)
        plan = plan_attention(graph, self.heads * x_src.size(1), backward=need_grad) \
            if x_src.is_cuda else None
        if fused and residual is not None and not need_grad:  # (bench/NOTES.md v27)
            w_key, b_key, w_value, b_value = params
            out, _ = _reassociated._fused_forward(graph, x_src, query.contiguous(), w_key, b_key,
                                                  w_value, b_value, residual, scale, plan, True)
            return out
        return ReassociatedAttention.apply(x_src, query, *params, graph, scale, plan, need_grad,
                                           fused, residual)

    def _needs_grad(self, x_src: Tensor, query: Tensor, residual: Optional[Tensor] = None) -> bool:
        params = (self.lin_key.weight, self.lin_key.bias, self.lin_value.weight, self.lin_value.bias)
        return torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in (x_src, query, residual) + params)

    def _residual_fusable(self, x_r: Optional[Tensor], x_src: Tensor, query: Tensor) -> bool:
        """Whether the fused kernel can add the skip in its store: concatenated heads, no beta,
        lin_skip's own output of the output's shape and dtype, and no backward (the inference
        op, CPU or CUDA) or, on CUDA, a backward that does not read out (it forms D_i in its
        pass A when query needs a gradient: ReassociatedAttention; a kept out would hold the
        skip too)."""
        if x_r is None or self.lin_beta is not None or not self.concat:
            return False
        if x_r.shape != (query.size(0), self.heads * self.out_channels) or x_r.dtype != query.dtype:
            return False
        if not _plain_linear(self.lin_skip):
            return False
        if not self._needs_grad(x_src, query, x_r):
            return True
        return x_src.is_cuda and query.requires_grad and ReassociatedAttention.delta_in_pass_a()

    def _finish(self, out: Tensor, x_r: Optional[Tensor]) -> Tensor:
        """The heads concatenated or averaged, then the skip (with beta's gate)."""
        H, C = self.heads, self.out_channels
        out = out.reshape(-1, H * C) if self.concat else out.mean(dim=1)
        if x_r is not None:
            if self.lin_beta is not None:
                beta = self.lin_beta(torch.cat([out, x_r, out - x_r], dim=-1)).sigmoid()
                out = beta * x_r + (1 - beta) * out
            elif x_r.shape == out.shape and x_r.dtype == out.dtype and _plain_linear(self.lin_skip):
                # = out + x_r (addition commutes bitwise); x_r is the skip's own output, which
                # no hook of lin_skip can have kept
                out = x_r.add_(out)
            else:
                out = out + x_r
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}({self.in_channels}, {self.out_channels}, heads={self.heads})"
