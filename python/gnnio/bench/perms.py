"""Node orders computed on one machine and loaded on another (the reordering study).

A GPU machine may lack pymetis, or be too short of time for scipy's RCM on a power-law graph
(~300 s on ``powerlaw-1M-16M``), so ``python -m gnnio.bench.study --save-perms DIR`` computes
each (graph, order) permutation where the libraries are, and ``--perms DIR`` loads it there.

A file ``DIR/{graph}-{order}.pt`` (torch.save, loaded with weights_only=True) holds ``perm``
(int32 when it fits: new position -> old node id), the order's wall-clock ``cost_s`` on the
``host`` that computed it, and the graph's ``fingerprint`` (node count, edge count, SHA-256 of
the int64 edge_index bytes). A file whose fingerprint differs from the graph loaded here (a
generator that drew other edges, another version of a real graph) or whose ``perm`` is not a
permutation is refused: :func:`load` says why and the study skips that order."""
import datetime
import hashlib
import importlib.metadata
import os
import platform
import time
from typing import NamedTuple, Optional

import torch

import gnnio
import gnnio.reorder

FORMAT = 1


class Order(NamedTuple):
    perm: torch.Tensor  # int64 [N] on the CPU: new position -> old node id
    cost_s: float  # wall clock of computing it
    host: str  # the machine that computed it (and measured cost_s)
    source: str  # 'computed here' or the file it was read from


def fingerprint(edge_index: torch.Tensor, num_nodes: int) -> dict:
    """Node and edge counts and the SHA-256 of the edge_index as contiguous int64 bytes."""
    ei = edge_index.detach().to("cpu", torch.int64).contiguous()
    return {"num_nodes": int(num_nodes), "num_edges": int(ei.size(1)),
            "sha256": hashlib.sha256(ei.numpy().data).hexdigest()}


def host_description() -> str:
    """The CPU (model, cores) and the library versions an order's cost depends on."""
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f
                          if line.startswith("model name")), model)
    except OSError:
        pass
    libs = [f"torch {torch.__version__}"]
    for name in ("scipy", "pymetis"):
        try:
            libs.append(f"{name} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return f"{model} ({os.cpu_count()} cores), {', '.join(libs)}"


def file_path(folder: str, graph: str, order: str) -> str:
    return os.path.join(folder, f"{graph}-{order}.pt")


def compute(edge_index: torch.Tensor, num_nodes: int, order: str) -> Order:
    """The order of the graph, computed on this machine's CPU; ``cost_s`` is the wall clock of
    ``gnnio.reorder.permutation`` from a built CPU Graph (symmetrising the adjacency and the
    library call included; its library already imported)."""
    gnnio.reorder.check_available(order)
    graph = gnnio.Graph(edge_index.detach().cpu(), num_nodes=num_nodes)
    graph.csr_by_dst
    t0 = time.perf_counter()
    perm = gnnio.reorder.permutation(graph, order).perm
    cost = time.perf_counter() - t0
    return Order(perm.cpu(), cost, host_description(), "computed here")


def save(folder: str, graph: str, order: str, result: Order, fp: dict) -> str:
    os.makedirs(folder, exist_ok=True)
    perm = result.perm.cpu()
    if perm.numel() < 2**31:
        perm = perm.to(torch.int32)
    path = file_path(folder, graph, order)
    torch.save({"format": FORMAT, "graph": graph, "order": order, "perm": perm,
                "cost_s": float(result.cost_s), "host": result.host, "fingerprint": fp,
                "date": datetime.date.today().isoformat()}, path + ".tmp")
    os.replace(path + ".tmp", path)
    return path


def is_permutation(perm: torch.Tensor, n: int) -> bool:
    if perm.dim() != 1 or perm.numel() != n or perm.dtype not in (torch.int32, torch.int64):
        return False
    if n == 0:
        return True
    if int(perm.min()) < 0 or int(perm.max()) >= n:
        return False
    return bool((torch.bincount(perm.long(), minlength=n) == 1).all())


def load(folder: str, graph: str, order: str, fp: dict):
    """(Order, None) from ``folder``, or (None, why) when there is no file or it is refused."""
    path = file_path(folder, graph, order)
    if not os.path.isfile(path):
        return None, f"no file {path}"
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is refused the same way
        return None, f"{path}: unreadable ({type(e).__name__}: {str(e)[:120]})"
    if not isinstance(data, dict) or data.get("format") != FORMAT or "perm" not in data:
        return None, f"{path}: not a format-{FORMAT} permutation file"
    theirs = data.get("fingerprint") or {}
    if theirs != fp:
        diff = ", ".join(f"{k} {theirs.get(k)!s:.16} here {fp[k]!s:.16}" for k in fp
                         if theirs.get(k) != fp[k])
        return None, f"{path}: computed for another graph ({diff}); refused"
    if not is_permutation(data["perm"], fp["num_nodes"]):
        return None, f"{path}: perm is not a permutation of {fp['num_nodes']} nodes; refused"
    return Order(data["perm"].long(), float(data["cost_s"]), str(data["host"]), path), None


def get(folder: Optional[str], graph: str, order: str, edge_index, num_nodes, fp: dict,
        compute_orders):
    """(Order, None): the order from ``folder`` when a valid file is there, else computed here if
    ``order`` is in ``compute_orders``; (None, why) when neither."""
    refused = ""
    if folder:
        found, why = load(folder, graph, order, fp)
        if found is not None:
            return found, None
        if not why.startswith("no file"):
            refused = why + "; "
    if order not in compute_orders:
        return None, refused + "no valid permutation file, and not in --compute-orders"
    try:
        return compute(edge_index, num_nodes, order), None
    except ImportError as e:
        return None, refused + str(e)
