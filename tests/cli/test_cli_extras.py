"""A command that needs an optional extra which is not installed says which, in one line,
exit status 2 (not "internal error")."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from sparse_patterns.cli import app


@pytest.mark.parametrize("missing,args,extra", [
    ("torch", ["export", "strided", "--n", "64", "--stride", "8", "--format", "flex"], "torch"),
    ("dask", ["search", "strided", "--n", "64", "--grid", "stride=4,8"], "search"),
])
def test_a_missing_extra_is_one_line_exit_2(monkeypatch, tmp_path, missing, args, extra):
    for name in list(sys.modules):
        if name == missing or name.startswith(missing + "."):
            monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, missing, None)
    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(app, [*args, *(["-o", "out.pt"] if args[0] == "export" else [])])
    assert r.exit_code == 2, r.output
    assert r.output == (f"error: {missing}: not installed; this command needs the {extra!r} "
                        f"extra (pip install 'sparse-patterns[{extra}]')\n")
    assert not any(tmp_path.iterdir())
