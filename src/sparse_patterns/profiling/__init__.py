"""Profile what each pattern costs in the fused kernel, side by side with torch's attention.

:func:`profile` runs a grid of patterns and sequence lengths on one set of random
``q, k, v`` per cell and measures our implementations (``impl="numba"``,
``"flex"``, ``"cuda"`` and any other name in :data:`sparse_patterns.kernels.IMPLS`)
next to two baselines: torch's ``scaled_dot_product_attention`` (``is_causal=True``
for a causal pattern, a dense boolean mask otherwise; its flash backend on a GPU)
and FlexAttention compiled with a ``BlockMask`` of the pattern in natural token
order. Inputs live on the host or, with ``device="cuda"``, on the GPU (CUDA
events, ``torch.cuda.max_memory_allocated``). Every runner's output is
checked against an exact float64 oracle (sampled query rows, computed from the
CSR) and, for ours, against a baseline that computes the same function, before
anything is timed: a wrong kernel is reported as wrong, never as fast. The
result is a :class:`ProfileTable` (median, min and max time, first-call time,
useful and computed FLOPs, GFLOP/s, their share of the host's FMA peak and of
the fp32 ``torch.matmul`` throughput, both measured in the same run, peak
memory, ratios to the baselines) that prints itself: ``table()`` (a rich table,
compact or ``wide=True``), ``to_dict()`` (JSON), ``to_markdown()``; the log-log
figure is :func:`sparse_patterns.render.profile.plot_profile`.

This package sits beside ``export`` and ``render``: it uses ``kernels``,
``patterns`` and ``export``, and nothing below it imports it. Its modules are
private: ``_run`` (:func:`profile`, the oracle), ``_table`` (the result types),
``_machine`` (memory, matmul rate, FMA peak, machine facts), ``_device`` (where
the inputs live and the clock there), ``_ours`` (our implementations as runners)
and ``_baselines`` (torch SDPA and FlexAttention).

Examples
--------
>>> from sparse_patterns.profiling import profile
>>> t = profile(["strided"], [16], impls=("reference",), baselines=(), repeats=1,
...             heads=2, head_dim=4, params={"stride": 4})
>>> t[0].get("reference").status, t.columns()[:3]
('ok', ('pattern', 'n', 'impl'))
"""

from ._baselines import BASELINES
from ._run import DEVICES, DTYPES, profile
from ._table import COLUMNS, WIDE_COLUMNS, Measurement, ProfileGrid, ProfileRow, ProfileTable

__all__ = [
    "profile", "ProfileTable", "ProfileRow", "Measurement", "ProfileGrid", "BASELINES", "DTYPES",
    "DEVICES",
    "COLUMNS", "WIDE_COLUMNS",
]
