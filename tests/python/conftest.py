import pytest
import torch

import gnnio

CUDA = torch.cuda.is_available() and gnnio._ops.HAS_CUDA_KERNELS
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])


def pytest_configure(config):
    config.addinivalue_line("markers", "cuda: needs a CUDA GPU and gnnio's CUDA kernels")
    config.addinivalue_line("markers", "slow: large inputs (hub nodes of 10^5+ neighbours)")


def pytest_collection_modifyitems(config, items):
    skip = pytest.mark.skip(reason="needs CUDA and gnnio built with CUDA kernels")
    for item in items:
        if "cuda" in item.keywords and not CUDA:
            item.add_marker(skip)


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


def assert_no_worse_than_reference(ours, theirs, exact, factor=2.0, floor=None):
    """FlashAttention's rule: the fast kernel's error against a float64 computation is at most
    `factor` times the error of the reference implementation at the same precision (plus a floor of
    a few ulp of the output's scale, for outputs the reference happens to get exactly)."""
    eps = torch.finfo(ours.dtype).eps  # of the precision under test, before going to float64
    ours, theirs, exact = ours.detach().double(), theirs.detach().double(), exact.detach().double()
    scale = exact.abs().max().item() if exact.numel() else 0.0
    floor = 8 * eps * max(scale, 1.0) if floor is None else floor
    err_ours = (ours - exact).abs().max().item() if exact.numel() else 0.0
    err_theirs = (theirs - exact).abs().max().item() if exact.numel() else 0.0
    assert err_ours <= factor * err_theirs + floor, (
        f"error {err_ours:.3g} vs reference error {err_theirs:.3g} (scale {scale:.3g})")
