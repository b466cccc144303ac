"""One interface for every attention backend, and how ``impl="auto"`` picks one.

A backend is an object with one shape (after xformers' ``FwOp``): its
:attr:`~Backend.name`, a :attr:`~Backend.description`, the devices, array kinds and
dtypes it takes, its default tile size per device (:meth:`~Backend.default_block`),
:meth:`~Backend.reasons` why it cannot run some inputs and plan, and
:meth:`~Backend.forward` and :meth:`~Backend.backward` with one signature.
:func:`sparse_patterns.kernels.attention` describes the inputs once
(:class:`Inputs`), builds the plan once, and hands both to the backend it chose:
the one named by ``impl``, or with ``impl="auto"`` the first of
:data:`AUTO` for the inputs' device whose reasons are empty; when none can run,
the error lists every candidate's reasons.

The built-in backends live beside their kernels and are imported on first use
(:data:`BUILTIN`: name -> the module whose ``BACKEND`` it is), so that
``import sparse_patterns`` imports neither torch nor numba-cuda. Nothing registers
itself on import; :func:`register` adds a user's backend explicitly.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..pattern import Pattern
    from .planning import ExecutionPlan

__all__ = ["Inputs", "Backend", "BUILTIN", "AUTO", "FLOATS", "get", "names", "register",
           "unregister", "choose", "as_tensors", "grads_by_autograd", "merge_by_lse"]

#: The float dtypes (by name) that attention takes.
FLOATS = ("float16", "bfloat16", "float32", "float64")

#: Built-in backends: name -> the module holding its ``BACKEND`` object.
BUILTIN: dict[str, str] = {
    "numba": "sparse_patterns.kernels.cpu.backend",
    "torch": "sparse_patterns.kernels.torch_path",
    "flex": "sparse_patterns.kernels.flex",
    "cuda": "sparse_patterns.kernels.cuda",
    "reference": "sparse_patterns.kernels.reference",
}

#: ``impl="auto"``: the backends tried, in order, for inputs on each device. On a GPU the
#: plan's pieces run on PyTorch's attention kernels (``torch``), numba-cuda after it; on the
#: CPU the numba kernels.
AUTO: dict[str, tuple[str, ...]] = {"cpu": ("numba",), "cuda": ("torch", "cuda")}

_USER: dict[str, Backend] = {}
_LOADED: dict[str, Backend] = {}


# --------------------------------------------------------------------- inputs
@dataclass(frozen=True)
class Inputs:
    """What a backend is told of a call's arrays before it runs.

    Attributes
    ----------
    kind : {"numpy", "torch", "numba", "other"}
        NumPy arrays, torch tensors, numba device arrays, or anything else (the
        backend's own check then says what it takes).
    device : {"cpu", "cuda"}
        Where ``q`` lives.
    dtype : str
        ``q``'s dtype by name (``"bfloat16"``, ``"float32"``, ...).
    shape : tuple of int
        ``q``'s shape, ``(B, H, n, d)`` for valid inputs.
    requires_grad : bool
        Whether a torch tensor among them requires a gradient.

    Examples
    --------
    >>> import numpy as np
    >>> Inputs.of({"q": np.zeros((1, 2, 8, 4), np.float32)})
    Inputs(kind='numpy', device='cpu', dtype='float32', shape=(1, 2, 8, 4), requires_grad=False)
    """

    kind: str
    device: str
    dtype: str
    shape: tuple[int, ...]
    requires_grad: bool = False

    @property
    def head_dim(self) -> int:
        """``d``, the last dimension (0 for a shape without one)."""
        return int(self.shape[-1]) if self.shape else 0

    @classmethod
    def of(cls, arrays: Mapping[str, Any]) -> Inputs:
        """Describe ``arrays`` (``q`` first); ``ValueError`` for torch tensors on two devices.

        Examples
        --------
        >>> import torch
        >>> Inputs.of({"q": torch.zeros(1, 1, 4, 2, dtype=torch.bfloat16)}).dtype
        'bfloat16'
        """
        q = arrays["q"]
        kind, device = _kind_device(q)
        if kind == "torch":
            for name, a in arrays.items():
                if _kind_device(a)[0] == "torch" and a.device != q.device:
                    raise ValueError(
                        f"{name}: on {a.device}, q on {q.device}; put q, k, v (and o, lse, do) "
                        "on one device"
                    )
        grad = kind == "torch" and any(
            getattr(a, "requires_grad", False) for a in arrays.values() if a is not None)
        shape = tuple(int(s) for s in getattr(q, "shape", ()))
        return cls(kind, device, str(getattr(q, "dtype", "")).removeprefix("torch."), shape,
                   bool(grad))


def _kind_device(a: Any) -> tuple[str, str]:
    mod = type(a).__module__
    if mod == "numpy":
        return "numpy", "cpu"
    if mod.startswith("torch") and hasattr(a, "device"):
        return "torch", "cuda" if a.device.type == "cuda" else a.device.type
    if getattr(a, "__cuda_ndarray__", False) or hasattr(a, "__cuda_array_interface__"):
        return "numba", "cuda"
    return "other", "cpu"


# --------------------------------------------------------------------- backends
class Backend:
    """An attention backend: what it takes, why it cannot run, forward and backward.

    Subclasses set the class attributes and implement :meth:`forward` (and
    :meth:`backward` where it has one); :meth:`reasons` checks the attributes and
    calls :meth:`more_reasons` for what only the backend knows.

    Attributes
    ----------
    name : str
        The ``impl=`` name.
    description : str
        One line: what runs, on what.
    devices, kinds, dtypes : tuple of str
        Devices (``"cpu"``, ``"cuda"``), array kinds (:class:`Inputs`) and dtypes taken.
    blocks : mapping
        Default tile size per device.
    max_block, max_head_dim : int
        Largest tile size and head dimension.
    autograd : bool
        Whether torch autograd differentiates :meth:`forward` on tensors that
        require gradients (``SparseAttention`` then calls it directly).
    needs_pattern : bool
        Whether it needs the Pattern, not only a plan.
    """

    name: str = ""
    description: str = ""
    devices: tuple[str, ...] = ("cpu",)
    kinds: tuple[str, ...] = ("numpy", "torch")
    dtypes: tuple[str, ...] = FLOATS
    blocks: Mapping[str, int] = {"cpu": 32}
    max_block: int = 4096
    max_head_dim: int = 1 << 14
    autograd: bool = False
    needs_pattern: bool = False
    has_backward: bool = True

    def default_block(self, device: str) -> int:
        """The tile size of the plans this backend runs on ``device`` by default."""
        return int(self.blocks.get(device, next(iter(self.blocks.values()))))

    def reasons(self, inputs: Inputs, plan: ExecutionPlan | None = None,
                pattern: Pattern | None = None) -> list[str]:
        """Why this backend cannot run ``inputs`` with ``plan`` (empty: it can).

        Each reason is one line naming the argument and what is allowed.
        """
        out = []
        if inputs.device not in self.devices:
            out.append(f"q: on {inputs.device}; impl={self.name!r} runs on "
                       f"{', '.join(self.devices)}")
        if inputs.kind not in self.kinds:
            out.append(f"q: a {inputs.kind} array; impl={self.name!r} takes "
                       f"{', '.join(self.kinds)}")
        if inputs.dtype not in self.dtypes:
            out.append(f"q: dtype {inputs.dtype} is not supported by impl={self.name!r}; "
                       f"use one of {', '.join(self.dtypes)}")
        if not 1 <= inputs.head_dim <= self.max_head_dim:
            out.append(f"q: head dimension {inputs.head_dim}; impl={self.name!r} takes "
                       f"[1, {self.max_head_dim}]")
        if plan is not None and plan.block > self.max_block:
            out.append(f"block: {plan.block}; impl={self.name!r} takes [1, {self.max_block}]")
        if self.needs_pattern and pattern is None:
            out.append(f"pattern: impl={self.name!r} needs the Pattern, not an ExecutionPlan")
        if inputs.requires_grad and not (self.autograd or self.has_backward):
            out.append(f"q: requires a gradient; impl={self.name!r} has no backward")
        return out + (self.more_reasons(inputs, plan, pattern) if not out else [])

    def require(self) -> None:
        """Raise a one-line ``ValueError`` when a library this backend needs is missing."""

    def more_reasons(self, inputs: Inputs, plan: ExecutionPlan | None,
                     pattern: Pattern | None) -> list[str]:
        """Reasons only this backend knows (its library missing, say); none by default."""
        return []

    def forward(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                pattern: Pattern | None = None, scale: float | None = None,
                return_lse: bool = False) -> Any:
        """``out`` (and ``lse`` with ``return_lse``) of ``plan`` on ``(B, H, n, d)`` arrays."""
        raise NotImplementedError

    def backward(self, q: Any, k: Any, v: Any, o: Any, lse: Any, do: Any, plan: ExecutionPlan,
                 *, pattern: Pattern | None = None,
                 scale: float | None = None) -> tuple[Any, Any, Any]:
        """``(dq, dk, dv)`` from the forward's output and log-sum-exp."""
        raise ValueError(f"impl: {self.name!r} has no backward")

    def differentiable(self, q: Any, k: Any, v: Any, plan: ExecutionPlan, *,
                       pattern: Pattern | None = None, scale: float | None = None) -> Any:
        """``out``, differentiated by torch autograd (backends with :attr:`autograd`)."""
        raise ValueError(f"impl: {self.name!r} is not differentiated by torch autograd")

    def note(self, plan: ExecutionPlan, inputs: Inputs) -> str:
        """One line on how a call of ``plan`` on ``inputs`` runs (the profiler prints it)."""
        return self.description

    def __repr__(self) -> str:
        return f"<backend {self.name!r}: {self.description}>"


# --------------------------------------------------------------------- torch backends
def as_tensors(arrays: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """torch tensors of ``arrays`` (NumPy arrays shared, not copied), and whether they were
    NumPy; a one-line ``ValueError`` for a mix of the two.

    Examples
    --------
    >>> import numpy as np
    >>> t, was_numpy = as_tensors({"q": np.zeros((1, 1, 2, 2))})
    >>> type(t["q"]).__name__, was_numpy
    ('Tensor', True)
    """
    import numpy as np  # noqa: PLC0415
    import torch  # noqa: PLC0415

    kinds = {isinstance(a, np.ndarray) for a in arrays.values()}
    if len(kinds) > 1:
        raise ValueError("q, k, v: mix NumPy arrays and torch tensors; pass one kind")
    if kinds == {True}:
        return {k: torch.from_numpy(np.ascontiguousarray(a)) for k, a in arrays.items()}, True
    return dict(arrays), False


def grads_by_autograd(fn: Any, q: Any, k: Any, v: Any, do: Any) -> tuple[Any, Any, Any]:
    """``(dq, dk, dv)`` of ``fn(q, k, v)`` against ``do``, by torch autograd: the backward of
    a backend that torch differentiates (NumPy in, NumPy out).

    Examples
    --------
    >>> import torch
    >>> x = torch.ones(1, 1, 2, 2)
    >>> grads_by_autograd(lambda q, k, v: q * k, x, 2 * x, x, x)[0][0, 0, 0].tolist()
    [2.0, 2.0]
    """
    import torch  # noqa: PLC0415

    t, numpy_in = as_tensors({"q": q, "k": k, "v": v, "do": do})
    with torch.enable_grad():
        x = [t[name].detach().requires_grad_(True) for name in ("q", "k", "v")]
        out = fn(*x)
        grads = torch.autograd.grad(out, x, t["do"].to(out.dtype), allow_unused=True)
    grads = tuple(torch.zeros_like(a) if g is None else g for a, g in zip(x, grads, strict=True))
    return tuple(g.numpy() for g in grads) if numpy_in else grads


def merge_by_lse(torch: Any, parts: Sequence[tuple[Any, Any]], dtype: Any) -> tuple[Any, Any]:
    """Pieces of one softmax, ``(out, lse)`` each in token order, merged by their
    log-sum-exp: the output in ``dtype`` and the log-sum-exp (float64 for float64, else
    float32). A row no piece covers is 0 and ``-inf``, with zero (not NaN) gradients;
    differentiable (the shift by the largest lse is detached: it cancels).

    Examples
    --------
    >>> import torch
    >>> o = torch.ones(1, 1, 2, 1)
    >>> out, lse = merge_by_lse(torch, [(o, torch.zeros(1, 1, 2)), (3 * o, torch.zeros(1, 1, 2))],
    ...                         torch.float32)
    >>> out.ravel().tolist(), round(float(lse[0, 0, 0]), 4)
    ([2.0, 2.0], 0.6931)
    """
    import math  # noqa: PLC0415

    f = torch.float64 if dtype == torch.float64 else torch.float32
    if len(parts) == 1:
        o, lse = parts[0]
        return o.to(dtype), lse.to(f)
    L = torch.stack([lse.to(f) for _, lse in parts])  # (P, B, Hg, n)
    top = L.detach().amax(0)
    top = torch.where(torch.isfinite(top), top, torch.zeros_like(top))
    w = torch.exp(L - top)
    tot = w.sum(0)
    empty = tot == 0
    safe = torch.where(empty, torch.ones_like(tot), tot)
    acc = parts[0][0].to(f) * w[0][..., None]
    for i in range(1, len(parts)):
        acc = acc + parts[i][0].to(f) * w[i][..., None]
    out = (acc / safe[..., None]).to(dtype)
    return out, torch.where(empty, torch.full_like(tot, -math.inf), torch.log(safe) + top)


# --------------------------------------------------------------------- the table
def names() -> tuple[str, ...]:
    """Every backend name: the built-in ones, then the registered ones.

    Examples
    --------
    >>> names()[:3]
    ('numba', 'torch', 'flex')
    """
    return tuple(BUILTIN) + tuple(n for n in _USER if n not in BUILTIN)


def get(name: Any) -> Backend:
    """The backend called ``name`` (its module imported on first use).

    Raises ``ValueError`` listing the valid names for an unknown one.

    Examples
    --------
    >>> get("reference").name
    'reference'
    """
    name = getattr(name, "value", name)
    if isinstance(name, str) and name in _USER:
        return _USER[name]
    if not isinstance(name, str) or name not in BUILTIN:
        raise ValueError(
            f"impl: unknown implementation {name!r}; valid: {', '.join(names())} (or auto)")
    if name not in _LOADED:
        _LOADED[name] = importlib.import_module(BUILTIN[name]).BACKEND
    return _LOADED[name]


def register(backend: Backend) -> None:
    """Make ``impl=backend.name`` available (a name of a built-in one is refused).

    Examples
    --------
    >>> class Mine(Backend):
    ...     name, description = "mine", "an example"
    >>> register(Mine())
    >>> get("mine").description
    'an example'
    >>> unregister("mine")
    """
    if not isinstance(backend, Backend):
        raise ValueError(f"backend: must be a Backend, got {type(backend).__name__}")
    if not isinstance(backend.name, str) or not backend.name or backend.name == "auto":
        raise ValueError(f"backend.name: must be a non-empty string other than 'auto', "
                         f"got {backend.name!r}")
    if backend.name in BUILTIN:
        raise ValueError(f"backend.name: {backend.name!r} is a built-in backend; "
                         "choose another name")
    _USER[backend.name] = backend


def unregister(name: str) -> None:
    """Forget a registered backend (``KeyError`` if there is none by that name)."""
    del _USER[name]


def choose(impl: Any, arrays: Mapping[str, Any], pattern: Any, mode: Any, block: Any, *,
           backward: bool = False) -> tuple[Backend, Pattern | None, ExecutionPlan]:
    """The backend that runs a call, the pattern (None when a plan was given) and its plan.

    ``impl`` a name: that backend (its own check then validates the arrays, with
    its own messages). ``"auto"``: the first of :data:`AUTO` for the inputs' device
    whose :meth:`Backend.reasons` are empty. ``block`` None: the chosen backend's
    default on that device. The plan is built (or found in the cache) once.

    Examples
    --------
    >>> import numpy as np, sparse_patterns as sps
    >>> x = np.zeros((1, 1, 8, 2), np.float32)
    >>> be, pat, pl = choose("auto", {"q": x}, sps.make("full", 8), "merged", None)
    >>> be.name, pl.block
    ('numba', 32)
    """
    from .inputs import resolve  # noqa: PLC0415 - numba (the CPU converters): on first call

    inputs = Inputs.of(arrays)
    name = getattr(impl, "value", impl)
    if name != "auto":
        be = get(name)
        if backward and not (be.has_backward or be.autograd):
            raise ValueError(f"impl: {be.name!r} has no backward")
        if block is None:
            block = be.default_block(inputs.device)
        pat, pl = resolve(pattern, mode, block, max_block=be.max_block,
                          needs_pattern=be.name if be.needs_pattern else None)
        return be, pat, pl
    cands = [get(n) for n in AUTO.get(inputs.device, AUTO["cpu"])]
    pat, pl = resolve(pattern, mode, cands[0].default_block(inputs.device)
                      if block is None else block)
    why = []
    for be in cands:
        rs = be.reasons(inputs, pl, pat)
        if backward and not be.has_backward:
            rs.append(f"impl={be.name!r} has no backward")
        if not rs:
            return be, pat, pl
        why.append(f"{be.name}: {'; '.join(rs)}")
        if len(cands) == 1:
            raise ValueError(rs[0])
    raise ValueError(f"impl: 'auto' found no backend for {inputs.kind} {inputs.dtype} inputs on "
                     f"{inputs.device} ({' | '.join(why)})")
