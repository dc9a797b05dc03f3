"""Notebook panels driven like a user would: set ``.value``, ``.click()``, assert the Setup and estimate."""

import json

import pytest

from kit import models
from kit.estimate import estimate
from kit.lab import teach
from kit.lab.widgets import ComparisonPanel, MemoryPanel, comparison_panel, memory_panel
from kit.paths import MODELS
from kit.schema import Setup


@pytest.fixture
def llama():
    return Setup(model=models.preset("llama-2-7b"), zero={"stage": 2}, batch={"micro_batch": 1})


@pytest.fixture
def panel(llama) -> MemoryPanel:
    return memory_panel(llama)


def test_memory_panel_starts_from_the_setup(panel, llama):
    assert panel.error is None
    assert panel.setup == llama
    assert panel.estimate.components == estimate(llama).components
    assert panel.model_source.value == "preset" and panel.preset.value == "llama-2-7b"
    assert panel.train_batch.value == 8 and panel.train_batch.disabled  # derived: 1 x 8 GPUs x 1


def test_stage_change_reestimates(panel, llama):
    panel.stage.value = 3
    expected = estimate(llama.replace(zero={"stage": 3}))
    assert panel.setup.zero.stage == 3
    assert panel.estimate.components == expected.components
    assert panel.estimate.per_gpu_bytes < estimate(llama).per_gpu_bytes


def test_parameter_offload_only_at_stage_3(panel, llama):
    assert panel.offload_param.disabled
    assert "offload_param: needs ZeRO stage 3" in panel.offload_reason.value
    panel.stage.value = 3
    assert not panel.offload_param.disabled and panel.offload_reason.value == ""
    panel.offload_optimizer.value = "cpu"
    panel.offload_param.value = "cpu"
    assert panel.setup.label == "z3 opt-off param-off bf16 mb1"
    offloaded = estimate(llama.replace(zero={"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}))
    assert panel.estimate.components == offloaded.components and panel.estimate.host == offloaded.host
    # what stays on the GPU: only the tensors under the persistence threshold (norms, biases)
    assert panel.estimate.components["parameters"] < 1e6 < panel.estimate.host["parameters"]
    panel.stage.value = 2  # leaving stage 3 switches parameter offload off, with the reason shown
    assert panel.offload_param.value == "none" and panel.offload_param.disabled
    assert panel.error is None and panel.setup.label == "z2 opt-off bf16 mb1"


def test_stage_0_disables_optimizer_offload(panel):
    panel.offload_optimizer.value = "cpu"
    panel.stage.value = 0
    assert panel.offload_optimizer.value == "none" and panel.offload_optimizer.disabled
    assert "offload_optimizer: needs ZeRO stage 1, 2 or 3" in panel.offload_reason.value
    assert panel.error is None and panel.setup.zero.offload_optimizer == "none"


def test_impossible_global_batch_shows_one_line(panel):
    panel.batch_by.value = "train_batch"
    assert not panel.train_batch.disabled and panel.grad_accum.disabled
    panel.train_batch.value = 100
    assert panel.setup is None and panel.estimate is None
    assert panel.error.startswith("train_batch_size is not equal to micro_batch_per_gpu")
    assert "100 != 1 * 12 * 8" in panel.error and "\n" not in panel.error
    assert "train_batch_size is not equal" in panel.message.value
    panel.train_batch.value = 64
    assert panel.error is None and panel.message.value == ""
    assert (panel.setup.batch.micro_batch, panel.setup.batch.grad_accum) == (1, 8)
    assert panel.grad_accum.value == 8


def test_model_sources(panel):
    panel.model_source.value = "count"
    panel.params.value = 7e9
    assert panel.setup.model.params == 7_000_000_000
    assert panel.setup.model == models.from_count(7_000_000_000)
    panel.model_source.value = "config"
    assert panel.error == "config.json: give the path to a Hugging Face config.json or a model file"
    panel.config_path.value = "/nonexistent/config.json"
    assert panel.error == "model: no such config file: /nonexistent/config.json"
    panel.config_path.value = str(MODELS / "gpt2.json")
    assert panel.error == "seq_len: must be <= the model's max_seq_len (1024), got 4096"
    panel.seq_len.value = 1024
    assert panel.setup.model.params == models.preset("gpt2").params == 124_439_808
    panel.model_source.value = "preset"
    panel.preset.value = "gpt2"
    assert panel.setup.model == models.preset("gpt2")


def test_a_given_model_stays_selectable():
    toy = Setup(model=models.from_count(1_000_000, 10_000, name="mine"), batch={"micro_batch": 1})
    panel = MemoryPanel(toy)
    assert panel.model_source.value == "given" and panel.setup.model == toy.model
    assert panel.preset.disabled and panel.params.disabled


def test_bucket_slider_moves_stage_3_buffers(panel, llama):
    panel.stage.value = 3
    before = panel.estimate.components["buffers"]
    panel.reduce_bucket.value = 1e6
    expected = estimate(llama.replace(zero={"stage": 3, "reduce_bucket_size": 1_000_000}))
    assert panel.setup.zero.reduce_bucket_size == 1_000_000
    assert panel.estimate.components["buffers"] == expected.components["buffers"] < before


def test_verdict_for_plain_data_parallelism(panel):
    panel.stage.value = 0
    assert not panel.estimate.fits["H100-SXM-80GB"]
    assert "does NOT fit" in panel.summary.value
    panel.stage.value = 3
    assert panel.estimate.fits["H100-SXM-80GB"] and "<b>fits</b>" in panel.summary.value


def test_write_config_button(panel, tmp_path):
    panel.stage.value = 3
    panel.config_file.value = str(tmp_path / "ds.json")
    panel.write_button.click()
    config = json.loads((tmp_path / "ds.json").read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["train_batch_size"] == 8 and config["train_micro_batch_size_per_gpu"] == 1
    assert panel.message.value == f"wrote {tmp_path / 'ds.json'}"


def test_write_config_refuses_an_invalid_setup(panel, tmp_path):
    panel.batch_by.value = "train_batch"
    panel.train_batch.value = 100
    with pytest.raises(ValueError, match="^train_batch_size is not equal"):
        panel.write_config(tmp_path / "ds.json")
    panel.config_file.value = str(tmp_path / "ds.json")
    panel.write_button.click()
    assert not (tmp_path / "ds.json").exists()
    assert "train_batch_size is not equal" in panel.message.value


def test_launch_command_button(panel):
    panel.command_button.click()
    assert panel.command.value == "deepspeed --num_gpus 8 train.py --deepspeed_config ds_config.json"
    panel.nodes.value = 2
    assert panel.setup.batch.train_batch == 16
    assert panel.launch_command("pretrain.py") == (
        'deepspeed --hostfile hostfile --master_addr "$MASTER_ADDR" --master_port 29500 '
        "pretrain.py --deepspeed_config ds_config.json"
    )


def test_comparison_panel_builds_setups():
    panel = comparison_panel(stages=(0, 3), nprocs=2)
    assert [s.label for s in panel.setups] == ["z0 bf16 mb2", "z3 bf16 mb2"]
    panel.offload_optimizer.value = True
    panel.offload_param.value = True
    panel.micro_batches.value = (1, 4)
    assert [s.label for s in panel.setups] == [
        "z0 bf16 mb1",
        "z0 bf16 mb4",
        "z3 bf16 mb1",
        "z3 opt-off bf16 mb1",
        "z3 opt-off param-off bf16 mb1",
        "z3 bf16 mb4",
        "z3 opt-off bf16 mb4",
        "z3 opt-off param-off bf16 mb4",
    ]
    assert {s.cluster.world_size for s in panel.setups} == {2}
    assert [e.components for e in panel.estimates] == [estimate(s).components for s in panel.setups]
    panel.layers.value = 3
    panel.nprocs.value = 4
    assert {(s.model.layers, s.dp, s.batch.train_batch) for s in panel.setups[:1]} == {(3, 4, 4)}


def test_comparison_panel_invalid_model():
    panel = ComparisonPanel(stages=(2,))
    panel.heads.value = 3
    assert panel.error == "model.heads: must divide hidden (64), got 3"
    assert panel.setups == []
    with pytest.raises(ValueError, match=r"^model.heads: must divide hidden"):
        panel.run()
    panel.heads.value = 4
    panel.stages.value = ()
    assert panel.error == "stages: choose at least one of 0, 1, 2, 3"


@pytest.mark.distributed
def test_comparison_panel_run_button(tmp_path):
    panel = comparison_panel(stages=(0, 2), nprocs=2, steps=1, runs_dir=tmp_path, sweep="panel")
    panel.run_button.click()
    assert panel.message.value.startswith("2 configurations")  # no error replaced it
    summary = panel.results.summary()
    assert summary["label"].tolist() == ["z0 bf16 mb2", "z2 bf16 mb2"]
    assert summary["status"].tolist() == ["ok", "ok"]
    check = teach.states_check(panel.results)
    assert len(check) == 2 * 2 * 8  # configurations x ranks x (4 device + 4 host components)
    assert (check["difference"] == 0).all()
    assert (tmp_path / "panel" / "records.jsonl").exists()


def test_plan_panel_shows_what_the_planner_says():
    from kit.estimate import plan
    from kit.lab.widgets import plan_panel

    start = Setup(
        model=models.preset("llama-2-7b"), zero={"stage": 0}, batch={"micro_batch": 8, "seq_len": 4096}
    )
    p = plan_panel(start, train_batch=256, max_nodes=4)
    assert (
        p.error is None
        and f"{len(p.plan.fitting()):,} of {len(p.plan.table):,} setups fit" in p.verdict.value
    )
    again = plan.search(start, train_batch=256, max_nodes=4, tokens=p.tokens.value * 1e9)
    assert p.plan.table.cost_usd.tolist() == again.table.cost_usd.tolist()
    assert not p.fixes.empty and p.fixes.fits.all()  # z0 with micro batch 8 does not fit an H100
    fast = p.plan.fitting().hours.min()
    p.efficiency.value = 0.8  # twice the default: compute takes half as long
    assert p.plan.assumptions.efficiency == 0.8 and p.plan.fitting().hours.min() < fast
    p.gpus.value = ("H100-SXM-80GB",)
    assert set(p.plan.table.gpu) == {"H100-SXM-80GB"}
    p.max_hours.value = 0.001
    assert "none of" in p.verdict.value and "in time" in p.verdict.value
