"""Time the generators and the block layouts (prints figures; asserts nothing).

Targets (issue 2): strided and fixed at n = 65,536 (stride 256) in under 1 s each,
``to_blocks(128)`` of fixed at n = 2**20 in under 1 s.

Usage: python benchmarks/generate.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import sparse_patterns as sps


def best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rows = [
        ("strided n=65,536 l=256 (CSR)", lambda: sps.make("strided", 65536, stride=256).heads, 1.0),
        ("fixed n=65,536 l=256 c=8 (CSR)", lambda: sps.make("fixed", 65536, stride=256, c=8).heads, 1.0),
        ("fixed n=65,536 l=256 c=32 (CSR)", lambda: sps.make("fixed", 65536, stride=256, c=32).heads, None),
        ("full n=16,384 (CSR)", lambda: sps.make("full", 16384).heads, None),
        ("bigbird n=65,536 block=64 (CSR)", lambda: sps.make("bigbird", 65536).heads, None),
        ("fixed n=2^20 l=1024 c=32 to_blocks(128)",
         lambda: sps.make("fixed", 2**20, stride=1024, c=32).to_blocks(128), 1.0),
        ("strided n=2^20 l=1024 to_blocks(128)",
         lambda: sps.make("strided", 2**20, stride=1024).to_blocks(128), None),
        ("strided n=65,536 l=256 to_blocks(64) from CSR",
         lambda: sps.BlockLayout.from_pattern(sps.make("strided", 65536, stride=256), 64), None),
    ]
    print(f"{'case':48s} {'best (s)':>9s} {'target':>8s}")
    for label, fn, target in rows:
        t = best_of(fn, args.repeats)
        tgt = f"< {target:.0f} s" if target else ""
        mark = "" if target is None else ("  ok" if t < target else "  MISSED")
        print(f"{label:48s} {t:9.3f} {tgt:>8s}{mark}")


if __name__ == "__main__":
    main()
