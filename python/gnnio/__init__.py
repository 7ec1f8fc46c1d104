"""gnnio: IO-aware GPU kernels for graph neural network layers, drop-in for PyTorch Geometric."""
from gnnio import _ops  # noqa: F401  (loads the compiled operators)
from gnnio import datasets, nn, ops, plan, plan_layer, reorder
from gnnio.graph import CSR, WSB, Graph

__version__ = "0.1.0"
__all__ = ["Graph", "CSR", "WSB", "nn", "ops", "plan", "plan_layer", "datasets", "reorder", "__version__"]
