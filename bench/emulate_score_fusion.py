# bench/NOTES.md v20: why the float16 per-head dot kernel at 8 channels a lane differed by 1 ulp
# before scaled_score (ptxas fused e * scale into e - m for the first slot of each step).
# Emulates forward_kernel's float32 arithmetic (CPL 8, L 32, U 2 slots a step) on random data shaped
# like the diag (2000 rows x 4 heads x 256, degrees 3-16), with and without slot 0's e - m as one FMA.
import numpy as np
rng = np.random.default_rng(0)
f32, f64 = np.float32, np.float64
def r32(x): return np.asarray(x, f64).astype(f32)
def fma(a, b, c): return r32(f64(a) * f64(b) + f64(c))
N, H, C, NS = 2000, 4, 256, 2000
def run(scale, fused):
    rng = np.random.default_rng(1)
    q = (rng.standard_normal((N, H, C)) * 0.3).astype(np.float16).astype(f32)
    val = rng.standard_normal((NS, C)).astype(np.float16).astype(f32)
    out = np.empty((N, H, C), np.float16)
    deg = rng.integers(3, 17, N)
    for d in range(3, 17):
        rows = np.nonzero(deg == d)[0]
        src = rng.integers(0, NS, (rows.size, d))
        Q = q[rows]                                   # [R,H,C]
        m = np.full((rows.size, H), -np.inf, f32); s = np.zeros((rows.size, H), f32)
        acc = np.zeros((rows.size, H, C), f32)
        sc = f32(scale)
        for u0 in range(0, d, 2):
            es, raw = [], []
            for u in range(u0, min(u0 + 2, d)):
                V = val[src[:, u]][:, None, :]          # [R,1,C]
                part = np.zeros((rows.size, H, 32), f32)
                for t in range(8):                     # lane sub holds channels sub*8 + t
                    part = fma(Q[..., t::8], V[..., t::8], part)
                for o in (16, 8, 4, 2, 1):             # butterfly: lane l gets v_l + v_(l^o)
                    part = r32(f64(part) + f64(part[..., np.arange(32) ^ o]))
                tot = part[..., 0]
                raw.append(tot); es.append(r32(f64(tot) * f64(sc)))
            m_new = np.maximum.reduce([m] + es)
            r = np.exp(r32(f64(m) - f64(m_new))).astype(f32)
            s = r32(f64(s) * f64(r)); acc = r32(f64(acc) * f64(r)[..., None])
            m = m_new
            for k, u in enumerate(range(u0, min(u0 + 2, d))):
                x = r32(f64(raw[k]) * f64(sc) - f64(m)) if (fused and k == 0) else r32(f64(es[k]) - f64(m))
                w = np.exp(x).astype(f32)
                s = r32(f64(s) + f64(w))
                acc = fma(w[..., None], val[src[:, u]][:, None, :], acc)
        out[rows] = (acc / (s + f32(1e-16))[..., None]).astype(f32).astype(np.float16)
    return out
for scale in (0.2, 0.25):
    a, b = run(scale, False), run(scale, True)
    print(f"scale {scale}: fp16 outputs differing fused vs unfused: {(a != b).sum()} of {a.size}, "
          f"max ulp-ish |d|/|a| {np.max(np.abs(a.astype(f64)-b.astype(f64))/np.maximum(np.abs(a.astype(f64)),1e-30))*2048:.2f}")
a, b = run(0.2, False), run(0.2, True)
d = np.abs(a.view(np.int16).astype(np.int32) - b.view(np.int16).astype(np.int32))[a != b]
print("bit-pattern distance of the differing entries:", np.unique(d, return_counts=True))
