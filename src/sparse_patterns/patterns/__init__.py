"""Pattern generators, one module per family, and the registry that names them.

Every generator takes ``n`` first and returns a :class:`~sparse_patterns.Pattern`
whose heads are built directly as CSR (never as a dense n x n array). A family
module also holds what consumers must not re-derive from a name: the closed-form
block layout (in the pattern's rule) and the FlexAttention formula it registers
beside its generator (``REGISTRY[name].flex``).
"""

from . import axial, bigbird, factorized, fixed, full, global_tokens, local, longformer, strided  # noqa: F401
from ._build import csr
from .registry import (
    REGISTRY,
    Param,
    PatternSpec,
    describe,
    get,
    make,
    register,
    resolve,
    root_of,
)

__all__ = [
    "REGISTRY", "Param", "PatternSpec", "describe", "get", "make", "register", "resolve", "root_of",
    "csr",
]
