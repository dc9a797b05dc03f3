"""Notebook panels driven like a user would: set ``.value``, ``.click()``, assert the Setup and estimate."""

import argparse
import contextlib
import html
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import ipywidgets as w
import pytest

from kit import checkpointing, models
from kit.components import MEASURED
from kit.estimate import estimate
from kit.gpus import gpu
from kit.lab import ui
from kit.lab.comparison_panel import WARMUP, ComparisonPanel, comparison_panel, peak_plot, peak_records
from kit.lab.memory_panel import MemoryPanel, memory_panel
from kit.lab.ui import DESCRIPTION_WIDTH
from kit.paths import MODELS
from kit.records import append_record, load_records
from kit.run.sweep import config_id, on_ranks
from kit.schema import ModelSpec, Setup
from kit.settings import SETTINGS
from kit.units import GIB


def TWO_RANK_SETUPS(_root: Path) -> list[Setup]:  # noqa: N802 (what tests/conftest.py reads)
    """What test_comparison_panel_run_button's panel runs: its Run button replays them from the session's
    shared 2-rank sweep (tests/conftest.py)."""
    return list(comparison_panel(stages=(0, 2), nprocs=2).setups)


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


def test_deepspeeds_checkpointing_options_apply_with_its_checkpoint(panel, llama):
    """The "CPU checkpoints" and "partition ckpts" boxes are on offer only where DeepSpeed's checkpoint
    runs (checkpointing on, policy full), and turn off with it: the panel never holds a refused setting."""
    options = (panel.cpu_checkpointing, panel.partition_activations)
    assert all(c.disabled for c in options)
    panel.checkpointing.label = "every block"
    assert not any(c.disabled for c in options)
    panel.cpu_checkpointing.value = panel.partition_activations.value = True
    assert panel.error is None and panel.setup.label.endswith("ckpt-part-cpu")
    offloaded = llama.replace(
        zero={"activation_checkpointing": True, **dict.fromkeys(checkpointing.DEEPSPEED_FIELDS, True)}
    )
    assert panel.estimate.components == estimate(offloaded).components
    for label, ends in (("selective (op policy)", "ckpt-op"), ("off", "mb1")):
        panel.checkpointing.label = label
        assert all(c.disabled and not c.value for c in options)
        assert panel.error is None and panel.setup.label.endswith(ends)


def test_impossible_global_batch_shows_one_line(panel):
    panel.batch_by.value = "train_batch"
    assert not panel.train_batch.disabled and panel.grad_accum.disabled
    panel.train_batch.value = 100
    assert panel.setup is None and panel.estimate is None
    assert panel.error.startswith("train_batch_size is not equal to micro_batch_per_gpu")
    assert "100 != 1 * 12 * 8" in panel.error and "\n" not in panel.error
    assert "train_batch_size is not equal" in panel.verdict.value
    panel.train_batch.value = 64
    assert panel.error is None and "fits" in panel.verdict.value
    assert (panel.setup.batch.micro_batch, panel.setup.batch.grad_accum) == (1, 8)
    assert panel.grad_accum.value == 8


def test_a_fixed_global_batch_is_kept_by_every_suggestion(panel):
    # global 8 on 8 GPUs with micro 3: DeepSpeed would floor grad accum to 0; the panel says the minimum
    panel.batch_by.value = "train_batch"
    panel.micro_batch.value = 3
    assert panel.error.startswith("train_batch_size is not equal")
    assert "* 0 *" not in panel.error and "8 < 3 * 1 * 8 = 24" in panel.error
    suggestions = panel.error.split("valid (micro x dp x grad_accum = train): ")[1].split("; ")
    assert suggestions == ["1 x 8 x 1 = 8"]  # the global batch the user fixed, never 24 or 48
    panel.nodes.value = 2  # 16 GPUs: 8 does not divide; the nearest global batches that work
    assert "8 < 3 * 1 * 16 = 48" in panel.error and "3 x 16 x 1 = 48" in panel.error


def test_the_count_boxes_follow_the_model_in_use(panel):
    assert panel.params.value == "6,738,415,616" and panel.params.disabled
    panel.preset.value = "gpt2"
    assert panel.params.value == f"{models.preset('gpt2').params:,}" == "124,439,808"
    assert panel.largest_layer.value == f"{models.preset('gpt2').largest_layer_params:,}"
    panel.model_source.value = "count"
    panel.params.value = "7B"
    panel.largest_layer.value = ""
    assert panel.setup.model == models.from_count(7_000_000_000)
    assert panel.params.value == "7,000,000,000"
    panel.params.value = "lots"
    assert panel.error == "parameters: not a count: 'lots' (try 7e9, 7B or 350M)"


def test_model_sources(panel):
    panel.model_source.value = "count"
    panel.params.value = "7e9"
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


def test_verdict_says_whether_it_fits_and_by_how_much(panel):
    panel.stage.value = 0
    est, capacity = panel.estimate, gpu("H100-SXM-80GB").memory_gib * GIB
    assert not est.fits["H100-SXM-80GB"]
    over = (est.per_gpu_bytes - capacity) / GIB
    assert f"does not fit: {est.per_gpu_bytes / GIB:,.2f} GiB per GPU of the H100-SXM-80GB's 79.65 GiB" in (
        panel.verdict.value
    )
    assert f"{over:,.2f} GiB over" in panel.verdict.value
    panel.stage.value = 3
    est = panel.estimate
    assert est.fits["H100-SXM-80GB"] and "fits: " in panel.verdict.value
    assert f"{(capacity - est.per_gpu_bytes) / GIB:,.2f} GiB free" in panel.verdict.value
    assert f"<b class='zk-per-gpu'>{est.per_gpu_bytes / GIB:,.2f} GiB</b>" in panel.summary.value
    # the caching allocator's replay beside it, in the verdict; expandable segments would hold 13 % less
    # here (46.34 -> 40.48 GiB), so the panel says so
    plain, grown = est.reserved_bytes, est.reserved_expandable_bytes
    assert est.per_gpu_bytes == plain + est.peak_overhead.bytes
    assert f"{plain / GIB:,.2f} GiB (replayed: in the verdict)" in panel.summary.value
    assert plain - grown > 0.05 * plain
    assert f"{grown / GIB:,.2f} GiB ({(plain - grown) / GIB:,.2f} less)" in panel.summary.value
    # the run sets them (More settings): the verdict is theirs, the plain allocator's beside it
    panel.controls["expandable_segments"].value = True
    est = panel.estimate
    assert panel.setup.zero.expandable_segments and est.per_gpu_bytes == grown + est.peak_overhead.bytes
    assert (
        f"{grown / GIB:,.2f} GiB (replayed with expandable segments: in the verdict)" in panel.summary.value
    )
    assert f"{plain / GIB:,.2f} GiB ({(plain - grown) / GIB:,.2f} more)" in panel.summary.value
    assert f"<b class='zk-per-gpu'>{est.per_gpu_bytes / GIB:,.2f} GiB</b>" in panel.summary.value


def test_a_gpu_given_by_its_figures_replaces_the_lists_choice(panel):
    from kit import gpus

    try:
        panel.stage.value = 3
        panel.own_gpu.value = "X9:memory_gib=24,memory_gbps=1000,bf16_tflops=200"
        assert panel.error is None and panel.setup.cluster.gpu == "X9"
        est = panel.estimate
        assert "GiB per GPU of the X9's 24.00 GiB" in panel.verdict.value and not est.fits["X9"]
        panel.own_gpu.value = "X9:memory_gib=24"  # one line naming the box and what is missing
        assert panel.setup is None and panel.error == "your GPU: X9 needs memory_gbps, bf16_tflops > 0"
        assert "your GPU: X9 needs" in panel.verdict.value
        panel.own_gpu.value = ""  # back to the list's
        assert panel.error is None and panel.setup.cluster.gpu == "H100-SXM-80GB"
    finally:
        gpus.DEFINED_GPUS.clear()


def test_a_gpu_without_the_precision_is_neither_offered_nor_said_to_fit(panel):
    panel.stage.value = 3  # 7B at ZeRO-3 on 8 GPUs, checkpointed: the bytes fit a V100-32GB, bf16 does not
    panel.checkpointing.label = "every block"
    assert panel.precision.value == "bf16"
    assert "V100" not in panel.summary.value.split("also fits on:")[1]
    panel.gpu.value = "V100-SXM2-32GB"
    assert panel.estimate.per_gpu_bytes < gpu("V100-SXM2-32GB").memory_bytes
    verdict = ui.strip_tags(panel.verdict.value)
    assert "&#10008; does not fit: the V100-SXM2-32GB has no bf16; choose another GPU or precision" in verdict
    panel.precision.value = "fp16"
    assert "&#10004; fits: " in panel.verdict.value and "no fp16" not in panel.verdict.value
    assert "V100-SXM2-32GB" not in panel.summary.value.split("also fits on:")[1]  # it is the GPU chosen
    panel.gpu.value = "H100-SXM-80GB"
    assert "V100-SXM2-32GB" in panel.summary.value.split("also fits on:")[1]


def test_the_charts_name_the_setting_they_show(panel):
    from kit.lab.memory_panel import chart_class

    before = chart_class(panel.estimate)
    assert panel.plot._dom_classes == ("zk-chart", before)
    panel.micro_batch.value = 2
    est = panel.estimate
    assert panel.plot._dom_classes == ("zk-chart", chart_class(est)) and chart_class(est) != before
    assert panel.timeline_plot._dom_classes == ("zk-peak-chart", chart_class(est))  # the peak chart too
    assert chart_class(est) == chart_class(estimate(est.setup))  # what a test computes for the setting


def test_the_verdict_is_the_estimates_own_when_cpu_ram_is_short(llama):
    offloaded = {"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}
    panel = memory_panel(llama.replace(zero=offloaded, cluster={"cpu_ram_per_node_bytes": 2**30}))
    est = panel.estimate
    assert not est.fits["H100-SXM-80GB"]  # the GPU has room, the node's 1 GiB of RAM does not
    capacity = gpu("H100-SXM-80GB").memory_gib * GIB
    over = (est.cpu_bytes_per_node - 2**30) / GIB
    verdict = panel.verdict.value
    assert (
        "&#10008; does not fit: " in verdict
        and f"{(capacity - est.per_gpu_bytes) / GIB:,.2f} GiB free" in verdict
    )
    assert (
        f"CPU RAM per node {est.cpu_bytes_per_node / GIB:,.2f} GiB of 1.00 GiB, {over:,.2f} GiB over"
        in verdict
    )


def test_import_kit_offers_the_data_flow_and_the_four_panels_and_stays_light():
    code = """
import json, sys, kit
heavy = [m for m in ("pandas", "ipywidgets", "matplotlib", "torch", "deepspeed") if m in sys.modules]
print(json.dumps({"heavy": heavy, "names": kit.__all__}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    face = json.loads(done.stdout)
    assert face["heavy"] == []  # only pydantic until a name is used
    import kit
    from kit.ds_config import to_ds_config
    from kit.lab.monitor_panel import monitor_panel
    from kit.lab.plan_panel import plan_panel
    from kit.planning.plan import search
    from kit.review import explain_ds_config
    from kit.run.results import Results
    from kit.run.sweep import run_sweep
    from kit.run.tune import tune

    flow = {
        "plan": search, "to_ds_config": to_ds_config, "explain_ds_config": explain_ds_config,
        "run_sweep": run_sweep, "Results": Results, "tune": tune, "memory_panel": memory_panel,
        "comparison_panel": comparison_panel, "plan_panel": plan_panel, "monitor_panel": monitor_panel,
    }  # fmt: skip
    assert {name: getattr(kit, name) for name in flow} == flow
    assert set(flow) | {"Setup", "estimate", "models", "monitor"} <= set(face["names"]) <= set(dir(kit))
    assert kit.estimate.estimate(Setup(model=models.preset("gpt2"), batch={})).per_gpu_bytes > 0
    with pytest.raises(AttributeError, match="module 'kit' has no attribute 'nope'"):
        kit.nope  # noqa: B018


def test_formula_table_has_units_and_separators(panel):
    table = panel.formulas.value
    for term in panel.estimate.terms.values():
        assert f">{term.bytes:,}<" in table
    est = panel.estimate
    assert f">{est.per_gpu_bytes:,}<" in table and ">optimizer states<" in table
    assert f">{est.components_bytes:,}<" in table and "peak per GPU<" in table  # both, named
    assert [t.bytes for t in est.terms.values() if f">{t.bytes}<" in table] == []  # raw counts
    # the components, their sum, the peak per GPU, CPU RAM and the header: no empty row
    assert ">component<" in table and table.count("<tr>") == len(est.terms) + 4


def test_labels_line_up_and_buttons_fit_their_labels(panel):
    comparison = ComparisonPanel(stages=(2,))
    for p in (panel, comparison):
        controls = p._inputs()
        assert {c.style.description_width for c in controls} == {DESCRIPTION_WIDTH}
        for toggle in (c for c in controls if isinstance(c, w.ToggleButtons)):
            assert "widget-inline-hbox" in toggle._dom_classes  # label beside the buttons, as elsewhere
            width = toggle.style.button_width
            if width != "auto":  # room for the longest option at 8 px a character (56 px cut "nvme")
                longest = max(len(str(label)) for label in toggle._options_labels)
                assert int(width.removesuffix("px")) >= 8 * longest + 30, (toggle.description, width)
    for button in (panel.write_button, panel.command_button, comparison.run_button, comparison.stop_button):
        assert button.layout.width == "auto"


def test_write_config_button(panel, tmp_path, monkeypatch):
    panel.stage.value = 3
    monkeypatch.chdir(tmp_path)
    panel.config_file.value = "ds.json"  # relative: the message names the absolute path
    panel.write_button.click()
    config = json.loads((tmp_path / "ds.json").read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["train_batch_size"] == 8 and config["train_micro_batch_size_per_gpu"] == 1
    assert f"wrote {tmp_path / 'ds.json'} (z3 bf16 mb1: fits the H100-SXM-80GB)" in panel.message.value
    panel.command_button.click()
    assert panel.command.layout.display != "none"
    # a later change, here a global batch the GPUs cannot split, leaves no word about the earlier setting
    panel.batch_by.value = "train_batch"
    panel.train_batch.value = 100
    assert panel.error and panel.message.value == "" and panel.command.layout.display == "none"


def test_writing_a_setting_that_does_not_fit_says_so(panel, tmp_path):
    panel.stage.value = 0
    panel.config_file.value = str(tmp_path / "ds.json")
    panel.write_button.click()
    assert (tmp_path / "ds.json").exists()
    assert f"wrote {tmp_path / 'ds.json'}, but warning: " in panel.message.value
    assert "does not fit" in panel.message.value and "GiB over" in panel.message.value


def test_write_config_refuses_an_invalid_setup(panel, tmp_path):
    panel.batch_by.value = "train_batch"
    panel.train_batch.value = 100
    with pytest.raises(ValueError, match="^train_batch_size is not equal"):
        panel.write_config(tmp_path / "ds.json")
    panel.config_file.value = str(tmp_path / "ds.json")
    panel.write_button.click()
    assert not (tmp_path / "ds.json").exists()
    assert "train_batch_size is not equal" in panel.message.value
    assert panel.command.layout.display == "none"  # the command box shows only once asked for


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
    # CPU ranks: the preview's total is the ranks' tensors, without a GPU's CUDA context and NCCL buffers
    assert "peak tensors MiB per rank" in panel.preview.value
    assert "peak MiB per GPU" not in panel.preview.value
    assert "per GPU" not in panel.preview.value  # nor the legend: "micro batch 2 per rank (GPU or ..."
    first = panel.estimates[0]
    assert f"{first.peak_tensor_bytes / 2**20:,.1f}" in panel.preview.value
    assert f"{first.per_gpu_bytes / 2**20:,.1f}" not in panel.preview.value
    panel.layers.value = 3
    panel.nprocs.value = 4
    assert {(s.model.layers, s.dp, s.batch.train_batch) for s in panel.setups[:1]} == {(3, 4, 4)}


def test_both_panels_offer_the_checkpointing_policies(panel, llama):
    assert list(panel.checkpointing.options) == list(checkpointing.CHOICES)
    panel.checkpointing.label = "selective (op policy)"
    chosen = llama.replace(zero={"activation_checkpointing": True, "checkpoint_policy": "selective-op"})
    assert panel.setup == chosen and panel.setup.label.endswith("ckpt-op")
    assert panel.estimate.components == estimate(chosen).components
    # a Setup's own policy outside the usual choices is offered too, and chosen
    own = memory_panel(llama.replace(zero={"activation_checkpointing": True, "checkpoint_every": 4}))
    assert own.checkpointing.label == "one block in 4, recomputed from its input" and own.error is None
    comparison = comparison_panel(stages=(1, 2), nprocs=2)
    comparison.checkpointing.label = "one block in 2"
    assert [s.label for s in comparison.setups] == ["z1 bf16 mb2 ckpt/2", "z2 bf16 mb2 ckpt/2"]


def test_comparison_panel_warmup_is_a_control_with_run_sweeps_default(tmp_path, monkeypatch):
    import inspect

    import kit.run.sweep

    default = inspect.signature(kit.run.sweep.run_sweep).parameters["warmup"].default
    assert default == WARMUP and comparison_panel(stages=(2,)).warmup.value == default
    asked, run_sweep = [], kit.run.sweep.run_sweep
    monkeypatch.setattr(kit.run.sweep, "run_sweep", lambda *a, **kw: asked.append(kw) or run_sweep(*a, **kw))
    panel = comparison_panel(stages=(0, 2), nprocs=2, steps=2, warmup=0, runs_dir=tmp_path, sweep="w0")
    assert panel.warmup.value == 0 and "after 0 warm-up" in panel.message.value
    panel.warmup.value = 1
    assert "after 1 warm-up" in panel.message.value
    finished_sweep(panel, tmp_path, warmup=1)  # steps 1 and 2 measured: what warm-up 1 of 2 steps needs
    panel.run()
    assert asked[-1]["warmup"] == 1 and panel.message.value.startswith("2 of 2 configurations reused")


def test_comparison_panel_invalid_model():
    panel = ComparisonPanel(stages=(2,))
    panel.heads.value = 3
    assert panel.error == "model.heads: must divide hidden (64), got 3"
    assert panel.setups == []
    with pytest.raises(ValueError, match=r"^model.heads: must divide hidden"):
        panel.run()
    panel.heads.value = 4
    panel.stages.value = ()
    assert panel.error == "stages: choose at least one of ddp, fsdp, fsdp-grad-op, 0, 1, 2, 3"


def finished_sweep(panel: ComparisonPanel, folder, warmup: int = WARMUP) -> None:
    """records.jsonl as if every configuration of ``panel`` had run (rank 0 and 1, every measured step)."""
    path = folder / panel.sweep.value / "records.jsonl"
    path.parent.mkdir(parents=True)
    for n, setup in enumerate(panel.setups, start=1):
        setup = on_ranks(setup, panel.nprocs.value)
        for step in range(warmup, warmup + panel.steps.value):
            for rank in (0, 1):
                record = {"sweep": panel.sweep.value, "run_id": "r1", "config_id": config_id(setup)}
                record.update(label=setup.label, setup={}, rank=rank, world_size=2, step=step, time=1e9)
                record["status"] = "ok"
                record.update(error=None, step_time_s=0.01234 * n, samples_per_s=4 / 0.01234 / n, loss=5.5)
                record.update(
                    tokens_per_s=1.0, tflops=1e-4, peak_allocated_bytes=None, peak_rss_bytes=2**29 * n
                )
                record["measured"] = record["estimate"] = {c: 1_234_567 * n for c in MEASURED}
                record.update(comm_bytes={"all_reduce": 4_000_000}, comm_wire_bytes=4_000_000)
                append_record(str(path), record)


def test_rerunning_a_finished_sweep_says_it_reused_everything(tmp_path):
    panel = comparison_panel(stages=(0, 2), nprocs=2, runs_dir=tmp_path, sweep="done")
    finished_sweep(panel, tmp_path)
    results = panel.run()  # nothing to launch: every configuration is in records.jsonl
    records = tmp_path / "done" / "records.jsonl"
    assert panel.message.value.startswith(f"2 of 2 configurations reused from {records}, nothing run")
    assert results.summary()["status"].tolist() == ["ok", "ok"] and not panel.busy
    assert len(panel.plots.children) == 4 and all(isinstance(i, w.Image) for i in panel.plots.children)


def test_the_results_table_is_short_and_formatted(tmp_path):
    panel = comparison_panel(stages=(0, 2), nprocs=2, runs_dir=tmp_path, sweep="done")
    finished_sweep(panel, tmp_path)
    panel.run()
    table = panel.table.value
    header = re.findall(r"<th[^>]*>([^<]*)</th>", table)
    assert header == [
        "configuration", "status", "step ms", "samples/s", "loss", "model states MiB", "estimate MiB",
        "peak RSS MiB", "wire MB/step",
    ]  # fmt: skip
    # loss, MiB, MB: at most four significant digits (kit.units.number)
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", table)
    # model states in MiB (3,704,xxx B), as the estimates show memory; bytes sent in MB (4e6 B)
    assert cells[:9] == ["z0 bf16 mb2", "ok", "12.3", "324.1", "5.5", "3.532", "3.532", "512", "4"]
    assert "white-space:nowrap'>z2 bf16 mb2<" in table  # a label stays on one line
    assert len(panel.results.summary().columns) > 20  # the full frame, one call away


def test_busy_state_while_a_sweep_runs(tmp_path):
    panel = comparison_panel(stages=(0,), nprocs=2, runs_dir=tmp_path, sweep="busy")
    seen = []
    panel.run_button.observe(lambda _: seen.append((panel.busy, panel.run_button.disabled)), "disabled")
    finished_sweep(panel, tmp_path)
    panel.run()
    assert seen == [(True, True), (False, False)]  # Run off while busy, back on after
    panel.start()
    assert panel.wait(60) and not panel.busy and "reused" in panel.message.value


def processes_of(text: str) -> set[int]:
    """The processes whose command line contains ``text``."""
    found = set()
    for proc in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if proc.name.isdigit() and text in (proc / "cmdline").read_bytes().decode(errors="replace"):
                found.add(int(proc.name))
    return found


@pytest.mark.distributed
def test_stop_kills_the_process_group_and_keeps_the_records(tmp_path):
    panel = comparison_panel(stages=(0, 2), nprocs=2, steps=500, runs_dir=tmp_path, sweep="stop")
    panel.run_button.click()
    assert panel.busy and panel.run_button.disabled and not panel.stop_button.disabled
    assert panel.stages.disabled and panel.sweep.disabled and "zk-busy" in panel.widget._dom_classes
    deadline, step = time.monotonic() + 240, 0
    while step < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
        shown = re.search(
            r"^running 1 of 2: z0 bf16 mb2, step (\d+) of 500, [\d,.]+ samples/s", panel.message.value
        )
        step = int(shown.group(1)) if shown else 0
    assert step >= 3, panel.message.value
    launch = processes_of(str(tmp_path / "stop"))
    assert len(launch) == 3  # the launcher and its 2 ranks (torchrun starts each in a session of its own)
    started = time.monotonic()
    panel.stop_button.click()
    assert panel.wait(30) and time.monotonic() - started < 10
    assert not processes_of(str(tmp_path / "stop"))
    for pid in launch:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not panel.busy and not panel.run_button.disabled and panel.stop_button.disabled
    assert panel.message.value.startswith("<b>stopped</b> after")
    assert "z0 bf16 mb2 cancelled; 0 of 2 configurations measured; records kept in" in panel.message.value
    records = load_records(tmp_path / "stop" / "records.jsonl")
    steps = [r for r in records if r["rank"] == 0 and r["status"] == "ok"]
    assert len(steps) >= 2  # the steps measured before Stop are kept
    (cancelled,) = [r for r in records if r["status"] == "cancelled"]
    assert cancelled["label"] == "z0 bf16 mb2" and cancelled["rank"] is None
    assert panel.results.summary()["status"].tolist() == ["cancelled"]
    assert "cancelled" in panel.table.value


@pytest.mark.distributed
def test_comparison_panel_run_button(tmp_path, replay_launches):
    panel = comparison_panel(stages=(0, 2), nprocs=2, steps=1, runs_dir=tmp_path, sweep="panel")
    panel.run_button.click()
    assert panel.wait(600)
    assert panel.message.value.startswith("ran 2 configurations in")  # no error replaced it
    summary = panel.results.summary()
    assert summary["label"].tolist() == ["z0 bf16 mb2", "z2 bf16 mb2"]
    assert summary["status"].tolist() == ["ok", "ok"]
    check = panel.results.states()
    assert len(check) == 2 * 2 * 8  # configurations x ranks x (4 device + 4 host components)
    assert (check["difference"] == 0).all()
    assert (tmp_path / "panel" / "records.jsonl").exists()


def test_plan_panel_shows_what_the_planner_says():
    from kit.lab.plan_panel import plan_panel
    from kit.lab.ui import strip_tags
    from kit.planning import booking, plan

    start = Setup(
        model=models.preset("llama-2-7b"), zero={"stage": 0}, batch={"micro_batch": 8, "seq_len": 4096}
    )
    # the notebook's run length, no time limit (on 4 nodes it takes longer than the default two weeks)
    p = plan_panel(start, train_batch=256, max_nodes=4, tokens=2e12, max_hours=0)
    summary = strip_tags(p.verdict.value)
    assert p.error is None and p.tokens.value == "2T"  # shown as a count, read back by parse_count
    assert f"{len(p.plan.fitting()):,} of {len(p.plan.table):,} setups pass the memory screen" in summary
    again = plan.search(start, train_batch=256, max_nodes=4, tokens=2e12)
    assert p.plan.table.cost_usd.tolist() == again.table.cost_usd.tolist()
    assert f"Book, the cheapest: {booking.recommend(again).recommended.label}," in summary
    # make-it-fit at the panel's global batch (256), not the starting setup's own (64)
    assert p.start.batch.train_batch == 256 and not p.fixes.empty and p.fixes.fits.all()
    assert {c for c in p.fixes.change if "micro batch" in c} and all(
        "(global 256 kept)" in c for c in p.fixes.change if "micro batch" in c
    )
    html = "".join(p.tables_html())
    assert all(change in html for change in p.fixes.change) and "..." not in html  # every row in full
    fast = p.plan.fitting().hours.min()
    p.efficiency.value = 0.4  # half the default: every matmul takes up to twice as long
    assert p.plan.assumptions.efficiency == 0.4 and p.plan.fitting().hours.min() > fast
    # max hours filters the summary, the plot and every table alike
    limit = round(float(p.plan.fitting().hours.median()))
    searched = p.plan
    p.max_hours.value = limit
    assert p.plan is searched  # a limit filters the last search; it does not search again
    within = p.plan.fitting(max_hours=limit)
    screened = f"{len(within):,} of {len(p.plan.table):,} setups pass the memory screen with 10% headroom"
    assert f"{screened} within {limit:,} h" in (strip_tags(p.verdict.value))
    ax = p.figure.axes[0]
    assert sum(len(c.get_offsets()) for c in ax.collections) == len(within)
    assert max(ax.lines[0].get_xdata()) <= limit and f"within {limit:,} h" in ax.get_title()
    for _, frame, _ in p._tables():
        assert "hours" not in frame or frame.hours.max() <= limit
    assert booking.recommend(p.plan, max_hours=limit).recommended.label in p.verdict.value
    p.gpus.value = ("H100-SXM-80GB",)
    assert set(p.plan.table.gpu) == {"H100-SXM-80GB"} and p.plan is not searched
    p.max_hours.value = 0.001
    assert strip_tags(p.verdict.value).startswith("none of ") and "within 0.001 h" in p.verdict.value
    assert [title for title, _, _ in p._tables()] == [
        "z0 bf16 mb8 gas4 on 1x8 H100-SXM-80GB does not fit; what makes it fit"
    ]  # no table lists a setup the summary says is out of time
    p.max_hours.value = 0
    p.train_batch.value = 100  # not a multiple of the start's 8 x 8: the plan stands, make-it-fit is left out
    assert (
        p.error is None and p.start is None and p.plan.table.micro_batch.mul(p.plan.table.gpus).le(100).all()
    )
    p.tokens.value = "lots"
    assert p.error == "tokens: not a count: 'lots' (try 7e9, 7B or 350M)"


def test_plan_panel_takes_a_calibration(tmp_path):
    from kit.lab.plan_panel import plan_panel
    from kit.planning import plan

    base = Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 4096})
    h100 = _h100_calibration()
    p = plan_panel(base, train_batch=64, max_nodes=2, calibration=h100)
    again = plan.search(base, train_batch=64, max_nodes=2, calibration=h100)
    assert p.error is None and p.plan.calibration == again.calibration and h100.label in p.verdict.value
    assert again.calibration.startswith(h100.label + "; carried over, not measured: model llama 32 x 4096")
    # up to 2 nodes, and NVMe offload among the variants: the network's and the drives' datasheet figures
    datasheet = "bandwidth across nodes (the network's figure), NVMe swap (the drives' figures)"
    assert again.calibration.endswith(f"; from datasheets: {datasheet}")
    assert set(p.plan.table.gpu) == {"H100-SXM-80GB"}  # only the calibrated GPU type is planned
    assert p.plan.table.step_s.tolist() == again.table.step_s.tolist()
    path = tmp_path / "calibration.json"
    h100.save(path)
    p.calibration.value = str(path)  # the file box: the same calibration, from its file
    assert p.error is None and p.plan.table.step_s.tolist() == again.table.step_s.tolist()
    p.calibration.value = str(tmp_path / "missing.json")
    assert p.plan is None and p.error.startswith("calibration: cannot read")
    p.calibration.value = ""
    assert p.error is None and p.plan.calibration == again.calibration  # back to the one given


def test_plan_panel_plans_a_gpu_given_by_its_figures():
    from kit import gpus
    from kit.lab.plan_panel import plan_panel

    base = Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 4096})
    p = plan_panel(base, train_batch=64, max_nodes=2)
    try:
        p.gpus.value = ("H100-SXM-80GB",)
        p.own_gpu.value = "X1:memory_gib=96,memory_gbps=4000,bf16_tflops=800,sms=120,nvlink_gbps=900"
        assert p.plan is None and p.error == "its USD/GPU-h: give X1's price per GPU-hour (> 0)"
        p.own_price.value = 3.0
        assert p.error is None and set(p.plan.table.gpu) == {"H100-SXM-80GB", "X1"}
        x1 = p.plan.table[p.plan.table.gpu == "X1"]
        assert (x1.cost_usd / (x1.hours * x1.gpus)).round(9).eq(3.0).all()  # at its price
        p.own_gpu.value = "X1:memory_gib=96"
        assert p.plan is None and p.error == "your GPU: X1 needs memory_gbps, bf16_tflops > 0"
    finally:
        gpus.DEFINED_GPUS.clear()


def _h100_calibration():
    from kit.steptime.calibration import Calibration, EngineCost, Link

    return Calibration(
        device="NVIDIA H100 80GB HBM3", accelerator="cuda", backend="nccl", ranks=8, cores=64,
        threads_per_rank=8, model="llama", layers=2, tensors=20, precision="bf16", tflops=600.0,
        micro_fixed_s=0.002, adam_s_per_param=1e-11, host_adam_s_per_param=1e-9, to_host_gbps=25.0,
        to_device_gbps=25.0, collectives={"all_reduce": Link(5e-5, 300.0), "all_gather": Link(5e-5, 300.0)},
        engines={"z0": EngineCost(1e-4, 1e-4), "z3": EngineCost(2e-4, 3e-4)},
        created="2026-01-01T00:00:00+00:00", host="gpu-box", versions={"torch": "t", "deepspeed": "d"},
    )  # fmt: skip


def test_comparison_panel_takes_a_batch_schedule():
    panel = comparison_panel(stages=(2, 3))
    panel.micro_batches.value = (1, 2)
    panel.batch_schedule.value = "2=8,4=16"
    assert panel.error is None and len(panel.setups) == 4
    for setup in panel.setups:  # each keeps its own micro batch; grad accum makes the global batch
        assert [c.train_batch for c in setup.batch.schedule] == [8, 16]
        assert {c.micro_batch for c in setup.batch.schedule} == {setup.batch.micro_batch}
    panel.batch_schedule.value = "2=8,4=10"
    assert panel.setups == [] and panel.error.startswith(
        "batch.schedule: step 4: train_batch 10 is not a multiple"
    )
    assert "batch.schedule: step 4" in panel.message.value


def test_comparison_panel_offloads_to_nvme_and_adds_zeropp_variants_at_stage_3():
    panel = ComparisonPanel(stages=(2, 3))
    panel.offload_optimizer.value = panel.offload_param.value = True
    panel.offload_to.value = "nvme"
    assert panel.error.startswith(
        "zero.nvme_path: required when offload_optimizer or offload_param is 'nvme'"
    )
    panel.nvme_path.value = "/local_nvme/zerokit"
    labels = [s.label.removesuffix(" bf16 mb2") for s in panel.setups]
    assert labels == ["z2", "z2 opt-off", "z3", "z3 opt-nvme", "z3 opt-nvme param-nvme"]  # NVMe: stage 3 only
    assert {s.zero.nvme_path for s in panel.setups if s.zero.nvme} == {"/local_nvme/zerokit"}
    panel.hpz.value = 2
    panel.quantized_gradients.value = True
    zeropp = panel.setups[-1]
    assert zeropp.label == "z3 hpz2 qgz bf16 mb2" and zeropp.zero.offload_optimizer == "none"
    assert len(panel.estimates) == len(panel.setups) == 6
    panel.hpz.value = 3  # hpZ's group must divide the node's 2 ranks
    assert panel.error.startswith("hpz_partition_size: must divide gpus_per_node (2)")


def test_memory_panel_shows_the_predicted_peak_timeline_before_anything_runs(panel):
    assert panel.estimate.timeline is not None and panel.timeline_plot.layout.display is None
    stage_2 = bytes(panel.timeline_plot.value)
    assert stage_2.startswith(b"\x89PNG")
    panel.stage.value = 3  # another setting, another timeline
    assert panel.estimate.peak_phase in ("forward", "backward", "optimizer")
    stage_3 = bytes(panel.timeline_plot.value)
    assert stage_3.startswith(b"\x89PNG") and stage_3 != stage_2
    panel.batch_by.value = "train_batch"
    panel.train_batch.value = 100  # not a multiple of micro batch x GPUs: no estimate, no plot
    assert panel.error and panel.timeline_plot.layout.display == "none"


def timeline_sweep(panel: ComparisonPanel, folder) -> None:
    """records.jsonl as if ``panel``'s configurations had run with the memory timeline: each record's
    real setting and device, its phases a stub 1 % above the timeline predicted for it."""
    from kit.estimate.memory import peak_timeline

    finished_sweep(panel, folder)
    path = folder / panel.sweep.value / "records.jsonl"
    records = load_records(path)
    path.unlink()
    for record, setup in zip(
        records, [s for s in panel.setups for _ in range(2 * panel.steps.value)], strict=True
    ):
        setup = on_ranks(setup, panel.nprocs.value)
        line = peak_timeline(setup, record["rank"], implementation="single", backend="gloo")
        record.update(setup=setup.model_dump(mode="json"), device="cpu")
        record["measured"]["phases"] = {p: int(b * 1.01) for p, b in line.totals.items()}
        append_record(str(path), record)


def test_memory_timeline_checkbox_runs_the_timeline_and_plots_it_beside_the_prediction(tmp_path, monkeypatch):
    import kit.run.sweep

    asked, run_sweep = [], kit.run.sweep.run_sweep
    monkeypatch.setattr(kit.run.sweep, "run_sweep", lambda *a, **kw: asked.append(kw) or run_sweep(*a, **kw))
    panel = comparison_panel(stages=(2, 3), nprocs=2, steps=2, runs_dir=tmp_path, sweep="peak")
    assert panel.memory_timeline.value is False  # off by default: on CPU the profiler costs ~19x a step
    panel.memory_timeline.value = True
    timeline_sweep(panel, tmp_path)
    panel.run()
    assert asked[-1]["memory_timeline"] is True
    # the 4 sweep plots, then one peak timeline per configuration (rank 0, its last step)
    assert len(panel.plots.children) == 4 + 2
    records = peak_records(panel.results)
    assert [(r["label"], r["rank"], r["step"]) for r in records] == [
        ("z2 bf16 mb2", 0, WARMUP + 1), ("z3 bf16 mb2", 0, WARMUP + 1)
    ]  # fmt: skip
    ax = peak_plot(records[1]).axes[0]
    assert ax.get_title().startswith("z3 bf16 mb2: predicted peak in backward (")
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == "measured"
    measured = [b.get_height() for b in ax.patches[-3:]]
    assert measured == pytest.approx([b / 2**20 for b in records[1]["measured"]["phases"].values()])
    panel.memory_timeline.value = False
    panel.run()  # every configuration reused: the same records, the switch passed as it now is
    assert asked[-1]["memory_timeline"] is False


def test_a_sweep_without_the_timeline_shows_no_peak_plot(tmp_path):
    panel = comparison_panel(stages=(0, 2), nprocs=2, runs_dir=tmp_path, sweep="plain")
    finished_sweep(panel, tmp_path)
    panel.run()
    assert len(panel.plots.children) == 4 and not peak_records(panel.results)


def _perturbed(control) -> bool:
    """Move a control to another value it offers; False for one this test cannot move (a text box)."""
    if isinstance(control, w.Checkbox):
        control.value = not control.value
    elif isinstance(control, (w.Dropdown, w.ToggleButtons)):
        values = [o[1] if isinstance(o, tuple) else o for o in control.options]
        others = [v for v in values if v != control.value]
        if not others:
            return False
        control.value = others[-1]
    elif isinstance(control, w.FloatLogSlider):
        control.value = control.value * control.base
    elif isinstance(control, (w.BoundedIntText, w.IntText)):
        control.value = control.value + 1 if control.value < getattr(control, "max", 1 << 30) else 1
    else:
        return False
    return True


def _fields(setups) -> dict[str, set[str]]:
    """Each Setup field's values over ``setups`` (the setups' order and number aside)."""
    out: dict[str, set[str]] = {}
    for s in setups:
        for values in s.model_dump().values():
            for key, value in values.items():
                nested = value.items() if isinstance(value, dict) else ()  # the aio block: aio.block_size
                for name, part in [*((f"{key}.{k}", v) for k, v in nested), (key, value)]:
                    out.setdefault(name, set()).add(repr(part))
    return out


def _changed_by_each_control(controls, setups) -> set[str]:
    """The Setup fields that moving each control changes (each moved back afterwards)."""
    changed: set[str] = set()
    for control in controls:
        before, value = _fields(setups()), control.value
        if not _perturbed(control):
            continue
        moved = setups()
        if moved and None not in moved:  # a value the panel refuses (one line in it): no setting to read
            after = _fields(moved)
            changed |= {k for k in before if after.get(k) != before[k]}
        control.value = value
    return changed


def test_every_setting_a_panel_offers_has_a_cli_flag(panel, monkeypatch):
    """Issue 40: each field the memory panel's controls set has a flag on `zerokit estimate`, each the
    comparison panel's on `zerokit run` (the registry's flag, or the field's name as a flag)."""
    from kit.cli import build_parser

    aliases = {"largest_layer_params": "--largest-layer", **{s.field: s.option for s in SETTINGS}}
    aliases["aio"] = "--aio-block-size"  # the block, beside each of its fields

    def flags(command: str) -> set[str]:
        sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
        return {o for a in sub.choices[command]._actions for o in a.option_strings}

    def missing(fields: set[str], command: str) -> list[str]:
        have = flags(command)
        return sorted(f for f in fields if aliases.get(f, "--" + f.replace("_", "-")) not in have)

    model = set(ModelSpec.model_fields)  # what --model (a preset, a config, a file) and its overrides set
    monkeypatch.setattr(panel, "_render", lambda: None)  # settings, not pictures
    memory = _changed_by_each_control(panel._inputs(), lambda: [panel.setup])
    assert {"reduce_bucket_size", "prefetch_bucket_size", "checkpoint_policy", "stage", "params"} <= memory
    assert missing(memory - model, "estimate") == [] and {"--model", "--params"} <= flags("estimate")
    comparison = comparison_panel(stages=(2, 3), nprocs=2)
    moved = [c for c in comparison._inputs() if c not in (comparison.stages, comparison.micro_batches)]
    fields = _changed_by_each_control(moved, lambda: comparison.setups)
    assert {"reduce_bucket_size", "checkpoint_policy", "precision", "layers"} <= fields
    # on `run` the ranks are --nprocs, and the global batch follows from them (no control of its own)
    aliases["gpus_per_node"] = "--nprocs"
    assert missing(fields - model - {"train_batch"}, "run") == []
    assert {"--layers", "--hidden", "--heads"} <= flags("run")


# ------------------------------------------------------------------------ what a reader sees (issue 43)

#: the widgets a reader does not act on: they only show
SHOWN = (w.HTML, w.HTMLMath, w.Label, w.Image, w.IntProgress, w.FloatProgress)


def inputs_of(widget: w.Widget) -> list[w.Widget]:
    """Every control in ``widget``'s tree (boxes, accordions, grids walked) a reader types into, picks or
    clicks."""
    found = []
    if isinstance(widget, w.Button) or (isinstance(widget, w.ValueWidget) and not isinstance(widget, SHOWN)):
        found.append(widget)
    for child in getattr(widget, "children", ()):
        found += inputs_of(child)
    return found


def test_every_control_of_the_four_panels_has_a_tooltip(panel, tmp_path):
    from kit.lab.monitor_panel import monitor_panel
    from kit.lab.plan_panel import plan_panel

    panels = {
        "memory": panel,
        "comparison": comparison_panel(stages=(2, 3)),
        "plan": plan_panel(panel.setup, max_nodes=1),
        "monitor": monitor_panel(tmp_path),
    }
    for name, shown in panels.items():
        controls = inputs_of(shown.widget)
        assert len(controls) >= (2 if name == "monitor" else 13), name
        assert [c for c in controls if not (c.tooltip or "").strip()] == [], name
        for control in controls:  # ipywidgets 8 titles only the input of these, and only without a label
            if isinstance(control, ui.UNTITLED) and control.description:
                assert control.description_allow_html, (name, control.description)
                assert control.description.startswith(f"<span title='{html.escape(control.tooltip)}'>")
    assert {c.description for c in inputs_of(panel.widget)} >= {"s3 prefetch", "ZeRO stage"}
    # a ZeRO setting's control carries its help from the registry (kit.settings), a composite each field's
    assert panel.prefetch_bucket.tooltip == next(s.help for s in SETTINGS if s.name == "prefetch_bucket")
    assert "checkpoint policy: full: a block keeps its input" in panel.checkpointing.tooltip
    assert "<span title='" in panel.quantized_weights.description and panel.quantized_weights.value is False


def test_the_panels_explain_the_labels_they_show(panel, tmp_path):
    assert "<code>z2</code> ZeRO stage 2" in panel.summary.value  # beside the summary's setting
    panel.stage.value = 3
    panel.offload_optimizer.value = "cpu"
    assert "<code>opt-off</code> optimizer states offloaded to the CPU" in panel.summary.value
    comparison = comparison_panel(stages=(0, 2), nprocs=2, runs_dir=tmp_path, sweep="legend")
    assert "<code>z0</code> ZeRO stage 0" in comparison.preview.value  # under the estimates' table
    finished_sweep(comparison, tmp_path)
    comparison.run()
    _, legend = comparison.table.value.split("</table>")
    assert "<code>mb2</code> micro batch 2 per rank (GPU or CPU process)" in legend and "z3" not in legend


def test_a_run_stopped_before_any_step_says_nothing_was_measured(tmp_path):
    from kit.run.results import Results

    comparison = comparison_panel(stages=(0,), nprocs=2, runs_dir=tmp_path, sweep="none")
    path = tmp_path / "none" / "records.jsonl"
    path.parent.mkdir()
    stopped = {"sweep": "none", "run_id": "r1", "config_id": "c1", "label": "z0 bf16 mb2", "setup": {}}
    stopped |= {"rank": None, "step": None, "time": 1e9, "status": "cancelled", "error": "stopped"}
    append_record(str(path), stopped)
    comparison.results = Results.load(path)
    comparison._show_results()
    (shown,) = comparison.plots.children  # one line, no empty axes
    assert isinstance(shown, w.HTML) and "nothing measured yet" in shown.value
    assert "cancelled" in comparison.table.value


def test_a_refused_batch_clears_the_earlier_written_message(panel, tmp_path):
    panel.config_file.value = str(tmp_path / "ds_config.json")
    panel.write_button.click()
    assert "fits the H100-SXM-80GB" in panel.message.value and ui.GREEN in panel.message.value
    panel.batch_by.value = "train_batch"
    panel.micro_batch.value = 3  # global batch 8 on 8 GPUs: no micro batch of 3 makes it
    assert panel.error and ui.RED in panel.verdict.value
    assert panel.message.value == ""  # no green "wrote ... fits" under the refusal
    panel.micro_batch.value = 1
    assert panel.error is None and panel.message.value == ""


def test_the_plan_panel_books_within_two_weeks_by_default():
    from kit.lab.plan_panel import MAX_HOURS, plan_panel

    p = plan_panel()  # the default model, GPU types and run length
    assert MAX_HOURS == 336 and p.max_hours.value == MAX_HOURS and p.limits["max_hours"] == MAX_HOURS
    assert p.error is None and p.booking.recommended.hours <= MAX_HOURS
    assert f"within {MAX_HOURS:,} h" in ui.strip_tags(p.verdict.value)
    assert "two weeks" in p.max_hours.tooltip
    fastest = p.plan.fitting().hours.min()
    p.max_hours.value = fastest / 2  # a limit the search cannot meet: said in one line, nothing booked
    verdict = ui.strip_tags(p.verdict.value)
    assert p.booking.recommended is None and verdict.startswith("none of ") and "\n" not in verdict
    assert f"the fastest that fits takes {fastest:,.1f} h" in verdict
