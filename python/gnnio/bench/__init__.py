"""gnnio's benchmark: gnnio and the reference (PyG, torch.sparse) in one process, same graph
and inputs, ratio reported (DESIGN.md's protocol). Run ``python -m gnnio.bench --help``."""
