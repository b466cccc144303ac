"""Dense masks for ``torch.nn.functional.scaled_dot_product_attention``: a
boolean ``attn_mask`` (True = attend) or an additive float mask (0 / -inf),
built row block by row block from the CSR and refused above a size limit; and
the way back from a dense mask to a :class:`Pattern`."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from ..pattern import DENSE_LIMIT, Pattern
from ._common import head_plan

__all__ = ["to_sdpa_mask", "from_sdpa_mask"]


def to_sdpa_mask(
    pattern: Pattern,
    *,
    additive: bool = False,
    mode: str = "multihead",
    num_heads: int | None = None,
    dtype: Any = None,
    limit: int = DENSE_LIMIT,
) -> Any:
    """A dense attention mask ``(H, n, n)`` for torch SDPA.

    ``scaled_dot_product_attention(q, k, v, attn_mask=mask)`` with ``q`` of
    shape ``(B, H, n, d)`` then attends exactly the pattern (the mask
    broadcasts over the batch; with ``mode="merged"`` and the default ``H = 1``
    it broadcasts over heads too).

    Parameters
    ----------
    pattern : Pattern
    additive : bool
        False: ``torch.bool``, True where ``i`` attends to ``j``. True: a float
        mask, 0 where attended and ``-inf`` elsewhere.
    mode : {"multihead", "merged"}
        ``"multihead"``: attention head ``h`` uses pattern head ``h mod p``;
        ``"merged"``: the union of the heads.
    num_heads : int, optional
        ``H``; ``p`` (multihead) or 1 (merged) by default.
    dtype : torch.dtype, optional
        Float type of the additive mask (``torch.float32`` by default).
    limit : int
        Largest number of cells ``H * n * n`` allowed.

    Returns
    -------
    torch.Tensor
        ``(H, n, n)``.

    Raises
    ------
    ValueError
        ``H * n * n > limit``, or a bad mode / num_heads.

    Examples
    --------
    >>> from sparse_patterns import make
    >>> m = to_sdpa_mask(make("local", 4, window=1), additive=True)
    >>> m[0]
    tensor([[0., -inf, -inf, -inf],
            [0., 0., -inf, -inf],
            [-inf, 0., 0., -inf],
            [-inf, -inf, 0., 0.]])
    """
    import torch  # noqa: PLC0415

    _, plan = head_plan(pattern, mode, num_heads)
    n = pattern.n
    cells = len(plan) * n * n
    if cells > limit:
        raise ValueError(
            f"n: a dense (H, n, n) mask would have {cells:,} cells (H={len(plan)}, n={n}); "
            f"the limit is {limit:,}: use to_flex_block_mask or a block layout instead"
        )
    cache: dict[int, np.ndarray] = {}
    out = np.empty((len(plan), n, n), dtype=bool)
    for h, k in enumerate(plan):
        if k not in cache:
            m = pattern.union() if k < 0 else pattern.heads[k]
            cache[k] = m.toarray()
        out[h] = cache[k]
    mask = torch.from_numpy(out)
    if not additive:
        return mask
    dtype = torch.float32 if dtype is None else dtype
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ValueError(f"dtype: must be a torch floating dtype, got {dtype!r}")
    add = torch.zeros(mask.shape, dtype=dtype)
    add.masked_fill_(~mask, float("-inf"))
    return add


def from_sdpa_mask(mask: Any, *, causal: bool | None = None, name: str = "custom") -> Pattern:
    """Pattern from a dense SDPA mask: boolean (True = attend) or additive.

    An additive mask attends where the entry is finite (``> -inf``).

    Parameters
    ----------
    mask : torch.Tensor or array_like
        ``(n, n)`` or ``(H, n, n)``; a leading batch axis of size 1 is dropped.
    causal : bool, optional
        Inferred (no entry above the diagonal) by default.
    name : str
        Name of the returned pattern.

    Returns
    -------
    Pattern

    Examples
    --------
    >>> from sparse_patterns import make
    >>> pat = make("strided", 16, stride=4)
    >>> from_sdpa_mask(to_sdpa_mask(pat, additive=True)) == pat
    True
    """
    if hasattr(mask, "detach"):
        mask = mask.detach().cpu().numpy()
    a = np.asarray(mask)
    if a.ndim == 4 and a.shape[0] == 1:
        a = a[0]
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3 or a.shape[1] != a.shape[2] or a.shape[0] < 1:
        raise ValueError(f"mask: expected shape (n, n) or (H, n, n), got {np.shape(mask)}")
    if a.dtype == np.bool_:
        keep = a
    elif np.issubdtype(a.dtype, np.floating):
        if np.isnan(a).any():
            raise ValueError("mask: an additive mask must not contain NaN")
        keep = a > -np.inf
    else:
        raise ValueError(f"mask: expected a bool or float mask, got dtype {a.dtype}")
    if causal is None:
        causal = not np.triu(keep, 1).any()
    return Pattern([sp.csr_matrix(h) for h in keep], name=name, causal=causal)
