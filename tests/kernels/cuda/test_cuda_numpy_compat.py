"""``impl="cuda"`` on a NumPy without ``row_stack`` (NumPy 2.5 removed the alias of ``vstack``).

numba-cuda <= 0.30.4 registers an overload of ``np.row_stack`` when its CUDA target first
loads its registries, at the first compile (a kernel launch, or :func:`cuda.ptx`): on NumPy
2.5 that raises ``AttributeError: module 'numpy' has no attribute 'row_stack'``.
``_detect.load``, the one place the package imports ``numba.cuda``, puts the alias back
first. Each test runs in a fresh process, which removes ``row_stack`` from NumPy (the
attribute and its ``__all__`` entry, as NumPy 2.5 does) before it imports
``sparse_patterns``. numba itself (>= 0.67) registers ``row_stack`` only for NumPy < 2.5,
a check of NumPy's version, which says 2.4 here: so the process imports numba's
``arrayobj`` before removing the alias, as numba on NumPy 2.5 would have skipped it.

Nothing here imports ``numba.cuda`` in the pytest process (``tests/kernels/cuda/test_cuda.py`` must
import it first, with the simulator).
"""

import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

if importlib.util.find_spec("numba_cuda") is None:
    pytest.skip("numba-cuda is not installed", allow_module_level=True)

# NumPy as 2.5 has it: no ``row_stack``.
_WITHOUT_ROW_STACK = """
import numpy as np
import numba.np.arrayobj  # noqa: F401 - numba's own registrations, while NumPy 2.4 has the alias
if "row_stack" in vars(np):
    del np.row_stack
    np.__all__.remove("row_stack")
"""

_SIMULATOR = _WITHOUT_ROW_STACK + """
import sparse_patterns as sps
from sparse_patterns.kernels import cuda as kc

assert kc.backend() == "simulator", kc.backend()  # imports numba.cuda, through _detect.load
from numba import cuda

pat = sps.make("strided", 16, stride=4)
rng = np.random.default_rng(0)
q, k, v = (rng.standard_normal((1, 2, 16, 4)) for _ in range(3))
out, lse = kc.forward(*(cuda.to_device(a) for a in (q, k, v)), sps.plan(pat, block=8),
                      scale=0.5)
want = sps.attention(q, k, v, pat, impl="reference", scale=0.5)
err = float(np.abs(out.copy_to_host() - want).max())
assert err < 1e-10, err
assert np.row_stack is np.vstack
print("OK", err)
"""

# The real numba-cuda: the first compile is where numba-cuda reads ``np.row_stack``. Without
# a GPU, :func:`cuda.ptx` compiles (or, without NVVM/NVRTC, stops with CudaUnavailableError
# after the registries were loaded: past the point that raised AttributeError).
_REAL = _WITHOUT_ROW_STACK + """
import sparse_patterns as sps
from sparse_patterns.kernels import cuda as kc

try:
    kc.ptx(block=8, d=4)
    print("PTX-OK")
except kc.CudaUnavailableError as e:
    print("NO-NVVM", e)
import numba.cuda.np.arrayobj  # noqa: F401 - loaded by the compile above
assert np.row_stack is np.vstack
if kc.backend() == "gpu":
    from numba import cuda

    pat = sps.make("strided", 16, stride=4)
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 16, 4)) for _ in range(3))
    out, _ = kc.forward(*(cuda.to_device(a) for a in (q, k, v)), sps.plan(pat, block=8),
                        scale=0.5)
    want = sps.attention(q, k, v, pat, impl="reference", scale=0.5)
    err = float(np.abs(out.copy_to_host() - want).max())
    assert err < 1e-10, err
    print("GPU-OK", err)
print("OK")
"""

# NumPy with ``row_stack`` (deprecated since 2.0; a warning when called): left as it is, and
# not read (nor warned about) by the package.
_UNTOUCHED = """
import warnings
warnings.filterwarnings("error", message=".*row_stack")
import numpy as np
before = vars(np)["row_stack"]
import sparse_patterns as sps
from sparse_patterns.kernels import cuda as kc
from sparse_patterns.kernels.cuda import _detect

_detect.load()
assert vars(np)["row_stack"] is before and before is not np.vstack
print("OK", kc.backend())
"""


def _run(code: str, sim: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_ENABLE_CUDASIM")}
    env["NUMBA_ENABLE_CUDASIM"] = sim
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return r.stdout


def test_simulator_runs_a_kernel_without_row_stack():
    """Through the package's import path, under the simulator: the kernel matches the
    reference, and NumPy has ``row_stack`` again, as ``vstack``."""
    assert _run(_SIMULATOR, "1").splitlines()[-1].startswith("OK")


def test_real_numba_cuda_compiles_without_row_stack():
    """The real numba-cuda's first compile: no AttributeError for ``np.row_stack``."""
    lines = _run(_REAL, "0").splitlines()
    assert lines[0].startswith(("PTX-OK", "NO-NVVM")) and lines[-1] == "OK"


@pytest.mark.skipif("row_stack" not in vars(np), reason="this NumPy has no row_stack")
def test_numpy_with_row_stack_is_left_untouched():
    assert _run(_UNTOUCHED, "1").splitlines()[-1].startswith("OK")
