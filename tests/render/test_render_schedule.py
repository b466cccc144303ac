"""Document boundaries in the matrix view, and the schedule figure (issue 21, item 5).

Boundaries are read back from the Axes (the LineCollection's segments, a pixel
on the line); the schedule figure's image array is compared with boolean
products of the dense layers built here from the families' dense oracles, and
its bars with the verifier's counts. The CLI is driven through CliRunner.
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.collections import LineCollection
from matplotlib.figure import Figure
from typer.testing import CliRunner

import sparse_patterns as sps
from sparse_patterns import render
from sparse_patterns.analysis import verify_schedule
from sparse_patterns.cli import app
from sparse_patterns.render.schedule import LEAK, UNREACHABLE, plot_schedule, schedule_hops
from sparse_patterns.testing import dense_oracle, document_oracle

runner = CliRunner()
MAGIC_PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _canvas(size=(6.0, 7.0), dpi=100):
    fig = Figure(figsize=size, dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _boundaries(ax):
    """The document-boundary collections of an Axes."""
    return [c for c in ax.collections
            if isinstance(c, LineCollection) and c.get_gid() == "document-boundaries"]


def _lines(ax):
    """(horizontal y positions, vertical x positions, spans) of the boundary segments."""
    (coll,) = _boundaries(ax)
    rows, cols, spans = [], [], set()
    for seg in coll.get_segments():
        (x0, y0), (x1, y1) = seg
        if y0 == y1:
            rows.append(float(y0))
            spans.add((float(x0), float(x1)))
        else:
            assert x0 == x1
            cols.append(float(x0))
            spans.add((float(y0), float(y1)))
    return sorted(rows), sorted(cols), spans


# ------------------------------------------------------------- matrix boundaries
@pytest.mark.parametrize("block", [None, 4])
def test_matrix_draws_a_line_at_each_document_start(block):
    # documents 8 + 10 + 6: starts at 8 and 18, lines between cells 7|8 and 17|18
    pat = sps.make("strided", 24, stride=4, documents=[8, 10, 6])
    ax = render.plot_pattern(pat, block=block)
    rows, cols, spans = _lines(ax)
    assert rows == [7.5, 17.5] and cols == [7.5, 17.5]
    assert spans == {(-0.5, 23.5)}  # each line crosses the whole matrix
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-1] == "document boundary (3 documents)"


def test_block_view_of_a_long_packed_sequence_draws_token_positions():
    # above TOKEN_LIMIT the picture is block densities; boundaries stay at token positions
    pat = sps.make("local", 5000, window=16, documents=[1000, 3001, 999])
    ax = render.plot_pattern(pat)
    assert "tiles of" in ax.get_legend().get_title().get_text()
    rows, cols, spans = _lines(ax)
    assert rows == cols == [999.5, 4000.5] and spans == {(-0.5, 4999.5)}


def test_cu_seqlens_offsets_draw_the_same_lines():
    pat = sps.make("local", 16, window=2, documents=[0, 5, 16])
    rows, cols, _ = _lines(render.plot_pattern(pat))
    assert rows == cols == [4.5]


def test_boundary_pixels_are_dark_and_cells_keep_their_colour():
    pat = sps.make("full", 12, documents=[5, 7])
    fig, ax = _canvas()
    render.plot_pattern(pat, ax=ax)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)

    def at(x, y):
        px, py = ax.transData.transform((x, y))
        return img[int(round(img.shape[0] - py)), int(round(px))]

    def darkest(x, y):  # the line is about one pixel wide: look one pixel around it
        px, py = ax.transData.transform((x, y))
        r, c = int(round(img.shape[0] - py)), int(round(px))
        return img[r - 1:r + 2, c - 1:c + 2].sum(axis=-1).min()

    assert darkest(2.0, 4.5) < 150 and darkest(4.5, 9.0) < 150  # horizontal, vertical line
    assert darkest(9.0, 3.5) > 600  # between two background cells of one row block: the grid
    # cells beside the line keep the head colour / background
    assert tuple(at(2, 4)) == (0x00, 0x72, 0xB2) and tuple(at(9, 4)) == (0xEB, 0xEB, 0xEB)


@pytest.mark.parametrize("pat", [
    sps.make("strided", 16, stride=4),
    sps.make("strided", 16, stride=4, documents=[16]),  # one document: no boundary
])
def test_no_lines_without_boundaries(pat):
    ax = render.plot_pattern(pat)
    assert _boundaries(ax) == []
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["A1", "A2", "A1 + A2"]


def test_too_many_documents_are_named_not_drawn():
    n = 2 * (render.matrix.DOCUMENT_LINE_LIMIT + 2)
    pat = sps.make("local", n, window=1, documents=[2] * (n // 2))
    ax = render.plot_pattern(pat)
    assert _boundaries(ax) == []
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[-1] == f"{n // 2} documents (boundaries not drawn)"


def test_within_patterns_draw_their_documents():
    from sparse_patterns.documents import within

    ax = render.plot_pattern(within(sps.make("local", 10, window=3), [3, 7]))
    rows, cols, _ = _lines(ax)
    assert rows == cols == [2.5]


# ------------------------------------------------------------------ schedules
def _reference(layers, offs, residual, causal):
    """First layer connecting each pair, from dense boolean products (see schedule_hops)."""
    n = layers[0].shape[0]
    same = np.zeros((n, n), bool)
    for s, e in zip(offs[:-1], offs[1:], strict=True):
        same[s:e, s:e] = True
    target = same & np.tril(np.ones((n, n), bool)) if causal else same
    eye = np.eye(n, dtype=bool)
    out = np.zeros((n, n), int)
    cut = whole = None
    for k, a in enumerate(layers, 1):
        m = a | eye if residual else a
        c = m & same
        cut = c if cut is None else (c.astype(np.int64) @ cut.astype(np.int64)) > 0
        whole = m if whole is None else (m.astype(np.int64) @ whole.astype(np.int64)) > 0
        out[cut & target & (out == 0)] = k
        if len(offs) > 2:
            out[whole & ~same] = -2
    out[target & (out == 0)] = -1
    return out


CASES = [
    # (layers as (name, params), documents, residual)
    ([("local", {"window": 3}), ("local", {"window": 3}), ("full", {})], None, True),
    ([("strided", {"stride": 4})], None, True),
    ([("local", {"window": 2})] * 3, None, False),
    ([("local", {"window": 3}), ("full", {})], [7, 13], True),  # both layers leak
    ([("local", {"window": 2}), ("local", {"window": 2, "causal": False})], [6, 6, 8], True),
    ([("dilated", {"window": 3, "dilation": 2}), ("fixed", {"stride": 4, "c": 1})], None, True),
]


@pytest.mark.parametrize("spec, documents, residual", CASES)
def test_schedule_image_equals_boolean_products(spec, documents, residual):
    n = 20
    layers = [sps.make(name, n, **params) for name, params in spec]
    dense = [dense_oracle(name, n, **params).any(axis=0) for name, params in spec]
    offs = [0, n] if documents is None else list(np.cumsum([0, *documents]))
    causal = all(params.get("causal", True) for _, params in spec)
    want = _reference(dense, offs, residual, causal)
    ax = plot_schedule(layers, documents=documents, residual=residual)
    got = np.asarray(ax.images[0].get_array())
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(schedule_hops(layers, documents=documents, residual=residual),
                                  want)
    # the legend counts every colour; the layer counts are the verifier's hop histogram
    r = verify_schedule(layers, documents=documents, residual=residual)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    expect = [f"layer {k}: {v:,}" for k, v in r.hops.items() if v]
    if r.unreachable:
        expect.append(f"unreachable: {r.unreachable:,}")
    if (want == LEAK).any():
        assert r.leak
        expect.append(f"leak across documents: {int((want == LEAK).sum()):,}")
    if documents is not None:
        expect.append(f"document boundary ({len(documents)} documents)")
    assert labels == expect


def test_schedule_on_packed_layers_has_no_leak_and_draws_boundaries():
    docs = [5, 9, 6]
    spec = [("local", {"window": 2}), ("local", {"window": 2}), ("full", {})]
    layers = [sps.make(name, 20, documents=docs, **params) for name, params in spec]
    dense = [document_oracle(name, docs, **params).any(axis=0) for name, params in spec]
    want = _reference(dense, [0, 5, 14, 20], True, True)
    assert not (want == LEAK).any() and not (want == UNREACHABLE).any()
    ax = plot_schedule(layers, documents=docs)
    np.testing.assert_array_equal(ax.images[0].get_array(), want)
    rows, cols, _ = _lines(ax)
    assert rows == cols == [4.5, 13.5]


def test_schedule_pixels_take_the_layer_colours():
    layers = [sps.make("local", 6, window=1)] * 2
    fig, ax = _canvas()
    plot_schedule(layers, ax=ax)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)

    def at(i, j):
        px, py = ax.transData.transform((j, i))
        return tuple(img[int(round(img.shape[0] - py)), int(round(px))])

    # layer 1 blue, layer 2 sky blue, unreachable vermillion, j > i background
    assert at(3, 3) == (0x00, 0x72, 0xB2) and at(3, 1) == (0x56, 0xB4, 0xE9)
    assert at(3, 0) == (0xD5, 0x5E, 0x00) and at(1, 4) == (0xEB, 0xEB, 0xEB)


def test_report_bars_and_large_schedules():
    layers = [sps.make("local", 16, window=3)] * 2 + [sps.make("full", 16)]
    r = verify_schedule(layers)
    ax = plot_schedule(r)
    assert [int(b.get_height()) for b in ax.patches] == list(r.reachable) == [58, 91, 136]
    assert "after layer 3" in ax.get_title()
    # above the limit the layers are verified and drawn as bars
    ax = plot_schedule(layers, limit=8)
    assert len(ax.images) == 0 and [int(b.get_height()) for b in ax.patches] == [58, 91, 136]


@pytest.mark.parametrize("arg, kw, match", [
    ([], {}, "layers: a schedule needs at least one layer"),
    ("local", {}, "report_or_layers: expected a list of Patterns"),
    ([sps.make("local", 8, window=1), sps.make("full", 9)], {}, "every layer must have the same n"),
    ([sps.make("local", 8, window=1)], {"documents": [3, 4]}, "documents: lengths sum to 7, not n=8"),
])
def test_plot_schedule_bad_input(arg, kw, match):
    with pytest.raises(ValueError, match=match):
        plot_schedule(arg, **kw)


def test_plot_schedule_refuses_documents_with_a_report():
    r = verify_schedule([sps.make("full", 8)])
    with pytest.raises(ValueError, match="documents, residual: a ScheduleReport holds its own"):
        plot_schedule(r, documents=[4, 4])


def test_schedule_hops_refuses_large_n():
    with pytest.raises(ValueError, match="n: schedule_hops builds dense .* got n=2049"):
        schedule_hops([sps.make("local", 2049, window=1)])


def test_schedule_figure_has_both_panels():
    layers = [sps.make("local", 16, window=3), sps.make("full", 16)]
    fig = render.schedule_figure(layers, documents=[6, 10])
    left, right = fig.axes
    assert left.images and len(right.patches) == 2
    assert "2 documents (6 + 10)" in fig.get_suptitle()


# ------------------------------------------------------------------------ CLI
@pytest.mark.parametrize("args", [
    ["--schedule", "local:window=8,local:window=8,full", "--n", "64", "--documents", "20,44"],
    ["--schedule", "local:window=8,full", "--n", "64", "--view", "hops", "--no-residual"],
    ["--schedule", "local:window=4,full", "--n", "3000"],  # above the limit: the bars alone
    ["strided", "--n", "64", "--stride", "8", "--documents", "20,24,20"],
    ["strided", "--n", "64", "--stride", "8", "--documents", "0,20,64", "--view", "image"],
])
def test_cli_writes_a_figure(tmp_path, args):
    out = tmp_path / "s.png"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_bytes().startswith(MAGIC_PNG) and out.stat().st_size > 5000
    assert "wrote" in res.stdout


def test_cli_file_with_documents_is_cut(tmp_path):
    src = tmp_path / "local.npz"
    sps.save(sps.make("local", 16, window=3), src)
    out = tmp_path / "s.svg"
    res = runner.invoke(app, ["render", "--file", str(src), "--documents", "6,10", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "documents=(6, 10)" in out.read_text()  # the title names the cut


@pytest.mark.parametrize("args, message", [
    (["--schedule", "", "--n", "64"], "schedule: layer 1 has no pattern name"),
    (["--schedule", ",", "--n", "64"], "schedule: layer 1 has no pattern name"),
    (["--schedule", "local:window=8,full", "--n", "64", "--documents", "20,40"],
     "documents: lengths sum to 60, not n=64"),
    (["--schedule", "local:window=8,full", "--n", "64", "--documents", "0,20,60"],
     "documents: cu_seqlens offsets must end at n=64"),
    (["--schedule", "local:window=8,full", "--n", "64", "--documents", "20,x"],
     "documents: expected comma-separated integers"),
    (["--schedule", "local:window=8,full", "--n", "64", "--view", "matrix"],
     "view: --schedule draws the hops view, got --view matrix"),
    (["--schedule", "local:window=8,full", "--n", "64", "--tile", "4"],
     "schedule: --schedule takes no --tile"),
    (["--schedule", "local:window=8,full", "--n", "64", "--mode", "merged"],
     "schedule: --schedule takes no --mode merged"),
    (["--schedule", "local:window=8,full"], "n: --n is required with --schedule"),
    (["--schedule", "local:window=8", "--n", "64", "--stride", "3"],
     "schedule: --schedule takes no pattern name or pattern options"),
    (["--schedule", "nosuch", "--n", "64"], "schedule: layer 1 (nosuch)"),
    (["strided", "--n", "64", "--documents", "20,40"], "documents: lengths sum to 60, not n=64"),
    (["strided", "--view", "scaling", "--documents", "3,4"], "documents: the scaling view"),
])
def test_cli_bad_input_one_line_exit_2(tmp_path, args, message):
    out = tmp_path / "s.png"
    res = runner.invoke(app, ["render", *args, "-o", str(out)])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []


# -------------------------------------------------------------------- gallery
def test_gallery_holds_the_document_and_schedule_figures():
    from pathlib import Path

    from sparse_patterns.render import gallery

    plan = dict(gallery._plan())
    assert {"documents_strided.png", "schedule_local_full.png"} <= set(plan)
    committed = Path(__file__).resolve().parents[2] / "figures"
    for name in ("documents_strided.png", "schedule_local_full.png"):
        assert (committed / name).read_bytes().startswith(MAGIC_PNG)
    fig = plan["documents_strided.png"]()
    (ax,) = fig.axes
    rows, cols, _ = _lines(ax)
    assert rows == cols == [15.5, 43.5]  # documents 16 + 28 + 20
    fig = plan["schedule_local_full.png"]()
    left, right = fig.axes
    hops = np.asarray(left.images[0].get_array())
    assert not (hops == LEAK).any() and not (hops == UNREACHABLE).any()
    assert set(np.unique(hops).tolist()) == {0, 1, 2, 3}
    assert [int(b.get_height()) for b in right.patches][-1] == 24 * 25 // 2 + 40 * 41 // 2
