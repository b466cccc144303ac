"""Graph analysis of attention patterns: the paper's criteria, budgets, scaling, bottlenecks.

:func:`verify` checks exactly, for every pair, that a pattern of p heads
connects every input to every output across p steps of attention (criterion 1)
through a path of at most p + 1 positions (criterion 2), as the Sparse
Transformer requires (Child et al. 2019, arXiv:1904.10509, section 4.1);
:func:`explain` shows a shortest path or why none exists; :func:`hop_matrix`
gives every pair's hop distance for small n; :func:`scaling` fits how
``|A_i|`` grows with n; :func:`bottleneck` finds the minimum vertex cut between
early positions and a later one (networkx, small n).
"""

from __future__ import annotations

from .bottleneck import Bottleneck, bottleneck
from .budget import HeadBudget, block_budgets, budgets
from .criteria import MODES, Explanation, VerifyReport, explain, hop_matrix, verify
from .scaling import ScalingTable, scaling

__all__ = [
    "verify", "explain", "hop_matrix", "scaling", "bottleneck", "budgets", "block_budgets",
    "VerifyReport", "Explanation", "ScalingTable", "Bottleneck", "HeadBudget", "MODES",
]
