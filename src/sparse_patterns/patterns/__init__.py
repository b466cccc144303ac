"""Pattern generators, one module per family, and the registry that names them.

Every generator takes ``n`` first and returns a :class:`~sparse_patterns.Pattern`
whose heads are built directly as CSR (never as a dense n x n array).
"""

from . import axial, bigbird, factorized, fixed, full, local, longformer, strided  # noqa: F401
from .registry import REGISTRY, Param, PatternSpec, get, make, register, resolve, root_of

__all__ = ["REGISTRY", "Param", "PatternSpec", "get", "make", "register", "resolve", "root_of"]
