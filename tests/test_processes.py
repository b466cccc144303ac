"""Attention in child processes after the parent ran it: multiprocessing's fork, spawn and
forkserver children and torch DataLoader workers compute what the parent does (with
numba's default OpenMP layer a forked child hung in its first parallel kernel; the
package now chooses numba's TBB layer where the ``tbb`` wheel is installed), and in
several Python threads at once. Each case runs in a fresh interpreter, with a timeout."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import multiprocessing as mp, sys, threading
    import numpy as np, sparse_patterns as sps

    def work(seed):
        x = np.random.default_rng(seed).standard_normal((1, 2, 256, 32)).astype(np.float32)
        return float(sps.attention(x, x, x, sps.make("strided", 256, stride=16)).sum())

    if __name__ == "__main__":
        want = [work(s) for s in range(2)]
        case = sys.argv[1]
        if case == "threads":
            got = [None] * 3
            def run(i):
                got[i] = work(i % 2)
            ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
            [t.start() for t in ts]
            [t.join() for t in ts]
            assert got == [want[0], want[1], want[0]], got
        elif case == "dataloader":
            import torch
            from sparse_patterns.torch import SparseAttention
            attn = SparseAttention(sps.make("strided", 256, stride=16))
            class Data(torch.utils.data.Dataset):
                def __len__(self):
                    return 4
                def __getitem__(self, i):
                    x = torch.from_numpy(np.random.default_rng(i % 2).standard_normal(
                        (1, 2, 256, 32)).astype(np.float32))
                    return attn(x, x, x).sum()
            loader = torch.utils.data.DataLoader(Data(), batch_size=None, num_workers=2)
            got = [float(v) for v in loader]
            assert np.allclose(got, want * 2, rtol=1e-6), (got, want)
        else:
            with mp.get_context(case).Pool(2) as pool:
                got = pool.map_async(work, range(2)).get(timeout=100)
            assert got == want, (got, want)
        print("ok")
""")


@pytest.mark.parametrize("case", ["fork", "spawn", "forkserver", "dataloader", "threads"])
def test_attention_in_children_and_threads_after_the_parent(case, tmp_path):
    if case == "dataloader":
        pytest.importorskip("torch")
    script = tmp_path / "child.py"
    script.write_text(SCRIPT)
    res = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert res.returncode == 0 and res.stdout.strip() == "ok", res.stderr[-2000:]


def test_attention_in_threads_on_the_workqueue_layer(tmp_path):
    # workqueue is not thread-safe: three threads entering the CPU kernel at once aborted the
    # process (SIGABRT); the backend now runs one call at a time on that layer
    import os

    script = tmp_path / "child.py"
    script.write_text(SCRIPT + textwrap.dedent("""
        import numba
        assert numba.threading_layer() == "workqueue", numba.threading_layer()
    """))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["NUMBA_THREADING_LAYER"] = "workqueue"
    res = subprocess.run([sys.executable, str(script), "threads"], capture_output=True, text=True,
                         timeout=240, cwd=tmp_path, env=env)
    assert res.returncode == 0 and res.stdout.strip() == "ok", (res.returncode, res.stderr[-2000:])
