"""How ``|A_i|`` grows with n: the sweep behind the paper's ``O(n^(1/p))`` promise.

:func:`scaling` generates a registered pattern at several sequence lengths
(parameters that follow n, such as ``stride="sqrt"``, are resolved per n),
records ``max |A_i|``, mean ``|A_i|`` and nnz of the union and of every head,
and fits the exponent of ``max |A_i|`` against n on a log-log scale, to set
next to the ``1/p`` the Sparse Transformer promises (arXiv:1904.10509, sec. 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from ..patterns import registry
from ..util.checks import check_int
from ._printable import Printable

__all__ = ["ScalingTable", "scaling"]


@dataclass(frozen=True)
class ScalingTable(Printable):
    """``|A_i|`` figures of one pattern family over a sweep of n.

    Attributes
    ----------
    name : str
        The family.
    params : dict
        The parameters as given (``"sqrt"`` kept as such).
    p : int
        Number of heads (at the largest n).
    ns : list of int
        Sequence lengths, ascending.
    max_row, mean_row, nnz : list
        ``max |A_i|``, mean ``|A_i|`` and nnz of the union, per n.
    head_names : list of str
    head_max_row, head_mean_row, head_nnz : list of list
        The same per n and per head.
    resolved : list of dict
        The parameters used at every n (``"sqrt"`` resolved).
    exponent : float
        Slope of ``log max |A_i|`` against ``log n`` (least squares); NaN for one n.
    mean_exponent : float
        The same for mean ``|A_i|``.
    expected : float
        ``1 / p``.
    """

    name: str
    params: dict[str, Any]
    p: int
    ns: list[int]
    max_row: list[int]
    mean_row: list[float]
    nnz: list[int]
    exponent: float
    expected: float
    mean_exponent: float = float("nan")
    head_names: list[str] = field(default_factory=list)
    head_max_row: list[list[int]] = field(default_factory=list)
    head_mean_row: list[list[float]] = field(default_factory=list)
    head_nnz: list[list[int]] = field(default_factory=list)
    resolved: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict (NaN exponents become None)."""
        d = asdict(self)
        for key in ("exponent", "mean_exponent"):
            if not np.isfinite(d[key]):
                d[key] = None
        return d

    def table(self) -> Any:
        """The sweep as a rich renderable: one row per n, then the fitted exponents.

        Parameters that follow n (``"sqrt"``, ``"cbrt"``) get a column of their
        resolved values.

        Returns
        -------
        rich.console.Group

        Examples
        --------
        >>> scaling("strided", [16, 64], stride="sqrt").text(100).splitlines()[-1].split(";")[0]
        'fitted exponent of max |A_i|: 0.550  (mean |A_i|: 0.555)'
        """
        from rich.console import Group  # noqa: PLC0415
        from rich.table import Table  # noqa: PLC0415
        from rich.text import Text  # noqa: PLC0415

        ps = ", ".join(f"{k}={v}" for k, v in self.params.items())
        t = Table(title=f"{self.name}({ps}): |A_i| against n")
        follow = [k for k, v in self.params.items() if isinstance(v, str) and v in ("sqrt", "cbrt")]
        for col in ("n", *follow, "max |A_i|", "mean |A_i|", f"n^(1/{self.p})", "max/n^(1/p)",
                    "nnz", "nnz/(n n^(1/p))"):
            t.add_column(col, justify="right")
        for k, n in enumerate(self.ns):
            root = n ** (1.0 / self.p)
            t.add_row(
                f"{n:,}", *(str(self.resolved[k][f]) for f in follow), f"{self.max_row[k]:,}",
                f"{self.mean_row[k]:.2f}", f"{root:.2f}", f"{self.max_row[k] / root:.2f}",
                f"{self.nnz[k]:,}", f"{self.nnz[k] / (n * root):.2f}",
            )
        fit = "n/a (one n)" if self.exponent != self.exponent else f"{self.exponent:.3f}"
        mfit = "n/a" if self.mean_exponent != self.mean_exponent else f"{self.mean_exponent:.3f}"
        return Group(t, Text(
            f"fitted exponent of max |A_i|: {fit}  (mean |A_i|: {mfit});  expected 1/p = "
            f"{self.expected:.3f} (p = {self.p})"
        ))


def _slope(ns: Sequence[int], ys: Sequence[float]) -> float:
    x = np.log(np.asarray(ns, dtype=np.float64))
    y = np.log(np.maximum(np.asarray(ys, dtype=np.float64), 1e-300))
    if x.size < 2 or np.ptp(x) == 0:
        return float("nan")
    return float(np.polyfit(x, y, 1)[0])


def scaling(name: str, ns: Sequence[int], **params: Any) -> ScalingTable:
    """Sweep a registered pattern over ``ns`` and fit the growth of ``max |A_i|``.

    Parameters
    ----------
    name : str
        A registered family (``patterns list``).
    ns : sequence of int
        Sequence lengths (each >= 1; sorted, duplicates dropped).
    **params
        The family's parameters; integers that follow n accept ``"sqrt"`` or
        ``"cbrt"``, resolved at every n.

    Returns
    -------
    ScalingTable

    Raises
    ------
    ValueError
        Unknown name or parameter, an empty ``ns`` or an n < 1.

    References
    ----------
    R. Child et al., arXiv:1904.10509, 2019, section 4 (``|A_i| ~ n^(1/p)``).

    Examples
    --------
    >>> t = scaling("strided", [16, 64, 256], stride="sqrt")
    >>> t.max_row, t.expected, round(t.exponent, 2)
    ([7, 15, 31], 0.5, 0.54)
    """
    registry.get(name)
    if isinstance(ns, (int, np.integer)):
        ns = [int(ns)]
    ns = sorted({check_int("ns", v, 1) for v in ns})
    if not ns:
        raise ValueError("ns: give at least one sequence length, got none")
    mx, mean, nnz, hmx, hmean, hnnz, resolved = [], [], [], [], [], [], []
    p = 1
    names: list[str] = []
    for n in ns:
        pat = registry.make(name, n, **params)
        rows = pat.row_counts()  # closed form where the rule has one: no CSR at any n
        p = pat.num_heads
        names = list(pat.head_names)
        mx.append(int(rows[-1].max()))
        mean.append(float(rows[-1].mean()))
        nnz.append(int(rows[-1].sum()))
        hmx.append([int(c.max()) for c in rows[:-1]])
        hmean.append([float(c.mean()) for c in rows[:-1]])
        hnnz.append([int(c.sum()) for c in rows[:-1]])
        resolved.append(dict(pat.params))
    return ScalingTable(
        name=name,
        params=dict(params),
        p=p,
        ns=ns,
        max_row=mx,
        mean_row=mean,
        nnz=nnz,
        exponent=_slope(ns, mx),
        expected=1.0 / p,
        mean_exponent=_slope(ns, mean),
        head_names=names,
        head_max_row=hmx,
        head_mean_row=hmean,
        head_nnz=hnnz,
        resolved=resolved,
    )
