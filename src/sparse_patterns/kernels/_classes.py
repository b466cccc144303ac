"""A piece that is causal attention inside residue classes, run as batched dense SDPA.

Private to :mod:`.torch_path`. The tokens ``i = c + s t`` of a ``(B, H, n, d)`` tensor,
viewed as ``(n / s, s)`` and transposed, are ``B H s`` sequences of length ``n / s``
(a strided view, no copy); the piece is causal attention on them, shifted by ``t0``
positions where a window before it holds the nearest ones, plus one call for the last
partial class. SDPA runs through the aten operators that return the log-sum-exp (the
merge needs it) and whose backward takes the group's output and log-sum-exp.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Classes", "classes_forward", "classes_tokens", "classes_backward"]


@dataclass(frozen=True)
class Classes:
    """A piece that is causal attention inside each residue class ``i mod s``: query
    ``i = c + s t`` attends keys ``c + s u`` with ``u <= t - t0``."""

    s: int
    t0: int


# --------------------------------------------------------------------- SDPA with its lse
def _sdpa(torch: Any, q: Any, k: Any, v: Any, causal: bool, scale: float) -> tuple[Any, Any, Any]:
    """``(out, lse, aux)`` of dense attention on ``(N, h, L, d)`` views; ``lse`` natural log,
    ``(N, h, L)``; ``aux`` what :func:`_sdpa_backward` needs of this call."""
    aten = torch.ops.aten
    if q.device.type == "cpu":
        out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal,
                                                                    scale=scale)
        return out, lse, None
    if q.dtype in (torch.float16, torch.bfloat16):
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
        return r[0], r[1], ("flash", r[2], r[3], r[4], r[5], r[6], r[7])
    r = aten._scaled_dot_product_efficient_attention(q, k, v, None, True, 0.0, causal,
                                                     scale=scale)
    return r[0], r[1][..., : q.shape[2]], ("efficient", r[2], r[3])


def _sdpa_backward(torch: Any, do: Any, q: Any, k: Any, v: Any, out: Any, lse: Any,
                   causal: bool, scale: float, aux: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of :func:`_sdpa` from the given ``out`` and ``lse``: those of the
    whole softmax group give this piece's share of the gradients."""
    aten = torch.ops.aten
    lse = lse.contiguous()
    if q.device.type == "cpu":
        return aten._scaled_dot_product_flash_attention_for_cpu_backward(
            do, q, k, v, out, lse, 0.0, causal, scale=scale)
    if aux[0] == "flash":
        _, cq, ck, mq, mk, seed, offset = aux
        return aten._scaled_dot_product_flash_attention_backward(
            do, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset, scale=scale)
    _, seed, offset = aux
    pad = -lse.shape[-1] % 32  # the kernel's lse rows come in multiples of 32
    lse = torch.nn.functional.pad(lse, (0, pad)).contiguous()
    g = aten._scaled_dot_product_efficient_attention_backward(
        do, q, k, v, None, out, lse, seed, offset, 0.0, [True, True, True, False], causal,
        scale=scale)
    return g[0], g[1], g[2]


# --------------------------------------------------------------------- a classes piece
class _ClassViews:
    """Views of ``(B, Hg, n, d)`` tensors by residue class: ``main`` ``(B, Hg, s, m, d)``
    (class ``c``, position ``t``: token ``c + s t``) and ``tail`` ``(B, Hg, r, d)`` (the
    tokens ``m s ..``: position ``m`` of the first ``r`` classes)."""

    def __init__(self, n: int, s: int, t0: int) -> None:
        self.n, self.s, self.t0 = n, s, t0
        self.m, self.r = n // s, n % s

    def main(self, x: Any) -> Any:
        B, H, _, d = x.shape
        return x[:, :, : self.m * self.s].unflatten(2, (self.m, self.s)).transpose(2, 3)

    def main_rows(self, x: Any) -> Any:
        """The same for ``(B, Hg, n)`` rows (a log-sum-exp)."""
        return x[:, :, : self.m * self.s].unflatten(2, (self.m, self.s)).transpose(2, 3)

    def tail(self, x: Any) -> Any:
        return x[:, :, self.m * self.s :]


def _flat(x: Any) -> Any:
    """``(B, Hg, s, L, d)`` as ``(B * Hg, s, L, d)`` (a view where the strides allow)."""
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def _tail_keys(torch: Any, cv: _ClassViews, x: Any) -> Any | None:
    """Keys of the tail's queries (position ``m`` of the first ``r`` classes): positions
    ``<= m - t0`` of those classes, ``(B, Hg, r, m - t0 + 1, d)``; None when none."""
    last = cv.m - cv.t0
    if cv.r == 0 or last < 0:
        return None
    head = cv.main(x)[:, :, : cv.r, : min(last + 1, cv.m)]
    if last < cv.m:
        return head
    return torch.cat([head, cv.tail(x)[:, :, :, None]], dim=3)  # t0 == 0: the query itself


def classes_forward(torch: Any, sh: Classes, n: int, q: Any, k: Any, v: Any,
                     scale: float) -> tuple[Any, Any]:
    """``(main, tail)`` results ``(out, lse, aux)`` or None of a classes piece."""
    cv = _ClassViews(n, sh.s, sh.t0)
    B, H, _, d = q.shape
    L = cv.m - sh.t0
    main = None
    if L > 0:
        mq, mk, mv = (_flat(cv.main(x)) for x in (q, k, v))
        main = _sdpa(torch, mq[:, :, sh.t0 :], mk[:, :, :L], mv[:, :, :L], True, scale)
    tail = None
    tk = _tail_keys(torch, cv, k)
    if tk is not None:
        tq = cv.tail(q).reshape(B * H, cv.r, 1, d)
        tail = _sdpa(torch, tq, _flat(tk), _flat(_tail_keys(torch, cv, v)), False, scale)
    return main, tail


def classes_tokens(torch: Any, sh: Classes, n: int, shape: tuple[int, ...], main: Any,
                    tail: Any, dtype: Any, device: Any) -> tuple[Any, Any]:
    """A classes piece's ``(out, lse)`` in token order ``(B, Hg, n, d)``, ``(B, Hg, n)``;
    rows without keys 0 and ``-inf``."""
    B, H, _, d = shape
    cv = _ClassViews(n, sh.s, sh.t0)
    F = torch.nn.functional
    f = torch.float64 if dtype == torch.float64 else torch.float32
    parts_o, parts_l = [], []
    if cv.m:
        if main is None:
            o = torch.zeros((B, H, cv.m * sh.s, d), dtype=dtype, device=device)
            lse = torch.full((B, H, cv.m * sh.s), -math.inf, dtype=f, device=o.device)
        else:
            o = F.pad(main[0].to(dtype), (0, 0, sh.t0, 0))  # (N, s, m, d): rows t < t0 empty
            lse = F.pad(main[1].to(f), (sh.t0, 0), value=-math.inf)
            o = o.view(B, H, sh.s, cv.m, d).transpose(2, 3).reshape(B, H, cv.m * sh.s, d)
            lse = lse.view(B, H, sh.s, cv.m).transpose(2, 3).reshape(B, H, cv.m * sh.s)
        parts_o.append(o)
        parts_l.append(lse)
    if cv.r:
        if tail is None:
            parts_o.append(torch.zeros((B, H, cv.r, d), dtype=dtype, device=device))
            parts_l.append(torch.full((B, H, cv.r), -math.inf, dtype=f, device=device))
        else:
            parts_o.append(tail[0].to(dtype).reshape(B, H, cv.r, d))
            parts_l.append(tail[1].to(f).reshape(B, H, cv.r))
    if len(parts_o) == 1:
        return parts_o[0], parts_l[0]
    return torch.cat(parts_o, dim=2), torch.cat(parts_l, dim=2)


def classes_backward(torch: Any, sh: Classes, n: int, q: Any, k: Any, v: Any, out: Any,
                      lse: Any, do: Any, scale: float, aux: tuple[Any, Any],
                      acc: tuple[Any, Any, Any]) -> None:
    """Add a classes piece's ``(dq, dk, dv)`` into ``acc`` (float32 ``(B, Hg, n, d)`` views),
    from the group's output and log-sum-exp."""
    cv = _ClassViews(n, sh.s, sh.t0)
    B, H, _, d = q.shape
    L = cv.m - sh.t0
    dq, dk, dv = acc
    main, tail = aux
    if main is not None:
        t0 = sh.t0
        mq, mk, mv, mo, mdo = (_flat(cv.main(x)) for x in (q, k, v, out, do))
        ml = cv.main_rows(lse).reshape(B * H, sh.s, cv.m)
        g = _sdpa_backward(torch, mdo[:, :, t0:], mq[:, :, t0:], mk[:, :, :L], mv[:, :, :L],
                           mo[:, :, t0:], ml[:, :, t0:], True, scale, main[2])
        for a, x, rows in ((dq, g[0], slice(t0, None)), (dk, g[1], slice(0, L)),
                           (dv, g[2], slice(0, L))):
            cv.main(a)[:, :, :, rows] += x.view(B, H, sh.s, -1, d)
    if tail is not None:
        tk, tv = _tail_keys(torch, cv, k), _tail_keys(torch, cv, v)
        K = tk.shape[3]
        rows = (cv.tail(x).reshape(B * H, cv.r, 1, d) for x in (q, out, do))
        tq, to, tdo = rows
        tl = cv.tail(lse).reshape(B * H, cv.r, 1)
        g = _sdpa_backward(torch, tdo, tq, _flat(tk), _flat(tv), to, tl, False, scale, tail[2])
        cv.tail(dq)[...] += g[0].view(B, H, cv.r, d)
        for a, x in ((dk, g[1]), (dv, g[2])):
            x = x.view(B, H, cv.r, K, d)
            upto = min(K, cv.m)
            cv.main(a)[:, :, : cv.r, :upto] += x[:, :, :, :upto]
            if K > cv.m:  # t0 == 0: the tail query's own key
                cv.tail(a)[...] += x[:, :, :, cv.m]
