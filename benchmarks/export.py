"""Time ``to_flex_block_mask`` at long sequence lengths (default n = 65,536).

Prints, per pattern: the time to build the BlockMask (median of a few runs,
after one warm-up that also imports torch), its partial / full block counts,
and the memory of its tensors. The formula mask_mod is used for registered
families; ``--custom`` also times the generic (CSR) path on the same heads
relabelled as a custom pattern. With ``--compare N`` it times torch's
``create_block_mask`` (which evaluates the n x n mask) at a smaller N beside ours.

    .venv/bin/python benchmarks/export.py [--n 65536] [--repeats 3] [--custom] [--compare 8192]
"""

from __future__ import annotations

import argparse
import statistics
import time

__all__ = ["main"]


def _time(fn, repeats: int) -> tuple[float, object]:
    out = fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--custom", action="store_true", help="also time the CSR mask_mod path")
    ap.add_argument("--compare", type=int, default=0, help="n for create_block_mask beside ours")
    args = ap.parse_args()

    t0 = time.perf_counter()
    import torch  # noqa: F401
    from torch.nn.attention.flex_attention import create_block_mask

    from sparse_patterns import Pattern, make
    from sparse_patterns.export import to_flex_block_mask

    print(f"import torch + flex_attention: {time.perf_counter() - t0:.2f} s")
    cases = [("strided", {}), ("fixed", {})]
    print(f"n = {args.n:,}, block 128, median of {args.repeats}")
    print(f"{'pattern':<34} {'impl':<8} {'time s':>8} {'partial':>8} {'full':>6} {'MB':>7}")
    for name, params in cases:
        pat = make(name, args.n, **params)
        label = f"{name}({', '.join(f'{k}={v}' for k, v in pat.params.items() if k != 'causal')})"
        runs = ["formula", "csr"] if args.custom else ["formula"]
        for impl in runs:
            # formula: a fresh generated pattern (closed-form layout, no CSR built);
            # csr: the same heads as a custom pattern (layout and bit table from the CSR)
            p = pat if impl == "formula" else Pattern(pat.heads, name="custom")
            secs, bm = _time(lambda p=p: to_flex_block_mask(p), args.repeats)
            mb = sum(t.numel() * t.element_size() for t in (
                bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks, bm.full_kv_indices,
                bm.q_num_blocks, bm.q_indices, bm.full_q_num_blocks, bm.full_q_indices)) / 2**20
            print(f"{label:<34} {impl:<8} {secs:8.3f} {int(bm.kv_num_blocks.sum()):8d} "
                  f"{int(bm.full_kv_num_blocks.sum()):6d} {mb:7.1f}")
    if args.compare:
        n = args.compare
        pat = make("strided", n)
        l = pat.params["stride"]
        ours, _ = _time(lambda: to_flex_block_mask(pat), 1)

        def mm(b, h, q, kv):
            d = q - kv
            return (h == 0) & (d >= 0) & (d <= l) | (h == 1) & (d >= 0) & (d % l == 0)

        theirs, _ = _time(lambda: create_block_mask(mm, 1, 2, n, n, device="cpu"), 1)
        print(f"n = {n:,} strided: to_flex_block_mask {ours:.3f} s, create_block_mask "
              f"{theirs:.3f} s (ratio {theirs / ours:.0f}x)")


if __name__ == "__main__":
    main()
