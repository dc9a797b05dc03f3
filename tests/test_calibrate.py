"""Calibration: each configuration's prediction is the step-time model's, its error predicted/measured - 1."""

import json
from dataclasses import replace

import pytest

from kit import models
from kit.cli import main
from kit.run import calibrate as cal
from kit.run.results import Results
from kit.run.sweep import config_id
from kit.schema import Setup
from kit.steptime import calibrated, perf
from kit.steptime.comm import TIMED_AS, collective_calls, collectives
from kit.toys import TOY_ZERO


def records(setups_and_times: list[tuple[Setup, list[float]]], device: str) -> Results:
    rows = []
    for setup, times in setups_and_times:
        for step, seconds in enumerate(times):
            rows.append(
                {
                    "sweep": "fake", "config_id": config_id(setup), "label": setup.label,
                    "setup": setup.model_dump(mode="json"), "rank": 0, "world_size": setup.dp,
                    "device": device, "step": step, "step_time_s": seconds,
                    "samples_per_s": setup.batch.train_batch / seconds, "loss": 1.0, "status": "ok",
                    "error": None, "run_id": "r", "time": 1e9,
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
        assert (row.measured_min_s, row.measured_max_s) == (min(times), max(times))
    assert cal.median_abs_error(table) == pytest.approx(table.error.abs().median())


def test_a_prediction_between_the_fastest_and_slowest_step_is_within_the_steps():
    """The run's own step-to-step range beside each prediction: inside it, the machine's noise covers
    the error."""
    setup = Setup(model=models.toy_spec(), cluster={"gpus_per_node": 2}, zero={"precision": "fp32"}, batch={})
    machine = cal.CpuMachine(threads=1, tflops={"fp32": 0.05}, bus_gbps=1.0, copy_gbps=10.0)
    p = perf.step_time(setup, machine.hardware("fp32"), cal.MEASURED).step_s
    other = setup.replace(batch={"grad_accum": 2})
    q = perf.step_time(other, machine.hardware("fp32"), cal.MEASURED).step_s
    table = cal.calibrate(
        records([(setup, [0.9 * p, 1.3 * p, 1.1 * p]), (other, [1.2 * q, 1.4 * q])], "cpu"), machine
    )
    assert list(cal.within_steps(table)) == [True, False]
    assert table.measured_min_s.tolist() == [0.9 * p, 1.2 * q]  # the steps themselves, exactly
    assert table.measured_max_s.tolist() == [1.3 * p, 1.4 * q]


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


def test_the_report_is_what_zerokit_calibrate_prints(capsys, tmp_path):
    """``report``: CPU records predicted on this machine at the bus bandwidth ``bus`` gives for ``nprocs``
    ranks; with a calibration file no machine is measured, and what it carried over comes with the command
    that measures it; ``zerokit calibrate --json`` prints ``to_dict``."""
    from kit.records import append_record
    from tests.test_perf import calibration, toy

    setups = [toy(stage=2), toy(stage=3, precision="bf16")]
    for row in records([(setups[0], [0.5, 0.4, 0.4]), (setups[1], [0.7, 0.6])], "cpu").records:
        append_record(str(tmp_path / "records.jsonl"), row)
    asked = []

    def bus(nprocs: int) -> float:
        asked.append(nprocs)
        return 2.5

    found = cal.report(str(tmp_path), bus, nprocs=1)
    assert asked == [1] and found.machine is not None and found.machine.bus_gbps == 2.5
    assert sorted(found.machine.tflops) == ["bf16", "fp32"] and found.label == "uncalibrated"
    hardware = found.machine.hardware("bf16")
    assert found.table.predicted_s.iloc[1] == perf.step_time(setups[1], hardware, cal.MEASURED).step_s
    assert found.carried_over == []
    summary = found.to_dict()
    assert summary["machine"]["bus_gbps"] == 2.5 and summary["calibration"] == "uncalibrated"
    assert summary["max_abs_error"] == pytest.approx(found.table.error.abs().max())

    path = tmp_path / "c.json"
    calibration().save(path)
    found = cal.report(
        str(tmp_path), lambda n: pytest.fail("a calibration file measures nothing"), 2, str(path)
    )
    bf16 = "precision bf16 (the calibration measured fp32)"
    assert found.machine is None and found.label.startswith("calibrated on cpu (2 ranks, gloo")
    assert found.carried_over == [
        (bf16, [setups[1].label], ["zerokit", "calibrate", "--measure", "--precision", "bf16"])
    ]
    assert main(["calibrate", str(tmp_path), "--calibration", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(found.to_dict()))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "records.jsonl").write_text("")
    with pytest.raises(ValueError, match=r"^sweep: \S+empty has no measured configuration to compare with$"):
        cal.report(str(tmp_path / "empty"), lambda n: 1.0)


#: the busy shares ``worker_lines`` measures: per collective (its middle size) and per engine
BUSY_COMM = {"all_reduce": 0.6, "all_gather": 0.4, "reduce_scatter": 0.5, "broadcast": 0.3}
BUSY_ENGINE = {"z1": 0.7, "z3": 0.45, "z2+offload": 0.9, "ddp": 0.8}


def worker_lines(base: Setup, engines: dict[str, tuple[float, float]]) -> dict:
    """What ``kit.ranks.calibrate_worker`` would print on a machine of known rates and fixed costs."""
    from kit.estimate import partition
    from kit.rules import bus_factor
    from kit.steptime.calibration import EngineCost

    rate, fixed, per_token = 0.04e12, 0.003, perf.flops_per_token(base)[0]
    links = {"all_reduce": (2e-4, 0.8), "all_gather": (4e-4, 0.4), "reduce_scatter": (6e-4, 0.5)}
    links["broadcast"] = (1e-4, 2.0)
    lines = {
        "machine": {"device": "cpu", "backend": "gloo", "world_size": 2, "threads_per_rank": 1}
        | {"torch": "2", "deepspeed": "0.19"},
        "compute": {
            "micro_batches": [2, 4],
            "tokens": [128, 256],
            "rounds_s": [[fixed + per_token * t / rate for t in (128, 256)]] * 3,
            "rounds_busy": [[0.9, 0.95]] * 3,
        },
        "adam": {"numel": 1000, "device_s": 2e-5, "host_s": 3e-5, "host_busy": 0.8},
        "copy": {"bytes": 8e9, "to_host_s": 2.0, "to_device_s": 1.0, "busy": 0.7},
        "collective": [
            {"op": op, "size_bytes": size, "s": lat + size * bus_factor(op, 2) / (bw * 1e9), "busy": busy}
            for op, (lat, bw) in links.items()
            for size, busy in ((4096, 0.2), (1 << 20, BUSY_COMM[op]), (1 << 24, 0.9))
        ],
        "engine": [],
    }  # fmt: skip
    known = cal.fit({**lines, "engine": []}, base)
    for key, (step, micro) in engines.items():
        setup = cal.engine_setup(base, key)
        truth = replace(known, engines={key: EngineCost(step, micro)})
        one = calibrated.step_time(setup.replace(batch={"grad_accum": 1}), calibration=truth)
        two = calibrated.step_time(setup.replace(batch={"grad_accum": 2}), calibration=truth)
        bare = two.compute.seconds - one.compute.seconds  # measured beside it, around the same moments
        micro_s = two.step_s - one.step_s
        last_s = micro_s + 2 * one.step_s - two.step_s
        beside = [0.9 * bare, bare, 1.1 * bare]  # the engine's micro-steps ran at the middle one's load
        item = {"key": key, "setup": setup.model_dump(mode="json"), "bare_s": beside, "bare_busy": [0.9] * 3}
        # a micro-step's CPU seconds: its bare pass busy 0.9 of it, what the engine adds BUSY_ENGINE of it
        cpu = [0.9 * bare + (t - bare) * BUSY_ENGINE[key] for t in (micro_s, last_s)]
        lines["engine"].append(
            {**item, "micro_steps_s": [[micro_s, last_s]] * 3, "micro_steps_cpu_s": [cpu] * 3}
        )
    assert len(partition.numels(base)) == known.tensors
    return lines


def test_fit_recovers_each_rate_and_fixed_cost():
    base = Setup(
        model=models.toy_spec(), cluster={"gpus_per_node": 2}, zero={**TOY_ZERO, "precision": "fp32"},
        batch={"micro_batch": 2, "grad_accum": 2, "seq_len": 64},
    )  # fmt: skip
    costs = {"z1": (3e-4, 1e-4), "z3": (2e-4, 4e-4), "z2+offload": (1e-3, 2e-4), "ddp": (5e-5, 1e-5)}
    found = cal.fit(worker_lines(base, costs), base)
    assert found.tflops == pytest.approx(0.04) and found.micro_fixed_s == pytest.approx(0.003)
    assert found.adam_s_per_param == pytest.approx(2e-8) and found.host_adam_s_per_param == pytest.approx(
        3e-8
    )
    assert (found.to_host_gbps, found.to_device_gbps) == pytest.approx((4.0, 8.0))
    assert found.collectives["all_gather"].latency_s == pytest.approx(4e-4)
    assert found.collectives["reduce_scatter"].bus_gbps == pytest.approx(0.5)
    for key, (step, micro) in costs.items():
        got = found.engines[key]
        assert (got.step_s_per_tensor, got.micro_step_s_per_tensor) == pytest.approx((step, micro)), key
    # the compute passes' median (0.9, 0.95 in rounds, 0.9 beside the engines), each op's median size
    assert found.busy == {
        "compute": 0.9, "adam": 0.8, "copy": 0.7, "comm": BUSY_COMM, "fixed": BUSY_ENGINE
    }  # fmt: skip
    text = cal.describe(found)
    assert "GFLOP/s per rank" in text and "z2+offload" in text and "engines z1 0.70, z3 0.45" in text
    # the micro batch's pass: the same in every round and (as a median) beside every engine
    one = 0.003 + perf.flops_per_token(base)[0] * 128 / 0.04e12
    assert cal.moved(found) == pytest.approx((one, one))
    assert f"took {one * 1e3:.1f}-{one * 1e3:.1f} ms over the launch (x 1.00)" in text
    slower = replace(found, measured={**found.measured, "engines": {"z1": {"bare_s": 1.5 * one}}})
    assert cal.moved(slower) == pytest.approx((one, 1.5 * one)) and "(x 1.50)" in cal.describe(slower)
    assert cal.moved(replace(found, measured={})) is None
    with pytest.raises(ValueError, match="^engines: 'z4' is not an engine"):
        cal.engine_setup(base, "z4")


def test_a_collectives_latency_is_set_by_its_small_calls():
    """gloo's all-gather between 2 ranks as a calibration on this machine measured it (4 KiB to 16 MiB).
    A plain least-squares line puts the latency at 712 us, above the 4 KiB call's whole 430 us (the large
    calls' milliseconds of noise and gloo's slower middle sizes set it), and 4 ranks triple it; relative
    residuals give 303 us. Exact data come back exactly."""
    import statistics

    sizes = [x * cal.bus_factor("all_gather", 2) for x in cal.CALIBRATION_SIZES]
    seconds = [430e-6, 291e-6, 2340e-6, 13834e-6]
    assert statistics.linear_regression(sizes, seconds).intercept == pytest.approx(711.6e-6, rel=1e-3)
    per_byte, latency = cal._hockney(sizes, seconds)
    assert latency == pytest.approx(303.5e-6, rel=1e-3) and latency < seconds[0]
    assert 1 / per_byte / 1e9 == pytest.approx(0.5488, rel=1e-3)  # the 16 MiB call alone: 0.606 GB/s
    assert cal._hockney(sizes, [5e-4 + x / 1e9 for x in sizes]) == pytest.approx((1e-9, 5e-4))


def test_estimate_and_plan_take_a_calibration(capsys, tmp_path):
    from tests.test_perf import calibration

    path = tmp_path / "c.json"
    calibration().save(path)
    toy = ["--model", "toy", "--gpus-per-node", "2", "--micro-batch", "2", "--precision", "fp32"]
    assert main(["estimate", *toy, "--calibration", str(path), "--json"]) == 0
    timed = json.loads(capsys.readouterr().out)["step_time"]
    assert timed["calibration"].startswith("calibrated on cpu") and "fixed" in timed["parts"]
    assert main(["plan", *toy, "--calibration", str(path), "--json"]) == 2
    assert "calibration: measured on cpu, none of the GPU types" in capsys.readouterr().err
    calibration(device="NVIDIA H100 80GB HBM3", accelerator="cuda", backend="nccl").save(path)
    assert main(["plan", *toy, "--top", "3", "--calibration", str(path), "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    assert planned["calibration"].startswith("calibrated on NVIDIA H100")
    assert {row["gpu"] for row in planned["setups"]} == {"H100-SXM-80GB"}
    assert main(["plan", *toy, "--top", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["calibration"] == "uncalibrated"


def test_a_sweep_the_calibration_did_not_measure_says_what_was_carried_over(capsys, tmp_path):
    """A bf16 sweep predicted from an fp32 calibration of the same model, and a shrunk Llama with the same
    label: the JSON names what was carried over per configuration, the text one line per kind under the
    table with the command that measures it (each configuration's own, labels alike or not)."""
    from kit.records import append_record
    from tests.test_perf import calibration, toy

    path = tmp_path / "c.json"
    calibration().save(path)
    small = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}
    llama = toy(stage=3, precision="bf16").replace(model=models.override(models.preset("llama-2-7b"), small))
    setups = [toy(stage=2), toy(stage=3, precision="bf16"), llama]
    assert setups[1].label == llama.label
    for row in records([(s, [0.5, 0.4, 0.4]) for s in setups], "cpu").records:
        append_record(str(tmp_path / "records.jsonl"), row)
    assert main(["calibrate", str(tmp_path), "--calibration", str(path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["configs"]
    bf16 = "precision bf16 (the calibration measured fp32)"
    measured = calibration().model
    model = f"model llama 2 x 64, {llama.model.params:,} parameters (the calibration measured {measured})"
    assert [r["carried_over"] for r in rows] == ["", bf16, f"{bf16}; {model}"]
    assert [r["config_id"] for r in rows] == [config_id(s) for s in setups]
    assert [(r["measured_min_s"], r["measured_max_s"]) for r in rows] == [(0.4, 0.5)] * 3
    assert [r["within_steps"] for r in rows] == [0.4 <= r["predicted_s"] <= 0.5 for r in rows]
    assert main(["calibrate", str(tmp_path), "--calibration", str(path)]) == 0
    text = capsys.readouterr().out
    header, *table = text.splitlines()[1:5]
    assert "steps_ms" in header.split() and all(" 400-500 " in line for line in table)
    within = sum(r["within_steps"] for r in rows)
    assert f"over 3 configurations; {within} predicted within their fastest to slowest step" in text
    notes = [line for line in text.splitlines() if "carried over" in line]
    shape = "--layers 2 --hidden 64 --heads 4 --ffn 128 --vocab 256"
    assert notes == [
        f"carried over, not measured: {bf16} ({llama.label}): measure it with zerokit calibrate --measure "
        "--precision bf16",
        f"carried over, not measured: {bf16}; {model} ({llama.label}): measure it with zerokit calibrate "
        f"--measure --model llama-2-7b {shape} --precision bf16",
    ]


def test_the_command_that_measures_what_was_carried_over_measures_it():
    """``measure_argv``: for a model, precision or engine the calibration did not measure, the
    ``zerokit calibrate --measure`` whose calibration has none of it left to carry over."""
    from kit.cli import build_parser
    from kit.cli.calibrate import measure_base
    from kit.run.calibrate import measure_argv
    from kit.steptime.calibration import model_text
    from tests.test_perf import calibration, toy

    cal = calibration()
    assert measure_argv(toy(stage=2), cal) == ["zerokit", "calibrate", "--measure"]
    deeper = toy(stage=1, precision="bf16").replace(model=models.override(models.toy_spec(), {"layers": 4}))
    argv = measure_argv(deeper, cal)
    assert argv[3:] == [
        "--layers", "4", "--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "512",
        "--precision", "bf16", "--engines", "z2,z3,z3+offload,z1",
    ]  # fmt: skip
    base, engines, _ = measure_base(build_parser().parse_args(argv[1:]))
    costs = dict.fromkeys(engines, cal.engines["z2"])
    measured = replace(cal, model=model_text(base.model), precision=base.zero.precision, engines=costs)
    assert measured.carried_over(deeper) == []
    assert measure_argv(toy(stage=2).replace(model=models.preset("llama-2-7b")), cal)[3:] == [
        "--model", "llama-2-7b"
    ]  # fmt: skip
    small = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}
    shrunk = toy(stage=2).replace(model=models.override(models.preset("llama-2-7b"), small))
    argv = measure_argv(shrunk, cal)  # the preset a shrunk Llama came from, and its shape
    assert argv[3:] == ["--model", "llama-2-7b", *[a for k, v in small.items() for a in (f"--{k}", str(v))]]
    base, _, _ = measure_base(build_parser().parse_args(argv[1:]))
    assert replace(cal, model=model_text(base.model)).carried_over(shrunk) == []


@pytest.mark.distributed
def test_a_calibration_predicts_configurations_it_never_ran(capsys, tmp_path):
    """One short measuring launch (and one timing the collectives on 4 ranks), then a sweep of
    configurations it never ran (sharing nothing with it but the machine): grad accum 3, micro batch 3,
    offload (the twice-deeper model, with the rest of the hold-out, is `make bench`'s: suite time)."""
    from kit.run.sweep import run_sweep

    out = tmp_path / "calibration.json"
    engines = "z0,z3,z2+offload"
    assert (
        main(["calibrate", "--measure", "--engines", engines, "--steps", "2", "--out", str(out), "--json"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    assert data["kind"] == "zerokit-calibration" and data["device"] == "cpu" and data["versions"]["deepspeed"]
    assert set(data["engines"]) == set(engines.split(",")) and data["tflops"] > 0
    assert all(c["bus_gbps"] > 0 and c["latency_s"] >= 0 for c in data["collectives"].values())
    # CPU ranks: by default the collectives are also timed alone on twice the ranks, one launch of 4
    four = data["collectives_at"]["4"]
    assert set(four) == set(data["collectives"]) and all(c["bus_gbps"] > 0 for c in four.values())
    assert {r["op"] for r in data["measured"]["collectives_at"]["4"]} == set(four)
    base = Setup(
        model=cal.DEFAULT_MODEL, cluster={"gpus_per_node": 2}, zero={**TOY_ZERO, "precision": "fp32"},
        batch={"micro_batch": 2, "seq_len": 64},
    )  # fmt: skip
    chosen = [cal.holdout(base)[i] for i in (0, 3, 4)]  # z0 accum 3, z3 micro 3, z2 offload
    run_sweep(chosen, sweep="holdout", runs_dir=tmp_path, steps=2, progress=False, instrument=False)
    assert main(["calibrate", str(tmp_path / "holdout"), "--calibration", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = report["configs"]
    assert [r["label"] for r in rows] == [s.label for s in chosen]
    for r in rows:
        assert r["error"] == pytest.approx(r["predicted_s"] / r["measured_s"] - 1)
    errors = sorted(abs(r["error"]) for r in rows)
    assert report["median_abs_error"] == pytest.approx(errors[1])
    assert report["calibration"].startswith("calibrated on cpu")
    shown = [(r["label"], round(r["measured_s"], 3), round(r["predicted_s"], 3)) for r in rows]
    # The accuracy goal (median |error| <= 0.10, none above 0.25) is a timing target: `make bench`
    # (tests/bench/bench_calibrate.py) measures it on medians over rounds. Here, in make test, beside
    # whatever else shares 2 cores, the same configuration's step time moves by up to a median 36 % between
    # runs minutes apart, so the test holds each prediction to a factor of 3 of its measurement: what no
    # load swing explains, a wrong unit, term or count does.
    assert all(1 / 3 <= r["predicted_s"] / r["measured_s"] <= 3 for r in rows), shown


def test_only_the_busy_share_of_a_term_shares_the_cores(tmp_path):
    """4 ranks of one thread on 2 cores: of a term's seconds the busy share b runs 2x slower, the rest (a
    rank waiting in gloo) leaves its core to another rank: x (1 - b + 2 b). b is the term's busy share over
    the compute passes' (0.8 here: the calibration's ranks had 1.6 of the 2 cores, the rest was others')."""
    from kit.estimate import partition
    from kit.steptime.calibration import Calibration
    from tests.test_perf import calibration, toy

    comm = {"all_gather": 0.4, "reduce_scatter": 0.6, "all_reduce": 0.7}
    busy = {"compute": 0.8, "adam": 0.5, "copy": 0.3, "comm": comm, "fixed": {"z3": 0.2}}
    old, new = calibration(), calibration(busy=busy)
    assert new.cores_had == pytest.approx(1.6) and old.cores_had == 2
    two, four = toy(stage=3), toy(stage=3).replace(cluster={"gpus_per_node": 4})
    assert (
        calibrated.step_time(two, calibration=new).step_s == calibrated.step_time(two, calibration=old).step_s
    )
    was, now = calibrated.step_time(four, calibration=old), calibrated.step_time(four, calibration=new)
    assert now.compute.seconds == pytest.approx(was.compute.seconds)  # all busy: 2x either way
    part = partition.partition_numel(four)
    assert now.optimizer.seconds == pytest.approx(part * 2e-8 * (1 + 0.5 / 0.8))
    assert now.fixed.seconds == pytest.approx(was.fixed.seconds / 2 * (1 + 0.2 / 0.8))
    # per collective: 1 + b / 0.8 (all at 2 without busy shares)
    ops = {"all_gather": 0.0, "reduce_scatter": 0.0, "all_reduce": 0.0}
    for part_ in collectives(four):
        gbps = old.collectives[TIMED_AS[part_.name]].bus_gbps
        ops[TIMED_AS[part_.name]] += part_.bytes / (gbps * 1e9)
    hops = 3 / 1  # 4 ranks' ring against the calibration's 2
    for op, calls, _ in collective_calls(four):
        ops[op] += calls * old.collectives[op].latency_s * hops
    assert ops["all_reduce"] > 0
    assert now.comm.seconds == pytest.approx(sum((1 + comm[op] / 0.8) * ops[op] for op in ops))
    assert was.comm.seconds == pytest.approx(2 * sum(ops.values()))
    assert "x 2 (shared cores: 1 - b + b x s, b = 1, s = 2 on 1.6 of 2 cores had)" in now.compute.formula
    assert "all_gather: (" in now.comm.formula and "b = 0.60 busy / compute's 0.80 = 0.75" in now.comm.formula
    assert "busy share not measured: all of it stretched" in was.fixed.formula
    one = toy(stage=3).replace(cluster={"gpus_per_node": 1})  # one rank: both threads on the 1.6 cores
    half = calibrated.step_time(one, calibration=new).compute.seconds
    assert half == pytest.approx(calibrated.step_time(two, calibration=new).compute.seconds / 2)
    offload = toy(stage=2, offload_optimizer="cpu").replace(cluster={"gpus_per_node": 4})
    p = partition.partition_numel(offload)
    down, up = 4 * p * 2, 4 * p  # gradients every micro-step at stage 2, parameters once
    expected = (down / 4e9 + up / 5e9) * (1 + 0.3 / 0.8) + p * 3e-8 * (1 + 0.5 / 0.8)
    assert calibrated.step_time(offload, calibration=new).offload.seconds == pytest.approx(expected)
    # a term busier than the compute passes is all busy: b at most 1
    assert new.stretch(4, "comm", "all_reduce")[0] == pytest.approx(1.875)
    assert calibration(busy={**busy, "comm": {"all_reduce": 0.9}}).stretch(4, "comm", "all_reduce")[0] == 2
    # an older file, without the key, loads and stretches every term in full, and says so
    data = old.to_dict()
    del data["busy"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    loaded = Calibration.load(tmp_path / "old.json")
    assert loaded.busy is None and calibrated.step_time(four, calibration=loaded).step_s == was.step_s
    assert "busy shares: not measured" in cal.describe(loaded)
    new.save(tmp_path / "new.json")
    assert Calibration.load(tmp_path / "new.json") == new
    with pytest.raises(
        ValueError, match=r"^busy\.comm\.all_gather: a busy share must be in \[0, 1\], got 1\.5"
    ):
        calibration(busy={**busy, "comm": {"all_gather": 1.5}})


def test_collectives_measured_on_more_ranks_predict_those_ranks(tmp_path):
    """A calibration on 2 ranks that also timed the collectives on 4 (``collectives_at``): a 4-rank setup
    takes those links as measured (no hops, no stretch: the 4 ranks shared the cores as it will), 8 ranks
    scale them by (8-1)/(4-1) hops and stretch from 4 ranks, 3 ranks still use the 2-rank links."""
    from kit.steptime.calibration import Calibration, Link
    from tests.test_perf import calibration, toy

    comm = {"all_gather": 0.4, "reduce_scatter": 0.6, "all_reduce": 0.7}
    busy = {"compute": 0.8, "adam": 0.5, "copy": 0.3, "comm": comm, "fixed": {"z3": 0.2}}
    four_links = {
        "all_reduce": Link(4e-3, 0.5),
        "all_gather": Link(3e-3, 0.2),
        "reduce_scatter": Link(9e-3, 0.1),
    }
    two, both = calibration(busy=busy), calibration(busy=busy, collectives_at={"4": four_links})
    assert both.links(4) == (4, four_links) and both.links(8) == (4, four_links)
    assert both.links(3) == (2, two.collectives) and both.link("all_gather", 5) == four_links["all_gather"]

    def expected(setup, links, hops, s):
        """Each collective's bytes and calls on ``links``, latency x ``hops``, x (1 - b + b s)."""
        ops = dict.fromkeys(links, 0.0)
        for part_ in collectives(setup):
            op = TIMED_AS[part_.name]
            ops[op] += part_.bytes / (links[op].bus_gbps * 1e9)
        for op, calls, _ in collective_calls(setup):
            ops[op] += calls * links[op].latency_s * hops
        assert ops["all_gather"] > 0 and ops["reduce_scatter"] > 0
        return sum((1 + comm[op] / 0.8 * (s - 1)) * seconds for op, seconds in ops.items())

    for n, links, hops, s in (
        (4, four_links, 1, 1.0),
        (8, four_links, 7 / 3, 2.0),
        (3, two.collectives, 2, 1.5),
    ):
        setup = toy(stage=3).replace(cluster={"gpus_per_node": n})
        predicted = calibrated.step_time(setup, calibration=both).comm.seconds
        assert predicted == pytest.approx(expected(setup, links, hops, s))
    four = calibrated.step_time(toy(stage=3).replace(cluster={"gpus_per_node": 4}), calibration=both)
    assert "x 3,000 us x 1)" in four.comm.formula and "x 1 (measured on 4 ranks)" in four.comm.formula
    assert (
        calibrated.step_time(toy(stage=3), calibration=both).step_s
        == calibrated.step_time(toy(stage=3), calibration=two).step_s
    )
    assert "collectives on 4 ranks: all_gather 3000 us + 0.20 GB/s" in cal.describe(both)
    both.save(tmp_path / "both.json")
    assert Calibration.load(tmp_path / "both.json") == both
    with pytest.raises(
        ValueError, match=r"^collectives_at: keys are the rank counts measured \(>= 2\), got 'x'$"
    ):
        calibration(collectives_at={"x": four_links})
    with pytest.raises(
        ValueError, match=r"^comm-ranks: each must be >= 2 ranks, other than nprocs \(2\), got 2$"
    ):
        cal.measure(toy(stage=3), 2, comm_ranks=(4, 2))


def test_calibrate_measure_rejects_bad_comm_ranks_before_launching(capsys):
    assert main(["calibrate", "--measure", "--comm-ranks", "4,x"]) == 2
    assert (
        capsys.readouterr()
        .err.strip()
        .endswith("comm-ranks: a comma-separated list of rank counts (or 0 for none), got 'x'")
    )
    assert main(["calibrate", "--measure", "--comm-ranks", "1"]) == 2
    assert "comm-ranks: each must be >= 2 ranks, other than nprocs (2), got 1" in capsys.readouterr().err


def test_a_failed_measuring_launch_says_what_its_ranks_said_last():
    """What a rank said, not torch's launcher's exit-code summary after it (a 4-rank launch's abort)."""
    output = "\n".join(
        [
            'ZEROKIT_CALIBRATION {"kind": "done", "value": true}',
            "terminate called without an active exception",
            "W1202 21:44:36.555000 3341 .venv/lib/python3.11/site-packages/torch/distributed/elastic/"
            "multiprocessing/api.py:1028] Sending process 3344 closing signal SIGTERM",
            "Traceback (most recent call last):",
            "  error_file: <N/A>",
        ]
    )
    assert cal.last_words(output, 2) == (
        'ZEROKIT_CALIBRATION {"kind": "done", "value": true} | terminate called without an active exception'
    )
    assert cal.last_words("a\nb") == "a | b" and cal.last_words("") == "no output"


def test_measure_times_the_collectives_on_the_ranks_the_cli_does_unless_told(monkeypatch, capsys, tmp_path):
    """``measure``'s default ``comm_ranks`` (None) is ``zerokit calibrate --measure``'s: on CPU ranks a
    second launch of the collectives alone on twice the ranks, none on GPUs; ``()`` (``--comm-ranks 0``)
    makes none."""
    import torch

    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert cal.default_comm_ranks(2) == ()  # a node has no ranks beyond its GPUs
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    base = Setup(
        model=models.toy_spec(), cluster={"gpus_per_node": 2}, zero={**TOY_ZERO, "precision": "fp32"},
        batch={"micro_batch": 2, "grad_accum": 2, "seq_len": 64},
    )  # fmt: skip
    lines = worker_lines(base, {})
    launched = []

    def launch(spec, nprocs, timeout_s):
        launched.append((nprocs, spec.collectives_only))
        return lines

    monkeypatch.setattr(cal, "_launch", launch)
    assert cal.default_comm_ranks(2) == (4,) and cal.default_comm_ranks(1) == ()
    found = cal.measure(base, 2, ("z1",))
    assert launched == [(2, False), (4, True)] and set(found.collectives_at) == {"4"}
    launched.clear()
    assert cal.measure(base, 2, ("z1",), comm_ranks=()).collectives_at == {}
    assert launched == [(2, False)]
    out = str(tmp_path / "calibration.json")
    for flags, expected in (([], [(2, False), (4, True)]), (["--comm-ranks", "0"], [(2, False)])):
        launched.clear()
        assert main(["calibrate", "--measure", "--engines", "z1", "--out", out, *flags]) == 0
        assert launched == expected, flags
        shown = "collectives on 4 ranks: " in capsys.readouterr().out
        assert shown == (len(expected) == 2), flags
