"""``examples/char_lm.py``: a tiny run of the whole script (two patterns, a table, the
figure), and its allocator setting, which must stop a training step from faulting freed
memory back in."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _char_lm(*argv: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python examples/char_lm.py *argv``, its output captured."""
    return subprocess.run([sys.executable, str(EXAMPLES / "char_lm.py"), *argv],
                          capture_output=True, text=True, timeout=timeout)

_CHURN = """
import resource, sys
sys.path.insert(0, {examples!r})
import torch, char_lm

def step():  # what a training step does: allocate and write large tensors, then free them
    f = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.ones(n) for n in (2 << 20, 16 << 20, 8 << 20, 4 << 20)]  # 8-64 MB each
    del xs
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f

before = [step() for _ in range(3)][-1]
kept = char_lm.keep_freed_memory()
# the first steps grow and lay out the heap; beside other processes a later step can still
# grow it once (one full run in a few): the median of 7 settled steps
after = sorted([step() for _ in range(10)][3:])[3]
print(kept, before, after)
"""


def test_keep_freed_memory_stops_a_step_faulting_its_memory_back_in():
    out = subprocess.run([sys.executable, "-c", _CHURN.format(examples=str(EXAMPLES))],
                         capture_output=True, text=True, check=True).stdout.split()
    kept, before, after = out[0] == "True", int(out[1]), int(out[2])
    if not kept:
        pytest.skip("not glibc: keep_freed_memory changes nothing here")
    assert before > 10_000  # most of the 120 MB faulted in again, 4 KiB pages: glibc's default
    assert after < 1_000


def test_char_lm_trains_two_patterns_and_draws_the_figure(tmp_path):
    fig = tmp_path / "curves.png"
    res = _char_lm("--patterns", "full,strided", "--steps", "3", "--context", "256",
                   "--eval-batches", "1", "--corpus-bytes", str(2 << 20), "--figure", str(fig),
                   timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    rows = [line.split("|") for line in res.stdout.splitlines() if line.startswith("| ")]
    assert [r[1].strip() for r in rows[1:]] == ["full", "strided"]
    bpc = [float(r[2]) for r in rows[1:]]
    assert all(0 < b < 8 for b in bpc)  # a byte model: at most 8 bits, if it learnt nothing
    assert fig.stat().st_size > 0


@pytest.mark.parametrize(("device", "line"), [
    ("tpu", "--device: 'tpu' is not a torch device; cpu or cuda"),
    ("meta", "--device: 'meta'; cpu or cuda"),
])
def test_char_lm_refuses_a_device_before_training(device, line):
    res = _char_lm("--device", device)
    assert res.returncode == 2 and res.stderr.splitlines()[-1] == f"char_lm.py: error: {line}"
    assert "Traceback" not in res.stderr and res.stdout == ""


def test_char_lm_refuses_cuda_where_torch_sees_none():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this torch sees a CUDA device")
    res = _char_lm("--device", "cuda")
    assert res.returncode == 2 and res.stderr.splitlines()[-1] == (
        f"char_lm.py: error: --device: 'cuda', but this torch ({torch.__version__}) sees no CUDA "
        "device; cpu or cuda")
