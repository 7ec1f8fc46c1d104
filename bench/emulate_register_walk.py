"""An emulation in numpy of csrc/gnnio/transformer/cuda.cu's walk_registers (the fused
TransformerConv walk with a lane's features of every slot in registers; the kernel's only walk
since fd0fc6f):
32 lanes, each holding features 4 l .. 4 l + 3 of q~ and of the chunk's 8 rows, its 8H partial
scores combined by the reduce-scatter (offsets 16, 8, 4, 2, 1; a lane keeps the upper half where
its bit is set), then the online softmax per head over chunks and the weighted sums, against a
float64 softmax attention of the same row. Checks the lane -> (slot, head) map the kernel
relies on (lane (j H + h) << shift holds slot j's score for head h) and the algorithm; float32
rounding aside, not the kernel's bits.

    python3 bench/emulate_register_walk.py
"""
import numpy as np

CHUNK, LANES, F = 8, 32, 128


def reduce_scatter(v, n, o):
    """v: [32 lanes, n] partial sums; returns [32, 1] after the steps from offset o down to 1."""
    lanes = np.arange(LANES)
    while o >= 1:
        partner = lanes ^ o
        if n > 1:
            upper = (lanes & o) != 0
            half = n // 2
            send = np.where(upper[:, None], v[:, :half], v[:, half:n])
            keep = np.where(upper[:, None], v[:, half:n], v[:, :half])
            v = (keep + send[partner]).astype(np.float32)
            n = half
        else:
            v = (v + v[partner]).astype(np.float32)
        o //= 2
    return v[:, 0]


def walk(qt, rows, scale, heads):
    """qt [H, F], rows [deg, F] float32: (m [H], s [H], acc [H, F]) as walk_registers leaves them."""
    shift = {4: 0, 2: 1, 1: 2}[heads]
    lanes = np.arange(LANES)
    mine = lanes >> shift
    my_j, my_h = mine // heads, mine % heads
    m_mine = np.full(LANES, -np.inf, np.float32)
    s_mine = np.zeros(LANES, np.float32)
    acc = np.zeros((heads, F), np.float32)
    q = qt.reshape(heads, LANES, 4)
    deg = rows.shape[0]
    for base in range(0, deg, CHUNK):
        x = np.zeros((CHUNK, F), np.float32)
        n = min(CHUNK, deg - base)
        x[:n] = rows[base:base + n]
        xl = x.reshape(CHUNK, LANES, 4)
        # v[lane, j H + h] = lane's 4-term chain over its features
        v = np.einsum("hlk,jlk->ljh", q, xl).reshape(LANES, CHUNK * heads).astype(np.float32)
        score = reduce_scatter(v, CHUNK * heads, 16)
        valid = base + my_j < deg
        e = np.where(valid, score * np.float32(scale), -np.inf).astype(np.float32)
        mx = e.copy()
        for o in (4, 8, 16):
            mx = np.maximum(mx, mx[lanes ^ o])
        m_new = np.maximum(m_mine, mx)
        r = np.exp(m_mine - m_new).astype(np.float32)
        w = np.where(valid, np.exp(e - m_new), 0).astype(np.float32)
        s_mine = (s_mine * r + w).astype(np.float32)
        m_mine = m_new
        ws = np.zeros(CHUNK * heads, np.float32)
        writers = (lanes & ((1 << shift) - 1)) == 0
        ws[mine[writers]] = w[writers]
        rh = r[np.arange(heads) << shift]
        acc = acc * rh[:, None]
        for j in range(CHUNK):
            acc = (acc + ws[j * heads:(j + 1) * heads, None] * x[j][None, :]).astype(np.float32)
    s_all = s_mine.copy()
    for o in (4, 8, 16):
        s_all = s_all + s_all[lanes ^ o]
    heads_lane = np.arange(heads) << shift
    return m_mine[heads_lane], s_all[heads_lane], acc


def main():
    rng = np.random.default_rng(0)
    worst = 0.0
    for heads in (1, 2, 4):
        for deg in (1, 5, 8, 9, 16, 37, 300):
            qt = (rng.standard_normal((heads, F)) * 0.2).astype(np.float32)
            rows = rng.standard_normal((deg, F)).astype(np.float32)
            scale = 32 ** -0.5
            m, s, acc = walk(qt, rows, scale, heads)
            e = (qt.astype(np.float64) @ rows.T.astype(np.float64)) * scale  # [H, deg]
            m_ref = e.max(1)
            p = np.exp(e - m_ref[:, None])
            s_ref = p.sum(1)
            x_ref = (p / (s_ref[:, None] + 1e-16)) @ rows.astype(np.float64)
            assert np.allclose(m, m_ref, rtol=1e-5, atol=1e-5), (heads, deg, m, m_ref)
            assert np.allclose(s, s_ref, rtol=1e-5), (heads, deg)
            err = np.abs(acc / (s[:, None] + 1e-16) - x_ref).max() / np.abs(x_ref).max()
            worst = max(worst, err)
            assert err < 1e-5, (heads, deg, err)
    print(f"walk_registers emulation: lane map and softmax agree with float64 at 1, 2, 4 heads and "
          f"degrees 1-300; worst relative error of x~ {worst:.2e}")


if __name__ == "__main__":
    main()
