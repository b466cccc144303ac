"""Where the benchmarks write their tables: one section of ``docs/benchmarks.md`` each.

A benchmark run with ``--markdown`` replaces its own section for the machine it ran
on (or adds it), so the file holds the latest figures of every benchmark on every
machine it has measured, each headed by the machine, the date and the commit; their
history lives in git. Nothing else writes that file.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

__all__ = ["DOC", "machine", "write_section"]

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"

_HEAD = """# Benchmarks

Written by the benchmarks (`--markdown`), one section per benchmark and machine, each
replaced by the next run of that benchmark on that machine. Ratios are measured side by
side in one run; the machine changes between sessions, so compare figures within a
section, not across sections.
"""


def machine() -> str:
    """The CPU (model name, vendor family and model, cores), or the GPU torch sees."""
    name, fam, model = platform.processor() or "unknown CPU", "", ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        name = re.search(r"model name\s*:\s*(.*)", text).group(1).strip()
        fam = re.search(r"cpu family\s*:\s*(\d+)", text).group(1)
        model = re.search(r"model\s*:\s*(\d+)", text).group(1)
    except (OSError, AttributeError):
        pass
    cpu = f"{name} (family {fam}, model {model}), {os.cpu_count()} cores" if fam else name
    return cpu


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=DOC.parent.parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def write_section(benchmark: str, where: str, body: str) -> Path:
    """Replace the section of ``benchmark`` on machine ``where`` in :data:`DOC` by ``body``
    (markdown), headed by the date and the commit; other sections are kept."""
    key = f"{benchmark} | {where}"
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    section = (f"<!-- section: {key} -->\n## `{benchmark}` on {where}\n\n"
               f"{when}, commit {_commit()}.\n\n{body.rstrip()}\n<!-- end: {key} -->\n")
    text = DOC.read_text() if DOC.exists() else _HEAD
    pat = re.compile(rf"<!-- section: {re.escape(key)} -->\n.*?<!-- end: {re.escape(key)} -->\n",
                     re.S)
    text = pat.sub(lambda _: section, text) if pat.search(text) else text.rstrip() + "\n\n" + section
    DOC.parent.mkdir(exist_ok=True)
    tmp = DOC.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(DOC)
    return DOC
