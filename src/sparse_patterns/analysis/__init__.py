"""Graph analysis of attention patterns: the paper's criteria, budgets, scaling, bottlenecks.

:func:`verify` checks exactly, for every pair, that a pattern of p heads
connects every input to every output across p steps of attention (criterion 1)
through a path of at most p + 1 positions (criterion 2), as the Sparse
Transformer requires (Child et al. 2019, arXiv:1904.10509, section 4.1);
:func:`verify_schedule` does the same for a schedule of layers (a list of
patterns), document by document, with a leak check across documents;
:func:`explain` shows a shortest path or why none exists; :func:`hop_matrix`
gives every pair's hop distance for small n; :func:`scaling` fits how
``|A_i|`` grows with n; :func:`bottleneck` finds the minimum vertex cut between
early positions and a later one (networkx, small n); :func:`budgets` and
:func:`budget_table` give ``|A_i|`` against ``n^(1/p)``. Results print
themselves (``table()``, rich) and serialize (``to_dict()``, JSON).

The rooms: ``criteria`` (verify, hops, explain), ``report`` (VerifyReport,
Explanation), ``schedule`` (verify_schedule: a list of layers, packed
documents, the leak check), ``blocks`` (the block-level check), ``budget``, ``sweep``
(scaling), ``cuts`` (bottleneck), and the private ``_common`` (shared checks,
run structures, step matrices), ``_printable`` (``text()`` from ``table()``),
``_numba`` and ``_bits`` (the kernels). The
names below load on first use, so reading budgets imports no numba.
"""

from __future__ import annotations

from ..pattern import MODES
from ..util.lazy import lazy_attributes

#: public name -> the module of this package that defines it
_LAZY = {
    "verify": "criteria", "explain": "criteria", "hop_matrix": "criteria",
    "VerifyReport": "report", "Explanation": "report",
    "verify_schedule": "schedule", "ScheduleReport": "schedule", "document_offsets": "schedule",
    "scaling": "sweep", "ScalingTable": "sweep",
    "bottleneck": "cuts", "Bottleneck": "cuts",
    "budgets": "budget", "block_budgets": "budget", "budget_table": "budget",
    "HeadBudget": "budget", "BudgetTable": "budget",
    "Printable": "_printable",
}

__all__ = ["MODES", *_LAZY]


__getattr__, __dir__ = lazy_attributes(__name__, {k: f".{m}" for k, m in _LAZY.items()})
