"""Figures, checked pixel by pixel: the rendered Agg canvas is read back as an array.

The expected colours are written out literally (Okabe-Ito blue and orange, their
mean, the background and black), and the expected cells come from the dense
oracles in ``sparse_patterns.testing``, not from the drawing code.
"""

from __future__ import annotations

import time
import tracemalloc

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import sparse_patterns as sps
from sparse_patterns import render
from sparse_patterns.testing import ORACLES

BLUE = (0x00, 0x72, 0xB2)  # head A1
ORANGE = (0xE6, 0x9F, 0x00)  # head A2
MIXED = (115, 137, 89)  # mean of blue and orange, rounded half up
BACKGROUND = (0xEB, 0xEB, 0xEB)
BLACK = (0, 0, 0)


def _canvas(size=(6.0, 7.0), dpi=100):
    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _pixels(fig):
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H, W, 3)


def _cell(ax, img, row, col):
    """RGB at the centre of the data cell (row, col) of an image drawn with unit cells."""
    x, y = ax.transData.transform((col, row))
    return tuple(int(v) for v in img[int(round(img.shape[0] - y)), int(round(x))])


def _close(a, b, tol=2):
    return all(abs(int(u) - int(v)) <= tol for u, v in zip(a, b, strict=True))


def test_palette_is_okabe_ito_and_mixed_is_the_mean():
    assert render.head_color(0) == "#0072B2" and render.head_color(1) == "#E69F00"
    assert render.combo_color([0, 1]) == "#{:02X}{:02X}{:02X}".format(*MIXED)
    assert render.BACKGROUND == "#{:02X}{:02X}{:02X}".format(*BACKGROUND)
    assert len(set(render.HEAD_COLORS)) == len(render.HEAD_COLORS)


def test_matrix_pixels_strided_16():
    pat = sps.make("strided", 16, stride=4)
    a1, a2 = ORACLES["strided"](16, stride=4)
    fig, ax = _canvas()
    assert render.plot_pattern(pat, ax=ax) is ax
    img = _pixels(fig)
    counts = {"A1": 0, "A2": 0, "both": 0, "none": 0}
    for i in range(16):
        for j in range(16):
            want = {(True, True): MIXED, (True, False): BLUE, (False, True): ORANGE,
                    (False, False): BACKGROUND}[(bool(a1[i, j]), bool(a2[i, j]))]
            got = _cell(ax, img, i, j)
            assert _close(got, want), (i, j, got, want)
            key = {(True, True): "both", (True, False): "A1", (False, True): "A2",
                   (False, False): "none"}[(bool(a1[i, j]), bool(a2[i, j]))]
            counts[key] += 1
    # A1: 70 pairs, A2: 40, both: j = i and j = i - 4 (16 + 12)
    assert counts == {"A1": 70 - 28, "A2": 40 - 28, "both": 28, "none": 256 - 82}
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["A1", "A2", "A1 + A2"]
    # rows are outputs: row 9 (A1 = 5..9, A2 = 1, 5, 9) read left to right
    row9 = [_cell(ax, img, 9, j) for j in range(16)]
    assert _close(row9[1], ORANGE) and _close(row9[5], MIXED) and _close(row9[7], BLUE)
    assert _close(row9[10], BACKGROUND)


def test_matrix_one_head_selected():
    pat = sps.make("strided", 16, stride=4)
    (a1, a2) = ORACLES["strided"](16, stride=4)
    fig, ax = _canvas()
    render.plot_pattern(pat, ax=ax, heads=["A2"])
    img = _pixels(fig)
    for i in range(16):
        for j in range(16):
            assert _close(_cell(ax, img, i, j), ORANGE if a2[i, j] else BACKGROUND), (i, j)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A2"]


def test_image_view_pixels_strided_16():
    pat = sps.make("strided", 16, stride=4)
    a1, a2 = ORACLES["strided"](16, stride=4)
    i = 10
    fig, ax = _canvas(size=(5.0, 5.5))
    assert render.plot_image_view(pat, i, height=4, width=4, ax=ax) is ax
    img = _pixels(fig)
    for j in range(16):
        r, c = divmod(j, 4)
        if j == i:
            want = BLACK
        else:
            want = {(True, True): MIXED, (True, False): BLUE, (False, True): ORANGE,
                    (False, False): BACKGROUND}[(bool(a1[i, j]), bool(a2[i, j]))]
        assert _close(_cell(ax, img, r, c), want), (j, want)
    # hand check: A1 = 6..10, A2 = 2, 6, 10
    assert _close(_cell(ax, img, 0, 2), ORANGE) and _close(_cell(ax, img, 1, 2), MIXED)
    assert _close(_cell(ax, img, 1, 3), BLUE) and _close(_cell(ax, img, 2, 3), BACKGROUND)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["output i = 10", "A1", "A2", "A1 + A2"]


def test_image_view_rectangular_raster_and_fixed():
    pat = sps.make("fixed", 24, stride=6, c=2)
    a1, a2 = ORACLES["fixed"](24, stride=6, c=2)
    i = 21
    fig, ax = _canvas(size=(7.0, 4.0))
    render.plot_image_view(pat, i, height=3, width=8, ax=ax)
    img = _pixels(fig)
    for j in range(24):
        r, c = divmod(j, 8)
        want = BLACK if j == i else {(True, True): MIXED, (True, False): BLUE,
                                     (False, True): ORANGE, (False, False): BACKGROUND}[
            (bool(a1[i, j]), bool(a2[i, j]))]
        assert _close(_cell(ax, img, r, c), want), j


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(i=3, height=3, width=4), "height, width"),
        (dict(i=16, height=4, width=4), "i: must be an integer"),
        (dict(i=-1, height=4, width=4), "i: must be an integer"),
        (dict(i=3, height=4, width=4, heads=["B"]), "heads: unknown head"),
        (dict(i=3, height=4, width=4, heads=[2]), r"heads: head index must be in \[0, 2\)"),
    ],
)
def test_image_view_bad_input(kwargs, match):
    pat = sps.make("strided", 16, stride=4)
    i = kwargs.pop("i")
    with pytest.raises(ValueError, match=match):
        render.plot_image_view(pat, i, **kwargs)


def _dense_block_density(dense, block):
    n = dense.shape[-1]
    nb = -(-n // block)
    out = np.zeros((dense.shape[0], nb, nb))
    for bi in range(nb):
        for bj in range(nb):
            tile = dense[:, bi * block:(bi + 1) * block, bj * block:(bj + 1) * block]
            out[:, bi, bj] = tile.reshape(dense.shape[0], -1).mean(axis=1)
    return out


@pytest.mark.parametrize(
    "name, n, params, block",
    [
        ("strided", 50, dict(stride=7), 8),
        ("fixed", 64, dict(stride=8, c=2, summary_heads=2), 16),
        ("bigbird", 45, dict(block=4, seed=3), 6),
        ("full", 10, dict(causal=False), 3),
        ("local", 33, dict(window=5), 33),
        ("strided", 20, dict(stride=3), 1),
    ],
)
def test_block_density_matches_dense(name, n, params, block):
    pat = sps.make(name, n, **params)
    want = _dense_block_density(pat.to_dense(), block)
    got = render.block_density(pat, block)
    np.testing.assert_allclose(got, want, atol=1e-12)


@given(
    n=st.integers(1, 40),
    block=st.integers(1, 12),
    seed=st.integers(0, 2**16),
    heads=st.integers(1, 3),
)
def test_block_density_random_patterns(n, block, seed, heads):
    rng = np.random.default_rng(seed)
    dense = rng.random((heads, n, n)) < 0.3
    pat = sps.Pattern.from_dense(dense, causal=False)
    np.testing.assert_allclose(render.block_density(pat, block), _dense_block_density(dense, block))


def test_block_density_chunks_rows(monkeypatch):
    # a tiny chunk forces the row-splitting path; the counts must not change
    from sparse_patterns.render import matrix

    pat = sps.make("fixed", 70, stride=10, c=3)
    want = render.block_density(pat, 16)
    monkeypatch.setattr(matrix, "_CHUNK", 5)
    np.testing.assert_array_equal(render.block_density(pat, 16), want)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_block_density_and_image_view_never_build_the_csr(monkeypatch, chunk):
    # a generated pattern is read in row chunks (any size) and one row for the image view:
    # under a memory limit that refuses its whole CSR, both still match the dense oracle
    from sparse_patterns import config

    want_dense = sps.make("strided", 200, stride=13).to_dense()
    monkeypatch.setattr(sps.Pattern, "chunk_rows", lambda self, entries=None: chunk)
    pat = sps.make("strided", 200, stride=13)
    with config.memory_limit(2000):
        with pytest.raises(config.MemoryLimitError):
            _ = sps.make("strided", 200, stride=13).heads
        got = render.block_density(pat, 16)
        fig, ax = _canvas()
        render.plot_image_view(pat, 150, height=10, width=20, ax=ax)
        img = _pixels(fig)
    assert not pat.materialized
    np.testing.assert_allclose(got, _dense_block_density(want_dense, 16), atol=1e-12)
    for j in (0, 124, 137, 149):  # none, A2 only, both (150 - 13), A1 only
        colour = BLUE if want_dense[0, 150, j] and not want_dense[1, 150, j] else (
            ORANGE if want_dense[1, 150, j] and not want_dense[0, 150, j] else (
                MIXED if want_dense[0, 150, j] else BACKGROUND))
        assert _close(_cell(ax, img, j // 20, j % 20), colour), (j, colour)


def test_block_view_pixels():
    # forced block view at small n: empty tiles are background, full tiles the head colour
    pat = sps.make("fixed", 32, stride=8, c=8)  # A2 covers every column j <= i
    fig, ax = _canvas()
    render.plot_pattern(pat, ax=ax, heads=["A2"], block=8)
    img = _pixels(fig)
    for bi in range(4):
        for bj in range(4):
            got = _cell(ax, img, bi * 8 + 3.5, bj * 8 + 3.5)
            if bj < bi:
                assert _close(got, ORANGE), (bi, bj, got)  # every pair set
            elif bj > bi:
                assert _close(got, BACKGROUND), (bi, bj, got)
            else:  # half-full diagonal tile: lighter than the head colour, not background
                assert not _close(got, ORANGE, 10) and not _close(got, BACKGROUND, 10)
    assert "tiles of 8 x 8" in ax.get_legend().get_title().get_text()


def test_auto_block_and_token_limit():
    assert render.auto_block(render.TOKEN_LIMIT + 1) >= 8
    assert -(-65536 // render.auto_block(65536)) <= 256
    with pytest.raises(ValueError, match="block"):
        render.plot_pattern(sps.make("strided", 16, stride=4), block=0)


def test_large_n_renders_block_view_without_n_squared_memory():
    n = 65536
    pat = sps.make("strided", n, stride=256)
    _ = pat.heads  # build the CSR outside the measurement: it is the input, not the figure
    fig, ax = _canvas(size=(6.0, 6.5), dpi=80)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        render.plot_pattern(pat, ax=ax)
        _pixels(fig)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < n * n // 64, f"peak {peak:,} bytes"  # n^2 bytes would be 4.3 GB
    assert elapsed >= 0  # timing is reported by benchmarks, never asserted
    title = ax.get_legend().get_title().get_text()
    assert f"tiles of {render.auto_block(n)}" in title


def test_plot_functions_do_not_save_or_print(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    pat = sps.make("fixed", 16, stride=4)
    render.plot_pattern(pat)
    render.plot_image_view(pat, 5, height=4, width=4)
    import matplotlib.pyplot as plt

    plt.close("all")
    assert list(tmp_path.iterdir()) == []
    assert capsys.readouterr() == ("", "")


def test_render_view_titles_and_errors():
    pat = sps.make("strided", 36, stride=6)
    fig = render.render_view("matrix", pat)
    assert fig.get_suptitle() == "strided(stride=6, window='paper', causal=True), n=36"
    fig = render.render_view("image", pat)
    assert "output i = 28 on a 6 x 6 raster" in fig.get_suptitle()
    import matplotlib.pyplot as plt

    plt.close("all")
    with pytest.raises(ValueError, match="view: must be one of"):
        render.render_view("picture", pat)
    with pytest.raises(ValueError, match="n=20 is not a square"):
        render.render_view("image", sps.make("strided", 20, stride=4))
    with pytest.raises(ValueError, match="height, width: give both"):
        render.render_view("image", pat, height=6)


def test_save_figure_leaves_nothing_on_failure(tmp_path):
    class Broken:
        def savefig(self, fh, **kw):
            fh.write(b"half a figure")
            raise OSError(28, "No space left on device")

    target = tmp_path / "out.png"
    target.write_bytes(b"old")
    with pytest.raises(ValueError, match="output: cannot write .*No space left on device"):
        render.save_figure(Broken(), target)
    assert target.read_bytes() == b"old"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]  # no temp file left
