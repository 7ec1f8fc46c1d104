"""What the training examples share: the models (built from gnnio's or PyG's layers, same
architecture and state_dict keys), the seeded node-classification task, and small helpers
(timing, peak memory).

Every model is a stack of ``num_layers`` convolutions of one kind with an activation between them
and, optionally, feature dropout (off by default, so that gnnio and PyG give the same loss curve
from the same initial weights):

=============  ==============================================  ==========  ======  ============
model          layer                                           hidden      heads   layers
=============  ==============================================  ==========  ======  ============
gcn            GCNConv                                          64          -       2
sage_max       SAGEConv(aggr='max')                             64          -       2
gat            GATConv (last layer: 1 head, concat=False)       8           8       2
gatv2          GATv2Conv (last layer: 1 head, concat=False)     64          4       3
transformer    TransformerConv (last: 1 head, concat=False)     16          4       2
=============  ==============================================  ==========  ======  ============

The gatv2 default is the model of issue 7 (3 layers, hidden 4 heads x 64).
"""
import resource
import time
from types import SimpleNamespace
from typing import Optional

import torch
import torch.nn.functional as F

import gnnio
import gnnio.nn

MODELS = ("gcn", "sage_max", "gat", "gatv2", "transformer")
IMPLS = ("gnnio", "pyg")

DEFAULTS = {
    "gcn": dict(hidden=64, heads=1, layers=2),
    "sage_max": dict(hidden=64, heads=1, layers=2),
    "gat": dict(hidden=8, heads=8, layers=2),
    "gatv2": dict(hidden=64, heads=4, layers=3),
    "transformer": dict(hidden=16, heads=4, layers=2),
}


def layer_module(impl: str):
    """The module the layers come from: ``gnnio.nn`` or ``torch_geometric.nn``."""
    if impl == "gnnio":
        return gnnio.nn
    if impl == "pyg":
        import torch_geometric.nn
        return torch_geometric.nn
    raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")


class GNN(torch.nn.Module):
    """``num_layers`` convolutions of one kind; ``forward(x, edge_index)`` takes whatever the
    layers take (an edge_index Tensor, or for gnnio layers a shared ``gnnio.Graph``)."""

    def __init__(self, model: str, impl: str, in_channels: int, out_channels: int,
                 hidden: Optional[int] = None, heads: Optional[int] = None,
                 layers: Optional[int] = None, dropout: float = 0.0):
        super().__init__()
        if model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {model!r}")
        d = DEFAULTS[model]
        hidden = d["hidden"] if hidden is None else hidden
        heads = d["heads"] if heads is None else heads
        layers = d["layers"] if layers is None else layers
        if layers < 1:
            raise ValueError("layers must be >= 1")
        self.model, self.impl, self.dropout = model, impl, dropout
        self.hidden, self.heads, self.num_layers = hidden, heads, layers
        nn = layer_module(impl)
        self.convs = torch.nn.ModuleList()
        c_in = in_channels
        for i in range(layers):
            last = i == layers - 1
            c_out = out_channels if last else hidden
            if model == "gcn":
                conv, width = nn.GCNConv(c_in, c_out), c_out
            elif model == "sage_max":
                conv, width = nn.SAGEConv(c_in, c_out, aggr="max"), c_out
            else:
                cls = {"gat": nn.GATConv, "gatv2": nn.GATv2Conv,
                       "transformer": nn.TransformerConv}[model]
                if last:
                    conv, width = cls(c_in, c_out, heads=1, concat=False), c_out
                else:
                    conv, width = cls(c_in, c_out, heads=heads), heads * c_out
            self.convs.append(conv)
            c_in = width
        self.act = F.relu if model in ("gcn", "sage_max") else F.elu

    def forward(self, x, edge_index):
        for i, conv in enumerate(self.convs):
            if self.dropout > 0:
                x = F.dropout(x, p=self.dropout, training=self.training)
            x = conv(x, edge_index)
            if i < len(self.convs) - 1:
                # In place: the layer's output (a bias add, which saves nothing) becomes the
                # activation, so the activation's backward keeps its result, which the next
                # layer saves anyway, instead of a second [N, width] input buffer. Same values.
                x = self.act(x, inplace=True)
        return x


def pyg_available() -> bool:
    try:
        import torch_geometric.nn  # noqa: F401
    except ImportError:
        return False
    return True


def build_model(model: str, impl: str, in_channels: int, out_channels: int, seed: int = 0,
                **kwargs) -> GNN:
    """The model with the initial weights of seed ``seed``: the PyG model is built right after
    ``torch.manual_seed(seed)`` and, for ``impl='gnnio'``, its state_dict is loaded (strictly)
    into the gnnio model, so both implementations start from identical weights. Without PyG the
    gnnio model is built from the same seed (its layers draw their weights as PyG's do)."""
    torch.manual_seed(seed)
    if impl == "pyg" or (impl == "gnnio" and pyg_available()):
        reference = GNN(model, "pyg", in_channels, out_channels, **kwargs)
        if impl == "pyg":
            return reference
        net = GNN(model, "gnnio", in_channels, out_channels, **kwargs)
        net.load_state_dict(reference.state_dict(), strict=True)
        return net
    return GNN(model, impl, in_channels, out_channels, **kwargs)


def graph_input(impl: str, edge_index: torch.Tensor, num_nodes: int):
    """What the model's layers are given: for gnnio one ``gnnio.Graph`` shared by every layer
    (CSR, transpose and normalisations built once and cached), for PyG the edge_index itself."""
    if impl == "gnnio":
        return gnnio.Graph(edge_index, num_nodes=num_nodes)
    return edge_index


# ---------------------------------------------------------------------------------------------
# data

def _mean_propagate(z: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """z_i <- mean(z_i, z_j for every edge j -> i), in plain torch."""
    out = z.clone().index_add_(0, dst, z[src])
    deg = torch.ones(z.size(0), dtype=z.dtype).index_add_(0, dst, torch.ones_like(dst, dtype=z.dtype))
    return out / deg.unsqueeze(1)


def make_data(graph: str = "cora", num_features: int = 64, num_classes: int = 7, seed: int = 0,
              train_frac: float = 0.5, device="cpu", hops: int = 2) -> SimpleNamespace:
    """A seeded node-classification task on a bundled or generated graph.

    gnnio bundles graph structure only (no features or labels), so: features are N(0, 1); labels
    are the argmax of a random projection of the features, propagated ``hops`` times over the
    graph (mean over in-neighbours and the node itself), so a ``hops``-layer GNN can learn them;
    ``train_frac`` of the nodes (a seeded permutation) are training nodes, the rest test nodes.
    Everything is drawn on the CPU from ``seed`` and then moved to ``device``; generated graphs
    (``powerlaw-1M-16M``, ...) use their standard seed 0.
    """
    d = gnnio.datasets.load(graph)
    n = d.num_nodes
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, num_features, generator=g)
    w = torch.randn(num_features, num_classes, generator=g)
    src, dst = d.edge_index[0], d.edge_index[1]
    z = x @ w
    for _ in range(hops):
        z = _mean_propagate(z, src, dst)
    y = z.argmax(1)
    perm = torch.randperm(n, generator=g)
    n_train = int(round(train_frac * n))
    device = torch.device(device)
    return SimpleNamespace(
        name=d.name, num_nodes=n, num_features=num_features, num_classes=num_classes,
        x=x.to(device), y=y.to(device), edge_index=d.edge_index.to(device),
        train_idx=perm[:n_train].to(device), test_idx=perm[n_train:].to(device), device=device)


# ---------------------------------------------------------------------------------------------
# measuring

class Timer:
    """Wall time of a block, synchronising the GPU on both ends."""

    def __init__(self, device):
        self.cuda = torch.device(device).type == "cuda"
        self.device = device

    def __enter__(self):
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.seconds = time.perf_counter() - self.t0


def reset_peak_memory(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device) -> str:
    """torch.cuda.max_memory_allocated since the last reset on CUDA; on the CPU the process's
    peak resident set size (since it started: not per epoch)."""
    if torch.device(device).type == "cuda":
        return f"{torch.cuda.max_memory_allocated(device) / 2**20:.1f} MiB"
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return f"n/a (CPU; process peak RSS {rss_kib / 1024:.0f} MiB)"


def resolve_device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    if name == "cuda" and not gnnio._ops.HAS_CUDA_KERNELS:
        raise SystemExit("--device cuda: gnnio was built without its CUDA kernels")
    return torch.device(name)

