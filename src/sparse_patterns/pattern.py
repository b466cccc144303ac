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
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["Pattern", "BlockLayout", "PatternRule", "Mode", "MODES", "DENSE_LIMIT"]

#: Largest number of dense cells (heads x n x n) that ``to_dense`` will allocate.
DENSE_LIMIT = 1 << 28


class Mode(str, Enum):
    """How the heads of a pattern combine (the paper uses all three).

    ``INTERLEAVED``: step ``m`` of a path uses head ``m``; ``MERGED``: one
    softmax over the union of the heads; ``MULTIHEAD``: ``p`` heads in one
    layer, one softmax each. Analysis accepts all three; kernels and exports
    run ``MERGED`` and ``MULTIHEAD`` (:data:`KERNEL_MODES`).

    Examples
    --------
    >>> Mode("merged") is Mode.MERGED, Mode.MERGED == "merged"
    (True, True)
    """

    INTERLEAVED = "interleaved"
    MERGED = "merged"
    MULTIHEAD = "multihead"


#: Every mode's name, in the order analysis documents them.
MODES: tuple[str, ...] = tuple(m.value for m in Mode)
#: The modes a kernel or an export executes (one softmax per head, or over the union).
KERNEL_MODES: tuple[str, ...] = (Mode.MULTIHEAD.value, Mode.MERGED.value)


@dataclass(frozen=True)
class PatternRule:
    """The rule a generator gives a :class:`Pattern`, so consumers need not build its CSR.

    Parameters
    ----------
    num_heads : int
        Number of heads the rule builds.
    build : callable
        ``build() -> sequence of csr_matrix``: every head, canonical bool CSR.
    blocks : callable, optional
        ``blocks(block) -> BlockLayout`` in closed form, without the CSR, so
        that block layouts of very long sequences stay cheap.

    Examples
    --------
    >>> import scipy.sparse as sp
    >>> rule = PatternRule(1, lambda: [sp.identity(4, dtype=bool, format="csr")])
    >>> Pattern.from_rule(rule, 4, name="diagonal").nnz
    4
    """

    num_heads: int
    build: Callable[[], Sequence[sp.csr_matrix]]
    blocks: Callable[[int], BlockLayout] | None = None


def _freeze(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


def _check_csr(m: Any, k: int, n: int | None) -> sp.csr_matrix:
    """Validate one head and return it as a frozen canonical bool CSR."""
    if not sp.issparse(m):
        raise ValueError(f"heads[{k}]: expected a scipy.sparse matrix, got {type(m).__name__}")
    m = sp.csr_matrix(m)
    if m.shape[0] != m.shape[1]:
        raise ValueError(f"heads[{k}]: must be square (n x n), got shape {m.shape}")
    if n is not None and m.shape[0] != n:
        raise ValueError(f"heads[{k}]: has n={m.shape[0]} but heads[0] has n={n}")
    if m.dtype != np.bool_:
        m = m.astype(np.bool_)  # a copy
    if not m.data.all():
        m = m.copy()
        m.eliminate_zeros()
    if not m.has_canonical_format:
        # has_canonical_format checks sorted indices and no duplicates
        m = m.copy()
        m.sum_duplicates()
        m.sort_indices()
    m.indptr = _freeze(np.ascontiguousarray(m.indptr))
    m.indices = _freeze(np.ascontiguousarray(m.indices))
    m.data = _freeze(np.ascontiguousarray(m.data))
    return m


def _upper_entry(m: sp.csr_matrix) -> tuple[int, int] | None:
    """First entry (i, j) with j > i, or None."""
    rows = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr))
    bad = np.flatnonzero(m.indices > rows)
    if bad.size == 0:
        return None
    return int(rows[bad[0]]), int(m.indices[bad[0]])


class Pattern:
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

    __slots__ = ("_heads", "_n", "_name", "_params", "_causal", "_head_names", "_union", "_rule")

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
            m = _check_csr(h, k, n)
            n = m.shape[0]
            checked.append(m)
        assert n is not None
        if n < 1:
            raise ValueError("n: must be >= 1, got 0")
        if causal:
            for k, m in enumerate(checked):
                bad = _upper_entry(m)
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

    # ------------------------------------------------------------------ basic
    @property
    def n(self) -> int:
        """Sequence length."""
        return self._n

    @property
    def heads(self) -> tuple[sp.csr_matrix, ...]:
        """The heads, boolean CSR ``(n, n)`` each (built on first access)."""
        if self._heads is None:
            built = tuple(self._rule.build())
            self._heads = tuple(_check_csr(h, k, self._n) for k, h in enumerate(built))
        return self._heads

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
            hs = self.heads
            u = hs[0]
            for h in hs[1:]:
                u = u + h
            self._union = _check_csr(u, 0, self._n)
        return self._union

    @property
    def nnz(self) -> int:
        """Number of attended pairs in the union of the heads."""
        return int(self.union().nnz)

    @property
    def head_nnz(self) -> tuple[int, ...]:
        """Number of attended pairs per head."""
        return tuple(int(h.nnz) for h in self.heads)

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
        out = np.empty((self.num_heads + 1, self._n), dtype=np.int64)
        for k, h in enumerate(self.heads):
            out[k] = np.diff(h.indptr)
        out[-1] = np.diff(self.union().indptr)
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

        ``causal=None`` infers it (True when no entry lies above the diagonal).
        """
        a = np.asarray(dense)
        if a.ndim == 2:
            a = a[None]
        if a.ndim != 3 or a.shape[1] != a.shape[2]:
            raise ValueError(f"dense: expected shape (n, n) or (p, n, n), got {np.shape(dense)}")
        a = a.astype(bool)
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
        """
        block = _check_block(block)
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
        d = self.to_dense()
        if head is not None:
            if not 0 <= head < self.num_heads:
                raise ValueError(f"head: must be in [0, {self.num_heads}), got {head}")
            d = d[head : head + 1]
        count = d.sum(axis=0)
        which = d.argmax(axis=0)
        lines = []
        for i in range(self._n):
            row = []
            for j in range(self._n):
                c = count[i, j]
                if c == 0:
                    row.append(".")
                elif c == 1 and d.shape[0] > 1 and which[i, j] < 9:
                    row.append(str(which[i, j] + 1))
                else:
                    row.append("#")
            lines.append("".join(row))
        return "\n".join(lines)

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


def _check_block(block: Any) -> int:
    if isinstance(block, (bool, np.bool_)) or not isinstance(block, (int, np.integer)):
        raise ValueError(f"block: must be an integer >= 1, got {block!r}")
    if block < 1:
        raise ValueError(f"block: must be an integer >= 1, got {block}")
    return int(block)


class BlockLayout:
    """Block-level layout ``bool (H, nb, nb)`` with full / partial blocks.

    Block ``(h, I, J)`` is set when some token pair ``(i, j)`` with
    ``i // block == I`` and ``j // block == J`` is set in head ``h``
    (max-pooling). It is **full** when every token pair of the tile (cropped to
    ``n`` at the edges) is set, **partial** otherwise.

    Parameters
    ----------
    layout : array_like of bool, shape (H, nb, nb)
    block : int
    n : int
        Token sequence length; ``nb`` must equal ``ceil(n / block)``.
    full : array_like of bool, shape (H, nb, nb), optional
        Which set blocks are full. Defaults to all set blocks being full (a
        layout read from a block-sparse library, where a set block is dense).

    Notes
    -----
    Decoding to token level by hand (what :meth:`to_pattern` does)::

        for h, I, J in zip(*np.nonzero(bl.layout)):
            for i in range(I * bl.block, min((I + 1) * bl.block, bl.n)):
                for j in range(J * bl.block, min((J + 1) * bl.block, bl.n)):
                    print(f"head {h}: {i} attends to {j}")

    Examples
    --------
    >>> import numpy as np
    >>> bl = BlockLayout(np.tril(np.ones((1, 2, 2), dtype=bool)), block=2, n=3)
    >>> bl.to_pattern(causal=True).to_string()
    '#..\\n##.\\n###'
    """

    __slots__ = ("_layout", "_full", "_block", "_n")

    def __init__(
        self,
        layout: np.ndarray,
        *,
        block: int,
        n: int,
        full: np.ndarray | None = None,
    ) -> None:
        block = _check_block(block)
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n: must be an integer >= 1, got {n!r}")
        lay = np.asarray(layout)
        if lay.ndim == 2:
            lay = lay[None]
        if lay.ndim != 3 or lay.shape[1] != lay.shape[2]:
            raise ValueError(f"layout: expected shape (H, nb, nb), got {np.shape(layout)}")
        nb = -(-int(n) // block)
        if lay.shape[1] != nb:
            raise ValueError(
                f"layout: has nb={lay.shape[1]} but ceil(n / block) = ceil({n} / {block}) = {nb}"
            )
        if lay.dtype != np.bool_:
            if not np.isin(lay, (0, 1)).all():
                raise ValueError("layout: entries must be 0 or 1")
            lay = lay.astype(bool)
        if full is None:
            fl = lay.copy()
        else:
            fl = np.asarray(full, dtype=bool)
            if fl.shape != lay.shape:
                raise ValueError(f"full: expected shape {lay.shape}, got {fl.shape}")
            if (fl & ~lay).any():
                raise ValueError("full: a block marked full is not set in the layout")
        self._layout = _freeze(np.ascontiguousarray(lay))
        self._full = _freeze(np.ascontiguousarray(fl))
        self._block = block
        self._n = int(n)

    @property
    def layout(self) -> np.ndarray:
        """``bool (H, nb, nb)``: blocks that hold at least one pair."""
        return self._layout

    @property
    def full(self) -> np.ndarray:
        """``bool (H, nb, nb)``: blocks in which every token pair is set."""
        return self._full

    @property
    def partial(self) -> np.ndarray:
        """``bool (H, nb, nb)``: set blocks that are not full."""
        return self._layout & ~self._full

    @property
    def block(self) -> int:
        """Block size in tokens."""
        return self._block

    @property
    def n(self) -> int:
        """Token sequence length."""
        return self._n

    @property
    def nb(self) -> int:
        """Number of blocks per side, ``ceil(n / block)``."""
        return self._layout.shape[1]

    @property
    def num_heads(self) -> int:
        """Number of heads ``H``."""
        return self._layout.shape[0]

    def density(self) -> float:
        """Fraction of set blocks."""
        return float(self._layout.mean())

    def __repr__(self) -> str:
        return (
            f"BlockLayout(H={self.num_heads}, nb={self.nb}, block={self._block}, n={self._n}, "
            f"set={int(self._layout.sum())}, full={int(self._full.sum())})"
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, BlockLayout):
            return NotImplemented
        return (
            self._n == other._n
            and self._block == other._block
            and np.array_equal(self._layout, other._layout)
            and np.array_equal(self._full, other._full)
        )

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def from_pattern(cls, pattern: Pattern, block: int) -> BlockLayout:
        """Max-pool every head of ``pattern`` (from its CSR, never dense)."""
        block = _check_block(block)
        n = pattern.n
        nb = -(-n // block)
        sizes = np.full(nb, block, dtype=np.int64)
        sizes[-1] = n - block * (nb - 1)
        area = np.multiply.outer(sizes, sizes)  # (nb, nb)
        lay = np.zeros((pattern.num_heads, nb, nb), dtype=bool)
        full = np.zeros_like(lay)
        for h, m in enumerate(pattern.heads):
            counts = _block_counts(m, block, nb)
            lay[h] = counts > 0
            full[h] = counts == area
        return cls(lay, block=block, n=n, full=full)

    def to_pattern(
        self, *, causal: bool = False, name: str = "blocks", params: Mapping[str, Any] | None = None
    ) -> Pattern:
        """Token-level pattern: Kronecker expansion cropped to ``n``.

        With ``causal=True`` the causal token mask ``j <= i`` is applied after
        the expansion (the way block-sparse libraries use a unidirectional
        layout).
        """
        heads = [
            _expand_blocks(self._layout[h], self._block, self._n, causal)
            for h in range(self.num_heads)
        ]
        p = {"block": self._block}
        p.update(params or {})
        return Pattern(heads, name=name, params=p, causal=causal)


def _block_counts(m: sp.csr_matrix, block: int, nb: int) -> np.ndarray:
    """Number of set token pairs per (row block, column block): int64 (nb, nb)."""
    rows = np.repeat(np.arange(m.shape[0], dtype=np.int64) // block, np.diff(m.indptr))
    key = rows * nb + m.indices.astype(np.int64) // block
    return np.bincount(key, minlength=nb * nb).reshape(nb, nb)


def _expand_blocks(lay: np.ndarray, block: int, n: int, causal: bool) -> sp.csr_matrix:
    """Kronecker-expand a (nb, nb) bool layout to an (n, n) CSR, cropped, optionally causal."""
    nb = lay.shape[0]
    counts = np.zeros(n, dtype=np.int64)
    pieces: list[np.ndarray] = []
    tok = np.arange(n, dtype=np.int64)
    for bi in range(nb):
        r0, r1 = bi * block, min((bi + 1) * block, n)
        cb = np.flatnonzero(lay[bi])
        # the token columns of this block row: whole column blocks, cropped to n
        cols = (cb[:, None] * block + np.arange(block)[None, :]).ravel()
        cols = cols[cols < n]
        rows = tok[r0:r1]
        cnt = np.searchsorted(cols, rows, side="right") if causal else np.full(rows.size, cols.size)
        counts[r0:r1] = cnt
        total = int(cnt.sum())
        if total:
            off = np.repeat(np.cumsum(cnt) - cnt, cnt)
            pieces.append(cols[np.arange(total, dtype=np.int64) - off])
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    indices = np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)
    dt = np.int32 if max(n, indices.size) < 2**31 - 1 else np.int64
    return sp.csr_matrix(
        (np.ones(indices.size, dtype=bool), indices.astype(dt), indptr.astype(dt)), shape=(n, n)
    )
