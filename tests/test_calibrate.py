"""Calibration: each configuration's prediction is the step-time model's, its error predicted/measured - 1."""

import json

import pytest

from kit import models
from kit.cli import main
from kit.estimate import perf
from kit.run import calibrate as cal
from kit.run.results import Results
from kit.run.sweep import config_id
from kit.schema import Setup


def records(setups_and_times: list[tuple[Setup, list[float]]], device: str) -> Results:
    rows = []
    for order, (setup, times) in enumerate(setups_and_times):
        for step, seconds in enumerate(times):
            rows.append(
                {
                    "sweep": "fake", "config_id": config_id(setup), "label": setup.label, "order": order,
                    "setup": setup.model_dump(mode="json"), "rank": 0, "world_size": setup.dp,
                    "device": device, "step": step, "step_time_s": seconds,
                    "samples_per_s": setup.batch.train_batch / seconds, "loss": 1.0, "status": "ok",
                    "error": None, "run_id": "r",
                }
            )  # fmt: skip
    return Results(rows)


def test_gpu_records_are_predicted_from_the_datasheet():
    base = Setup(
        model=models.preset("llama-2-7b"), zero={"stage": 3}, batch={"micro_batch": 2, "seq_len": 4096}
    )
    measured = [(base, [9.0, 1.2, 1.0, 1.1]), (base.replace(zero={"stage": 2}), [2.0, 2.0, 2.2])]
    table = cal.calibrate(records(measured, "cuda"))
    for (setup, times), row in zip(measured, table.itertuples(), strict=True):
        median = sorted(times)[len(times) // 2] if len(times) % 2 else sum(sorted(times)[1:3]) / 2
        assert row.measured_s == pytest.approx(median)
        assert row.predicted_s == pytest.approx(perf.step_time(setup).step_s)
        assert row.error == pytest.approx(row.predicted_s / row.measured_s - 1)
    assert cal.median_abs_error(table) == pytest.approx(table.error.abs().median())


def test_cpu_records_use_the_measured_machine_without_discounts():
    setup = Setup(model=models.toy_spec(), cluster={"gpus_per_node": 2}, zero={"precision": "fp32"}, batch={})
    machine = cal.CpuMachine(threads=1, tflops={"fp32": 0.05}, bus_gbps=1.0, copy_gbps=10.0)
    table = cal.calibrate(records([(setup, [0.05, 0.04, 0.06])], "cpu"), machine)
    expected = perf.step_time(
        setup, machine.hardware("fp32"), perf.Assumptions(efficiency=1, link_efficiency=1)
    )
    assert table.predicted_s.iloc[0] == pytest.approx(expected.step_s)
    with pytest.raises(ValueError, match="^machine: CPU records need"):
        cal.calibrate(records([(setup, [0.05])], "cpu"))


@pytest.mark.distributed
def test_calibrate_cli_measures_this_machine(capsys, tmp_path):
    setup = Setup(model=models.toy_spec(), cluster={"gpus_per_node": 2}, zero={"precision": "fp32"}, batch={})
    folder = tmp_path / "fake"
    folder.mkdir()
    fake = records([(setup, [0.05, 0.04, 0.06]), (setup.replace(zero={"stage": 3}), [0.09, 0.08])], "cpu")
    (folder / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in fake.records))
    assert main(["calibrate", str(folder), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    machine = data["machine"]
    assert machine["tflops"]["fp32"] > 0 and machine["bus_gbps"] > 0 and machine["copy_gbps"] > 0
    assert [c["label"] for c in data["configs"]] == ["z2 fp32 mb1", "z3 fp32 mb1"]
    errors = [abs(c["error"]) for c in data["configs"]]
    assert data["median_abs_error"] == pytest.approx(sum(errors) / 2)
    assert main(["calibrate", str(tmp_path / "none")]) == 2
