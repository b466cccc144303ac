"""Hop and scaling figures: pixels of the hop matrix, bars of the histogram, log-log lines.

The drawing is checked against hand-made inputs (a literal hop matrix, a
report and a scaling table written out here), so these tests do not depend on
the verifier; the last tests run the real ``hop_matrix`` / ``verify`` / ``scaling``
when they are available.
"""

from __future__ import annotations

from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import sparse_patterns as sps
from sparse_patterns import analysis
from sparse_patterns.render.analysis import hop_color, plot_hops, plot_scaling, scaling_title

HOP1 = (0x00, 0x72, 0xB2)  # blue
HOP2 = (0x56, 0xB4, 0xE9)  # sky blue
UNREACHABLE = (0xD5, 0x5E, 0x00)  # vermillion
BACKGROUND = (0xEB, 0xEB, 0xEB)


def _canvas(size=(6.0, 7.0)):
    fig = Figure(figsize=size, dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _pixels(fig):
    fig.canvas.draw()
    return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()


def _cell(ax, img, row, col):
    x, y = ax.transData.transform((col, row))
    return tuple(int(v) for v in img[int(round(img.shape[0] - y)), int(round(x))])


def _close(a, b, tol=2):
    return all(abs(int(u) - int(v)) <= tol for u, v in zip(a, b, strict=True))


def test_hop_matrix_pixels(monkeypatch):
    # a literal hop matrix: 0 non-target, 1 and 2 hops, -1 unreachable
    hops = np.array([[1, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0],
                     [2, 1, 1, 0, 0],
                     [-1, 2, 1, 1, 0],
                     [-1, -1, 2, 1, 1]])
    monkeypatch.setattr(analysis, "hop_matrix", lambda pattern, **kw: hops, raising=False)
    fig, ax = _canvas()
    assert plot_hops(sps.make("local", 5, window=1), ax=ax) is ax
    img = _pixels(fig)
    colours = {0: BACKGROUND, 1: HOP1, 2: HOP2, -1: UNREACHABLE}
    for i in range(5):
        for j in range(5):
            assert _close(_cell(ax, img, i, j), colours[hops[i, j]]), (i, j)
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["1 hop", "2 hops", "unreachable"]


def test_hop_histogram_bars():
    report = SimpleNamespace(hops={1: 70, 2: 66}, unreachable=0, p=2, n=16, mode="interleaved")
    fig, ax = _canvas((6.0, 4.0))
    plot_hops(report, ax=ax)
    heights = [b.get_height() for b in ax.patches]
    assert heights == [70, 66]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "2"]
    report = SimpleNamespace(hops={1: 5}, unreachable=3, p=1, n=4, mode="merged")
    fig, ax = _canvas((6.0, 4.0))
    plot_hops(report, ax=ax)
    assert [b.get_height() for b in ax.patches] == [5, 3]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["1", "unreachable"]
    r, g, b, _ = ax.patches[1].get_facecolor()
    assert _close((r * 255, g * 255, b * 255), UNREACHABLE)


def test_plot_hops_rejects_other_input():
    with pytest.raises(ValueError, match="report_or_pattern: expected a Pattern or a VerifyReport"):
        plot_hops(42)


def _table(name="strided", p=2):
    ns = [256, 1024, 4096, 16384]
    mx = [int(2 * n ** 0.5) for n in ns]
    return SimpleNamespace(name=name, params={"stride": "sqrt"}, p=p, ns=ns, max_row=mx,
                           mean_row=[0.9 * m for m in mx], nnz=[n * m for n, m in zip(ns, mx, strict=True)],
                           exponent=0.5, expected=0.5)


def test_scaling_lines_and_guide():
    t = _table()
    fig, ax = _canvas((6.0, 4.5))
    assert plot_scaling(t, ax=ax) is ax
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    mx, mean, guide = ax.lines
    np.testing.assert_array_equal(mx.get_xdata(), t.ns)
    np.testing.assert_array_equal(mx.get_ydata(), t.max_row)
    np.testing.assert_array_equal(mean.get_ydata(), t.mean_row)
    g = np.asarray(guide.get_ydata())
    assert g[-1] == pytest.approx(t.max_row[-1])
    slope = np.polyfit(np.log(t.ns), np.log(g), 1)[0]
    assert slope == pytest.approx(0.5)
    labels = [x.get_text() for x in ax.get_legend().get_texts()]
    assert labels == ["strided: max |A_i| (fit n^0.50)", "strided: mean |A_i|", "n^(1/2) guide"]
    assert "fitted exponent 0.500 (1/p = 0.500)" in scaling_title(t)


def test_scaling_tables_share_axes_with_distinct_colours():
    fig, ax = _canvas((6.0, 4.5))
    plot_scaling(_table("strided"), ax=ax)
    plot_scaling(_table("fixed"), ax=ax)
    assert ax.lines[0].get_color() != ax.lines[3].get_color()
    labels = [x.get_text() for x in ax.get_legend().get_texts()]
    assert labels.count("n^(1/2) guide") == 1 and "fixed: mean |A_i|" in labels


def test_hop_colours():
    assert hop_color(1) == "#0072B2" and hop_color(-1) == "#D55E00" and hop_color(0) == "#EBEBEB"


# ----------------------------------------------------------- with the real verifier
def _hex(c):
    return tuple(int(c[k:k + 2], 16) for k in (1, 3, 5))


@pytest.mark.parametrize(
    "name, params, kw",
    [
        ("strided", dict(stride=4), {}),
        ("local", dict(window=3), dict(p=2, mode="merged")),
        ("fixed", dict(stride=4, c=1), dict(residual=False)),
    ],
)
def test_hop_pixels_follow_the_bfs_oracle(name, params, kw):
    from sparse_patterns.testing import bfs_hops

    pat = sps.make(name, 16, **params)
    want, _ = bfs_hops(pat.to_dense(), p=kw.get("p"), mode=kw.get("mode", "interleaved"),
                       residual=kw.get("residual", True), causal=pat.causal)
    fig, ax = _canvas()
    plot_hops(pat, ax=ax, **kw)
    img = _pixels(fig)
    for i in range(16):
        for j in range(16):
            assert _close(_cell(ax, img, i, j), _hex(hop_color(int(want[i, j])))), (i, j)


def test_hop_histogram_of_a_real_report_counts_every_target_pair():
    pat = sps.make("strided", 300, stride=17)
    fig, ax = _canvas((6.0, 4.0))
    plot_hops(pat, ax=ax, limit=100)  # above the limit: verify, then bars
    heights = [b.get_height() for b in ax.patches]
    assert sum(heights) == 300 * 301 // 2  # every pair j <= i is a target
    report = analysis.verify(pat)
    assert heights == [report.hops[k] for k in sorted(report.hops)]


def test_scaling_of_a_real_table():
    t = analysis.scaling("strided", [64, 256, 1024], stride="sqrt")
    fig, ax = _canvas((8.0, 4.5))
    plot_scaling(t, ax=ax)
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), t.max_row)
    np.testing.assert_array_equal(ax.lines[0].get_xdata(), [64, 256, 1024])
