"""The two core types: :class:`Pattern` (token level) and :class:`BlockLayout`.

A :class:`Pattern` holds ``p`` heads, each a boolean ``scipy.sparse.csr_matrix``
of shape ``(n, n)``; rows are queries (outputs) ``i``, columns are keys (inputs)
``j``. A :class:`BlockLayout` is the block-level view used by block-sparse
kernels: ``bool (H, nb, nb)`` with ``nb = ceil(n / block)``, token -> block by
max-pooling, block -> token by Kronecker expansion cropped to ``n``.

Both types are immutable and validate in their constructors (``ValueError``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

import numpy as np
import scipy.sparse as sp

from . import config
from ._csr import check_csr, expand_blocks, freeze, text_picture, union_rows, upper_entry
from ._expression import combined
from ._row_access import RowAccess
from .layout import BlockLayout, check_block
from .rule import (
    CHUNK_ENTRIES,
    PatternRule,
    check_counts_fit,
    check_csr_fits,
    csr_bytes,
)
from .util.checks import check_binary
from .util.modes import KERNEL_MODES, MODES, Mode

__all__ = [
    "Pattern", "BlockLayout", "PatternRule", "Mode", "MODES", "KERNEL_MODES", "DENSE_LIMIT",
    "CHUNK_ENTRIES", "csr_bytes",
]

#: Largest number of dense cells (heads x n x n) that ``to_dense`` will allocate.
DENSE_LIMIT = 1 << 28


class Pattern(RowAccess):
    """A sparse attention pattern: ``p`` boolean CSR heads of shape ``(n, n)``.

    Entry ``(i, j)`` of head ``m`` set means that output (query) ``i`` attends to
    input (key) ``j`` in head ``m``. ``S_i``, the row of the merged pattern, is
    the union of the heads' rows (:meth:`union`).

    Parameters
    ----------
    heads : sequence of scipy.sparse matrices
        One ``(n, n)`` matrix per head; converted to boolean CSR with sorted,
        unique column indices.
    name : str
        The pattern family's name (``"strided"``, ...), or ``"custom"``.
    params : mapping, optional
        The generator's parameters, kept for display, export and recipes.
    causal : bool
        Whether every entry has ``j <= i``. Checked: a causal pattern with an
        entry above the diagonal raises ``ValueError``.
    head_names : sequence of str, optional
        A label per head (``"A1"``, ``"A2"``, ...).

    Notes
    -----
    The storage is plain CSR. Decoding head ``m`` by hand::

        A = pattern.heads[m]
        for i in range(pattern.n):
            for j in A.indices[A.indptr[i]:A.indptr[i + 1]]:
                print(f"output {i} attends to input {j}")

    Examples
    --------
    >>> import numpy as np
    >>> pat = Pattern.from_dense(np.tril(np.ones((4, 4), dtype=bool)), name="full")
    >>> pat.n, pat.num_heads, pat.nnz
    (4, 1, 10)
    >>> print(pat.to_string())
    #...
    ##..
    ###.
    ####
    """

    __slots__ = ("_heads", "_n", "_name", "_params", "_causal", "_head_names", "_union", "_rule", "_counts",
                 "_remake")

    def __init__(
        self,
        heads: Sequence[sp.spmatrix],
        *,
        name: str = "custom",
        params: Mapping[str, Any] | None = None,
        causal: bool = True,
        head_names: Sequence[str] | None = None,
    ) -> None:
        heads = tuple(heads)
        if len(heads) == 0:
            raise ValueError("heads: a pattern needs at least one head, got 0")
        checked: list[sp.csr_matrix] = []
        n: int | None = None
        for k, h in enumerate(heads):
            m = check_csr(h, k, n)
            n = m.shape[0]
            checked.append(m)
        assert n is not None
        if n < 1:
            raise ValueError("n: must be >= 1, got 0")
        if causal:
            for k, m in enumerate(checked):
                bad = upper_entry(m)
                if bad is not None:
                    raise ValueError(
                        f"heads[{k}]: causal pattern has entry (i={bad[0]}, j={bad[1]}) with j > i"
                    )
        self._init(n, tuple(checked), name, params, causal, head_names, None)

    def _init(self, n, heads, name, params, causal, head_names, rule) -> None:
        self._n = int(n)
        self._heads = heads
        self._name = str(name)
        self._params = MappingProxyType(dict(params or {}))
        self._causal = bool(causal)
        p = len(heads) if heads is not None else rule.num_heads
        if head_names is None:
            head_names = tuple(f"A{k + 1}" for k in range(p))
        head_names = tuple(str(s) for s in head_names)
        if len(head_names) != p:
            raise ValueError(f"head_names: expected {p} names, got {len(head_names)}")
        self._head_names = head_names
        self._union = None
        self._rule = rule
        self._counts = None
        self._remake: tuple[Callable[..., Pattern], tuple[Any, ...]] | None = None

    @classmethod
    def from_rule(
        cls,
        rule: PatternRule,
        n: int,
        *,
        name: str,
        params: Mapping[str, Any] | None = None,
        causal: bool = True,
        head_names: Sequence[str] | None = None,
    ) -> Pattern:
        """A pattern that carries its generator's rule; its heads are built on first use.

        Generators call this with their validated parameters: the rule's
        ``build()`` must return canonical bool CSR heads of shape ``(n, n)``.

        Parameters
        ----------
        rule : PatternRule
            How to build the heads (and, optionally, the block layout in closed form).
        n : int
            Sequence length (>= 1).
        name, params, causal, head_names
            As for :class:`Pattern`.

        Returns
        -------
        Pattern

        Examples
        --------
        >>> import scipy.sparse as sp
        >>> eye = PatternRule(1, lambda: [sp.identity(8, dtype=bool, format="csr")])
        >>> Pattern.from_rule(eye, 8, name="diagonal").rule is eye
        True
        """
        self = cls.__new__(cls)
        self._init(n, None, name, params, causal, head_names, rule)
        return self

    @classmethod
    def from_blocks(
        cls, layout: BlockLayout, *, causal: bool = False, name: str = "blocks",
        params: Mapping[str, Any] | None = None,
    ) -> Pattern:
        """The token-level pattern of a block layout: its Kronecker expansion cropped to
        ``n``; with ``causal=True`` the causal token mask ``j <= i`` applied after the
        expansion (the way block-sparse libraries use a unidirectional layout). Its
        params are ``block`` and ``params``.

        Examples
        --------
        >>> import numpy as np
        >>> bl = BlockLayout(np.array([[[1, 0], [1, 1]]]), block=2, n=3)
        >>> Pattern.from_blocks(bl, causal=True).rows(0, 3).toarray().astype(int).tolist()
        [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
        """
        heads = [expand_blocks(layout.layout[h], layout.block, layout.n, causal)
                 for h in range(layout.num_heads)]
        return cls(heads, name=name, params={"block": layout.block, **(params or {})},
                   causal=causal)

    # ------------------------------------------------------------------ basic
    @property
    def n(self) -> int:
        """Sequence length."""
        return self._n

    @property
    def heads(self) -> tuple[sp.csr_matrix, ...]:
        """The heads, boolean CSR ``(n, n)`` each (built on first access).

        Raises
        ------
        MemoryLimitError
            (a ``ValueError``) when the whole CSR would exceed
            :func:`sparse_patterns.config.get_memory_limit`; read row ranges
            (:meth:`rows`, :meth:`iter_rows`) or the block level
            (:meth:`to_blocks`) instead.
        """
        if self._heads is None:
            if self._counts_without_csr():
                check_csr_fits(self._name, self._n, "heads", sum(csr_bytes(self._n, c) for c in self.head_nnz))
            built = tuple(self._rule.build())
            self._heads = tuple(check_csr(h, k, self._n) for k, h in enumerate(built))
        return self._heads

    @property
    def materialized(self) -> bool:
        """Whether the whole CSR of the heads is held (built, or given)."""
        return self._heads is not None

    def _counts_without_csr(self) -> bool:
        """Whether ``|A_i|`` can be had without building the whole CSR."""
        return self._counts is not None or self._heads is not None or (
            self._rule is not None and (self._rule.counts is not None or self._rule.rows is not None)
        )

    def _head_counts(self) -> np.ndarray:
        """``int64 (p, n)``: ``|A_i|`` per head, from the CSR, the rule, or streamed rows."""
        if self._counts is None:
            check_counts_fit(self._name, self._n, self.num_heads)
            if self._heads is not None:
                counts = np.stack([np.diff(h.indptr).astype(np.int64) for h in self._heads])
            elif self._rule is not None and self._rule.counts is not None:
                counts = np.asarray(self._rule.counts(), dtype=np.int64)
            elif self._rule is not None and self._rule.rows is not None:
                counts = np.empty((self.num_heads, self._n), dtype=np.int64)
                for start, stop, mats in self.iter_rows():
                    for k, m in enumerate(mats):
                        counts[k, start:stop] = np.diff(m.indptr)
            else:
                heads = self.heads
                counts = np.stack([np.diff(h.indptr).astype(np.int64) for h in heads])
            self._counts = freeze(counts)
        return self._counts

    @property
    def num_heads(self) -> int:
        """Number of heads ``p``."""
        return len(self._head_names)

    @property
    def rule(self) -> PatternRule | None:
        """The generator's rule, or None for a pattern built from CSR (a user layout, a file).

        A pattern with a rule is exactly what its ``name`` and ``params``
        generate, so consumers may use the family's formulas for it.
        """
        return self._rule

    @property
    def name(self) -> str:
        """Family name (``"custom"`` for hand-made patterns)."""
        return self._name

    @property
    def params(self) -> Mapping[str, Any]:
        """Generator parameters (read-only mapping)."""
        return self._params

    @property
    def causal(self) -> bool:
        """True when every entry has ``j <= i``."""
        return self._causal

    @property
    def head_names(self) -> tuple[str, ...]:
        """One label per head."""
        return self._head_names

    def __repr__(self) -> str:
        ps = ", ".join(f"{k}={v!r}" for k, v in self._params.items())
        return (
            f"Pattern({self._name}({ps}), n={self._n}, heads={self.num_heads}, "
            f"causal={self._causal})"
        )

    # --------------------------------------------------------------- derived
    def union(self) -> sp.csr_matrix:
        """The merged pattern ``S``: boolean CSR union of all heads."""
        if self._union is None:
            if self._heads is None and self._counts_without_csr():
                check_csr_fits(self._name, self._n, "union", 2 * sum(csr_bytes(self._n, c) for c in self.head_nnz))
            hs = self.heads
            u = hs[0]
            for h in hs[1:]:
                u = u + h
            self._union = check_csr(u, 0, self._n)
        return self._union

    @property
    def nnz(self) -> int:
        """Number of attended pairs in the union of the heads (streamed when not held)."""
        if self.num_heads == 1:
            return int(self._head_counts()[0].sum())
        if self._union is not None or self._heads is not None:
            return int(self.union().nnz)
        return int(self.row_counts()[-1].sum())

    @property
    def head_nnz(self) -> tuple[int, ...]:
        """Number of attended pairs per head (in closed form, or from the rule's counts,
        where the rule has them)."""
        if self._counts is None and self._rule is not None and self._rule.head_nnz is not None:
            return tuple(int(c) for c in self._rule.head_nnz())
        return tuple(int(c) for c in self._head_counts().sum(axis=1))

    @property
    def density(self) -> float:
        """``nnz / n**2`` of the union."""
        return self.nnz / float(self._n) ** 2

    def row_counts(self) -> np.ndarray:
        """``|A_i|`` per head and for the union.

        Returns
        -------
        numpy.ndarray
            ``int64 (p + 1, n)``: row ``m < p`` is head ``m``, the last row the union.
        """
        check_counts_fit(self._name, self._n, self.num_heads + 1)
        out = np.empty((self.num_heads + 1, self._n), dtype=np.int64)
        out[:-1] = self._head_counts()
        if self.num_heads == 1:
            out[-1] = out[0]
        elif self._heads is not None:
            out[-1] = np.diff(self.union().indptr)
        elif self._rule is not None and self._rule.union_counts is not None:
            out[-1] = self._rule.union_counts()
        else:  # stream the union row range by row range
            for start, stop, mats in self.iter_rows():
                out[-1, start:stop] = np.diff(union_rows(list(mats)).indptr)
        return out

    def to_dense(self, *, limit: int = DENSE_LIMIT) -> np.ndarray:
        """Dense boolean array ``(p, n, n)``; refuses above ``limit`` cells."""
        cells = self.num_heads * self._n * self._n
        if cells > limit:
            raise ValueError(
                f"n: to_dense would allocate {cells:,} cells (p={self.num_heads}, n={self._n}); "
                f"the limit is {limit:,}"
            )
        return np.stack([h.toarray() for h in self.heads])

    @classmethod
    def from_dense(
        cls,
        dense: np.ndarray,
        *,
        name: str = "custom",
        params: Mapping[str, Any] | None = None,
        causal: bool | None = None,
        head_names: Sequence[str] | None = None,
    ) -> Pattern:
        """Build a pattern from a dense boolean ``(n, n)`` or ``(p, n, n)`` array.

        ``dense`` is boolean, or integer or float with every value exactly 0 or
        1; anything else (2, 0.5, NaN, -1, strings, objects) is refused rather
        than guessed at. ``causal=None`` infers it (True when no entry lies above
        the diagonal).

        Raises
        ------
        ValueError
            A shape other than ``(n, n)`` or ``(p, n, n)``, a dtype other than
            bool, integer or float, or a value other than 0 and 1.

        Examples
        --------
        >>> Pattern.from_dense(np.eye(3, dtype=int)).nnz
        3
        >>> Pattern.from_dense(np.array([[1, 0], [2, 1]]))
        Traceback (most recent call last):
        ...
        ValueError: dense: values must be 0 or 1 (or bool), got 2 at (1, 0)
        """
        a = np.asarray(dense)
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3 or a.shape[1] != a.shape[2]:
            raise ValueError(f"dense: expected shape (n, n) or (p, n, n), got {np.shape(dense)}")
        a = check_binary("dense", a, np.shape(dense))
        if causal is None:
            causal = not np.triu(a, 1).any()
        return cls(
            [sp.csr_matrix(h) for h in a],
            name=name,
            params=params,
            causal=causal,
            head_names=head_names,
        )

    def with_heads(self, heads: Sequence[sp.spmatrix], **changes: Any) -> Pattern:
        """A copy with other heads (and optionally other name/params/causal)."""
        kw = dict(name=self._name, params=self._params, causal=self._causal)
        kw.update(changes)
        return Pattern(heads, **kw)

    def to_blocks(self, block: int) -> BlockLayout:
        """Block layout by max-pooling each head over ``block x block`` tiles.

        Examples
        --------
        >>> from sparse_patterns import make
        >>> bl = make("strided", 16, stride=4).to_blocks(4)
        >>> bl.layout.shape
        (2, 4, 4)

        Raises ``MemoryLimitError`` when the dense ``(p, nb, nb)`` layout (and its
        full-tile mask, each built once and stacked) would exceed the memory limit.
        """
        block = check_block(block)
        nb = -(-self._n // block)
        need = nb * nb * 4 * self.num_heads  # layout + full per head, then stacked
        if need > config.get_memory_limit():
            raise config.MemoryLimitError(
                f"block: a layout of {self._name} at n={self._n:,} with block={block} has "
                f"{nb:,} x {nb:,} tiles and needs {config.format_bytes(need)}, above the memory "
                f"limit of {config.format_bytes(config.get_memory_limit())}; use a larger block"
            )
        if self._rule is not None and self._rule.blocks is not None:  # closed form, no CSR
            return self._rule.blocks(block)
        return BlockLayout.from_pattern(self, block)

    def to_string(self, *, head: int | None = None, max_n: int = 64) -> str:
        """A text picture: ``#`` attended, ``.`` not (the union, or one head).

        With several heads and ``head=None``, cells attended by exactly one head
        show that head's number (1-9), cells attended by several show ``#``.
        """
        if self._n > max_n:
            raise ValueError(f"n: to_string draws n <= {max_n}, got n={self._n}")
        if head is not None and not 0 <= head < self.num_heads:
            raise ValueError(f"head: must be in [0, {self.num_heads}), got {head}")
        d = self.to_dense()
        return text_picture(d if head is None else d[head : head + 1])

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Pattern):
            return NotImplemented
        if self._n != other._n or self.num_heads != other.num_heads:
            return False
        if self._causal != other._causal:
            return False
        return all(
            np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
            for a, b in zip(self.heads, other.heads, strict=True)
        )

    __hash__ = None  # type: ignore[assignment]

    def made_by(self, func: Callable[..., Pattern], *args: Any) -> Pattern:
        """Record that ``func(*args)`` makes this pattern again (its heads; the head names
        are kept apart): pickling then stores ``func`` (by reference) and ``args``, not the
        heads. :func:`~sparse_patterns.patterns.registry.make` records
        :func:`~sparse_patterns.patterns.registry.make_again` with the family's name, ``n``
        and params, the operators their operator and operands. Returns ``self``.

        Examples
        --------
        >>> import pickle, sparse_patterns as sps
        >>> pat = sps.make("local", 1 << 20, window=64)
        >>> pat.remake[1]
        ('local', 1048576, {'window': 64, 'causal': True})
        >>> len(pickle.dumps(pat)) < 1000  # the recipe, not 67 million entries
        True
        """
        self._remake = (func, tuple(args))
        return self

    @property
    def remake(self) -> tuple[Callable[..., Pattern], tuple[Any, ...]] | None:
        """``(func, args)`` from :meth:`made_by`, or None: pickled by its heads."""
        return self._remake

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle (``copy.deepcopy``, ``torch.save`` of a model holding one) by what makes
        the pattern again (:meth:`made_by`: a registered family's name and parameters,
        packed documents included; an expression's operator and operands), else by the
        heads themselves.

        Examples
        --------
        >>> import copy, sparse_patterns as sps
        >>> pat = sps.make("strided", 16, stride=4, documents=[7, 9])
        >>> again = copy.deepcopy(pat)
        >>> again == pat and again.params == pat.params
        True
        """
        if self._remake is not None:
            return _remade, (*self._remake, self._head_names)
        return _from_heads, (self.heads, self._name, dict(self._params), self._causal,
                             self._head_names)

    # --------------------------------------------------- algebra (sparse_patterns.algebra)
    def __or__(self, other: Any) -> Pattern:
        """Head-by-head union: ``algebra.combine("|", self, other)``."""
        return _combine("|", self, other)

    def __and__(self, other: Any) -> Pattern:
        """Head-by-head intersection: ``algebra.combine("&", self, other)``."""
        return _combine("&", self, other)

    def __sub__(self, other: Any) -> Pattern:
        """Head-by-head difference: ``algebra.combine("-", self, other)``."""
        return _combine("-", self, other)

    def __add__(self, other: Any) -> Pattern:
        """The heads of both, ``self``'s first: ``algebra.combine("+", self, other)``."""
        return _combine("+", self, other)


def _remade(func: Callable[..., Pattern], args: tuple[Any, ...],
            head_names: tuple[str, ...]) -> Pattern:
    """The pattern :meth:`Pattern.__reduce__` described by what makes it."""
    pat = func(*args)
    if pat._head_names != tuple(head_names):
        pat._head_names = tuple(head_names)
    return pat


def _from_heads(heads: tuple[sp.csr_matrix, ...], name: str, params: dict[str, Any],
                causal: bool, head_names: tuple[str, ...]) -> Pattern:
    """The pattern :meth:`Pattern.__reduce__` described by its heads."""
    return Pattern(heads, name=name, params=params, causal=causal, head_names=head_names)


def _combine(op: str, a: Pattern, b: Any) -> Any:  # a Pattern, or NotImplemented
    if not isinstance(b, Pattern):
        return NotImplemented
    return combined(op, (a, b), Pattern)
