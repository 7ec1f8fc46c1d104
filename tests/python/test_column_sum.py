"""gnnio.ops.column_sum (the bias gradients): against float64 sums, the same bits on the CPU and
CUDA (one order of slabs and lanes, column_sum.h), every run, shapes across its slab and lane
boundaries, its gradient, bad input, and the op's registration (opcheck)."""
import pytest
import torch

import gnnio

# the cuda cases carry the marker, so that the device's `-m cuda` run picks them (conftest skips
# them without a GPU)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.cuda)]
# a slab is >= 256 rows and a lane every 8th row of it; 2048 slabs at most, then slabs grow
SHAPES = [(0, 5), (7, 0), (1, 3), (9, 33), (256, 4), (257, 130), (3000, 17), (2048 * 256 + 5, 2)]


def bound(x, out_dtype):
    """float64 accumulation over `rows` terms, then one rounding to out_dtype."""
    exact = x.double().sum(0)
    rows = x.size(0)
    return (torch.finfo(out_dtype).eps / 2 * exact.abs()
            + 2 * rows * torch.finfo(torch.float64).eps * x.double().abs().sum(0))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{r}x{c}" for r, c in SHAPES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_sum_within_one_rounding(shape, dtype, device):
    x = torch.randn(*shape, dtype=torch.float64).to(dtype).to(device)
    out = gnnio.ops.column_sum(x)
    assert out.shape == (shape[1],) and out.dtype == dtype and out.device == x.device
    err = (out.cpu().double() - x.cpu().double().sum(0)).abs()
    assert (err <= bound(x.cpu(), dtype)).all()
    assert torch.equal(out, gnnio.ops.column_sum(x))  # the same bits every run


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(1_000_003, 128), (70_000, 257), (300, 3)])
def test_cuda_column_sum_same_bits_as_cpu(shape, dtype):
    """One order on both devices: the same float64 sums of the same terms, so float32 results
    bit for bit; for 16-bit inputs the CUDA kernel rounds the float64 sum to float32 and then to
    the 16-bit type (convert.cuh's from_acc), as the CPU's float32 sum of the widened values
    followed by .to(dtype) does: bit for bit too."""
    x = torch.randn(*shape).to(dtype)
    got = gnnio.ops.column_sum(x.cuda()).cpu()
    cpu = gnnio.ops.column_sum(x.float())
    if dtype == torch.float32:
        assert torch.equal(got, cpu)
    else:
        assert torch.equal(got, cpu.to(dtype))


@pytest.mark.parametrize("device", DEVICES)
def test_column_sum_gradient_and_non_contiguous_input(device):
    x = torch.randn(40, 6, dtype=torch.float64, device=device)
    t = x.t().contiguous().t().requires_grad_()  # column-major: the op makes it contiguous
    assert torch.autograd.gradcheck(gnnio.ops.column_sum, [t])
    torch.testing.assert_close(gnnio.ops.column_sum(x[:, ::2]), x[:, ::2].sum(0), rtol=1e-14, atol=1e-14)


def test_column_sum_bad_input_and_fallback():
    with pytest.raises(ValueError, match="2-D"):
        gnnio.ops.column_sum(torch.randn(3))
    with pytest.raises(ValueError, match="2-D"):
        gnnio.ops.column_sum(torch.arange(6).view(2, 3))
    with pytest.raises(ValueError, match="2-D"):
        torch.ops.gnnio.column_sum(torch.randn(2, 3, 4))
    # bfloat16 on the CPU: torch's own sum (the CPU kernels take float32 / float64)
    x = torch.randn(50, 4).bfloat16()
    assert torch.equal(gnnio.ops.column_sum(x), x.sum(0))


def test_opcheck_column_sum():
    torch.library.opcheck(torch.ops.gnnio.column_sum.default, (torch.randn(300, 7, dtype=torch.float64),))
