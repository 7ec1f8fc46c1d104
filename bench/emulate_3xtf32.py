"""3xTF32 linears (TransformerConv design, bench/NOTES.md "A design for TransformerConv's fused kernel"):
x @ W^T with each operand split into tf32 hi + lo parts, three tf32 products per k8 MMA step
(exact in float32) added to a float32 accumulator, rounded to nearest or truncated (tensor cores'
accumulation is not documented as round-to-nearest), against float64 and against torch's float32
matmul (PyG's linears). Prints each draw's error as a multiple of torch's. CPU only:
`python3 bench/emulate_3xtf32.py`."""
import torch
torch.manual_seed(0)

def tf32(a):  # round float32 to tf32 (10 explicit mantissa bits), nearest-even via bit ops
    b = a.view(torch.int32)
    lsb = (b >> 13) & 1
    b = (b + 0x0FFF + lsb) & ~0x1FFF
    return b.view(torch.float32)

def mma3(x, w, trunc=False):
    # x [N, K], w [M, K] float32. Products of tf32 parts are exact in float32; a k8 mma sums 8
    # exact products (emulated exactly in float64) and adds to a float32 accumulator.
    xh, wh = tf32(x), tf32(w)
    xl, wl = tf32(x - xh), tf32(w - wh)
    acc = torch.zeros(x.size(0), w.size(0), dtype=torch.float32)
    for k in range(0, x.size(1), 8):
        s = slice(k, k + 8)
        part = (xh[:, s].double() @ wh[:, s].double().t() + xh[:, s].double() @ wl[:, s].double().t()
                + xl[:, s].double() @ wh[:, s].double().t())
        tot = acc.double() + part
        if trunc:  # round toward zero to float32
            r = tot.float()
            over = r.double().abs() > tot.abs()
            r = torch.where(over, torch.nextafter(r, torch.zeros_like(r)), r)
            acc = r
        else:
            acc = tot.float()
    return acc

for n, k, m in [(4096, 128, 128), (4096, 32, 128), (4096, 128, 32)]:
    bound = 1 / k ** 0.5
    worst = []
    for trial in range(3):
        x = torch.randn(n, k)
        w = (torch.rand(m, k) * 2 - 1) * bound
        exact = x.double() @ w.double().t()
        pyg = x @ w.t()
        e_pyg = (pyg.double() - exact).abs().max().item()
        for trunc in (False, True):
            ours = mma3(x, w, trunc)
            e = (ours.double() - exact).abs().max().item()
            worst.append((trunc, e / e_pyg))
    print(n, k, m, "ratio to torch float32 error (nearest, truncating):",
          [f"{r:.2f}" for t, r in worst if not t], [f"{r:.2f}" for t, r in worst if t])
