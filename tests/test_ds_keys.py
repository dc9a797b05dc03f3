"""The single definitions of DeepSpeed's rules, checked against independent sources: the key table
against DeepSpeed's own config classes, HF's "auto" rules against transformers'
``HfTrainerDeepSpeedConfig``, the ring factors against nccl-tests' definitions, the fit rule against the
GPU table's precision support, and the stage-3 gather size and fp32 widths inside the estimate's text."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kit import rules
from kit.ds_config import read_ds_config, to_ds_config
from kit.ds_keys import BATCH_KEYS
from kit.estimate import estimate
from kit.fit import fit, supports
from kit.gpus import catalogue
from kit.schema import ModelSpec, Setup, ZeroSettings
from kit.settings import NVME_KEYS, STAGE3_KEYS, ZERO_KEYS, ZEROPP_KEYS, ZEROPP_OFF, hf_auto, zero_key

MODEL = ModelSpec(name="t", params=10**9, largest_layer_params=10**8, layers=32, hidden=4096, heads=32)


def _zero_config_fields():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    return DeepSpeedZeroConfig.model_fields


def test_every_zero_key_is_a_deepspeed_field_with_deepspeeds_default_and_alias():
    fields = _zero_config_fields()
    by_spelling = {}
    for name, f in fields.items():
        by_spelling[name] = (name, f)
        if f.alias:
            by_spelling[f.alias] = (name, f)
    for k in ZERO_KEYS:
        assert k.key in by_spelling, k.key
        name, f = by_spelling[k.key]
        assert {s for s in (name, f.alias) if s} == set(k.spellings), k.key
        # a setting's default is the schema's, DeepSpeed's but for the stage (the kit starts at stage 2)
        assert f.default == (0 if k.field == "stage" else k.default), k.key


def test_nvme_keys_are_deepspeeds_offload_fields_with_its_defaults():
    from deepspeed.runtime.zero.offload_config import (
        DeepSpeedZeroOffloadOptimizerConfig,
        DeepSpeedZeroOffloadParamConfig,
    )

    classes = {
        "offload_param": DeepSpeedZeroOffloadParamConfig,
        "offload_optimizer": DeepSpeedZeroOffloadOptimizerConfig,
    }
    for kind, keys in NVME_KEYS.items():
        fields = classes[kind].model_fields
        for k in keys:
            assert fields[k.key].default == k.default, (kind, k)


def test_stage3_keys_are_deepspeed_zero_keys():
    fields = _zero_config_fields()
    spellings = set(fields) | {f.alias for f in fields.values() if f.alias}
    assert set(STAGE3_KEYS) <= spellings
    assert {"stage3_prefetch_bucket_size", "prefetch_bucket_size", "sub_group_size"} <= set(STAGE3_KEYS)
    assert not {"reduce_bucket_size", "allgather_bucket_size", "overlap_comm"} & set(STAGE3_KEYS)


def test_zeropp_off_values_are_deepspeeds_defaults_and_schema_reads_them():
    assert ZEROPP_OFF == {"hpz_partition_size": 1, "quantized_weights": False, "quantized_gradients": False}
    assert [k.key for k in ZEROPP_KEYS] == [
        "zero_hpz_partition_size",
        "zero_quantized_weights",
        "zero_quantized_gradients",
    ]
    assert not ZeroSettings(stage=3).zeropp
    for field, off in ZEROPP_OFF.items():
        on = 2 if field == "hpz_partition_size" else not off
        assert ZeroSettings(stage=3, **{field: on}).zeropp


def test_the_writer_and_the_reader_walk_the_same_table():
    """Every stage-3 key the writer writes is read back into the same field."""
    zero = {"stage": 3, "hpz_partition_size": 4, "quantized_weights": True, "prefetch_bucket_size": 123_456}
    zero |= {"overlap_comm": False}  # None (DeepSpeed decides) is not written
    s = Setup(model=MODEL, cluster={"gpus_per_node": 8}, zero=zero, batch={"micro_batch": 1})
    section = to_ds_config(s)["zero_optimization"]
    written = {zero_key(key).field for key in section if zero_key(key)}
    assert written == {k.field for k in ZERO_KEYS if 3 in k.stages and k.field != "quantized_gradients"}
    back, _ = read_ds_config(to_ds_config(s), model=MODEL, cluster={"gpus_per_node": 8})
    assert back.zero == s.zero
    assert set(BATCH_KEYS) <= set(to_ds_config(s))


@pytest.mark.parametrize("hidden", [768, 4096, 5120])
def test_hf_auto_rules_are_transformers_own(hidden):
    """HfTrainerDeepSpeedConfig.trainer_config_finalize fills the same numbers for this hidden size."""
    from transformers.integrations import deepspeed as deepspeed_integration

    keys = [k.key for k in ZERO_KEYS if k.hf_auto]
    assert keys == ["reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"]
    config = {"train_batch_size": 8, "zero_optimization": {"stage": 3, **dict.fromkeys(keys, "auto")}}
    hf = deepspeed_integration.HfTrainerDeepSpeedConfig(config)
    model = SimpleNamespace(config=SimpleNamespace(hidden_size=hidden))
    hf.trainer_config_finalize(SimpleNamespace(get_warmup_steps=lambda steps: 0), model, 10)
    assert {key: hf.config["zero_optimization"][key] for key in keys} == {
        key: hf_auto(key, hidden) for key in keys
    }
    spec = MODEL.model_copy(update={"hidden": hidden, "heads": 8})
    setup, _ = read_ds_config(config, model=spec)
    assert setup.zero.reduce_bucket_size == hf_auto("reduce_bucket_size", hidden)
    assert setup.zero.prefetch_bucket_size == hf_auto("stage3_prefetch_bucket_size", hidden)


def test_ring_factors_are_nccl_tests_definitions_and_the_comms_loggers_convention():
    # nccl-tests doc/PERFORMANCE.md: busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather,
    # reduce_scatter, alltoall), 1 (broadcast, reduce)
    assert rules.bus_factor("all_reduce", 8) == 1.75
    assert rules.bus_factor("all_gather", 4) == rules.bus_factor("reduce_scatter", 4) == 0.75
    assert rules.bus_factor("all_to_all", 4) == 0.75
    assert rules.bus_factor("broadcast", 8) == rules.bus_factor("reduce", 8) == 1.0
    with pytest.raises(ValueError, match="^op: choose one of"):
        rules.bus_factor("alltoall", 4)
    # the comms logger records all_gather by the shard (full / n): n-1 shards go out
    assert rules.wire_factor("all_gather", 4) == 3
    assert rules.wire_factor("all_reduce", 4) == 1.5 and rules.wire_factor("barrier", 4) == 1.0
    assert rules.wire_bytes({"all_gather": 100, "reduce_scatter": 400}, 4) == 600


def test_the_fit_rule_refuses_a_precision_the_gpu_lacks():
    for name, g in catalogue().items():
        assert supports(name, "bf16") == (g.bf16_dense_tflops > 0)
        assert supports(name, "fp16") and supports(name, "fp32")
    small = Setup(
        model=ModelSpec(params=10**6, largest_layer_params=10**5), zero={"precision": "bf16"}, batch={}
    )
    fits = estimate(small).fits
    assert fits["H100-SXM-80GB"] and not fits["V100-SXM2-32GB"]
    assert estimate(small.replace(zero={"precision": "fp16"})).fits["V100-SXM2-32GB"]
    assert fit("V100-SXM2-32GB", "bf16", 1).problem == "precision"
    assert fit("H100-SXM-80GB", "bf16", 2**40).problem == "gpu"
    assert fit("H100-SXM-80GB", "bf16", 1, cpu_bytes_per_node=10, cpu_ram_per_node_bytes=5).problem == "cpu"
    edge = catalogue()["H100-SXM-80GB"].memory_bytes
    assert fit("H100-SXM-80GB", "bf16", edge).ok and not fit("H100-SXM-80GB", "bf16", edge, headroom=0.1).ok


def test_stage3_gather_size_keeps_a_whole_layer_and_the_text_says_so():
    """max_live_parameters below one layer still gathers the whole layer (the max in the formula)."""
    s = Setup(model=MODEL, zero={"stage": 3, "max_live_parameters": 0}, batch={"micro_batch": 1})
    assert rules.stage3_gathered(10**9, 10**8, 5 * 10**7, 0) == 10**8
    assert rules.stage3_gathered(10**9, 10**8, 5 * 10**7, 10**9) == 10**8 + 5 * 10**7
    buffers = estimate(s).terms["buffers"]
    assert "max(largest layer, max live)" in buffers.formula
    assert f"= {10**8:,} gathered params" in buffers.formula


def test_fp32_widths_and_the_paper_text_follow_the_precision():
    s = Setup(model=MODEL, zero={"stage": 2, "precision": "fp32"}, batch={"micro_batch": 1})
    paper = estimate(s, formula="zero-paper")
    assert "(4 + 4 + K) Psi" in paper.notes[0] and "K = 8" in paper.notes[0]
    assert "(2 + 2 + K) Psi" in estimate(s.replace(zero={"precision": "bf16"}), formula="zero-paper").notes[0]
    opt = estimate(s).terms["optimizer_states"]
    assert opt.formula.startswith(f"({rules.FP32} fp32 master + {rules.FP32 * 2} ")
