"""Models holding ``SparseAttention`` survive ``copy.deepcopy`` and ``torch.save`` /
``torch.load``: the pattern is pickled by what makes it again (a family's name and
parameters, packed documents included; an algebra expression's recipe; else its heads),
the plan without what kernels derived from it. Checked against the original: the same
pattern (pairs, params, head names) and bit-identical outputs."""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import sparse_patterns as sps  # noqa: E402
from sparse_patterns import Pattern  # noqa: E402
from sparse_patterns.algebra import combine  # noqa: E402
from sparse_patterns.torch import SparseAttention  # noqa: E402

PATTERNS = {
    "family": lambda: sps.make("strided", 48, stride=6),
    "documents": lambda: sps.make("fixed", 48, stride=8, c=2, documents=[20, 28]),
    "expression": lambda: combine("|", sps.make("local", 48, window=3),
                                  sps.make("dilated", 48, window=4, dilation=5)),
    "random-seeded": lambda: sps.make("bigbird", 48, block=8, window_blocks=1,
                                      global_blocks=1, random_blocks=1, seed=5),
    "user-csr": lambda: Pattern.from_dense(
        np.tril(np.random.default_rng(0).random((2, 48, 48)) < 0.3), name="mine"),
}


def _roundtrips(module):
    buf = io.BytesIO()
    torch.save(module, buf)
    buf.seek(0)
    return [copy.deepcopy(module), torch.load(buf, weights_only=False)]


@pytest.mark.parametrize("kind", list(PATTERNS))
@pytest.mark.parametrize("impl", ["numba", "torch"])
def test_deepcopy_and_torch_save_give_the_same_model(kind, impl):
    pat = PATTERNS[kind]()
    model = torch.nn.ModuleList([SparseAttention(pat, mode="merged", impl=impl, block=16)])
    q = torch.randn(1, 2, pat.n, 8, generator=torch.Generator().manual_seed(1))
    want = model[0](q, q, q)  # the plan's memo now holds device tensors and closures
    for again in _roundtrips(model):
        got = again[0]
        assert got.pattern == pat and got.pattern is not pat
        assert dict(got.pattern.params) == dict(pat.params)
        assert got.pattern.head_names == pat.head_names and got.pattern.name == pat.name
        assert torch.equal(got(q, q, q), want)
        assert got.state_dict().keys() == model[0].state_dict().keys()


def test_a_plan_pickles_without_its_memo():
    pat = sps.make("strided", 32, stride=4)
    pl = sps.plan(pat, block=8, mode="merged")
    pl.memo("closure", lambda: (lambda: 1))
    again = pickle.loads(pickle.dumps(pl))
    assert again.describe() == pl.describe()
    assert np.array_equal(again.tile_mask, pl.tile_mask) and not again.tile_mask.flags.writeable
    assert again.memo("closure", lambda: 2) == 2


def test_torch_compile_of_a_model_breaks_its_graph_at_the_attention():
    attn = SparseAttention(sps.make("strided", 64, stride=8), mode="merged")

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.attn = torch.nn.Linear(8, 8), attn

        def forward(self, x):
            y = self.lin(x)
            return self.attn(y, y, y).square().sum()

    model = Model()
    x = torch.randn(1, 2, 64, 8, dtype=torch.float64, requires_grad=True)
    model = model.double()
    want = model(x)
    (gw,) = torch.autograd.grad(want, x)
    got = torch.compile(model, backend="eager")(x)  # dynamo traces; no inductor files
    (gg,) = torch.autograd.grad(got, x)
    assert torch.equal(got, want) and torch.allclose(gg, gw, atol=1e-12)
