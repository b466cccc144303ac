"""``impl="torch"``: each piece of an ExecutionPlan on the PyTorch kernel made for its shape.

A plan cuts a pattern into pieces that are block-compact in a permuted order
(:mod:`sparse_patterns.kernels.planning`). This backend runs each piece on the
fastest kernel PyTorch maintains for its shape, then merges the pieces of a
softmax group by their log-sum-exp:

* **residue classes, causal-dense** (strided's stride head, a dilated window that
  reaches the start): the tokens ``i = c + s t`` viewed as ``(n / s, s)`` and
  transposed are ``B H s`` independent causal attentions of length ``n / s``: one
  ``scaled_dot_product_attention`` call with ``is_causal`` (FlashAttention on a GPU for
  float16 and bfloat16, memory-efficient attention for float32; the CPU's flash
  kernel), no mask and no copy of ``q, k, v`` (a strided view). A merged piece that
  the window before it holds the first ``t0`` offsets of (strided's stride head
  less its window: ``t0 = 2``) is the same call on queries ``t >= t0`` and keys
  ``t < n / s - t0``. The last partial class (``n`` not a multiple of ``s``) is one
  more call, one query per class. Which pieces these are comes from the family's
  declared offsets (``register(..., offsets=...)``), never from a guess;
* **everything else** (a window or band, summary keys, packed documents,
  expressions): FlexAttention on the piece's ``BlockMask`` in its order (full tiles
  without a ``mask_mod``), the ``mask_mod`` the family's formula where the pattern
  has one, else the plan's bit table (:mod:`sparse_patterns.kernels.flex`).
  ``BlockMask`` objects and index tensors are built once per plan and device.

The pieces' outputs are put back in token order and merged in one function, compiled
by ``torch.compile`` on CUDA (one fused kernel for the transposes, the log-sum-exp
weights and the cast to the output's dtype). Gradients: one ``autograd.Function``
over the call saves ``q, k, v``, the output and its log-sum-exp; its backward runs
each residue piece's own SDPA backward with the merged output and log-sum-exp (the
gradient of a piece of one softmax is its kernel's backward with the group's
statistics), and differentiates each FlexAttention piece through FlexAttention's
backward, weighted by the piece's share of the softmax. Nothing of size ``n x n`` is
made, except by FlexAttention's eager operator on the CPU (its memory is checked
first: the CPU runs this path for tests and small ``n``; ``impl="numba"`` is the CPU
kernel).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..pattern import Pattern
from ._classes import Classes, classes_backward, classes_forward, classes_tokens
from .backend import Backend, Inputs, as_tensors, grads_by_autograd, merge_by_lse
from .planning import ExecutionPlan

__all__ = ["BACKEND", "Classes", "piece_shapes", "plan_attention"]

#: FlexAttention's tile on a GPU: the plan's ``block`` on CUDA must be a multiple of it.
GPU_BLOCK = 128
#: Largest head dimension of the GPU kernels (FlashAttention, FlexAttention).
GPU_MAX_HEAD_DIM = 256


# --------------------------------------------------------------------- piece shapes
def _family_offsets(pattern: Pattern) -> list[Any] | None:
    """The family's declared :class:`~sparse_patterns.patterns._flex.Offsets` per head, for
    a pattern that is what its generator gives (the condition its formula is trusted on)."""
    from ..patterns import registry  # noqa: PLC0415
    from ..patterns.formulas import formula_of  # noqa: PLC0415

    spec = registry.REGISTRY.get(pattern.name)
    if spec is None or spec.offsets is None or "documents" in pattern.params:
        return None
    if formula_of(pattern) is None:
        return None
    offs = spec.offsets(pattern)
    return offs if len(offs) == pattern.num_heads else None


def _classes_of(own: Any, earlier: list[Any], n: int) -> Classes | None:
    """``own`` less the ``earlier`` heads, as :class:`Classes`, or None when it is not."""
    if own is None or own.step < 2 or (own.hi is not None and own.hi < n - 1):
        return None
    s = own.step
    t0 = -(-own.lo // s)
    for e in earlier:
        if e is None:
            return None
        if not any(e.holds(s * t) for t in range(t0, t0 + (n // s) + 2)):
            continue  # no offset of ours is in it
        if e.step != 1 or e.hi is None or e.lo > s * t0:
            return None  # it would leave a hole inside a class, or take a whole class
        t0 = max(t0, e.hi // s + 1)
    return Classes(s, t0)


def piece_shapes(plan: ExecutionPlan, pattern: Pattern | None) -> list[Classes | None]:
    """For every piece of ``plan``: :class:`Classes` where it is causal attention inside
    residue classes (from the family's declared offsets), else None (FlexAttention).

    Examples
    --------
    >>> import sparse_patterns as sps
    >>> pat = sps.make("strided", 64, stride=8)
    >>> piece_shapes(sps.plan(pat, block=16, mode="merged"), pat)
    [None, Classes(s=8, t0=2)]
    >>> piece_shapes(sps.plan(pat, block=16, mode="multihead"), pat)
    [None, Classes(s=8, t0=0)]
    """
    def build() -> list[Classes | None]:
        none = [None] * plan.num_pieces
        offs = None if pattern is None else _family_offsets(pattern)
        if offs is None:
            return none
        from .flex import piece_members  # noqa: PLC0415

        members = piece_members(pattern, plan)
        if members is None:
            return none
        out: list[Classes | None] = []
        for mem in members:
            if len(mem) != 1:
                out.append(None)
                continue
            (h,) = mem
            earlier = offs[:h] if plan.mode == "merged" else []
            out.append(_classes_of(offs[h], earlier, plan.n))
        return out

    return plan.memo(("torch_shapes", id(pattern)), build)


# --------------------------------------------------------------------- merge
def _finish(torch: Any, n: int, shape: tuple[int, ...], pieces: list[tuple], dtype: Any,
            device: Any) -> tuple[Any, Any]:
    """Every piece of a group in token order, then merged (compiled as one on CUDA)."""
    parts = []
    for kind, a, b in pieces:
        if kind == "classes":
            parts.append(classes_tokens(torch, a, n, shape, b[0], b[1], dtype, device))
        else:
            parts.append(b)
    if not parts:
        f = torch.float64 if dtype == torch.float64 else torch.float32
        return (torch.zeros(shape, dtype=dtype, device=device),
                torch.full(shape[:3], -math.inf, dtype=f, device=device))
    return merge_by_lse(torch, parts, dtype)


_COMPILED: dict[str, Any] = {}


def _finisher(torch: Any, device: Any) -> Any:
    """:func:`_finish`, compiled once per process for CUDA (one fused kernel per group
    shape, up to 64 shapes; past them dynamo runs the same function uncompiled, which
    gives the same result); as it is on the CPU."""
    if device.type != "cuda":
        return _finish
    if "finish" not in _COMPILED:
        fn = torch.compile(_finish, dynamic=False)
        cfg = torch._dynamo.config

        def call(*args: Any) -> Any:
            with cfg.patch(recompile_limit=max(64, cfg.recompile_limit)):
                return fn(*args)

        _COMPILED["finish"] = call
    return _COMPILED["finish"]


# --------------------------------------------------------------------- the call
@dataclass
class _Program:
    """What a call does per softmax group: its pieces (``("classes", Classes)`` or
    ``("flex", piece index)``) and the FlexAttention ``mask_mod`` kind."""

    groups: list[list[tuple[str, Any]]]
    mask: str


def _program(torch: Any, plan: ExecutionPlan, pattern: Pattern | None, device: Any) -> _Program:
    def build() -> _Program:
        from .flex import mask_kind  # noqa: PLC0415

        shapes = piece_shapes(plan, pattern)
        groups: list[list[tuple[str, Any]]] = [[] for _ in range(plan.num_groups)]
        for p in range(plan.num_pieces):
            g = int(plan.piece_group[p])
            sh = shapes[p]
            groups[g].append(("classes", sh) if sh is not None else ("flex", p))
        needs_flex = any(kind == "flex" for g in groups for kind, _ in g)
        mask = mask_kind("auto", device, pattern, plan) if needs_flex else "bits"
        return _Program(groups, mask)

    return plan.memo(("torch_program", id(pattern), str(device)), build)


def _group(t: Any, g: int, G: int) -> Any:
    return t if G == 1 else t[:, g::G]


def _run_forward(torch: Any, q: Any, k: Any, v: Any, plan: ExecutionPlan,
                 pattern: Pattern | None, scale: float,
                 keep: bool) -> tuple[Any, Any, list]:
    """``(out, lse, saved)``: ``saved`` per group, per piece, what the backward needs."""
    from .flex import piece_attention  # noqa: PLC0415

    prog = _program(torch, plan, pattern, q.device)
    B, H, n, d = q.shape
    G = plan.num_groups
    f = torch.float64 if q.dtype == torch.float64 else torch.float32
    how = "eager" if q.device.type == "cpu" else "compiled"
    finish = _finisher(torch, q.device)
    outs, saved = [], []
    for g in range(min(G, H)):
        qs, ks, vs = (_group(t, g, G) for t in (q, k, v))
        pieces, keeps = [], []
        for kind, what in prog.groups[g]:
            if kind == "classes":
                res = classes_forward(torch, what, n, qs, ks, vs, scale)
                pieces.append(("classes", what, res))
                keeps.append(("classes", what, tuple(None if r is None else r for r in res)))
                continue
            if keep:  # FlexAttention's own graph, kept for the backward
                with torch.enable_grad():
                    leaves = [t.detach().requires_grad_(True) for t in (qs, ks, vs)]
                    o, lse = piece_attention(torch, plan, what, *leaves, scale, how, prog.mask,
                                             pattern, True, True)
                keeps.append(("flex", what, (leaves, o, lse)))
                o, lse = o.detach(), lse.detach()
            else:
                o, lse = piece_attention(torch, plan, what, qs, ks, vs, scale, how, prog.mask,
                                         pattern, True, False)
                keeps.append(("flex", what, None))
            pieces.append(("flex", what, (o, lse)))
        og, lg = finish(torch, n, tuple(qs.shape), pieces, q.dtype, q.device)
        outs.append((og, lg))
        saved.append(keeps)
    if G == 1:
        out, lse = outs[0]
    else:
        out = torch.zeros((B, H, n, d), dtype=q.dtype, device=q.device)
        lse = torch.full((B, H, n), -math.inf, dtype=f, device=q.device)
        for g, (og, lg) in enumerate(outs):
            out[:, g::G] = og
            lse[:, g::G] = lg
    return out, lse, saved


def _run_backward(torch: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, do: Any,
                  plan: ExecutionPlan, scale: float, saved: list) -> tuple[Any, Any, Any]:
    B, H, n, d = q.shape
    G = plan.num_groups
    f = torch.float64 if q.dtype == torch.float64 else torch.float32
    acc = [torch.zeros((B, H, n, d), dtype=f, device=q.device) for _ in range(3)]
    do = do.to(q.dtype)
    for g in range(min(G, H)):
        qs, ks, vs, os_, ds = (_group(t, g, G) for t in (q, k, v, out, do))
        ls = _group(lse, g, G)
        ag = [_group(a, g, G) for a in acc]
        for kind, what, keep in saved[g]:
            if kind == "classes":
                classes_backward(torch, what, n, qs, ks, vs, os_, ls, ds, scale, keep, ag)
                continue
            leaves, o, lp = keep
            # this piece's share of the group: weight exp(lse_p - lse) on dO and on its lse
            fin = torch.isfinite(ls)
            w = torch.where(fin, torch.exp(lp.detach().to(f) - torch.where(fin, ls, 0)), 0)
            dof = ds.to(f)
            d_o = (w[..., None] * dof).to(o.dtype)
            d_l = w * (dof * (o.detach().to(f) - os_.to(f))).sum(-1)
            grads = torch.autograd.grad([o, lp], leaves, [d_o, d_l.to(lp.dtype)],
                                        allow_unused=True)
            for a, x in zip(ag, grads, strict=True):
                if x is not None:
                    a += x.to(f)
    return tuple(a.to(q.dtype) for a in acc)


def _autograd_function(torch: Any) -> Any:
    if "fn" in _COMPILED:
        return _COMPILED["fn"]
    from torch.autograd.function import once_differentiable  # noqa: PLC0415

    class PlanAttention(torch.autograd.Function):
        """The call as one autograd node: its backward is each piece's own backward."""

        @staticmethod
        def forward(ctx, q, k, v, plan, pattern, scale, keep):  # type: ignore[override]
            out, lse, saved = _run_forward(torch, q, k, v, plan, pattern, scale, keep)
            ctx.save_for_backward(q, k, v, out, lse)
            ctx.plan, ctx.scale, ctx.saved = plan, scale, saved
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        @once_differentiable
        def backward(ctx, dout, dlse):  # type: ignore[override]
            q, k, v, out, lse = ctx.saved_tensors
            dq, dk, dv = _run_backward(torch, q, k, v, out, lse, dout, ctx.plan, ctx.scale,
                                       ctx.saved)
            ctx.saved = None
            return dq, dk, dv, None, None, None, None

    _COMPILED["fn"] = PlanAttention
    return PlanAttention


def plan_attention(q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                   pattern: Pattern | None = None, scale: float | None = None,
                   return_lse: bool = False) -> Any:
    """Sparse attention of ``plan`` on torch tensors, differentiable (``impl="torch"``).

    Parameters
    ----------
    q, k, v : torch.Tensor, shape (B, H, n, d)
        One device and dtype; attention head ``h`` uses softmax group ``h % G``.
    plan : ExecutionPlan
        On CUDA its ``block`` a multiple of 128.
    pattern : Pattern, optional
        The plan's pattern: its family's offsets and formula choose each piece's kernel
        (without it every piece runs on FlexAttention with the plan's bit table).
    scale : float, optional
        ``1 / sqrt(d)`` by default.
    return_lse : bool
        Also return the log-sum-exp (not differentiable).

    Examples
    --------
    >>> import torch, sparse_patterns as sps
    >>> pat = sps.make("strided", 24, stride=5)
    >>> pl = sps.plan(pat, block=8, mode="merged")
    >>> x = torch.randn(1, 2, 24, 8, dtype=torch.float64)
    >>> out = plan_attention(x, x, x, pl, pattern=pat)
    >>> ref = sps.attention(x, x, x, pat, mode="merged", impl="reference")
    >>> bool(torch.allclose(out, ref, atol=1e-12))
    True
    """
    import torch  # noqa: PLC0415

    from .inputs import check_scale  # noqa: PLC0415 - numba, on first call

    _check(torch, q, k, v, plan)
    sc = check_scale(scale, q.shape[3], "float64" if q.dtype == torch.float64 else "float32")
    if q.device.type == "cpu":
        from .flex import check_eager_fits  # noqa: PLC0415

        if any(kind == "flex" for grp in _program(torch, plan, pattern, q.device).groups
               for kind, _ in grp):
            check_eager_fits(plan, tuple(q.shape), q.element_size(),
                             "n: impl='torch' on the CPU runs FlexAttention's eager operator, "
                             "which")
    if q.device.type == "cuda":  # the kernels read rows of 16-byte-aligned, unit-stride memory
        q, k, v = (t if t.stride(-1) == 1 and t.data_ptr() % 16 == 0 else t.contiguous()
                   for t in (q, k, v))
    # FlexAttention's graphs for the backward only where a gradient will be asked
    keep = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))
    out, lse = _autograd_function(torch).apply(q, k, v, plan, pattern, sc, keep)
    return (out, lse) if return_lse else out


def _check(torch: Any, q: Any, k: Any, v: Any, plan: ExecutionPlan) -> None:
    from .inputs import check_shapes  # noqa: PLC0415 - numba, on first call

    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name}: impl='torch' takes torch tensors, got {type(t).__name__}")
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} disagrees with q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, q on {q.device}; put them on one device")
    dt = str(q.dtype).removeprefix("torch.")
    allowed = ("float16", "bfloat16", "float32") if q.device.type == "cuda" else (
        "float16", "bfloat16", "float32", "float64")
    if dt not in allowed:
        raise ValueError(f"q: dtype {dt} is not supported by impl='torch' on "
                         f"{q.device.type}; use one of {', '.join(allowed)}")
    shape = check_shapes({"q": q, "k": k, "v": v})
    if min(shape) < 1:
        raise ValueError(f"q: every dimension of (B, H, n, d) must be >= 1, got {shape}")
    if shape[2] != plan.n:
        raise ValueError(f"q: sequence length n={shape[2]} disagrees with the plan's n={plan.n}")
    if q.device.type == "cuda":
        d = shape[3]
        if d > GPU_MAX_HEAD_DIM or d % 8:
            raise ValueError(f"q: head dimension d={d} is not supported by impl='torch' on CUDA; "
                             f"use a multiple of 8 in [8, {GPU_MAX_HEAD_DIM}]")
        if plan.block % GPU_BLOCK:
            raise ValueError(f"block: must be a multiple of {GPU_BLOCK} for impl='torch' on "
                             f"CUDA (FlexAttention's tile), got {plan.block}")


# --------------------------------------------------------------------- the backend
class _Torch(Backend):
    """``impl="torch"``: the plan's pieces on PyTorch's attention kernels."""

    name = "torch"
    description = ("the plan's pieces on PyTorch's kernels: residue classes as batched causal "
                   "SDPA, the rest on FlexAttention, one log-sum-exp merge (the GPU path)")
    devices = ("cpu", "cuda")
    kinds = ("torch", "numpy")
    blocks = {"cpu": GPU_BLOCK, "cuda": GPU_BLOCK}
    autograd = True

    def require(self) -> None:
        try:
            import torch  # noqa: F401, PLC0415
            from torch.nn.attention.flex_attention import BlockMask  # noqa: F401, PLC0415
        except ImportError as e:
            raise ValueError(
                f"impl: 'torch' needs torch >= 2.5 with FlexAttention, not importable ({e})"
            ) from e

    def more_reasons(self, inputs: Inputs, plan: ExecutionPlan | None,
                     pattern: Pattern | None) -> list[str]:
        from .flex import available  # noqa: PLC0415

        if not available():
            return ["torch with FlexAttention (torch >= 2.5) is not importable"]
        if inputs.device != "cuda":
            if inputs.kind == "numpy" or inputs.kind == "torch":
                return []
            return [f"q: a {inputs.kind} array; impl='torch' takes torch tensors"]
        out = []
        if inputs.kind != "torch":
            out.append("q: impl='torch' on CUDA takes torch tensors")
        if inputs.dtype == "float64":
            out.append("q: dtype float64 on CUDA; impl='torch' takes float16, bfloat16, float32")
        d = inputs.head_dim
        if d > GPU_MAX_HEAD_DIM or d % 8:
            out.append(f"q: head dimension {d}; impl='torch' on CUDA takes multiples of 8 up "
                       f"to {GPU_MAX_HEAD_DIM}")
        if plan is not None and plan.block % GPU_BLOCK:
            out.append(f"block: {plan.block}; impl='torch' on CUDA takes multiples of "
                       f"{GPU_BLOCK}")
        return out

    def forward(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                pattern: Pattern | None = None, scale: float | None = None,
                return_lse: bool = False) -> Any:
        import torch  # noqa: PLC0415

        t, numpy_in = as_tensors({"q": q, "k": k, "v": v})
        with torch.no_grad():
            out, lse = plan_attention(t["q"], t["k"], t["v"], plan, pattern=pattern,
                                      scale=scale, return_lse=True)
        if numpy_in:
            out, lse = out.numpy(), lse.numpy()
        return (out, lse) if return_lse else out

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                 *, pattern: Pattern | None = None,
                 scale: float | None = None) -> tuple[Any, Any, Any]:
        return grads_by_autograd(
            lambda *x: plan_attention(*x, plan, pattern=pattern, scale=scale), q, k, v, do)

    def differentiable(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                       pattern: Pattern | None = None, scale: float | None = None) -> Any:
        return plan_attention(q, k, v, plan, pattern=pattern, scale=scale)

    def note(self, plan: ExecutionPlan, inputs: Inputs) -> str:
        import torch  # noqa: PLC0415

        prog = _program(torch, plan, None, torch.device(inputs.device))
        sdpa = sum(kind == "classes" for g in prog.groups for kind, _ in g)
        return (f"{sdpa} piece(s) on causal SDPA, {plan.num_pieces - sdpa} on FlexAttention "
                f"({prog.mask} mask), block {plan.block}")


#: The PyTorch-kernels backend (:class:`~sparse_patterns.kernels.backend.Backend`).
BACKEND = _Torch()
