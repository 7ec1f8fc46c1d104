"""How precise GATv2's online pass A (D_i formed on the walk, GNNIO_GATV2_DELTA_IN_PASS_A=1)
can be, simulated in numpy float32 for one output of one row: d = sum_k p_k (rg_k - D) f_k.

- default: D summed first (delta_kernel), then the sum of p (rg - D) f;
- first: the kernel's way, sums relative to the first slot's rg, corrected at the row's end;
- mean_first_step: the shift is the p-weighted mean of the first step's slots (U of them);
- rebase: after every step of U slots the shift moves to the running estimate of D
  (A -= (s' - s) B, R -= (s' - s) W).

Prints, per row length and rg offset, the largest and the rms error over random rows,
relative to the largest |d|. A planning tool for bench/NOTES.md (v9), not a kernel test."""
import numpy as np

rng = np.random.default_rng(0)
f32 = np.float32


def errors(length, trials=2000, steps=4, offset=0.0):
    modes = ("default", "first", "mean_first_step", "rebase")
    errs = {m: [] for m in modes}
    scales = []
    for _ in range(trials):
        e = rng.normal(size=length)
        p = np.exp(e - e.max())
        p /= p.sum()
        rg = rng.normal(size=length) + offset
        fv = rng.normal(size=length)
        d_exact = np.sum(p * rg)
        exact = np.sum(p * (rg - d_exact) * fv)
        scales.append(abs(exact))
        p32, rg32, fv32 = p.astype(f32), rg.astype(f32), fv.astype(f32)
        d32 = f32(0)
        for k in range(length):
            d32 = f32(d32 + p32[k] * rg32[k])
        acc = f32(0)
        for k in range(length):
            acc = f32(acc + f32(p32[k] * f32(rg32[k] - d32)) * fv32[k])
        errs["default"].append(abs(acc - exact))
        for mode in modes[1:]:
            if mode == "mean_first_step":
                w = m = f32(0)
                for k in range(min(steps, length)):
                    w, m = f32(w + p32[k]), f32(m + p32[k] * rg32[k])
                s = f32(m / w)
            else:
                s = rg32[0]
            a = b = w = r = f32(0)
            for b0 in range(0, length, steps):
                for k in range(b0, min(length, b0 + steps)):
                    x = f32(p32[k] * f32(rg32[k] - s))
                    w, r = f32(w + p32[k]), f32(r + x)
                    a, b = f32(a + x * fv32[k]), f32(b + p32[k] * fv32[k])
                if mode == "rebase" and w > 0:
                    moved = f32(f32(s + r / w) - s)
                    a, r, s = f32(a - moved * b), f32(r - moved * w), f32(s + moved)
            d_rel = f32(r + s * f32(w - 1))
            errs[mode].append(abs(f32(a - d_rel * b) - exact))
    scale = max(scales)
    return {m: (max(v) / scale, float(np.sqrt(np.mean(np.square(v)))) / scale) for m, v in errs.items()}


if __name__ == "__main__":
    for length in (4, 8, 30, 200):
        for offset in (0.0, 3.0):
            res = errors(length, offset=offset)
            print(f"L={length:4d} offset={offset}: " +
                  ", ".join(f"{m} {mx:.2e}/{rms:.2e}" for m, (mx, rms) in res.items()))
