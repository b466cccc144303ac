"""The families' names, parameters and papers: one table, readable without NumPy.

``patterns list`` prints this table, and every generator takes its declared
parameters from here (:func:`sparse_patterns.patterns.register` checks that the
generator's signature matches), so the table cannot drift from the code. It
imports nothing heavier than the standard library: listing the families, or a
command's ``--help``, starts no NumPy, SciPy, numba or torch.

A parameter declared with ``follows_n=True`` also accepts ``"sqrt"``
(``ceil(sqrt(n))``) or ``"cbrt"`` (``ceil(n ** (1/3))``), so a sweep over n can
keep ``l ~ n^(1/p)``.

Examples
--------
>>> fam = CATALOG["strided"]
>>> [p.name for p in fam.params], fam.reference.split(",")[0]
(['stride', 'window', 'causal'], 'Child et al. 2019')
>>> fam.param("stride").convert("sqrt", 16384)
128
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Param", "Family", "CATALOG", "describe", "root_of"]


def root_of(n: int, p: int) -> int:
    """Smallest integer ``l`` with ``l ** p >= n`` (exact, no float rounding).

    Examples
    --------
    >>> root_of(16384, 2), root_of(1000, 3), root_of(1001, 3)
    (128, 10, 11)
    """
    l = max(1, round(n ** (1.0 / p)))
    while l**p < n:
        l += 1
    while l > 1 and (l - 1) ** p >= n:
        l -= 1
    return l


_FOLLOW = {"sqrt": 2, "cbrt": 3}


@dataclass(frozen=True)
class Param:
    """One generator parameter: its type (int, str, bool), default and help.

    Examples
    --------
    >>> Param("window", int, 8, "w").convert("16", n=64)
    16
    """

    name: str
    type: type
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    follows_n: bool = False

    def convert(self, value: Any, n: int) -> Any:
        """Convert a CLI string or Python value, resolving ``sqrt``/``cbrt``."""
        from .util.checks import check_bool, check_int  # noqa: PLC0415 (keeps NumPy out of `list`)

        if self.follows_n and isinstance(value, str) and value in _FOLLOW:
            return root_of(n, _FOLLOW[value])
        if self.type is int:
            if isinstance(value, str):
                try:
                    value = int(value, 10)
                except ValueError:
                    extra = " or 'sqrt'/'cbrt'" if self.follows_n else ""
                    raise ValueError(
                        f"{self.name}: must be an integer{extra}, got {value!r}"
                    ) from None
            return check_int(self.name, value, lo=-(2**62))
        if self.type is bool:
            if isinstance(value, str):
                low = value.lower()
                if low in ("true", "1", "yes"):
                    return True
                if low in ("false", "0", "no"):
                    return False
                raise ValueError(f"{self.name}: must be true or false, got {value!r}")
            return check_bool(self.name, value)
        if self.choices is not None and value not in self.choices:
            raise ValueError(
                f"{self.name}: must be one of {', '.join(map(repr, self.choices))}; got {value!r}"
            )
        return value

    def default_text(self) -> str:
        """The default as ``patterns list`` shows it (``required`` when there is none)."""
        return "required" if self.default is inspect.Parameter.empty else repr(self.default)


@dataclass(frozen=True)
class Family:
    """A pattern family as listed: parameters, one-line description, paper."""

    name: str
    params: tuple[Param, ...]
    description: str
    reference: str

    def param(self, name: str) -> Param:
        """The parameter called ``name`` (``KeyError`` if the family has none)."""
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


_CAUSAL = Param("causal", bool, True, "keep only j <= i")
_CAUSAL_RASTER = Param("causal", bool, True, "keep only j <= i in raster order")
_HEIGHT = Param("height", int, None, "raster rows (default: sqrt(n))")
_WIDTH = Param("width", int, None, "raster columns (default: n / height)")


def _family(name: str, *params: Param, description: str, reference: str) -> Family:
    return Family(name, params, description, reference)


#: Every family the package generates, by name.
CATALOG: dict[str, Family] = {f.name: f for f in (
    _family(
        "axial2d", _HEIGHT, _WIDTH, _CAUSAL_RASTER,
        description="row head and column head on a height x width raster",
        reference="Child et al. 2019, arXiv:1904.10509 (images); Ho et al. 2019, arXiv:1912.12180",
    ),
    _family(
        "bigbird",
        Param("block", int, 64, "block size in tokens"),
        Param("window_blocks", int, 1, "blocks seen on each side of the diagonal block"),
        Param("global_blocks", int, 1, "the first blocks are global"),
        Param("random_blocks", int, 2, "random blocks per block row"),
        Param("seed", int, 0, "seed of the random blocks"),
        Param("causal", bool, True, "keep only j <= i (token level)"),
        description="block window, global blocks and random blocks (three heads)",
        reference="Zaheer et al. 2020, arXiv:2007.14062",
    ),
    _family(
        "dilated",
        Param("window", int, 8, "w: number of earlier positions seen (each side if bidirectional)"),
        Param("dilation", int, 2, "d: gap between seen positions"),
        _CAUSAL,
        description="dilated sliding window: A_i = {i - k d : 0 <= k <= w}",
        reference="Beltagy et al. 2020 (Longformer), arXiv:2004.05150",
    ),
    _family(
        "factorized",
        Param("p", int, 2, "number of heads (factorization order)"),
        _CAUSAL,
        description="p heads, head m covers one base-l digit of i - j, l = ceil(n^(1/p))",
        reference="Child et al. 2019, arXiv:1904.10509, sec. 4.1 (p-dimensional factorization)",
    ),
    _family(
        "fixed",
        Param("stride", int, "sqrt", "l: block length (or 'sqrt')", follows_n=True),
        Param("c", int, None, "summary positions per block (default: max(1, l // 8))"),
        Param("summary_heads", int, 1, "number of distinct summary heads k (k * c <= l)"),
        _CAUSAL,
        description="blocks of l plus c summary positions at the end of every block",
        reference="Child et al. 2019, arXiv:1904.10509, sec. 4.2 (fixed)",
    ),
    _family(
        "full", _CAUSAL,
        description="dense attention (causal lower triangle, or every pair)",
        reference="Vaswani et al. 2017, arXiv:1706.03762",
    ),
    _family(
        "global_tokens",
        Param("tokens", int, 1, "g: the first g positions are global"),
        _CAUSAL,
        description="g global tokens: every position sees them, they see every earlier one",
        reference="Beltagy et al. 2020, arXiv:2004.05150; Zaheer et al. 2020, arXiv:2007.14062",
    ),
    _family(
        "local",
        Param("window", int, "sqrt", "w: how far back (and forward, if bidirectional) i sees",
              follows_n=True),
        _CAUSAL,
        description="1D sliding window: A_i = {i-w .. i}",
        reference="Liu et al. 2018 (local attention), arXiv:1801.10198",
    ),
    _family(
        "local2d", _HEIGHT, _WIDTH,
        Param("query_block", int, 4, "side of the square query blocks"),
        Param("memory", int, 4, "memory margin: rows above, columns left and right"),
        _CAUSAL_RASTER,
        description="Image Transformer 2D local: query blocks see a surrounding memory block",
        reference="Parmar et al. 2018 (Image Transformer), arXiv:1802.05751",
    ),
    _family(
        "longformer",
        Param("window", int, 8, "w: positions seen on each side (before i, if causal)"),
        Param("global_tokens", int, 1, "g: the first g positions are global"),
        Param("dilation", int, 1, "d: gap in the window"),
        _CAUSAL,
        description="sliding (dilated) window plus g global tokens (two heads)",
        reference="Beltagy et al. 2020, arXiv:2004.05150",
    ),
    _family(
        "strided",
        Param("stride", int, "sqrt", "l: window length and stride (or 'sqrt')", follows_n=True),
        Param("window", str, "paper", "A1 window: 'paper' (l+1 positions) or 'reference' (l)",
              choices=("paper", "reference")),
        _CAUSAL,
        description="local window of l plus every l-th earlier position (two heads)",
        reference="Child et al. 2019, arXiv:1904.10509, sec. 4.2 (strided)",
    ),
)}


def describe(families: Iterable[Any] | None = None) -> list[dict[str, Any]]:
    """The families (default: the catalog), sorted by name: parameters with defaults,
    description, reference.

    What ``patterns list`` prints (``--json`` prints this list as is). Any objects
    with ``name``, ``params``, ``description`` and ``reference`` will do (the
    registry's specs).

    Examples
    --------
    >>> row = {r["name"]: r for r in describe()}["strided"]
    >>> row["params"]
    {'stride': 'sqrt', 'window': 'paper', 'causal': True}
    """
    return [
        {
            "name": f.name,
            "params": {p.name: p.default for p in f.params},
            "description": f.description,
            "reference": f.reference,
        }
        for f in sorted(CATALOG.values() if families is None else families, key=lambda f: f.name)
    ]
