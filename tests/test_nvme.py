"""ZeRO-Infinity (NVMe offload): Setup rules, ds_config export / import through DeepSpeed's parser, the
estimate's swap files and pinned buffers, the CLI, the step-time model and planner, the paper's tables,
and a real 2-rank stage-3 run whose tensors and swap files equal the estimate to the byte.
"""

from __future__ import annotations

import json

import pytest

from kit import estimate
from kit.cli import main
from kit.ds_config import read_ds_config, to_ds_config, validate_ds_config
from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.estimate import infinity, nvme
from kit.lab.teach import offloading
from kit.models import resolve, toy_spec
from kit.planning import plan
from kit.ranks import nvme_files
from kit.run.sweep import LATER_FIELDS, async_io_problem, check, config_id, run_sweep
from kit.schema import Setup, ZeroSettings
from kit.steptime import perf
from kit.toys import TOY_ZERO

LLAMA = resolve("llama-2-7b")
NVME = {"stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme", "nvme_path": "/local_nvme"}
#: the toy GPT at hidden 512: its two MLP matrices (1,048,576 elements, 1 MiB per rank in bf16 over 2 ranks)
#: are swapped, its attention matrix (786,432: 768 KiB per rank) stays in RAM: both of DeepSpeed's paths
TOY = toy_spec(hidden=512, layers=1)


def llama(**zero) -> Setup:
    return Setup(model=LLAMA, zero={**NVME, "buffer_size": 200_000_000, **zero}, batch={"micro_batch": 1})


# --- Setup ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "zero, message",
    [
        ({"stage": 3, "offload_param": "nvme"}, "nvme_path: required"),
        (
            {"stage": 2, "offload_optimizer": "nvme", "nvme_path": "/x"},
            "offload_optimizer: 'nvme' needs ZeRO stage 3",
        ),
        ({"stage": 2, "offload_param": "nvme", "nvme_path": "/x"}, "offload_param: needs ZeRO stage 3"),
        ({**NVME, "aio": {"block_size": 0}}, "block_size"),
        ({**NVME, "buffer_count": 0}, "buffer_count"),
    ],
)
def test_bad_nvme_settings_name_the_field(zero, message):
    with pytest.raises(ValueError, match=message):
        ZeroSettings(**zero)


def test_defaults_are_deepspeeds():
    from deepspeed.runtime.swap_tensor.aio_config import AIO_DEFAULT_DICT
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    z, param, opt = (
        ZeroSettings(**NVME),
        DeepSpeedZeroOffloadParamConfig(),
        DeepSpeedZeroOffloadOptimizerConfig(),
    )
    assert (z.buffer_count, z.buffer_size, z.max_in_cpu) == (
        param.buffer_count,
        param.buffer_size,
        param.max_in_cpu,
    )
    assert z.optimizer_buffer_count == opt.buffer_count and z.pin_memory == param.pin_memory
    assert {**z.aio.model_dump(), "use_gds": False} == AIO_DEFAULT_DICT
    unset = LATER_FIELDS["zero"]
    assert {k: ZeroSettings().model_dump(mode="json")[k] for k in unset} == unset


def test_a_setup_without_nvme_hashes_as_before():
    # the config id of the toy stage-2 setup recorded before the NVMe fields existed
    old = Setup(model=toy_spec(), zero={"stage": 2}, batch={"micro_batch": 2})
    data = old.model_dump(mode="json")
    for section, fields in LATER_FIELDS.items():  # the NVMe fields among the zero section's
        for key in fields:
            del data[section][key]
    import hashlib

    assert config_id(old) == hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    assert config_id(old) != config_id(old.replace(zero={"nvme_path": "/x"}))


# --- ds_config ------------------------------------------------------------------------------------------


def test_export_is_valid_for_deepspeed_and_imports_back():
    s = llama(max_in_cpu=0, aio={"block_size": 2_097_152, "intra_op_parallelism": 2})
    config = to_ds_config(s, torch_adam=True)
    parsed = validate_ds_config(config, s.dp)  # DeepSpeed's own DeepSpeedConfig
    zc = parsed.zero_config
    assert zc.offload_param.device == "nvme" and str(zc.offload_param.nvme_path) == "/local_nvme"
    assert zc.offload_param.max_in_cpu == 0 and zc.offload_param.buffer_size == 200_000_000
    assert zc.offload_optimizer.device == "nvme" and zc.offload_optimizer.buffer_count == 4
    assert parsed.aio_config["block_size"] == 2_097_152 and parsed.aio_config["intra_op_parallelism"] == 2
    back, notes = read_ds_config(config, model=LLAMA, cluster=s.cluster)
    assert back.zero == s.zero and notes == []


def test_import_reads_nvme_below_stage_3_as_cpu_and_old_aio_names_with_a_note():
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "nvme", "nvme_path": "/n"}},
        "aio": {"thread_count": 2},
    }
    setup, notes = read_ds_config(config, model=LLAMA)
    assert setup.zero.offload_optimizer == "cpu"
    assert any("stage_1_and_2.py has no NVMe swapper" in n for n in notes)
    assert any("aio.thread_count: DeepSpeed 0.19 ignores it" in n for n in notes)


@pytest.mark.parametrize(
    "zero, aio, message",
    [
        (
            {
                "offload_param": {"device": "nvme", "nvme_path": "/a"},
                "offload_optimizer": {"device": "nvme", "nvme_path": "/b"},
            },
            {},
            "one NVMe folder",
        ),
        (
            {"offload_optimizer": {"device": "nvme", "nvme_path": "/a", "pipeline_read": True}},
            {},
            "pipeline_read",
        ),
        ({"offload_param": {"device": "nvme", "nvme_path": "/a"}}, {"use_gds": True}, "aio.use_gds"),
        ({"offload_param": {"device": "disk"}}, {}, "must be 'none', 'cpu' or 'nvme'"),
    ],
)
def test_import_refuses_what_is_not_modelled(zero, aio, message):
    config = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, **zero}, "aio": aio}
    with pytest.raises(ValueError, match=message):
        read_ds_config(config, model=LLAMA)


# --- estimate -------------------------------------------------------------------------------------------


def test_swap_files_and_buffers_follow_deepspeeds_rules():
    s = Setup(
        model=TOY, cluster={"gpus_per_node": 2}, zero={**NVME, "max_in_cpu": 0, "buffer_size": 1_000_000}
    )
    s = s.replace(zero={"reduce_bucket_size": 500_000})
    # two MLP matrices of 512 x 2048 swap (524,288 elements = 1 MiB per rank); 1 KiB-aligned already
    assert nvme.swapped_params(s) == [524_288, 524_288]
    states = estimate.rank_states(s, 0)
    assert states["nvme"]["parameters"] == 2 * 2 * 524_288
    part = sum(-(-t // 2) for t in nvme.partition.numels(s))
    assert states["nvme"]["optimizer_states"] == 3 * 4 * nvme.io_aligned(part, 4, s)
    # intra_op_parallelism 4 aligns every file to 4 KiB
    wide = s.replace(zero={"aio": {"intra_op_parallelism": 4}})
    assert nvme.io_aligned(1000, 2, wide) == 2048 and nvme.io_aligned(2048, 2, wide) == 2048
    # a block size above a partition keeps it in RAM
    big = s.replace(zero={"aio": {"block_size": 4 * 2**20}})
    assert nvme.swapped_params(big) == [] and estimate.rank_states(big, 0)["nvme"]["parameters"] == 0


def test_estimate_has_nvme_bytes_per_node_and_the_gpu_keeps_little():
    e = estimate.estimate(llama())
    per_rank = sum(estimate.rank_states(llama(), 0)["nvme"].values())
    assert e.nvme_bytes_per_node == 8 * per_rank > 0
    assert e.components["optimizer_states"] == 0 and e.components["gradients"] == 0
    cpu = estimate.estimate(llama(offload_optimizer="cpu", offload_param="cpu"))
    assert cpu.nvme_bytes_per_node == 0
    assert e.components["parameters"] == cpu.components["parameters"]  # persistent tensors only
    d = e.to_dict()
    assert d["nvme_bytes_per_node"] == e.nvme_bytes_per_node and "nvme_per_node" in d["formulas"]


def test_buffer_size_must_hold_the_largest_swapped_partition():
    # Llama-2-7B's embedding, 131,072,000 elements over 8 ranks = 16,384,000 per rank
    with pytest.raises(ValueError, match=r"buffer_size: must be >= 16,384,000 elements"):
        estimate.estimate(llama(buffer_size=10_000_000))


# --- CLI ------------------------------------------------------------------------------------------------


def test_cli_estimate_nvme(capsys):
    argv = ["estimate", "--model", "llama-2-7b", "--stage", "3", "--micro-batch", "1", "--offload-optimizer",
            "nvme", "--offload-param", "nvme", "--nvme-path", "/local_nvme", "--nvme-buffer-size", "2e8",
            "--nvme-max-in-cpu", "0", "--aio-block-size", "2097152", "--aio-thread-count", "2"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (
        data["setup"]["zero"]["max_in_cpu"] == 0 and data["setup"]["zero"]["aio"]["intra_op_parallelism"] == 2
    )
    setup = Setup.model_validate(data["setup"])
    assert (
        data["nvme_bytes_per_node"]
        == estimate.estimate(setup).nvme_bytes_per_node
        == 8 * sum(estimate.rank_states(setup, 0)["nvme"].values())
    )
    assert main(argv) == 0
    assert "NVMe per node" in capsys.readouterr().out


def test_cli_nvme_without_path_exits_2_with_one_line(capsys):
    code = main(["estimate", "--model", "llama-2-7b", "--stage", "3", "--offload-param", "nvme"])
    err = capsys.readouterr().err
    assert code == 2 and "nvme_path: required" in err and len(err.strip().splitlines()) == 1


# --- step time and plan ---------------------------------------------------------------------------------


def test_nvme_traffic_and_step_time():
    s = llama()
    traffic = perf.nvme_traffic(s)
    sp = sum(nvme.swapped_params(s))
    part = nvme.partition.partition_numel(s)
    assert traffic["read"].bytes == 2 * 2 * sp + 4 * 4 * part
    assert traffic["write"].bytes == 2 * sp + 4 * 4 * part
    cpu = perf.step_time(llama(offload_optimizer="cpu", offload_param="cpu"))
    nv = perf.step_time(s)
    hw = perf.hardware(s)
    extra = 8 * traffic["read"].bytes / (hw.nvme_read_gbps * 1e9) + 8 * traffic["write"].bytes / (
        hw.nvme_write_gbps * 1e9
    )
    assert nv.step_s == pytest.approx(cpu.step_s + extra)
    assert (hw.nvme_read_gbps, hw.nvme_write_gbps) == (56.0, 30.4)  # data/nvme.csv: 8 x PM1733


def test_plan_lists_nvme_setups_with_their_slowdown():
    s = Setup(model=LLAMA, batch={"micro_batch": 1, "seq_len": 4096})
    p = plan.search(s, train_batch=64, gpus=["A100-SXM-40GB"], max_nodes=1, checkpointing=(True,))
    assert {"nvme"} <= set(p.table.offload_optimizer) and (p.table.nvme_gib_per_node > 0).any()
    slow = plan.nvme_slowdown(p)
    assert len(slow) and (slow.slowdown > 1).all()
    row = slow.index[0]
    i = p.table.index[(p.table.label == slow.loc[row, "label"])][0]
    assert p.setup(i).zero.nvme_path == EXAMPLE_NVME_PATH


# --- the ZeRO-Infinity paper ------------------------------------------------------------------------------


def test_infinity_table_reproduces_the_papers_figure_2a():
    t = offloading.infinity_table().round(2)
    assert list(t["params (T)"]) == [0.10, 0.50, 1.01, 10.05, 101.47]
    assert list(t["model states (TiB)"]) == [1.83, 9.16, 18.31, 182.81, 1845.70]
    assert list(t["model-state working mem per GPU (GiB)"])[1:] == [6.25, 9.77, 64.00, 400.00]
    assert list(t["act. checkpoints (TiB)"])[:4] == [0.05, 0.12, 0.20, 0.76]
    assert t.loc["0.1T", "act. working mem per GPU (GiB)"] == pytest.approx(1.63, abs=0.01)
    assert t.loc["10T", "act. working mem per GPU (GiB)"] == 8.00


def test_infinity_bandwidth_matches_the_papers_claims():
    # section 4: 70 GB/s gives parameters and gradients > 50% efficiency at batch 1 (seq 1024); optimizer
    # states need ~1.5 TB/s for 90% at batch 2; 2 GB/s keeps activation checkpoints > 50% at hidden 2K
    pg = infinity.intensity("params_grads", batch=1)
    assert infinity.efficiency(pg, 70) > 0.5 > infinity.efficiency(pg, 60)
    assert infinity.bandwidth_for(0.9, infinity.intensity("optimizer_states", batch=2)) < 1500
    assert infinity.efficiency(infinity.intensity("activation_checkpoints", hidden=2048), 2) > 0.5
    t = offloading.infinity_bandwidth()
    assert set(t.tier) == {"params_grads", "optimizer_states", "activation_checkpoints"}


# --- swap files on disk -----------------------------------------------------------------------------------


def test_swap_file_bytes_sorts_deepspeeds_layout(tmp_path):
    files = {
        "zero_stage_3/bfloat16params/rank0/3_param.tensor.swp": 2048,
        "zero_stage_3/optimizer/rank0/7.tensor.swp": 4096,
        "zero_stage_3/optimizer/rank0/7_gradient_0_1024.tensor.swp": 1024,
        "zero_stage_3/optimizer/rank1/7.tensor.swp": 999,
    }
    for name, size in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"\0" * size)
    assert nvme_files.swap_file_bytes(tmp_path, 0) == {
        "parameters": 2048,
        "gradients": 1024,
        "optimizer_states": 4096,
    }
    nvme_files.clear(tmp_path, 0)
    assert nvme_files.swap_file_bytes(tmp_path, 0) == {"parameters": 0, "gradients": 0, "optimizer_states": 0}
    assert nvme_files.swap_file_bytes(tmp_path, 1)["optimizer_states"] == 999


def test_async_io_is_checked_before_launch(monkeypatch):
    from deepspeed.ops.op_builder import AsyncIOBuilder

    monkeypatch.setattr(AsyncIOBuilder, "is_compatible", lambda self, verbose=False: False)
    s = Setup(
        model=toy_spec(),
        cluster={"gpus_per_node": 2},
        zero={**NVME, **TOY_ZERO},
        batch={"micro_batch": 2},
    )
    with pytest.raises(
        ValueError, match=r"offload_param: 'nvme' needs DeepSpeed's async_io op.*apt-get install libaio-dev"
    ):
        check(s)


# --- a real run: 2 CPU ranks, stage 3, swap files under tmp_path ------------------------------------------

#: the first NVMe launch on a machine JIT-builds DeepSpeed's async_io op (about 320 CPU-seconds, 3-10 minutes
#: on 2 busy cores); make test builds it before the tests (tests/build_async_io.py), pytest alone here
ASYNC_IO_BUILD_S = 900.0
RUN = {**TOY_ZERO, "stage": 3, "buffer_size": 1_000_000}
RUNS = {
    "optimizer + params on NVMe, nothing kept in RAM": {
        "offload_optimizer": "nvme",
        "offload_param": "nvme",
        "max_in_cpu": 0,
    },
    "optimizer + params on NVMe, max_in_cpu keeps the params in RAM": {
        "offload_optimizer": "nvme",
        "offload_param": "nvme",
    },
    "optimizer on NVMe": {"offload_optimizer": "nvme"},
}


@pytest.fixture(scope="module")
def nvme_sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nvme")
    setups = [
        Setup(
            model=TOY,
            cluster={"gpus_per_node": 2},
            zero={**RUN, **z, "nvme_path": str(folder / "swap")},
            batch={"micro_batch": 2},
        )
        for z in RUNS.values()
    ]
    results = run_sweep(
        setups,
        sweep="nvme",
        runs_dir=folder / "runs",
        nprocs=2,
        steps=2,
        warmup=1,
        timeout_s=300.0,
        startup_s=ASYNC_IO_BUILD_S,
        progress=False,
    )
    return setups, results


@pytest.mark.distributed
@pytest.mark.timeout(ASYNC_IO_BUILD_S + 600)
@pytest.mark.parametrize("name", list(RUNS))
def test_nvme_run_measures_what_the_estimate_says(nvme_sweep, name):
    setups, results = nvme_sweep
    setup = setups[list(RUNS).index(name)]
    cid = config_id(setup)
    records = [r for r in results.records if r["config_id"] == cid]
    assert records and all(r["status"] == "ok" for r in records), [r.get("error") for r in records][:1]
    for rank in (0, 1):
        last = max((r for r in records if r["rank"] == rank), key=lambda r: r["step"])
        predicted = estimate.rank_states(setup, rank)
        measured = {k: v for k, v in last["measured"].items() if k != "activations"}
        assert measured == predicted["device"]
        assert last["measured_host"] == predicted["host"]
        assert (
            last["measured_nvme"]
            == last["estimate_nvme"]
            == {k: v for k, v in predicted["nvme"].items() if k != "buffers"}
        )
        assert sum(last["measured_nvme"].values()) > 0


def test_memory_panel_offers_nvme_and_shows_the_bytes_per_node():
    from kit.lab.memory_panel import memory_panel

    p = memory_panel()
    p.stage.value = 3
    p.offload_optimizer.value, p.offload_param.value = "nvme", "nvme"
    assert p.error is None and p.setup.zero.nvme_path == "/local_nvme" and not p.nvme_path.disabled
    assert p.estimate.nvme_bytes_per_node == estimate.estimate(p.setup).nvme_bytes_per_node > 0
    assert "NVMe per node" in p.summary.value and "NVMe per node" in p.formulas.value
    p.stage.value = 2  # no NVMe swapper below stage 3: back to CPU, saying why
    assert p.offload_optimizer.value == "cpu" and "needs ZeRO stage 3" in p.offload_reason.value
    assert p.nvme_path.disabled


@pytest.mark.distributed
@pytest.mark.timeout(ASYNC_IO_BUILD_S + 300)
def test_calibrate_measures_the_drive_through_async_io(nvme_sweep, tmp_path):
    # after the run (async_io is built): DeepSpeed's own aio handle writes and reads a pinned buffer. In a
    # process of its own: DeepSpeed's libaio check compiles a test program and needs real stdout/stderr fds
    import subprocess
    import sys

    argv = [sys.executable, "-m", "kit", "calibrate", "--nvme", str(tmp_path), "--nvme-mib", "16", "--json"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=ASYNC_IO_BUILD_S)
    assert proc.returncode == 0, proc.stderr[-2000:]
    found = json.loads(proc.stdout)
    assert found["bytes"] == 16 * 2**20 and found["read_gbps"] > 0 and found["write_gbps"] > 0
    assert found["planner_default"]["read_gbps"] == 56.0
    assert list(tmp_path.iterdir()) == []  # the test file is removed


def test_a_lock_left_by_a_killed_build_is_named_before_launch(monkeypatch, tmp_path):
    import os

    import torch.utils.cpp_extension as ext

    lock = tmp_path / "lock"
    lock.touch()
    os.utime(lock, (0, 0))
    monkeypatch.setattr(ext, "_get_build_directory", lambda name, verbose: str(tmp_path))
    assert "left by a build that was stopped" in async_io_problem("offload_optimizer")
    lock.unlink()
    assert async_io_problem() is None


def test_cli_plan_lists_nvme_slowdown(capsys):
    argv = ["plan", "--model", "llama-2-7b", "--seq-len", "4096", "--train-batch", "64", "--gpus",
            "H100-SXM-80GB", "--max-nodes", "1", "--price", "4.5"]  # fmt: skip
    assert main([*argv, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["nvme_slowdown"]
    assert {r["offload_param"] for r in rows} == {"none", "nvme"} and all(r["slowdown"] >= 1 for r in rows)
    assert main([*argv, "--all"]) == 0  # every table
    assert "NVMe offload (ZeRO-Infinity) beside CPU offload" in capsys.readouterr().out
