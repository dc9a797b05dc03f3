"""ds_config export / import / validation, checked against DeepSpeed's own config parser."""

from __future__ import annotations

import itertools
import json

import pytest

from kit.cli.args import add_setup_args, setup_from_args
from kit.ds_config import (
    from_ds_config,
    read_ds_config,
    to_ds_config,
    validate_ds_config,
    write_ds_config,
)
from kit.schema import ModelSpec, Setup, one_line_error

MODEL = ModelSpec(name="t", params=10**9, largest_layer_params=10**8, layers=32, hidden=4096, heads=32)
BARE = ModelSpec(params=10**9, largest_layer_params=10**8)
CLUSTER = {"nodes": 2, "gpus_per_node": 4}


def all_setups() -> list[Setup]:
    """Every valid stage x offload x precision x optimizer combination (81 of them)."""
    setups = []
    for stage, opt_off, param_off, precision, optimizer in itertools.product(
        range(4), ("none", "cpu"), ("none", "cpu"), ("fp32", "fp16", "bf16"), ("adamw", "adam", "sgd")
    ):
        if (opt_off == "cpu" and stage == 0) or (param_off == "cpu" and stage != 3):
            continue
        zero = {"stage": stage, "offload_optimizer": opt_off, "offload_param": param_off}
        zero |= {
            "precision": precision,
            "optimizer": optimizer,
            "momentum": 0.9 if optimizer == "sgd" else 0.0,
        }
        setups.append(
            Setup(model=MODEL, cluster=CLUSTER, zero=zero, batch={"micro_batch": 2, "grad_accum": 3})
        )
    return setups


SETUPS = all_setups()


def test_combinations_counted():
    # stage 0: 3 precisions x 3 optimizers; stages 1-2: x2 optimizer offload; stage 3: x2 x2.
    assert len(SETUPS) == 9 + 2 * 18 + 36 == 81


@pytest.mark.parametrize("torch_adam", [False, True])
def test_every_combination_passes_deepspeeds_parser(torch_adam):
    for s in SETUPS:
        parsed = validate_ds_config(to_ds_config(s, torch_adam=torch_adam), s.dp)
        z = parsed.zero_config
        assert (parsed.train_batch_size, parsed.train_micro_batch_size_per_gpu) == (48, 2), s.label
        assert parsed.gradient_accumulation_steps == 3
        assert z.stage == s.zero.stage
        assert z.offload_optimizer is None or z.offload_optimizer.device == s.zero.offload_optimizer
        assert (z.offload_param.device if z.offload_param else "none") == s.zero.offload_param
        assert (z.offload_optimizer.device if z.offload_optimizer else "none") == s.zero.offload_optimizer
        assert parsed.bfloat16_config.enabled == (s.zero.precision == "bf16")
        assert parsed.float16_config.enabled == (s.zero.precision == "fp16")
        assert z.overlap_comm == s.zero.overlap  # DeepSpeed's dynamic default: True only for stage 3
        assert parsed.optimizer_name == {"adamw": "adamw", "adam": "adam", "sgd": "SGD"}[s.zero.optimizer]
        assert parsed.optimizer_params.get("torch_adam", False) == (torch_adam and s.zero.optimizer != "sgd")
        assert parsed.zero_allow_untested_optimizer == (s.zero.optimizer == "sgd" and s.zero.stage > 0)


def test_export_stage3_offload_exact():
    s = Setup(
        model=MODEL,
        cluster={"nodes": 1, "gpus_per_node": 8},
        zero={"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu", "optimizer": "adam"},
        batch={"train_batch": 64, "grad_accum": 2},
    )
    assert to_ds_config(s, torch_adam=True, lr=3e-4) == {
        "train_batch_size": 64,
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 2,
        "steps_per_print": 100,
        "gradient_clipping": 1.0,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-4, "adam_w_mode": False, "torch_adam": True}},
        "zero_optimization": {
            "stage": 3,
            "reduce_bucket_size": 500_000_000,
            "contiguous_gradients": True,
            "stage3_prefetch_bucket_size": 50_000_000,
            "stage3_max_live_parameters": 1_000_000_000,
            "stage3_max_reuse_distance": 1_000_000_000,
            "stage3_param_persistence_threshold": 100_000,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
        },
        "bf16": {"enabled": True},
    }


def test_export_stage0_fp32_sgd_and_stage2_options_exact():
    s = Setup(
        model=BARE, cluster={"gpus_per_node": 2}, zero={"stage": 0, "precision": "fp32", "optimizer": "sgd"}
    )
    assert to_ds_config(s)["zero_optimization"] == {"stage": 0}
    assert to_ds_config(s)["optimizer"] == {"type": "SGD", "params": {"lr": 1e-4, "momentum": 0.0}}
    assert "bf16" not in to_ds_config(s) and "fp16" not in to_ds_config(s)
    assert "zero_allow_untested_optimizer" not in to_ds_config(s)
    s2 = s.replace(
        zero={"stage": 2, "precision": "fp16", "overlap_comm": False, "activation_checkpointing": True}
    )
    config = to_ds_config(s2)
    assert config["zero_optimization"] == {
        "stage": 2,
        "reduce_bucket_size": 500_000_000,
        "contiguous_gradients": True,
        "overlap_comm": False,
        "allgather_bucket_size": 500_000_000,
    }
    assert config["fp16"] == {"enabled": True}
    assert config["activation_checkpointing"]["partition_activations"] is False
    assert config["zero_allow_untested_optimizer"] is True


def test_round_trip_every_combination():
    for s in SETUPS:
        assert from_ds_config(to_ds_config(s), model=MODEL, cluster=s.cluster) == s, s.label


def test_deepspeeds_checkpointing_options_round_trip_and_what_it_cannot_read_is_one_line():
    """activation_checkpointing.cpu_checkpointing and .partition_activations are written and read back;
    a value DeepSpeed would take as a Python truth value, and the contiguous buffers of number_checkpoints
    inputs (not modelled), are refused naming the key."""
    base = SETUPS[-1].replace(zero={"activation_checkpointing": True})
    for cpu, partition in itertools.product((False, True), repeat=2):
        s = base.replace(zero={"cpu_checkpointing": cpu, "partition_activations": partition})
        section = to_ds_config(s)["activation_checkpointing"]
        assert (section["cpu_checkpointing"], section["partition_activations"]) == (cpu, partition)
        assert from_ds_config(to_ds_config(s), model=MODEL, cluster=s.cluster) == s
    for extra, line in (
        (
            {"cpu_checkpointing": "true"},
            "activation_checkpointing.cpu_checkpointing: must be true or false, got 'true'",
        ),
        (
            {"partition_activations": True, "contiguous_memory_optimization": True, "number_checkpoints": 32},
            "activation_checkpointing.contiguous_memory_optimization: deepspeed.checkpointing's contiguous "
            "buffers (number_checkpoints inputs allocated up front) is not modelled by zero-kit (got True; "
            "use False)",
        ),
    ):
        config = {**to_ds_config(base), "activation_checkpointing": extra}
        with pytest.raises(ValueError) as error:
            from_ds_config(config, model=MODEL, cluster=base.cluster)
        assert str(error.value) == line


def test_round_trip_custom_buckets_and_switches():
    s = SETUPS[-1].replace(
        zero={
            "reduce_bucket_size": 12_345,
            "prefetch_bucket_size": 0,
            "max_live_parameters": 7,
            "param_persistence_threshold": 0,
            "overlap_comm": False,
            "contiguous_gradients": False,
            "activation_checkpointing": True,
        },
        batch={"seq_len": 512},
    )
    assert from_ds_config(to_ds_config(s), model=MODEL, cluster=CLUSTER, seq_len=512) == s
    s1 = s.replace(zero={"stage": 1, "offload_param": "none", "allgather_bucket_size": 99})
    back = from_ds_config(to_ds_config(s1), model=MODEL, cluster=CLUSTER, seq_len=512)
    # Stage 1 has no use for the stage-3 knobs, so the ds_config omits them and they come back as defaults.
    stage3_defaults = {"prefetch_bucket_size": 50_000_000, "max_live_parameters": 10**9}
    assert back == s1.replace(zero={**stage3_defaults, "param_persistence_threshold": 100_000})
    assert (back.zero.allgather_bucket_size, back.zero.reduce_bucket_size) == (99, 12_345)


def hf_zero3() -> dict:
    """HF Trainer's ZeRO-3 example config (transformers docs, "deepspeed" page), "auto" everywhere."""
    return {
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16},
        "bf16": {"enabled": "auto"},
        "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "weight_decay": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": "auto"}},
        "zero_optimization": {
            "stage": 3,
            "offload_optimizer": {"device": "cpu", "pin_memory": True},
            "offload_param": {"device": "cpu", "pin_memory": True},
            "overlap_comm": True,
            "contiguous_gradients": True,
            "sub_group_size": 1e9,
            "reduce_bucket_size": "auto",
            "stage3_prefetch_bucket_size": "auto",
            "stage3_param_persistence_threshold": "auto",
            "stage3_max_live_parameters": 1e9,
            "stage3_max_reuse_distance": 1e9,
            "stage3_gather_16bit_weights_on_model_save": True,
        },
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "steps_per_print": 2000,
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "wall_clock_breakdown": False,
    }


def test_hf_auto_values_resolved_from_model_and_batch():
    s, notes = read_ds_config(
        hf_zero3(), model=MODEL, cluster={"gpus_per_node": 8}, micro_batch=4, grad_accum=2
    )
    z = s.zero
    assert z.reduce_bucket_size == 4096**2 == 16_777_216
    assert z.prefetch_bucket_size == int(0.9 * 4096**2) == 15_099_494
    assert z.param_persistence_threshold == 10 * 4096 == 40_960
    assert z.max_live_parameters == 1_000_000_000  # 1e9 in the file
    assert (z.stage, z.offload_optimizer, z.offload_param, z.overlap_comm) == (3, "cpu", "cpu", True)
    assert (z.precision, z.optimizer) == ("bf16", "adamw")
    assert (s.batch.micro_batch, s.batch.grad_accum, s.batch.train_batch) == (4, 2, 64)
    assert "train_batch_size: 'auto' -> 64 (from the other batch values)" in notes
    assert "zero_optimization.reduce_bucket_size: 'auto' -> hidden^2 = 16,777,216 (hidden 4096)" in notes
    assert any(
        n.startswith("bf16/fp16.enabled: 'auto' -> bf16 (the H100-SXM-80GB supports bf16") for n in notes
    )
    # The same file, resolved the HF way, is a config DeepSpeed accepts for 8 ranks.
    validate_ds_config(to_ds_config(s), 8)


def test_auto_precision_follows_the_gpu_and_batch_defaults():
    s, notes = read_ds_config(hf_zero3(), model=MODEL, cluster={"gpus_per_node": 8, "gpu": "V100-SXM2-32GB"})
    assert s.zero.precision == "fp16"  # V100 has no bf16
    assert (s.batch.micro_batch, s.batch.grad_accum, s.batch.train_batch) == (1, 1, 8)
    assert any("-> fp16 (the V100-SXM2-32GB lacks bf16" in n for n in notes)


def test_auto_buckets_without_hidden_size_fall_back_to_deepspeed_defaults():
    s, notes = read_ds_config(hf_zero3(), model=BARE, cluster={"gpus_per_node": 8})
    assert (s.zero.reduce_bucket_size, s.zero.prefetch_bucket_size) == (500_000_000, 50_000_000)
    assert s.zero.param_persistence_threshold == 100_000
    assert (
        "zero_optimization.reduce_bucket_size: 'auto' -> DeepSpeed's default (the model has no hidden size)"
        in notes
    )


def test_import_follows_deepspeed_semantics():
    base = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}}
    s, notes = read_ds_config(
        {**base, "optimizer": {"type": "Adam", "params": {}}}, model=BARE, cluster=CLUSTER
    )
    assert s.zero.optimizer == "adamw"  # DeepSpeed runs "Adam" as AdamW unless adam_w_mode is false
    assert s.zero.offload_param == "none"  # stage 2 ignores it, as DeepSpeed does
    assert notes == [
        "zero_optimization.offload_param: ignored, it needs ZeRO stage 3: only stage 3 partitions the "
        "parameters (got stage 2); use offload_optimizer for stages 1-2"
    ]
    assert (s.zero.precision, s.batch.micro_batch, s.batch.grad_accum) == ("fp32", 2, 1)
    adam = {**base, "optimizer": {"type": "Adam", "params": {"adam_w_mode": False}}}
    assert from_ds_config(adam, model=BARE, cluster=CLUSTER).zero.optimizer == "adam"
    sgd = {**base, "optimizer": {"type": "SGD", "params": {"momentum": 0.5}}}
    assert from_ds_config(sgd, model=BARE, cluster=CLUSTER).zero.momentum == 0.5
    legacy = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "cpu_offload": True}}
    assert from_ds_config(legacy, model=BARE, cluster=CLUSTER).zero.offload_optimizer == "cpu"
    aliases = {"train_batch_size": 16, "zero_optimization": {"stage": 3, "prefetch_bucket_size": 5e5}}
    assert from_ds_config(aliases, model=BARE, cluster=CLUSTER).zero.prefetch_bucket_size == 500_000
    # zero.Init is the training script's choice, not a ds_config key: the caller states it.
    assert from_ds_config(aliases, model=BARE, cluster=CLUSTER, zero_init=False).zero.zero_init is False


@pytest.mark.parametrize(
    "config, kwargs, message",
    [
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}},
            {},
            "zero.nvme_path: required when offload_optimizer or offload_param is 'nvme'",
        ),
        (
            {
                "train_batch_size": 16,
                "zero_optimization": {"stage": 3, "zero_quantized_nontrainable_weights": 1},
            },
            {},
            "zero_optimization.zero_quantized_nontrainable_weights: ZeRO++ int8 storage of frozen weights is "
            "not modelled by zero-kit (got 1; use False)",
        ),
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 3, "mics_shard_size": 8}},
            {},
            "zero_optimization.mics_shard_size: MiCS was removed from DeepSpeed 0.19 (its config parser "
            "refuses the key); for a parameter partition inside each node use ZeRO++ hpZ",
        ),
        (
            {"train_batch_size": 16, "optimizer": {"type": "Lamb"}},
            {},
            "optimizer.type: zero-kit models Adam, AdamW and SGD, got 'Lamb'",
        ),
        (
            {"train_batch_size": 16, "bf16": {"enabled": True}, "fp16": {"enabled": True}},
            {},
            "bf16.enabled: bf16 and fp16 cannot both be enabled (DeepSpeed asserts the same)",
        ),
        (
            {"train_micro_batch_size_per_gpu": 2},
            {"micro_batch": 4},
            'train_micro_batch_size_per_gpu: ds_config has 2 but micro_batch=4 was given; set it to "auto"',
        ),
        (
            {"train_batch_size": "16"},
            {},
            "train_batch_size: must be a whole number >= 1 or \"auto\", got '16'",
        ),
        (
            {"train_batch_size": 12, "gradient_accumulation_steps": 1},
            {},
            # kit.batch's wording: DeepSpeed's equation, then the valid alternatives
            "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size 12 != ",
        ),
    ],
)
def test_import_errors_are_one_clear_line(config, kwargs, message):
    with pytest.raises(ValueError) as error:
        from_ds_config(config, model=BARE, cluster=CLUSTER, **kwargs)
    assert one_line_error(error.value).startswith(message) and "\n" not in one_line_error(error.value)


@pytest.mark.parametrize(
    "config, message",
    [
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 4}},
            "zero_optimization.stage: Input should be",
        ),
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 2, "reduce_bucket_size": 0}},
            "zero_optimization.reduce_bucket_size: Input should be greater than 0",
        ),
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 3, "offload_param": {"device": "gpu"}}},
            "zero_optimization.offload_param.device: Input should be 'none', 'cpu' or 'nvme'",
        ),
        (
            {"train_batch_size": 16, "zero_optimization": {"stage": 2, "reduce_bucket_sise": 5}},
            "zero_optimization.reduce_bucket_sise: Extra inputs are not permitted",
        ),
        (
            {"train_batch_size": 16, "bf16": {"enabled": "maybe"}},
            "bf16.enabled: Input should be a valid boolean",
        ),
        (
            {"train_batch_size": 16, "bf16": {"enabled": True}, "fp16": {"enabled": True}},
            "ds_config: bfloat16 and fp16 modes cannot be simultaneously enabled",
        ),
        (
            {"gradient_accumulation_steps": 2},
            "ds_config: Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided",
        ),
        (
            {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3},
            "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size "
            "10 < 3 * 1 * 8 = 24",
        ),
    ],
)
def test_broken_configs_get_one_line_errors(config, message):
    with pytest.raises(ValueError) as error:
        validate_ds_config(config, 8)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_files(tmp_path):
    s = SETUPS[40]
    path = write_ds_config(s, tmp_path / "ds_config.json")
    assert json.loads(path.read_text()) == to_ds_config(s)
    assert from_ds_config(path, model=MODEL, cluster=CLUSTER) == s
    (tmp_path / "bad.json").write_text('{"train_batch_size": 16,\n "train_batch_size": 8}')
    with pytest.raises(ValueError, match="duplicate key 'train_batch_size'"):
        from_ds_config(tmp_path / "bad.json", model=MODEL, cluster=CLUSTER)
    (tmp_path / "broken.json").write_text('{"train_batch_size": 16,\n "zero_optimization": }')
    with pytest.raises(ValueError, match=r"broken.json: not valid JSON \(line 2: Expecting value\)"):
        from_ds_config(tmp_path / "broken.json", model=MODEL, cluster=CLUSTER)


def test_cli_ds_config_flag_uses_the_batch_flags(tmp_path):
    import argparse

    path = tmp_path / "ds.json"
    path.write_text(json.dumps(hf_zero3()))
    parser = argparse.ArgumentParser()
    add_setup_args(parser)
    args = parser.parse_args(
        ["--params", "1e9", "--ds-config", str(path), "--micro-batch", "2", "--grad-accum", "4"]
    )
    s = setup_from_args(args)
    assert (s.batch.micro_batch, s.batch.grad_accum, s.batch.train_batch) == (2, 4, 64)
    assert (s.zero.stage, s.zero.offload_param, s.model.params) == (3, "cpu", 1_000_000_000)


# ----- what DeepSpeed runs but the kit does not model (issue 39, item 4) --------------------------------

#: each feature on, and the one line it is refused with
UNMODELLED = [
    (
        {"tensor_parallel": {"autotp_size": 2}},
        "ds_config.tensor_parallel.autotp_size: tensor parallelism (2) is not modelled by zero-kit: its "
        "estimate would leave out the 2-way split of the linear layers' weights, gradients, optimizer states "
        "and activations, and their all-reduces; 0 or 1 leaves it off",
    ),
    (
        {"pipeline": {"stages": 4}},
        "ds_config.pipeline.stages: pipeline parallelism (4) is not modelled by zero-kit: its estimate "
        "would leave out the layers' split over 4 stages and the activations of the micro-batches in "
        'flight; "auto" or 1 leaves it off',
    ),
    (
        {"compile": {"deepcompile": True}},
        "ds_config.compile.deepcompile: DeepCompile (true) is not modelled by zero-kit: its estimate would "
        "leave out the torch.compile graph's own schedule of parameter gathers, releases and offloads, "
        "which replaces ZeRO's hooks; false leaves it off",
    ),
    (
        {"expert_parallel": {"enabled": True, "autoep_size": 4}},
        "ds_config.expert_parallel.enabled: expert parallelism (AutoEP) (true) is not modelled by zero-kit: "
        "its estimate would leave out the experts' split over expert_parallel.autoep_size ranks, their "
        "all-to-alls and the experts' own data-parallel groups; false leaves it off",
    ),
]
#: the values that leave each off, as DeepSpeed reads them ("auto": a pydantic config class's default)
OFF = [
    {"tensor_parallel": {"autotp_size": 0}},
    {"tensor_parallel": {"autotp_size": 1, "tp_overlap_comm": True}},
    {"tensor_parallel": {"autotp_size": "auto"}},
    {"sequence_parallel_size": 1},
    {"pipeline": {"stages": 1}},
    {"pipeline": {"stages": "auto", "partition": "best"}},
    {"compile": {"deepcompile": False}},
    {"compile": {"deepcompile": False, "offload_activation": True, "passes": ["z3"]}},
    {"compile": {}},
    {"fp8": {"enabled": False}},
    {"expert_parallel": {"enabled": False, "autoep_size": 4}},
    {"expert_parallel": {}},
]
FEATURES = [next(iter(extra)) for extra, _ in UNMODELLED]
ZERO3 = {
    "train_micro_batch_size_per_gpu": 2,
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW"},
}


@pytest.mark.parametrize("extra, line", UNMODELLED, ids=FEATURES)
def test_a_feature_the_kit_does_not_model_is_refused_in_one_line(extra, line):
    with pytest.raises(ValueError) as error:
        read_ds_config({**ZERO3, **extra}, model=BARE, cluster=CLUSTER)
    assert str(error.value) == line and "\n" not in line
    # first, whatever else the config holds that the kit cannot read
    with pytest.raises(ValueError) as error:
        read_ds_config({**ZERO3, **extra, "torch_autocast": {"enabled": True}}, model=BARE, cluster=CLUSTER)
    assert str(error.value) == line


@pytest.mark.parametrize("extra", OFF, ids=str)
def test_a_feature_left_off_is_accepted_silently_with_the_same_bytes(extra):
    from kit.estimate import estimate

    plain, plain_notes = read_ds_config(ZERO3, model=MODEL, cluster=CLUSTER)
    setup, notes = read_ds_config({**ZERO3, **extra}, model=MODEL, cluster=CLUSTER)
    assert (setup, notes) == (plain, plain_notes)
    assert estimate(setup).per_gpu_bytes == estimate(plain).per_gpu_bytes


@pytest.mark.parametrize(
    "extra, message",
    [
        (
            {"sequence_parallel_size": 0},
            "ds_config.sequence_parallel_size: must be a whole number >= 1, got 0",
        ),
        (
            {"tensor_parallel": {"autotp_size": "2"}},
            "ds_config.tensor_parallel.autotp_size: must be a whole number >= 0 or \"auto\", got '2'",
        ),
        (
            {"compile": {"deepcompile": "yes"}},
            "ds_config.compile.deepcompile: must be true or false, got 'yes'",
        ),
        ({"compile": {"deepcompile": 1}}, "ds_config.compile.deepcompile: must be true or false, got 1"),
        (
            {"expert_parallel": {"enabled": "yes"}},
            "ds_config.expert_parallel.enabled: must be true or false, got 'yes'",
        ),
        ({"tensor_parallel": 2}, "tensor_parallel: must be a JSON object, got 2"),
    ],
)
def test_a_value_deepspeed_could_not_read_as_on_or_off_is_one_line(extra, message):
    with pytest.raises(ValueError) as error:
        read_ds_config({**ZERO3, **extra}, model=BARE, cluster=CLUSTER)
    assert str(error.value) == message


def test_what_the_training_script_may_turn_on_is_a_note():
    """A pipeline section (read only for a PipelineModule) or an FP8 key (DeepSpeed has none): noted, the
    estimate unchanged. DeepSpeed's own activation-checkpointing options are read (kit.checkpointing)."""
    plain, _ = read_ds_config(ZERO3, model=MODEL, cluster=CLUSTER)
    config = {**ZERO3, "pipeline": {"activation_checkpoint_interval": 1}, "fp8": {"enabled": True}}
    config["activation_checkpointing"] = {"partition_activations": False, "cpu_checkpointing": True}
    setup, notes = read_ds_config(config, model=MODEL, cluster=CLUSTER)
    on = {"activation_checkpointing": True, "cpu_checkpointing": True}
    assert setup == plain.replace(zero=on)  # the section says: checkpointing, its inputs in CPU RAM
    assert notes == [
        "pipeline: only DeepSpeed's PipelineEngine reads it (a PipelineModule model); zero-kit does not "
        "model pipeline parallelism, so this estimate is of a model that is not a PipelineModule",
        "fp8: DeepSpeed has no FP8 setting and ignores this key; FP8 training (Transformer Engine, torchao) "
        "is the training script's, and zero-kit does not model it",
    ]


@pytest.mark.parametrize("extra, line", UNMODELLED, ids=FEATURES)
def test_the_cli_refuses_a_feature_the_kit_does_not_model_with_exit_2_and_one_line(
    capsys, tmp_path, extra, line
):
    from kit.cli import main

    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({**ZERO3, **extra}))
    for command in (["estimate"], ["estimate", "--json"], ["launch-cmd"]):
        code = main([*command, "--ds-config", str(path), "--params", "1e9"])
        out, err = capsys.readouterr()
        assert (code, out, err.splitlines()) == (2, "", [f"zerokit {command[0]}: {line}"]), command
    runs = tmp_path / "runs"
    code = main(["run", "--ds-config", str(path), "--model", "gpt2", "--runs-dir", str(runs), "--json"])
    out, err = capsys.readouterr()
    assert (code, out, err.splitlines()) == (2, "", [f"zerokit run: {line}"]) and not runs.exists()
