"""``make demo``, the README's first command, as a user runs it: the memory table it prints and writes, its
verdicts against the numbers beside them, the real 2-rank sweep's records and every picture it names."""

import csv
import shutil
import subprocess
from pathlib import Path

import pytest

from kit import Setup
from kit.estimate import estimate
from kit.gpus import gpu
from kit.models import preset
from kit.planning.plan import DEFAULT_VARIANTS
from kit.records import load_records
from kit.units import GIB

pytestmark = pytest.mark.distributed

REPO = Path(__file__).resolve().parent.parent
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """``make demo`` into a temporary folder: its stdout and the files it wrote."""
    out = tmp_path_factory.mktemp("demo")
    make = shutil.which("make")
    if make is None:
        pytest.fail("make is not installed: the README's quick start needs it")
    done = subprocess.run(
        [make, "--no-print-directory", "-C", str(REPO), "demo", f"DEMO_OUT={out}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, out


def test_the_memory_table_is_the_estimate_and_its_verdicts_the_peaks(demo):
    """Llama-2-7B on 8 H100s, micro batch 1, sequence 4096 (the demo's defaults): per common ZeRO variant
    the components, their sum and the predicted peak per GPU, which decides "fits" (issue 39)."""
    stdout, out = demo
    with open(out / "memory_table.csv") as f:
        rows = list(csv.DictReader(f))
    base = Setup(
        model=preset("llama-2-7b"), cluster={"gpus_per_node": 8}, batch={"micro_batch": 1, "seq_len": 4096}
    )
    capacity = gpu("H100-SXM-80GB").memory_bytes / GIB
    assert len(rows) == len(DEFAULT_VARIANTS)
    for row, variant in zip(rows, DEFAULT_VARIANTS, strict=True):
        e = estimate(base.replace(zero=variant))
        assert row["variant"] == e.setup.label
        assert float(row["peak_per_gpu"]) == round(e.per_gpu_bytes / GIB, 2)
        assert float(row["components_sum"]) == round(e.components_bytes / GIB, 2)
        assert (row["fits"] == "True") == (e.per_gpu_bytes / GIB <= capacity)  # the verdict is the peak's
        assert row["variant"] in stdout
    assert [r["fits"] for r in rows] == ["False"] + ["True"] * 6  # plain data parallelism alone does not fit
    assert "Memory per GPU (GiB), llama-2-7b on 1 x 8 H100-SXM-80GB, micro batch 1:" in stdout


def test_the_sweep_ran_every_stage_and_measured_what_was_estimated(demo):
    """Stages 0-3 of the tiny GPT on 2 CPU ranks: every configuration ok, its model states measured on the
    rank equal to the estimate, byte for byte."""
    stdout, out = demo
    records = [r for r in load_records(out / "stages" / "records.jsonl") if r.get("rank") == 0]
    last = {r["label"]: r for r in records if r["status"] == "ok"}
    assert sorted(last) == ["z0 bf16 mb2", "z1 bf16 mb2", "z2 bf16 mb2", "z3 bf16 mb2"]
    for label, r in last.items():
        states = ("parameters", "gradients", "optimizer_states", "buffers")
        assert {k: r["measured"][k] for k in states} == {k: r["estimate"][k] for k in states}, label
        assert r["samples_per_s"] > 0
    assert "wrote " in stdout


def test_every_picture_it_names_is_a_png(demo):
    stdout, out = demo
    names = ["memory_per_gpu", "sweep_throughput", "sweep_memory", "sweep_comm_volume", "sweep_loss_curves"]
    for name in names:
        path = out / f"{name}.png"
        assert str(path) in stdout and path.read_bytes()[:8] == PNG and path.stat().st_size > 10_000, name
