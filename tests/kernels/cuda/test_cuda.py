"""The CUDA kernel (``impl="cuda"``) against the dense reference, under numba's CUDA simulator.

``NUMBA_ENABLE_CUDASIM`` is read when ``numba.cuda`` is first imported, so this
module sets it (unless the environment already chose: ``NUMBA_ENABLE_CUDASIM=0
pytest tests/kernels/cuda/test_cuda.py`` runs the same tests on a real GPU) before anything
imports ``numba.cuda``; the CPU numba kernels are unaffected. Should some other
module have imported ``numba.cuda`` for real first, on a machine without a GPU,
the tests here skip themselves and ``test_whole_module_in_a_subprocess`` runs
this file again in a fresh process with the simulator, so nothing goes untested.

The simulator runs one Python thread per CUDA thread: sizes stay tiny (n <= 80,
d <= 8, block <= 40).
"""

import os
import subprocess
import sys

os.environ.setdefault("NUMBA_ENABLE_CUDASIM", "1")

import numba  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

numba.core.config.reload_config()  # numba was imported before the line above: re-read it

pytest.importorskip("numba.cuda")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import Pattern  # noqa: E402
from sparse_patterns.kernels import cuda as kc  # noqa: E402
from sparse_patterns.kernels import inputs as kinputs  # noqa: E402
from sparse_patterns.kernels import plan  # noqa: E402
from sparse_patterns.kernels.cuda import _detect as kdetect  # noqa: E402
from sparse_patterns.kernels.cuda import _kernels as kkernels  # noqa: E402
from sparse_patterns.kernels.reference import reference_backward, reference_forward  # noqa: E402

BACKEND = kc.backend()
runs_here = pytest.mark.skipif(
    BACKEND == "none",
    reason="numba.cuda was imported without the simulator before this module and there is "
    "no GPU: test_whole_module_in_a_subprocess runs these tests",
)


def _random_pattern(n: int, p: int, seed: int) -> Pattern:
    """p heads of very different densities, one with an empty row and one with single-key rows."""
    rng = np.random.default_rng(seed)
    dens = [0.5, 0.08, 0.25][:p]
    a = np.stack([rng.random((n, n)) < dd for dd in dens])
    a[0, 3] = False  # a row with no keys: zeros, lse = -inf
    if p > 1:
        a[1, :, :] = False
        a[1, np.arange(n), rng.integers(0, n, n)] = True  # one key per row
    return Pattern.from_dense(a, name="random")


CASES = {
    # id: (pattern, mode, block, B, H, d)
    "strided-multihead": (sps.make("strided", 32, stride=4), "multihead", 8, 1, 3, 4),
    "strided-merged": (sps.make("strided", 30, stride=5), "merged", 8, 2, 2, 4),
    "fixed-multihead": (sps.make("fixed", 32, stride=8, c=2), "multihead", 8, 1, 2, 4),
    "fixed-merged": (sps.make("fixed", 36, stride=8, c=2), "merged", 8, 1, 2, 8),
    "local": (sps.make("local", 28, window=5), "multihead", 8, 1, 2, 4),
    "random-multihead": (_random_pattern(24, 3, seed=1), "multihead", 8, 1, 3, 4),
    "random-merged": (_random_pattern(24, 3, seed=2), "merged", 8, 1, 2, 4),
    # block 40: two 32-bit mask words per row, not a multiple of the stride nor of n
    "strided-block40": (sps.make("strided", 80, stride=9), "merged", 40, 1, 1, 4),
}
DTYPES = {"float64": (np.float64, 1e-10), "float32": (np.float32, 2e-5)}


def _inputs(shape, dtype, seed, count):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(dtype) for _ in range(count)]


def _dev(*arrays):
    from numba import cuda

    return [cuda.to_device(a) for a in arrays]


def _host(*arrays):
    return [a.copy_to_host() for a in arrays]


def _close(got, want, tol, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    fin = np.isfinite(want)
    assert np.array_equal(fin, np.isfinite(got)), f"{what}: non-finite entries differ"
    err = np.abs(got[fin] - want[fin]).max(initial=0.0)
    assert err <= tol * max(1.0, np.abs(want[fin]).max(initial=0.0)), f"{what}: max error {err}"


@runs_here
def test_backend_is_the_simulator_or_a_gpu():
    assert BACKEND in ("simulator", "gpu")


@runs_here
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", list(CASES))
def test_forward_matches_reference(case, dtype):
    pat, mode, block, B, H, d = CASES[case]
    dt, tol = DTYPES[dtype]
    pl = plan(pat, block=block, mode=mode)
    q, k, v = _inputs((B, H, pat.n, d), dt, 0, 3)
    out, lse = kc.forward(*_dev(q, k, v), pl, scale=0.7)
    out, lse = _host(out, lse)
    ro, rl = reference_forward(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64),
                               pat, pl, scale=0.7)
    assert out.dtype == dt and lse.dtype == dt and out.shape == q.shape
    _close(out, ro, tol, "out")
    _close(lse, rl, tol, "lse")


# float64 on every case; float32 on three (the simulator is slow, the code path is the same)
BACKWARD = [(c, "float64") for c in CASES] + [
    (c, "float32") for c in ("strided-merged", "fixed-merged", "random-multihead")
]


@runs_here
@pytest.mark.parametrize(("case", "dtype"), BACKWARD)
def test_backward_matches_reference(case, dtype):
    pat, mode, block, B, H, d = CASES[case]
    dt, tol = DTYPES[dtype]
    pl = plan(pat, block=block, mode=mode)
    q, k, v, do = _inputs((B, H, pat.n, d), dt, 1, 4)
    q64, k64, v64, do64 = (a.astype(np.float64) for a in (q, k, v, do))
    ro, rl = reference_forward(q64, k64, v64, pat, pl, scale=0.7)
    grads = kc.backward(*_dev(q, k, v, ro.astype(dt), rl.astype(dt), do), pl, scale=0.7)
    want = reference_backward(q64, k64, v64, ro, rl, do64, pat, pl, scale=0.7)
    for name, g, w in zip(("dq", "dk", "dv"), _host(*grads), want, strict=True):
        assert g.dtype == dt
        _close(g, w, 10 * tol, name)


@runs_here
def test_forward_then_backward_chain_and_default_scale():
    """The kernel's own lse feeds its backward; scale defaults to 1/sqrt(d)."""
    pat = sps.make("strided", 24, stride=4)
    pl = plan(pat, block=8, mode="merged")
    q, k, v, do = _inputs((1, 2, 24, 4), np.float64, 3, 4)
    out, lse = kc.forward(*_dev(q, k, v), pl)
    grads = kc.backward(*_dev(q, k, v), out, lse, *_dev(do), pl)
    ro, rl = reference_forward(q, k, v, pat, pl, scale=0.5)
    _close(out.copy_to_host(), ro, 1e-10, "out")
    for g, w in zip(_host(*grads), reference_backward(q, k, v, ro, rl, do, pat, pl, scale=0.5), strict=True):
        _close(g, w, 1e-9, "grad")


@runs_here
def test_staging_in_several_sub_tiles(monkeypatch):
    """Little shared memory: each tile's keys are staged 4 at a time (and queries, backward)."""
    monkeypatch.setattr(kkernels, "_SHARED_BYTES", 2 * 4 * 4 * 8)
    assert kc._sub_tile(8, 4, 8) == 4
    pat = sps.make("fixed", 32, stride=8, c=2)
    pl = plan(pat, block=8, mode="merged")
    q, k, v, do = _inputs((1, 1, 32, 4), np.float64, 4, 4)
    out, lse = _host(*kc.forward(*_dev(q, k, v), pl, scale=0.5))
    ro, rl = reference_forward(q, k, v, pat, pl, scale=0.5)
    _close(out, ro, 1e-10, "out")
    grads = _host(*kc.backward(*_dev(q, k, v, ro, rl, do), pl, scale=0.5))
    for g, w in zip(grads, reference_backward(q, k, v, ro, rl, do, pat, pl, scale=0.5), strict=True):
        _close(g, w, 1e-9, "grad")


@runs_here
def test_empty_row_gives_zeros_and_minus_inf():
    a = np.tril(np.ones((16, 16), bool))
    a[5] = False
    pat = Pattern.from_dense(a)
    pl = plan(pat, block=8)
    q, k, v = _inputs((1, 1, 16, 2), np.float64, 5, 3)
    out, lse = _host(*kc.forward(*_dev(q, k, v), pl, scale=1.0))
    assert np.all(out[0, 0, 5] == 0) and lse[0, 0, 5] == -np.inf
    assert np.isfinite(out).all()


@runs_here
def test_nan_propagates_to_its_rows_only():
    pat = sps.make("local", 16, window=2)
    pl = plan(pat, block=8)
    q, k, v = _inputs((1, 1, 16, 2), np.float64, 6, 3)
    k[0, 0, 4, 0] = np.nan  # key 4 is seen by queries 4, 5, 6
    out, lse = _host(*kc.forward(*_dev(q, k, v), pl, scale=1.0))
    bad = np.isnan(out[0, 0]).any(axis=1)
    assert bad.tolist() == [i in (4, 5, 6) for i in range(16)]


# --------------------------------------------------------------------- bad input
@runs_here
def test_numpy_inputs_are_refused():
    pl = plan(sps.make("full", 8), block=4)
    x = np.zeros((1, 1, 8, 2), np.float32)
    with pytest.raises(ValueError, match="q: impl='cuda' needs GPU arrays .* NumPy array on the CPU"):
        kc.forward(x, x, x, pl)


@runs_here
def test_cpu_torch_tensors_are_refused():
    torch = pytest.importorskip("torch")
    pl = plan(sps.make("full", 8), block=4)
    x = torch.zeros(1, 1, 8, 2)
    with pytest.raises(ValueError, match="q: impl='cuda' needs tensors on a CUDA device, got a tensor on cpu"):
        kc.forward(x, x, x, pl)
    with pytest.raises(ValueError, match="q: impl='cuda' needs tensors on a CUDA device"):
        kc.attention(x, x, x, sps.make("full", 8), block=4)


@runs_here
def test_tensors_on_different_devices_are_refused(monkeypatch):
    """Two GPUs are not at hand: stand-ins that look like CUDA tensors on cuda:0 and cuda:1."""
    from types import SimpleNamespace

    monkeypatch.setattr(kinputs, "_kind", lambda name, a: "torch")
    a = SimpleNamespace(device="cuda:0", shape=(1, 1, 8, 2))
    b = SimpleNamespace(device="cuda:1", shape=(1, 1, 8, 2))
    with pytest.raises(ValueError, match=r"different devices \(q on cuda:0, k on cuda:1, v on cuda:0\)"):
        kc.forward(a, b, a, plan(sps.make("full", 8), block=4))


@runs_here
def test_mixed_kinds_dtypes_and_shapes_are_refused():
    pl = plan(sps.make("full", 8), block=4)
    x32, x64 = np.zeros((1, 1, 8, 2), np.float32), np.zeros((1, 1, 8, 2), np.float64)
    (d32, d64) = _dev(x32, x64)
    with pytest.raises(ValueError, match="k: impl='cuda' needs GPU arrays"):
        kc.forward(d32, x32, d32, pl)
    with pytest.raises(ValueError, match="k: dtype float64 disagrees with q's float32"):
        kc.forward(d32, d64, d32, pl)
    (short,) = _dev(np.zeros((1, 1, 4, 2), np.float32))
    with pytest.raises(ValueError, match=r"v: shape \(1, 1, 4, 2\) disagrees with q's"):
        kc.forward(d32, d32, short, pl)
    with pytest.raises(ValueError, match="sequence length 4 disagrees with the plan's n = 8"):
        kc.forward(short, short, short, pl)
    (ints,) = _dev(np.zeros((1, 1, 8, 2), np.int32))
    with pytest.raises(ValueError, match="q: dtype int32 is not supported"):
        kc.forward(ints, ints, ints, pl)
    with pytest.raises(ValueError, match=r"block: must be an integer \[1, 1024\]"):
        kc.attention(d32, d32, d32, sps.make("full", 8), block=2048)
    with pytest.raises(ValueError, match="block: must be an integer"):
        kc.forward(d32, d32, d32, plan(sps.make("full", 8), block=2048))
    (wide,) = _dev(np.zeros((1, 1, 8, 1025), np.float32))
    with pytest.raises(ValueError, match=r"head dimension d must be in \[1, 1024\]"):
        kc.forward(wide, wide, wide, pl)
    with pytest.raises(ValueError, match="lse: shape"):
        kc.backward(d32, d32, d32, d32, d32, d32, pl)


@runs_here
def test_attention_entry_point_plans_and_returns_lse():
    pat = sps.make("strided", 16, stride=4)
    q, k, v = _inputs((1, 2, 16, 4), np.float64, 7, 3)
    out, lse = kc.attention(*_dev(q, k, v), pat, mode="merged", block=8, return_lse=True)
    pl = plan(pat, block=8, mode="merged")
    ro, rl = reference_forward(q, k, v, pat, pl, scale=0.5)
    _close(out.copy_to_host(), ro, 1e-10, "out")
    _close(lse.copy_to_host(), rl, 1e-10, "lse")
    only = kc.attention(*_dev(q, k, v), pat, mode="merged", block=8)
    _close(only.copy_to_host(), ro, 1e-10, "out")


@runs_here
def test_through_the_impl_registry_forward_and_backward():
    """``sparse_patterns.attention(impl="cuda")`` and ``attention_backward`` reach this kernel."""
    from sparse_patterns.kernels import Impl, attention, attention_backward

    pat = sps.make("fixed", 24, stride=8, c=2)
    q, k, v, do = _inputs((1, 2, 24, 4), np.float64, 8, 4)
    kw = {"mode": "merged", "block": 8}
    out, lse = attention(*_dev(q, k, v), pat, impl="cuda", return_lse=True, **kw)
    ro, rl = attention(q, k, v, pat, impl="reference", return_lse=True, **kw)
    _close(out.copy_to_host(), ro, 1e-10, "out")
    _close(lse.copy_to_host(), rl, 1e-10, "lse")
    grads = attention_backward(*_dev(q, k, v), out, lse, *_dev(do), pat, impl=Impl.CUDA, **kw)
    want = attention_backward(q, k, v, ro, rl, do, pat, impl="reference", **kw)
    for g, w in zip(_host(*grads), want, strict=True):
        _close(g, w, 1e-9, "grad")
    pl = plan(pat, block=8, mode="merged")  # a plan instead of the pattern
    _close(attention(*_dev(q, k, v), pl, mode="merged", impl="cuda").copy_to_host(), ro, 1e-10,
           "out")
    with pytest.raises(ValueError, match="mode: 'multihead' disagrees with the given plan"):
        attention(*_dev(q, k, v), pl, mode="multihead", impl="cuda")
    with pytest.raises(ValueError, match="scale: must be a finite number"):
        attention(*_dev(q, k, v), pat, impl="cuda", scale=float("nan"), **kw)


@runs_here
def test_torch_module_with_impl_cuda_refuses_cpu_tensors():
    torch = pytest.importorskip("torch")
    from sparse_patterns.torch import SparseAttention

    attn = SparseAttention(sps.make("strided", 16, stride=4), impl="cuda", block=8)
    x = torch.randn(1, 2, 16, 4, requires_grad=True)
    with pytest.raises(ValueError, match="needs tensors on a CUDA device, got a tensor on cpu"):
        attn(x, x, x)


@runs_here
def test_a_missing_toolkit_at_the_first_compile_names_it(monkeypatch):
    """On a GPU without NVVM, numba-cuda fails only when the first launch compiles."""

    def fail(*a, **k):
        raise RuntimeError('Failure finding "libnvvm.so": No such file')

    monkeypatch.setattr(kc, "_run_forward", fail)
    (x,) = _dev(np.zeros((1, 1, 8, 2), np.float32))
    with pytest.raises(kc.CudaUnavailableError, match="NVVM/NVRTC not found.*numba-cuda\\[cu13\\]"):
        kc.forward(x, x, x, plan(sps.make("full", 8), block=4))
    monkeypatch.setattr(kc, "_run_forward", lambda *a, **k: 1 / 0)
    with pytest.raises(ZeroDivisionError):  # any other error passes through unchanged
        kc.forward(x, x, x, plan(sps.make("full", 8), block=4))


def test_without_numba_cuda_the_error_names_it(monkeypatch):
    monkeypatch.setattr(kdetect, "cuda", None)
    monkeypatch.setitem(sys.modules, "numba.cuda", None)  # import numba.cuda -> ImportError
    monkeypatch.delattr(numba, "cuda", raising=False)
    assert kc.backend() == "none"
    x = np.zeros((1, 1, 8, 2), np.float32)
    with pytest.raises(kc.CudaUnavailableError, match="needs numba-cuda.*sparse-patterns\\[cuda\\]"):
        kc.forward(x, x, x, plan(sps.make("full", 8), block=4))


_REAL = """
import numpy as np, sparse_patterns as sps
from sparse_patterns.kernels import cuda as kc
from numba import cuda
if cuda.is_available():
    print("HAS-GPU")
else:
    print(kc.backend())
    x = np.zeros((1, 1, 8, 2), np.float32)
    try:
        kc.forward(x, x, x, sps.plan(sps.make("full", 8), block=4))
    except kc.CudaUnavailableError as e:
        print(type(e).__name__, isinstance(e, ValueError), isinstance(e, RuntimeError))
        print(e)
try:
    for dt in ("float32", "float64"):
        ptx = kc.ptx(block=40, d=4, dtype=dt)
        assert all(".entry" in text for text in ptx.values()), dt
    print("PTX-OK")
except kc.CudaUnavailableError as e:
    print("NO-NVVM", e)
"""


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_ENABLE_CUDASIM")}
    env.update(extra)
    return env


@pytest.fixture(scope="module")
def real_numba_cuda():
    """stdout lines of a fresh process that imports the real numba-cuda (no simulator)."""
    r = subprocess.run([sys.executable, "-c", _REAL], capture_output=True, text=True,
                       env=_clean_env(NUMBA_ENABLE_CUDASIM="0"), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()


def test_without_a_gpu_the_error_names_it(real_numba_cuda):
    """The real numba-cuda and no GPU here: a one-line error that says so and what to do."""
    lines = real_numba_cuda
    if lines[0] == "HAS-GPU":  # pragma: no cover - only on a machine with a GPU
        return
    assert lines[0] == "none"
    assert lines[1] == "CudaUnavailableError True True"
    assert "impl='cuda' needs a CUDA GPU" in lines[2] and "NUMBA_ENABLE_CUDASIM=1" in lines[2]


def test_kernels_compile_to_ptx_for_a_real_gpu(real_numba_cuda):
    """The simulator runs Python; this checks the same kernels type and lower in numba-cuda."""
    last = real_numba_cuda[-1]
    if last.startswith("NO-NVVM"):
        pytest.skip("NVVM/NVRTC libraries not installed (nvidia-nvvm, nvidia-cuda-nvrtc)")
    assert last == "PTX-OK"


@pytest.mark.skipif(BACKEND != "none", reason="the tests above ran in this process")
def test_whole_module_in_a_subprocess():  # pragma: no cover - only when numba.cuda came early
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
        capture_output=True, text=True, env=_clean_env(NUMBA_ENABLE_CUDASIM="1"), timeout=600,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
