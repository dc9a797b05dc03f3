"""Traces kept on disk (``kit.estimate.trace_store``): read back by a later process instead of traced
again, keyed by everything that decides them, never kept when they fail or when the store is off."""

import os
import subprocess
import sys

import pytest

from kit import models
from kit.estimate import trace, trace_store
from kit.paths import EXAMPLES

TRACE_IN_A_PROCESS = (
    "import sys; from kit import models; from kit.estimate import trace; "
    "t = trace.trace(models.resolve(sys.argv[1]), int(sys.argv[2]), 0, 'fp32'); "
    "print(t.saved_bytes, t.peak_bytes, t.seconds)"
)


def in_a_process(source, micro_batch: int, env: dict) -> list[str]:
    argv = [sys.executable, "-c", TRACE_IN_A_PROCESS, str(source), str(micro_batch)]
    return subprocess.run(argv, capture_output=True, text=True, check=True, env=env).stdout.split()


def test_a_later_process_reads_the_trace_back_and_an_edited_model_file_is_traced_afresh(tmp_path):

    model = tmp_path / "mlp.py"
    model.write_text((EXAMPLES / "mlp.py").read_text())
    env = {**os.environ, trace_store.ENV: str(tmp_path / "cache")}
    first = in_a_process(model, 3, env)
    kept = list((tmp_path / "cache" / "traces").glob("*.json"))
    assert len(kept) == 1
    assert in_a_process(model, 3, env) == first  # read back: the same figures, the first trace's seconds
    assert list((tmp_path / "cache" / "traces").glob("*.json")) == kept
    model.write_text(model.read_text() + "\n# edited\n")  # the same path, other bytes: traced again
    again = in_a_process(model, 3, env)  # a comment changes no tensor: the same figures, traced anew
    assert again[:2] == first[:2]
    assert len(list((tmp_path / "cache" / "traces").glob("*.json"))) == 2


def test_what_decides_a_trace_names_it():
    spec = models.resolve(str(EXAMPLES / "mlp.py"))
    names = {
        trace_store.key(spec, 2, 0, "fp32", (), None),
        trace_store.key(spec, 3, 0, "fp32", (), None),
        trace_store.key(spec, 2, 0, "bf16", (), None),
        trace_store.key(spec.model_copy(update={"name": "other"}), 2, 0, "fp32", (), None),
    }
    assert len(names) == 4 and None not in names
    assert trace_store.key(spec, 2, 0, "fp32", (), None) in names  # the same again: the same name
    module = spec.model_copy(update={"source": "some_package.model"})  # a module name: cannot be told
    assert trace_store.key(module, 2, 0, "fp32", (), None) is None


def test_off_keeps_nothing_and_a_failed_trace_is_never_kept(tmp_path, monkeypatch):
    spec = models.resolve(str(EXAMPLES / "mlp.py"))
    monkeypatch.setenv(trace_store.ENV, "off")
    assert trace_store.folder() is None
    trace_store.save(trace_store.key(spec, 2, 0, "fp32", (), None), {"saved_bytes": 1})
    assert trace_store.load(trace_store.key(spec, 2, 0, "fp32", (), None)) is None
    monkeypatch.setenv(trace_store.ENV, str(tmp_path))
    broken = tmp_path / "broken.py"
    broken.write_text(
        "import torch\n\ndef model():\n    return torch.nn.Linear(4, 4)\n\n"
        "def batch(n):\n    return (torch.zeros(n, 5),)\n"  # 5 features into a Linear of 4: fails
    )
    with pytest.raises(ValueError, match="broken.py"):
        trace.trace(models.resolve(str(broken)), 2, 0, "fp32")
    assert not (tmp_path / "traces").exists() or not list((tmp_path / "traces").glob("*.json"))
