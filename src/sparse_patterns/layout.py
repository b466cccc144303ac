"""The block-level view of a pattern: :class:`BlockLayout`, ``bool (H, nb, nb)``.

Block-sparse kernels and frameworks (FlexAttention, DeepSpeed, Triton) run on
blocks: ``nb = ceil(n / block)``, token -> block by max-pooling, block -> token
by Kronecker expansion cropped to ``n``. A block is *full* when every token pair
in it is set, *partial* otherwise. Re-exported by :mod:`sparse_patterns.pattern`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ._csr import block_counts, freeze

if TYPE_CHECKING:
    from .pattern import Pattern

__all__ = ["BlockLayout", "check_block"]


def check_block(block: Any) -> int:
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
    Decoding to token level by hand (what :meth:`Pattern.from_blocks` does)::

        for h, I, J in zip(*np.nonzero(bl.layout)):
            for i in range(I * bl.block, min((I + 1) * bl.block, bl.n)):
                for j in range(J * bl.block, min((J + 1) * bl.block, bl.n)):
                    print(f"head {h}: {i} attends to {j}")

    Examples
    --------
    >>> import numpy as np
    >>> bl = BlockLayout(np.tril(np.ones((1, 2, 2), dtype=bool)), block=2, n=3)
    >>> from sparse_patterns import Pattern
    >>> Pattern.from_blocks(bl, causal=True).to_string()
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
        block = check_block(block)
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
        self._layout = freeze(np.ascontiguousarray(lay))
        self._full = freeze(np.ascontiguousarray(fl))
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
        block = check_block(block)
        n = pattern.n
        nb = -(-n // block)
        sizes = np.full(nb, block, dtype=np.int64)
        sizes[-1] = n - block * (nb - 1)
        area = np.multiply.outer(sizes, sizes)  # (nb, nb)
        lay = np.zeros((pattern.num_heads, nb, nb), dtype=bool)
        full = np.zeros_like(lay)
        # whole block rows at a time, in chunks of about CHUNK_ENTRIES entries
        chunk = max(1, pattern.chunk_rows() // block) * block
        for start, stop, mats in pattern.iter_rows(chunk):
            b0, b1 = start // block, -(-stop // block)
            for h, m in enumerate(mats):
                counts = block_counts(m, block, nb)  # (b1 - b0, nb)
                lay[h, b0:b1] = counts > 0
                full[h, b0:b1] = counts == area[b0:b1]
        return cls(lay, block=block, n=n, full=full)
