"""Fused sparse attention that executes a pattern's :class:`ExecutionPlan`.

``plan`` cuts a pattern into block-compact pieces; ``attention`` runs them with
an implementation chosen by name (``"numba"``: the CPU kernel of
:mod:`sparse_patterns.kernels.cpu`; ``"reference"``: the dense oracle; others,
such as ``"cuda"``, register themselves in :data:`IMPLS`).
"""

from __future__ import annotations

from .plan import MODES, ExecutionPlan, clear_plan_cache, plan

__all__ = ["ExecutionPlan", "plan", "MODES", "clear_plan_cache"]
