"""gnnio.ops.graph_attention(kind='dot') with key and value rows shared by the query's heads
([num_src, 1, C] against a query [num_dst, H, C]: multi-query attention, TransformerConv's
reassociated form): against the op with the rows copied per head (the per-head kernel, which
test_attention_op.py checks against a materialised reference), against a float64 computation
written with E x H tensors, gradcheck, the gradients' sum over heads, and bad inputs."""
import zlib

import pytest
import torch

import gnnio
from conftest import assert_no_worse_than_reference
from graphs import adversarial, hub, random_graph, real

pyg_utils = pytest.importorskip("torch_geometric.utils")


def graphs():
    cases = [("cora",) + real("cora"), ("random",) + random_graph(60, 500)] + adversarial()
    return cases


def reference(graph, query, key, value, scale, edge_key=None, edge_value=None):
    """The contract with E x H x C tensors: every head scores against the source's one key row."""
    src, dst = graph.edge_index.long()
    k = key[src] + (0 if edge_key is None else edge_key)  # [E, 1 or H, C]
    e = scale * (query[dst] * k).sum(-1)  # [E, H]
    p = pyg_utils.softmax(e, dst, num_nodes=graph.num_dst)
    v = value[src] + (0 if edge_value is None else edge_value)
    heads, channels = query.shape[1:]
    return torch.zeros(graph.num_dst, heads, channels, dtype=query.dtype).index_add(
        0, dst, p.unsqueeze(-1) * v)


def operands(graph, heads, channels, dtype, gen, same_rows, edge_terms=()):
    def r(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    query = r(graph.num_dst, heads, channels)
    value = r(graph.num_src, 1, channels)
    key = value if same_rows else r(graph.num_src, 1, channels)
    edge = {name: r(graph.num_edges, heads, channels) for name in edge_terms}
    return query, key, value, edge


def grads(out, tensors, gout):
    unique = list({id(t): t for t in tensors}.values())
    return [out] + list(torch.autograd.grad(out, unique, gout))


@pytest.mark.parametrize("same_rows", [True, False], ids=["key_is_value", "key_and_value"])
@pytest.mark.parametrize("edge_terms", [(), ("edge_key", "edge_value")], ids=["plain", "edge"])
@pytest.mark.parametrize("name,ei,n", graphs(), ids=lambda c: c if isinstance(c, str) else "")
def test_shared_rows_match_rows_copied_per_head(name, ei, n, same_rows, edge_terms):
    """The shared-row kernel against the per-head kernel on the rows copied per head: the same
    scores and sums in the same order, so the forward is the same bits (float64 and float32).
    The gradients of key and value sum the heads' in another order (in the kernel's double
    accumulator, against per-head roundings summed by autograd): float32 against the copied
    path in float64, no worse than the copied path in float32."""
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()) + 7 * same_rows + len(edge_terms))
    heads, channels = 3, 5
    q64, k64, v64, edge64 = operands(graph, heads, channels, torch.float64, gen, same_rows, edge_terms)
    gout = torch.randn(graph.num_dst, heads, channels, generator=gen, dtype=torch.float64)
    results = {}
    for dtype in (torch.float64, torch.float32):
        leaf = {id(t): t.detach().to(dtype).requires_grad_() for t in [q64, k64, v64] + list(edge64.values())}
        query, key, value = (leaf[id(t)] for t in (q64, k64, v64))
        edge = {name: leaf[id(t)] for name, t in edge64.items()}
        tensors = [query, key, value] + list(edge.values())
        out = gnnio.ops.graph_attention(graph, "dot", value, query=query, key=key, scale=0.4, **edge)
        copied_value = value.expand(-1, heads, -1).contiguous()
        copied_key = copied_value if same_rows else key.expand(-1, heads, -1).contiguous()
        copied = gnnio.ops.graph_attention(graph, "dot", copied_value, query=query, key=copied_key,
                                           scale=0.4, **edge)
        torch.testing.assert_close(out, copied, rtol=0, atol=0)
        results[dtype] = (grads(out, tensors, gout.to(dtype)), grads(copied, tensors, gout.to(dtype)))
    exact = results[torch.float64][1]
    for ours, theirs, ref in zip(*results[torch.float32], exact):
        assert_no_worse_than_reference(ours, theirs, ref)


@pytest.mark.parametrize("same_rows", [True, False], ids=["key_is_value", "key_and_value"])
@pytest.mark.parametrize("name,ei,n", graphs(), ids=lambda c: c if isinstance(c, str) else "")
def test_shared_rows_against_float64(name, ei, n, same_rows):
    """float32 against the E x H float64 reference: no worse than that reference run in float32."""
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(11 + same_rows)
    q64, k64, v64, _ = operands(graph, 4, 6, torch.float64, gen, same_rows)
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q64, k64, v64))
    k32 = v32 if same_rows else k32
    gout = torch.randn(graph.num_dst, 4, 6, generator=gen, dtype=torch.float64)
    exact = grads(reference(graph, q64, k64, v64, 0.3), [q64, k64, v64], gout)
    theirs = grads(reference(graph, q32, k32, v32, 0.3), [q32, k32, v32], gout.float())
    ours = grads(gnnio.ops.graph_attention(graph, "dot", v32, query=q32, key=k32, scale=0.3),
                 [q32, k32, v32], gout.float())
    for a, b, c in zip(ours, theirs, exact):
        assert_no_worse_than_reference(a, b, c)


def test_shared_rows_hub_and_bipartite():
    """A destination with 10^5 neighbours, and more sources than destinations."""
    ei, n = hub()
    gen = torch.Generator().manual_seed(3)
    for graph in (gnnio.Graph(ei, num_nodes=n), gnnio.Graph(ei[:, ei[1] < 30], size=(n, 30))):
        q, k, v, _ = operands(graph, 2, 4, torch.float64, gen, same_rows=False)
        out = gnnio.ops.graph_attention(graph, "dot", v, query=q, key=k, scale=0.5)
        ref = reference(graph, q, k, v, 0.5)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        gout = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        for a, b in zip(grads(out, [q, k, v], gout)[1:], grads(ref, [q, k, v], gout)[1:]):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("same_rows", [True, False], ids=["key_is_value", "key_and_value"])
def test_shared_rows_gradcheck_float64(same_rows):
    ei, n = random_graph(12, 50)
    ei = ei[:, ei[1] != 3]  # a destination without neighbours
    graph = gnnio.Graph(ei, num_nodes=n)
    gen = torch.Generator().manual_seed(5)
    q, k, v, edge = operands(graph, 3, 2, torch.float64, gen, same_rows, ("edge_key",))
    if same_rows:
        fn = lambda q, v, ek: gnnio.ops.graph_attention(graph, "dot", v, query=q, key=v,  # noqa: E731
                                                        edge_key=ek, scale=0.7)
        assert torch.autograd.gradcheck(fn, (q, v, edge["edge_key"]))
    else:
        fn = lambda q, k, v: gnnio.ops.graph_attention(graph, "dot", v, query=q, key=k,  # noqa: E731
                                                       scale=0.7)
        assert torch.autograd.gradcheck(fn, (q, k, v))


def test_one_head_is_the_per_head_op():
    """With one query head the rows are not 'shared': the usual op, against the reference
    (float32 against float64: within a few float32 roundings of 4-channel sums)."""
    ei, n = random_graph(30, 200)
    graph = gnnio.Graph(ei, num_nodes=n)
    q, k, v = (torch.randn(n, 1, 4) for _ in range(3))
    out = gnnio.ops.graph_attention(graph, "dot", v, query=q, key=k)
    torch.testing.assert_close(out, reference(graph, q.double(), k.double(), v.double(), 1.0).float(),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(key_heads=2), "key must be a Tensor of shape"),    # key per head, value shared
    (dict(value_heads=2), "query must be a Tensor of shape"),  # value per head, key shared
    (dict(kind="gatv2"), "query must be a Tensor of shape"),  # only kind dot shares rows
])
def test_shared_rows_bad_inputs(kwargs, fragment):
    ei, n = random_graph(20, 80)
    graph = gnnio.Graph(ei, num_nodes=n)
    kind = kwargs.get("kind", "dot")
    q = torch.randn(n, 3, 4)
    k = torch.randn(n, kwargs.get("key_heads", 1), 4)
    v = torch.randn(n, kwargs.get("value_heads", 1), 4)
    extra = dict(att=torch.randn(3, 4)) if kind == "gatv2" else {}
    with pytest.raises(ValueError, match=fragment):
        gnnio.ops.graph_attention(graph, kind, v, query=q, key=k, **extra)

