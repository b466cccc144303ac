"""``impl="flex"``: an ExecutionPlan run by PyTorch FlexAttention, one call per piece.

FlexAttention skips the empty blocks of a ``BlockMask`` in the order it is given
the tokens. In natural order a strided head keeps about half of the 128-token
blocks (every l-th key lands in nearly every block); in the order the plan gives
each piece (:mod:`sparse_patterns.kernels.planning`: positions grouped by
``i mod l`` for a stride head) the same head is block-compact. So for each piece
``q``, ``k`` and ``v`` are gathered into the piece's order (``index_select``),
FlexAttention runs with the piece's ``BlockMask`` (:mod:`._masks`: full
tiles as full blocks, partial tiles through a ``mask_mod``), and the pieces of
one softmax group are merged exactly by their log-sum-exp and put back in token
order. Every step is a differentiable torch operation, so gradients come from
torch autograd (FlexAttention's own backward on a GPU).

How FlexAttention runs, by device:

* **CUDA**: ``torch.compile(flex_attention, dynamic=False)`` with the
  log-sum-exp (``return_aux`` / ``return_lse``), forward and backward. The tile
  size (the plan's ``block``) must be a multiple of :data:`FLEX_BLOCK` (128,
  FlexAttention's block on a GPU).
* **CPU, float32 / float16 / bfloat16, no gradient**: the same compiled call.
  Compiled FlexAttention on the CPU is inference-only and returns no
  log-sum-exp, so a piece that must be merged (or ``return_lse``) gets it from
  an *anchor*: one more key, at position ``nb * block``, whose score is known
  exactly (an extra ``q`` column holding ``c / scale``, the anchor's ``k`` and
  ``v`` a unit vector in one extra column). Its weight ``w`` in the output
  gives ``lse = c + log(1 - w) - log(w)`` and the piece's output is the rest
  divided by ``1 - w``. ``c`` is the score of one pair of the row (so
  ``w <= 1/2``); a row whose ``w`` falls below ``1e-20`` is run again with ``c``
  raised by 40 (rare: scores more than ~46 below the row's log-sum-exp).
  The anchor costs a ``block x 1`` product per query block and one column.
* **CPU with gradients, or float64** (``compile=False``): FlexAttention's eager
  operator (what ``flex_attention`` runs with ``_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG``),
  which materializes ``(n, n)`` scores per piece: small ``n`` only, refused above
  :func:`sparse_patterns.config.get_memory_limit`.

``torch.compile(dynamic=False, fullgraph=True)`` of a one-line function calling
``flex_attention`` is made once per process (a frame of its own: a caller's
``torch.compile(flex_attention)`` shares neither its graphs nor their limit); dynamo
then compiles one graph per distinct input shape ``(B, heads of the group, n, d)``
(``d + 1`` and ``nb * block + 1`` keys with the anchor), dtype, device, ``block``
and ``mask_mod`` code (bits, or one family's formula with or without permutations).
The ``BlockMask`` tensors and the tables a ``mask_mod`` reads are graph inputs, so
another piece or another plan of the same shapes reuses the graph (no
recompilation; inputs are made contiguous so that their strides agree). Calls run
with room for :data:`RECOMPILE_LIMIT` graphs and fail past it rather than fall
back to the eager operator.

The ``mask_mod`` (:mod:`._masks`): ``"auto"`` takes the family's formula when
the pattern has one (the tensors it holds moved to the device), else the bit
tables, which any plan has: arithmetic on the tokens costs less than gathers from a
table per element.
"""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

from ... import config
from ...pattern import Pattern
from ...util.checks import check_choice
from ...util.threads import FULL_DISK
from ..backend import Backend, Inputs, as_tensors, grads_by_autograd, merge_by_lse
from ..inputs import check_scale, check_shapes, resolve
from ..planning import BLOCK, ExecutionPlan
from ._masks import (
    MASKS,
    cpu_group,
    key_extent,
    perm,
    piece_block_mask,
    piece_members,
    release_workspace,
)

__all__ = ["BACKEND", "FLEX_BLOCK", "MASKS", "RECOMPILE_LIMIT", "flex_attention_plan", "forward", "backward",
           "available", "check_block", "release_workspace", "piece_attention", "mask_kind",
           "check_eager_fits", "piece_members", "key_extent"]

#: FlexAttention's block size on a GPU: ``impl="flex"`` on CUDA needs a plan ``block``
#: that is a multiple of it (any ``block`` runs on the CPU).
FLEX_BLOCK = 128

#: Graphs dynamo may compile for ``flex_attention`` while ``impl="flex"`` calls it (one per
#: input shape, dtype, block and ``mask_mod`` code); past it the call raises.
RECOMPILE_LIMIT = 64

_FLOATS = ("float16", "bfloat16", "float32", "float64")
_COMPILED: dict[str, Any] = {}


def _api() -> tuple[Any, Any]:
    """``(torch, flex_attention)``, or a one-line ``ValueError`` saying what is missing."""
    try:
        import torch  # noqa: PLC0415
    except ImportError as e:
        raise ValueError(f"impl: 'flex' needs torch >= 2.5, which is not importable ({e})") from e
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: PLC0415
    except ImportError as e:
        raise ValueError(
            f"impl: 'flex' needs torch >= 2.5 (FlexAttention); found torch {torch.__version__}"
        ) from e
    if not hasattr(BlockMask, "from_kv_blocks"):
        raise ValueError(
            f"impl: 'flex' needs torch >= 2.5 (BlockMask.from_kv_blocks); found {torch.__version__}"
        )
    return torch, flex_attention


def available() -> bool:
    """Whether ``impl="flex"`` can run here (torch with FlexAttention); never raises.

    Examples
    --------
    >>> isinstance(available(), bool)
    True
    """
    try:
        _api()
    except ValueError:
        return False
    return True


def _compiled(torch: Any, flex: Any) -> Any:
    """``torch.compile(flex_attention, dynamic=False)``, made once, called with room for
    :data:`RECOMPILE_LIMIT` graphs and an error past it: dynamo's default (8 graphs per
    function, then the uncompiled call) would fall back to eager FlexAttention, whose
    ``(n, n)`` scores do not fit at large ``n``."""
    if "flex" not in _COMPILED:
        def flex_call(*args: Any, **kwargs: Any) -> Any:
            return flex(*args, **kwargs)

        # a frame of our own: its graphs and their limit are not shared with a caller's
        # torch.compile(flex_attention)
        fn = torch.compile(flex_call, dynamic=False, fullgraph=True)
        cfg = torch._dynamo.config

        def call(*args: Any, **kwargs: Any) -> Any:
            with cfg.patch(recompile_limit=max(RECOMPILE_LIMIT, cfg.recompile_limit),
                           fail_on_recompile_limit_hit=True):
                try:
                    return fn(*args, **kwargs)
                except Exception as exc:
                    full = _no_room(exc)
                    if full is None:
                        raise
                    raise full from None

        _COMPILED["flex"] = call
    return _COMPILED["flex"]


def _no_room(exc: BaseException) -> OSError | None:
    """An ``OSError`` naming ``TMPDIR`` when the compile failed writing its files for want of
    room (or of a writable file system): inductor writes its code and cache under the temporary
    directory, and dynamo wraps the ``OSError`` (``BackendCompilerFailed``); None otherwise."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in FULL_DISK:
            import tempfile  # noqa: PLC0415

            where = e.filename or tempfile.gettempdir()
            return OSError(e.errno, f"TMPDIR: torch.compile (inductor) cannot write its files "
                           f"under {str(where)!r} ({os.strerror(e.errno)}); free space there or "
                           f"set TMPDIR (or TORCHINDUCTOR_CACHE_DIR) to a writable directory "
                           f"with room (TMPDIR={os.environ.get('TMPDIR', '')!r})")
        todo += [e.__cause__, e.__context__, getattr(e, "inner_exception", None)]
    return None


def _eager(torch: Any, q: Any, k: Any, v: Any, bm: Any, scale: float) -> tuple[Any, Any]:
    """FlexAttention's eager operator: ``(out, natural-log lse)``, differentiable on the CPU."""
    try:
        from torch._higher_order_ops.flex_attention import flex_attention as hop  # noqa: PLC0415
        from torch.nn.attention import flex_attention as fa  # noqa: PLC0415

        try:
            opts = fa._apply_kernel_options(q, k, v, True, None, None)
        except TypeError:  # torch < 2.9: no return_aux argument
            opts = fa._apply_kernel_options(q, k, v, True, None)
    except (ImportError, AttributeError) as e:
        raise ValueError(
            "compile: eager FlexAttention (gradients on the CPU, float64) needs torch's "
            f"flex_attention operator, missing in torch {torch.__version__}; use impl='numba'"
        ) from e
    out, lse, *_ = hop(q, k, v, fa._identity, bm.as_tuple(), scale, opts)
    if opts.get("BACKEND") != "FLASH":  # torch keeps base-2 statistics (as flex_attention does)
        lse = lse * math.log(2.0)
    return out, lse


def _compiled_lse(torch: Any, fn: Any, q: Any, k: Any, v: Any, bm: Any,
                  scale: float) -> tuple[Any, Any]:
    """The compiled call with its (natural-log) log-sum-exp (CUDA)."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest  # noqa: PLC0415
    except ImportError:  # torch < 2.9
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            return fn(q, k, v, block_mask=bm, scale=scale, return_lse=True)
    out, aux = fn(q, k, v, block_mask=bm, scale=scale, return_aux=AuxRequest(lse=True))
    return out, aux.lse


# --------------------------------------------------------------------- checks
def _check(torch: Any, q: Any, k: Any, v: Any, plan: ExecutionPlan) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: impl='flex' takes torch tensors, got {type(t).__name__}")
        dt = str(t.dtype).removeprefix("torch.")
        if dt not in _FLOATS:
            raise ValueError(f"{name}: dtype {dt} is not supported; use one of {', '.join(_FLOATS)}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} disagrees with q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, q on {q.device}; put them on one device")
    shape = check_shapes({"q": q, "k": k, "v": v})
    if min(shape) < 1:
        raise ValueError(f"q: every dimension of (B, H, n, d) must be >= 1, got {shape}")
    if shape[2] != plan.n:
        raise ValueError(f"q: sequence length n={shape[2]} disagrees with the plan's n={plan.n}")
    check_block(plan.block, q.device.type)


def check_block(block: int, device_type: str) -> int:
    """``block`` if FlexAttention takes it as the tile size on ``device_type``: a multiple
    of :data:`FLEX_BLOCK` on CUDA, any size on the CPU; else a one-line ``ValueError``.

    Examples
    --------
    >>> check_block(256, "cuda"), check_block(32, "cpu")
    (256, 32)
    >>> check_block(32, "cuda")
    Traceback (most recent call last):
    ...
    ValueError: block: must be a multiple of 128 for impl='flex' on CUDA (FlexAttention's block), got 32
    """
    if device_type == "cuda" and block % FLEX_BLOCK:
        raise ValueError(
            f"block: must be a multiple of {FLEX_BLOCK} for impl='flex' on CUDA "
            f"(FlexAttention's block), got {block}"
        )
    return block


def _how(compile: Any, device: Any, dtype: Any, grad: bool, torch: Any) -> str:
    """``"compiled"`` or ``"eager"``; the compiled CPU kernel has no backward and no float64."""
    cpu_only = device.type == "cpu" and (grad or dtype == torch.float64)
    if compile is None:
        return "eager" if cpu_only else "compiled"
    if not isinstance(compile, bool):
        raise ValueError(f"compile: must be True, False or None, got {compile!r}")
    if compile and cpu_only:
        why = "gradients" if grad else "float64"
        raise ValueError(
            f"compile: FlexAttention compiled on the CPU has no {why} (inference in float32, "
            "float16, bfloat16 only); use compile=None (eager, small n) or impl='numba'"
        )
    return "compiled" if compile else "eager"


def check_eager_fits(plan: ExecutionPlan, shape: tuple[int, ...], itemsize: int,
                     what: str = "compile: eager FlexAttention (on the CPU with gradients, "
                                 "or float64)") -> None:
    """Eager FlexAttention holds ``(n, n)`` scores, probabilities and masks per piece:
    a ``MemoryLimitError`` beginning with ``what`` when that passes the memory limit."""
    B, H, n, d = shape
    heads = max(len(range(g, H, plan.num_groups)) for g in range(min(plan.num_groups, H)))
    need = n * n * (64 + 4 * B * heads * max(itemsize, 4)) + 16 * B * H * n * d * itemsize
    limit = config.get_memory_limit()
    if need > limit:
        raise config.MemoryLimitError(
            f"{what} holds dense (n, n) scores per piece; at (B, H, n, d) = {tuple(shape)} it needs "
            f"{config.format_bytes(need)}, above the memory limit of {config.format_bytes(limit)} "
            "(sparse_patterns.config.set_memory_limit); use impl='numba' on the CPU"
        )


def mask_kind(mask: str, device: Any, pattern: Pattern | None, plan: ExecutionPlan) -> str:
    mask = check_choice("mask", mask, MASKS)
    if mask == "bits":
        return mask
    from ...patterns.formulas import formula_of  # noqa: PLC0415

    def has() -> bool:
        return (pattern is not None and formula_of(pattern) is not None
                and piece_members(pattern, plan) is not None)

    ok = plan.memo(("flex_formula", id(pattern)), has)
    if mask == "formula" and not ok:
        raise ValueError(
            "mask: 'formula' needs the Pattern of a registered family (or an expression of them) "
            "whose pieces can be told; use mask='bits'"
        )
    return "formula" if ok else "bits"


# --------------------------------------------------------------------- the forward
def piece_attention(torch: Any, plan: ExecutionPlan, p: int, q: Any, k: Any, v: Any, scale: float,
           how: str, mask: str, pattern: Pattern | None, need_lse: bool,
           grad: bool) -> tuple[Any, Any]:
    """Piece ``p`` of ``plan`` through FlexAttention, in token order and differentiable:
    ``(out, lse or None)`` (natural log). ``how``: ``"compiled"`` or ``"eager"``; ``mask``:
    ``"bits"`` or ``"formula"`` (:func:`mask_kind`)."""
    dev = q.device
    qp, kp = perm(torch, plan, "qperm", p, dev), perm(torch, plan, "kperm", p, dev)
    xq = q if qp is None else q.index_select(2, qp)
    K = key_extent(plan, p)  # a summary-keys piece: its keys gathered once, not all n
    if kp is not None and K < plan.n:
        kp = kp[:K]
    xk, xv = (k, v) if kp is None else (k.index_select(2, kp), v.index_select(2, kp))
    bm = piece_block_mask(plan, p, device=dev, mask=mask, pattern=pattern, with_q=grad,
                          trim=kp is not None and K < plan.n)
    if how == "eager":
        o, lse = _eager(torch, xq, xk, xv, bm, scale)
    elif need_lse:
        o, lse = _compiled_lse(torch, _compiled(torch, _api()[1]), xq, xk, xv, bm, scale)
    else:
        o, lse = _compiled(torch, _api()[1])(xq, xk, xv, block_mask=bm, scale=scale), None
    inv = perm(torch, plan, "qinv", p, dev)
    if inv is None:
        return o, lse
    return o.index_select(2, inv), (None if lse is None else lse.index_select(2, inv))


def flex_attention_plan(
    q: Any, k: Any, v: Any, plan: ExecutionPlan, *, scale: float | None = None,
    return_lse: bool = False, compile: bool | None = None, pattern: Pattern | None = None,
    mask: str = "auto",
) -> Any:
    """Sparse attention of a plan with FlexAttention: torch tensors in, torch tensors out.

    Differentiable through torch autograd (gathers, FlexAttention, the merge).

    Parameters
    ----------
    q, k, v : torch.Tensor, shape (B, H, n, d)
        One device and dtype (float16, bfloat16, float32, float64); attention
        head ``h`` uses softmax group ``h % plan.num_groups``.
    plan : ExecutionPlan
        From :func:`sparse_patterns.kernels.plan`; on CUDA its ``block`` must be
        a multiple of :data:`FLEX_BLOCK`.
    scale : float, optional
        Score scale, ``1 / sqrt(d)`` by default.
    return_lse : bool
        Also return the log-sum-exp ``(B, H, n)`` (natural log, float32 or float64).
    compile : bool, optional
        None: compiled, except on the CPU with gradients or float64 (eager there).
    pattern : Pattern, optional
        The plan's pattern: lets the ``mask_mod`` use the family's formula.
    mask : {"auto", "bits", "formula"}
        How partial tiles are decided (see :mod:`._masks`).

    Returns
    -------
    out, or (out, lse) with ``return_lse``
        ``out`` like ``q``; a row with no keys is 0 (lse ``-inf``).

    Raises
    ------
    ValueError
        torch without FlexAttention, tensors that disagree (kind, dtype, device,
        shape, ``n``), a ``block`` FlexAttention cannot take on CUDA, ``compile=True``
        where the compiled kernel cannot run, or eager memory above the limit.

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> pat = sps.make("strided", 16, stride=4)
    >>> pl = sps.plan(pat, block=4, mode="merged")
    >>> x = torch.randn(1, 2, 16, 8, dtype=torch.float64)
    >>> out = flex_attention_plan(x, x, x, pl)  # float64 on the CPU: eager
    >>> ref = sps.attention(x, x, x, pat, mode="merged", impl="reference")
    >>> bool(torch.allclose(out, ref, atol=1e-12))
    True
    """
    torch, _ = _api()
    _check(torch, q, k, v, plan)
    B, H, n, d = q.shape
    sc = check_scale(scale, d, "float64" if q.dtype == torch.float64 else "float32")
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    how = _how(compile, q.device, q.dtype, grad, torch)
    if how == "eager":
        check_eager_fits(plan, tuple(q.shape), q.element_size())
    mask = mask_kind(mask, q.device, pattern, plan)
    f = torch.float64 if q.dtype == torch.float64 else torch.float32
    G = plan.num_groups
    if how == "compiled" and q.device.type == "cpu":  # inference: recycled buffers, anchors
        out = torch.empty((B, H, n, d), dtype=f)
        lse = torch.full((B, H, n), -math.inf, dtype=f) if return_lse else None
        for g in range(min(G, H)):
            ps = [p for p in range(plan.num_pieces) if int(plan.piece_group[p]) == g]
            qs, ks, vs, og = (t if G == 1 else t[:, g::G] for t in (q, k, v, out))
            if not ps:
                og.zero_()
                continue
            lg = cpu_group(torch, _compiled(torch, _api()[1]), plan, ps, qs, ks, vs, og, sc, mask,
                           pattern, return_lse)
            if lse is not None:
                lse[:, g::G] = lg
        out = out.to(q.dtype)
        return (out, lse) if return_lse else out
    groups = []
    for g in range(min(G, H)):
        qs, ks, vs = (t if G == 1 else t[:, g::G] for t in (q, k, v))
        ps = [p for p in range(plan.num_pieces) if int(plan.piece_group[p]) == g]
        need = return_lse or len(ps) > 1
        res = [piece_attention(torch, plan, p, qs, ks, vs, sc, how, mask, pattern, need, grad) for p in ps]
        if not res:
            o = torch.zeros(qs.shape, dtype=f, device=q.device)
            lse = torch.full(qs.shape[:3], -math.inf, dtype=f, device=q.device)
        elif len(res) == 1:
            o, lse = res[0][0].to(f), (None if res[0][1] is None else res[0][1].to(f))
        else:
            o, lse = merge_by_lse(torch, [(r[0], r[1]) for r in res], f)
        groups.append((o, lse))
    if G == 1:
        out, lse = groups[0]
    else:
        out = torch.zeros((B, H, n, d), dtype=f, device=q.device)
        lse = torch.full((B, H, n), -math.inf, dtype=f, device=q.device) if return_lse else None
        for g, (o, lg) in enumerate(groups):
            out[:, g::G] = o
            if lse is not None:
                lse[:, g::G] = lg
    out = out.to(q.dtype)
    return (out, lse) if return_lse else out


# --------------------------------------------------------------------- kernels.attention
def forward(q: Any, k: Any, v: Any, pattern: Pattern | ExecutionPlan, *,
            mode: str = "multihead", scale: float | None = None, return_lse: bool = False,
            block: int = BLOCK) -> Any:
    """``kernels.attention(..., impl="flex")``: NumPy arrays or torch tensors, no gradients.

    Outputs come back as the inputs' kind and dtype (``lse`` in float32, or
    float64 for float64 inputs).

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("fixed", 16, stride=4, c=1)
    >>> x = np.random.default_rng(0).standard_normal((1, 2, 16, 4))
    >>> out = forward(x, x, x, pat, mode="merged", block=4)
    >>> ref = sps.attention(x, x, x, pat, mode="merged", impl="reference")
    >>> type(out).__name__, bool(np.allclose(out, ref, atol=1e-12))
    ('ndarray', True)
    """
    torch, _ = _api()
    pat, pl = resolve(pattern, mode, block)
    t, numpy_in = as_tensors({"q": q, "k": k, "v": v})
    with torch.no_grad():
        out, lse = flex_attention_plan(t["q"], t["k"], t["v"], pl, scale=scale, return_lse=True,
                                       pattern=pat)
    if numpy_in:
        out, lse = out.numpy(), lse.numpy()
    return (out, lse) if return_lse else out


def backward(q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, pattern: Pattern | ExecutionPlan,
             *, mode: str = "multihead", scale: float | None = None,
             block: int = BLOCK) -> tuple[Any, Any, Any]:
    """``kernels.attention_backward(..., impl="flex")``: ``(dq, dk, dv)`` by recomputing the
    forward under torch autograd (``o`` and ``lse`` are not needed).

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> pat = sps.make("strided", 8, stride=2)
    >>> x = np.random.default_rng(1).standard_normal((1, 2, 8, 4))
    >>> g = backward(x, x, x, None, None, np.ones_like(x), pat, block=4)
    >>> from sparse_patterns.kernels import attention_backward
    >>> want = attention_backward(x, x, x, *sps.attention(x, x, x, pat, return_lse=True),
    ...                           np.ones_like(x), pat, impl="reference")
    >>> all(np.allclose(a, b, atol=1e-10) for a, b in zip(g, want))
    True
    """
    _api()
    pat, pl = resolve(pattern, mode, block)
    return grads_by_autograd(
        lambda *x: flex_attention_plan(*x, pl, scale=scale, pattern=pat), q, k, v, do)


class _Flex(Backend):
    """``impl="flex"``: each piece of the plan through FlexAttention with its BlockMask."""

    name = "flex"
    description = ("FlexAttention on every piece of the plan (its BlockMask in the piece's "
                   "order), merged by log-sum-exp")
    devices = ("cpu", "cuda")
    kinds = ("numpy", "torch")
    blocks = {"cpu": FLEX_BLOCK, "cuda": FLEX_BLOCK}
    autograd = True

    def require(self) -> None:
        _api()

    def more_reasons(self, inputs: Inputs, plan: ExecutionPlan | None,
                     pattern: Pattern | None) -> list[str]:
        if not available():
            return ["torch with FlexAttention (torch >= 2.5) is not importable"]
        if inputs.kind == "numpy" and inputs.device != "cpu":
            return ["q: NumPy arrays run on the CPU only"]
        if plan is not None and inputs.device == "cuda" and plan.block % FLEX_BLOCK:
            return [f"block: must be a multiple of {FLEX_BLOCK} on CUDA, got {plan.block}"]
        return []

    def forward(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                pattern: Pattern | None = None, scale: float | None = None,
                return_lse: bool = False) -> Any:
        return forward(q, k, v, plan if pattern is None else pattern, mode=plan.mode,
                       scale=scale, return_lse=return_lse, block=plan.block)

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                 *, pattern: Pattern | None = None,
                 scale: float | None = None) -> tuple[Any, Any, Any]:
        return backward(q, k, v, o, lse, do, plan if pattern is None else pattern,
                        mode=plan.mode, scale=scale, block=plan.block)

    def differentiable(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                       pattern: Pattern | None = None, scale: float | None = None) -> Any:
        return flex_attention_plan(q, k, v, plan, scale=scale, pattern=pattern)

    def note(self, plan: ExecutionPlan, inputs: Inputs) -> str:
        torch, _ = _api()
        dev = torch.device(inputs.device)
        how = _how(None, dev, getattr(torch, inputs.dtype, torch.float32), False, torch)
        return (f"{how} FlexAttention on {plan.num_pieces} piece(s), block {plan.block}, "
                f"computed/useful {plan.ratio:.2f}")


#: The FlexAttention backend (:class:`~sparse_patterns.kernels.backend.Backend`).
BACKEND = _Flex()
