"""The kit's own runs on a GPU (data/reference, ``make gpu-reference``) against its estimate: the numbers
a booking rests on, measured by the kit's runner on one H200, not on CPU ranks."""

import contextlib
import io
import json
import re
import statistics

import pytest

from kit.accuracy import reference
from kit.cli import main
from kit.paths import REFERENCE


@pytest.fixture(scope="module")
def configs():
    return reference.configurations()


def test_the_reference_runs_are_real_gpu_measurements(configs):
    assert len(configs) >= 9
    assert {c.device for c in configs} == {"NVIDIA H200"} and {c.gpu for c in configs} == {"H200-SXM-141GB"}
    assert {c.setup.zero.stage for c in configs} == {0, 1, 2, 3}
    assert all(
        c.steps >= 6 and c.measured["max_reserved"] >= c.measured["max_allocated"] > 0 for c in configs
    )


#: each run's errors (max allocated, max reserved) as the estimate gives them: a change to the peak or to
#: the replayed sequence shows here, and the numbers in the docs with it
MEASURED = {
    "gpu-1x z0 bf16 mb4": (0.007, 0.003),
    "gpu-1x z1 bf16 mb4": (-0.002, -0.002),
    "gpu-1x z1 opt-off bf16 mb4": (-0.003, 0.003),
    "gpu-1x z2 bf16 mb4": (-0.002, -0.002),
    "gpu-1x z2 opt-off bf16 mb4": (-0.003, 0.003),
    "gpu-1x z3 bf16 mb4": (-0.001, 0.008),
    "gpu-1x z3 opt-off bf16 mb4": (-0.003, 0.034),
    "gpu-1x-qwen z0 bf16 mb4": (-0.003, -0.018),
    "gpu-1x-qwen z3 bf16 mb4": (-0.002, -0.004),
}


def test_each_runs_errors_are_what_they_were(configs):
    """Each run's errors to half a percent of ``MEASURED``."""
    errors = {f"{c.sweep} {c.label}": (c.error("max_allocated"), c.error("max_reserved")) for c in configs}
    assert errors.keys() == MEASURED.keys()
    for name, (allocated, reserved) in MEASURED.items():
        assert errors[name][0] == pytest.approx(allocated, abs=0.005), (name, errors[name])
        assert errors[name][1] == pytest.approx(reserved, abs=0.005), (name, errors[name])


def test_tensor_peak_is_within_1_percent_of_max_allocated(configs):
    """Issue 39's bar for the tensor peak (``torch.cuda.max_memory_allocated``) is 5 %; measured: each
    within 0.7 % (stage 3 on one GPU gathers in place: +2.5 % and +4.4 % before that)."""
    errors = {f"{c.sweep} {c.label}": c.error("max_allocated") for c in configs}
    assert all(abs(e) <= 0.01 for e in errors.values()), errors
    assert statistics.median(abs(e) for e in errors.values()) <= 0.01


def test_replayed_reserved_is_within_5_percent_of_max_reserved(configs):
    """Issue 39's bar for reserved memory: median within 10 %, none more than 15 % under (an OOM the
    estimate did not see); the caching allocator's replay is not fitted to these runs. Measured on the
    runner's optimizer path (torch_adam's foreach; at stage 0 FP16_UnfusedOptimizer, tensor by tensor):
    median 0.3 %, from -1.8 % (Qwen2.5-0.5B at stage 0: -13.9 % when replayed as a fused Adam's flat
    buffers) to +3.4 % (GPT-2 XL at stage 3 with optimizer offload: +10.1 % while the replay gave
    reduce_scatter_coalesced's outputs, views, allocations of their own): each within 5 %."""
    errors = {f"{c.sweep} {c.label}": c.error("max_reserved") for c in configs}
    assert statistics.median(abs(e) for e in errors.values()) <= 0.01, errors
    assert all(abs(e) <= 0.05 for e in errors.values()), errors


def test_step_time_within_30_percent_and_stage_3_slowest(configs):
    """The datasheet step model (no calibration) on the runs it predicts: each within 30 % (stage 3's
    per-event hook cost, ``kernels.STAGE3_HOOK_US``, is the mean of what these two stage-3 runs measured),
    stage 3 the slowest in both measured and predicted; optimizer offload is not predicted, and says
    why."""
    timed = [c for c in configs if c.error("step_time") is not None]
    assert len(timed) == 6
    for c in timed:
        assert abs(c.error("step_time")) <= 0.30, (c.label, c.error("step_time"))
    for sweep in {c.sweep for c in timed}:
        mine = [c for c in timed if c.sweep == sweep]
        three = next(c for c in mine if c.setup.zero.stage == 3)
        for c in mine:
            if c is not three:
                assert c.measured["step_time"] < three.measured["step_time"]
                assert c.predicted["step_time"] < three.predicted["step_time"]
    offloaded = [c for c in configs if c.setup.zero.offload_optimizer != "none"]
    assert offloaded and all("torch's AdamW on the host" in c.unpredicted for c in offloaded)
    assert all(c.predicted["step_time"] is None for c in offloaded)


def test_a_device_is_found_in_the_gpu_table_by_its_torch_name():
    assert reference.gpu_of("NVIDIA H200") == "H200-SXM-141GB"
    assert reference.gpu_of("NVIDIA A100-SXM4-40GB") == "A100-SXM-40GB"
    assert reference.gpu_of("Tesla V100-SXM2-32GB") == "V100-SXM2-32GB"
    assert reference.gpu_of("NVIDIA H100 PCIe") is None  # not its SXM part
    assert reference.gpu_of("NVIDIA B200") is None and reference.gpu_of("cpu") is None


def test_a_run_on_an_unknown_device_keeps_its_memory_and_says_why_no_step_time(tmp_path):
    sweep = tmp_path / "gpu-1x"
    sweep.mkdir()
    lines = (REFERENCE / "gpu-1x-qwen" / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    for r in records:
        r["device"] = "NVIDIA B200"
    (sweep / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    found = reference.configurations(tmp_path)
    assert len(found) == 2 and all(c.gpu is None and c.error("step_time") is None for c in found)
    assert all(c.unpredicted == "step time: 'NVIDIA B200' is not in data/gpus.csv" for c in found)
    assert all(abs(c.error("max_allocated")) <= 0.05 for c in found)


def _run(*argv: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def test_published_prints_the_reference_runs_beside_the_published_rows(capsys, published_report):
    # published_report first: its traces of the published models are on disk when the CLI reads every row
    # (cold, the CLI traced them again beside the fixture: 72 s, not 6)
    text = _run("published", "--table", "reference")
    assert text.startswith("Measured on a GPU by the kit's own runner (data/reference")
    assert "gpu-1x z0 bf16 mb4" in text and "H200-SXM-141GB" in text
    assert "NVIDIA H200, torch 2.11.0+cu130, DeepSpeed 0.19.8" in text
    assert "max allocated: 9 configuration(s), median |error| 0.3 %" in text
    assert "torch's AdamW on the host" in text
    # the allocator traces after them: measured / replayed / estimated
    assert "Rank 0 of many on one GPU (data/reference/allocator-traces" in text
    assert re.search(r"a18-fp16 +64 +7\.82 / 7\.82 / 7\.88 \(\+0\.8 %\) +13\.46 / 13\.46 / ", text)
    data = json.loads(_run("published", "--table", "reference", "--json"))
    assert set(data) == {"reference"} and len(data["reference"]["configurations"]) == 9
    traced = {r["name"]: r for r in data["reference"]["traces"]}
    assert traced["a23-fp16"]["replayed"] == traced["a23-fp16"]["measured"]
    everything = json.loads(_run("published", "--json"))
    assert {"rows", "summary", "reference"} <= set(everything)
    assert "reference" not in json.loads(_run("published", "--id", "A18", "--json"))
    assert main(["published", "--table", "reference", "--id", "A18"]) == 2
    assert "--id: the reference table's runs have no ids" in capsys.readouterr().err


def test_no_reference_runs_yet_says_how_to_make_them(tmp_path):
    from kit.cli import published

    assert "(no runs yet: make gpu-reference GPUS=N" in published.reference_text([])
    assert reference.configurations(tmp_path / "nothing here") == []
