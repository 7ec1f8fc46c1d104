"""TransformerConv with W_k and W_v moved around the aggregation: how far its float32 results
are from PyG's, and what it would move. A planning study for issue 3's last bars (NOTES v18),
run on the CPU; not a kernel.

PyG's TransformerConv (heads H, C channels per head, input width F, no edge features) forms
per edge and head

    e_ij = q_i . k_j / sqrt(C),   k_j = W_k,h x_j + b_k,h,   out_i = sum_j a_ij (W_v,h x_j + b_v,h)

with a = softmax_j(e). Reassociated, with q~_i = W_k,h^T q_i (F values per head):

    e_ij = (q~_i . x_j + q_i . b_k,h) / sqrt(C)     (the second term is the same for every j of
                                                      a row: softmax drops it)
    out_i = W_v,h (sum_j a_ij x_j) + b_v,h sum_j a_ij

so a fused kernel gathers x_j (F values, shared by the heads) once per edge instead of k_j and
v_j (2 H C values), and applies W_k,h / W_v,h once per destination instead of once per source.
The sums are the same in exact arithmetic; in float32 they are rounded in another order, which
is what this study measures: the largest error of the output and of every gradient, relative to
that tensor's largest float64 value, for PyG's float32 layer and for the reassociated form
(torch ops, autograd), on the same weights and inputs. `python -m
gnnio.bench.transformer_reassociation` prints the table and the byte model for
powerlaw-1M-16M."""
import argparse
import math

import torch

from gnnio import datasets


def reassociated(conv, x, edge_index):
    """The TransformerConv forward of PyG's `conv` (no edge features, concat, root_weight, no
    beta, no dropout) with W_k and W_v applied around the aggregation; differentiable."""
    H, C = conv.heads, conv.out_channels
    src, dst = edge_index
    n = x.size(0)
    q = conv.lin_query(x).view(n, H, C)
    w_k = conv.lin_key.weight.view(H, C, -1)  # [H, C, F]
    w_v = conv.lin_value.weight.view(H, C, -1)
    q_t = torch.einsum("nhc,hcf->nhf", q, w_k)  # q~ = W_k,h^T q_i
    x_j = x[src][:, None, :]  # gathered once, shared by the heads
    e = (q_t[dst] * x_j).sum(-1) / math.sqrt(C)  # [E, H]; q . b_k dropped
    m = torch.full((n, H), -math.inf, dtype=x.dtype).scatter_reduce(
        0, dst[:, None].expand(-1, H), e.detach(), "amax", include_self=True)
    w = torch.exp(e - m[dst])
    s = torch.zeros(n, H, dtype=x.dtype).index_add(0, dst, w)
    a = w / (s[dst] + 1e-16)  # PyG's softmax denominator
    agg = torch.zeros(n, H, x.size(1), dtype=x.dtype).index_add(0, dst, a[..., None] * x_j)
    out = torch.einsum("nhf,hcf->nhc", agg, w_v)
    a_sum = torch.zeros(n, H, dtype=x.dtype).index_add(0, dst, a)  # 1, or 0 for no in-edges
    out = out + a_sum[..., None] * conv.lin_value.bias.view(1, H, C)
    return out.reshape(n, H * C) + conv.lin_skip(x)


def _grads(fn, conv, x, gout):
    out = fn(conv, x)
    params = [x] + list(conv.parameters())
    return [out] + list(torch.autograd.grad(out, params, gout, allow_unused=True))


def compare(edge_index, num_nodes, features=128, heads=4, channels=32, seed=0):
    """{quantity: (PyG float32 error, reassociated float32 error, reassociated float64 error)},
    each the largest |error| over that tensor relative to its largest float64 value (PyG's layer
    in float64); for lin_key.bias, which the reassociated form drops, "(abs)": PyG's float32
    gradient, 0, and the float64 gradient, absolute."""
    from torch_geometric.nn import TransformerConv
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    conv = TransformerConv(features, channels, heads=heads)
    x = torch.randn(num_nodes, features, generator=gen)
    gout = torch.randn(num_nodes, heads * channels, generator=gen)
    names = ["out", "d x"] + [f"d {name}" for name, _ in conv.named_parameters()]

    def pyg(c, xx):
        return c(xx, edge_index)

    def ours(c, xx):
        return reassociated(c, xx, edge_index)
    conv64 = TransformerConv(features, channels, heads=heads).double()
    conv64.load_state_dict({k: v.double() for k, v in conv.state_dict().items()})
    exact = _grads(pyg, conv64, x.double().requires_grad_(), gout.double())
    theirs = _grads(pyg, conv, x.clone().requires_grad_(), gout)
    mine = _grads(ours, conv, x.clone().requires_grad_(), gout)
    mine64 = _grads(ours, conv64, x.double().requires_grad_(), gout.double())
    result = {}
    for name, c, a, b, b64 in zip(names, exact, theirs, mine, mine64):
        if b is None:  # lin_key's bias: softmax drops it, its exact gradient is 0
            result[name + " (abs)"] = (a.abs().max().item(), 0.0, c.abs().max().item())
            continue
        scale = c.abs().max().item() or 1.0
        result[name] = ((a.double() - c).abs().max().item() / scale,
                        (b.double() - c).abs().max().item() / scale,
                        (b64 - c).abs().max().item() / scale)
    return result


def byte_model(num_edges=16_000_000, num_nodes=1_000_000, features=128, heads=4, channels=32,
               copy_tbps=4.27):
    """Bytes each forward must gather, and the FFMA work of the linears, float32."""
    hc = heads * channels
    now = num_edges * 2 * hc * 4 + num_nodes * (hc + hc) * 4  # k_j, v_j per edge; q, out
    re = num_edges * features * 4 + num_nodes * (hc + hc) * 4  # x_j per edge; q, out
    gemm = num_nodes * features * hc  # one 128 -> 128 linear, multiply-adds
    return {"gather now (GB)": now / 1e9, "gather now (ms)": now / copy_tbps / 1e9,
            "gather reassociated (GB)": re / 1e9, "gather reassociated (ms)": re / copy_tbps / 1e9,
            "linears now (GMAC)": 4 * gemm / 1e9,
            "reassociated: 2 linears + W_k~ and W_v per row (GMAC)": 4 * gemm / 1e9,
            "score + aggregation multiply-adds now (GMAC)": 2 * num_edges * hc / 1e9,
            "score + aggregation reassociated (GMAC)": 2 * num_edges * heads * features / 1e9}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    args = p.parse_args(argv)
    cases = []
    g = datasets.load("cora")
    cases.append(("cora", g.edge_index, g.num_nodes))
    cases.append(("powerlaw-3K-30K", datasets.powerlaw(3000, 30_000, seed=1), 3000))
    hub_src = torch.randint(2000, (20_000,), generator=torch.Generator().manual_seed(2))
    hub = torch.stack([hub_src, torch.zeros_like(hub_src)])
    cases.append(("hub-20K", torch.cat([hub, datasets.uniform(2000, 8000, seed=3)], 1), 2000))
    print("largest |error| / largest |float64 value|, worst over seeds; PyG float32 | "
          "reassociated float32 | reassociated float64 (the identity)")
    for name, ei, n in cases:
        worst = {}
        for seed in range(args.seeds):
            for k, v in compare(ei, n, seed=seed).items():
                worst[k] = tuple(max(a, b) for a, b in zip(worst.get(k, (0, 0, 0)), v))
        print(f"{name} ({n} nodes, {ei.size(1)} edges)")
        for k, (a, b, c) in worst.items():
            print(f"  {k:22s} {a:9.2e} | {b:9.2e} ({b / max(a, 1e-30):5.2f}x) | {c:9.2e}")
    print("powerlaw-1M-16M, 128 -> 4 x 32, float32:")
    for k, v in byte_model().items():
        print(f"  {k}: {v:.2f}")


if __name__ == "__main__":
    main()
