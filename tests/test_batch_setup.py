"""Batch decomposition and the Setup: validation names the field and the allowed values."""

import pytest
from pydantic import ValidationError

from kit import BatchError, Setup, decompositions
from kit.batch import resolve
from kit.models import preset
from kit.schema import one_line_error


def test_any_two_determine_the_third():
    assert resolve(64, micro_batch=1, grad_accum=2) == (1, 2, 128)
    assert resolve(64, micro_batch=1, train_batch=128) == (1, 2, 128)
    assert resolve(64, grad_accum=2, train_batch=128) == (1, 2, 128)
    assert resolve(8, train_batch=32) == (4, 1, 32)  # DeepSpeed: GAS 1 when only the global batch is given


def test_inconsistent_batch_prints_deepspeeds_equation_and_alternatives():
    with pytest.raises(BatchError) as err:
        resolve(8, micro_batch=3, train_batch=100)
    text = str(err.value)
    assert "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size" in text
    assert "100 != 3 * 4 * 8" in text  # DeepSpeed floors 100 // 3 // 8 = 4
    assert "3 x 8 x 4 = 96" in text and "3 x 8 x 5 = 120" in text


def test_all_three_inconsistent():
    with pytest.raises(BatchError, match=r"128 != 1 \* 3 \* 8; .*1 x 8 x 16 = 128"):
        resolve(8, micro_batch=1, grad_accum=3, train_batch=128)


def test_decompositions_lists_every_pair():
    assert [(d.micro_batch, d.grad_accum) for d in decompositions(128, 64)] == [(2, 1), (1, 2)]
    assert len(decompositions(96, 8)) == 6  # 12 has divisors 1, 2, 3, 4, 6, 12
    assert decompositions(100, 8) == []


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"micro_batch": 0}, "micro_batch: must be a whole number >= 1, got 0"),
        ({"train_batch": -4}, "train_batch: must be a whole number >= 1, got -4"),
    ],
)
def test_bad_batch_values(kwargs, message):
    with pytest.raises(BatchError, match=message):
        resolve(8, **kwargs)


def make(**sections):
    sections.setdefault("batch", {"micro_batch": 1})
    return Setup(model=preset("gpt2"), **sections)


@pytest.mark.parametrize(
    "sections, message",
    [
        ({"zero": {"stage": 2, "offload_param": "cpu"}}, "zero.offload_param: needs ZeRO stage 3"),
        (
            {"zero": {"stage": 0, "offload_optimizer": "cpu"}},
            "zero.offload_optimizer: needs ZeRO stage 1, 2 or 3",
        ),
        ({"zero": {"stage": 4}}, "zero.stage: Input should be 0, 1, 2 or 3"),
        ({"cluster": {"gpu": "B300"}}, "cluster.gpu: unknown GPU 'B300'; choose one of A100-SXM-40GB"),
        ({"cluster": {"nodes": 0}}, "cluster.nodes: Input should be greater than or equal to 1"),
        (
            {"batch": {"micro_batch": 1, "seq_len": 4096}},
            "seq_len: must be <= the model's max_seq_len (1024)",
        ),
        ({"zero": {"optimizer": "adamw", "momentum": 0.9}}, "zero.momentum: only applies to optimizer 'sgd'"),
    ],
)
def test_invalid_setups_name_the_field(sections, message):
    with pytest.raises(ValidationError) as err:
        make(**sections)
    assert message in one_line_error(err.value)


def test_setup_is_frozen_and_serialises():
    s = make(cluster={"nodes": 2, "gpus_per_node": 4}, batch={"micro_batch": 1, "grad_accum": 2})
    with pytest.raises(ValidationError):
        s.zero = None
    assert Setup.model_validate(s.model_dump()) == s
    assert s.batch.train_batch == 16 and s.dp == 8 and s.tokens_per_step == 16 * 1024


def test_replace_keeps_micro_batch_and_accumulation():
    s = make(cluster={"nodes": 1, "gpus_per_node": 8}, batch={"micro_batch": 2})
    assert s.replace(cluster={"nodes": 2}).batch.train_batch == 32
    assert s.replace(batch={"train_batch": 64}).batch.grad_accum == 4
    assert s.replace(batch={"train_batch": 64, "grad_accum": 2}).batch.micro_batch == 4
    assert s.replace(zero={"stage": 3}).zero.stage == 3 and s.zero.stage == 2
    with pytest.raises(ValueError, match="optimiser: not a Setup section"):
        s.replace(optimiser={})


def test_label_names_the_configuration():
    s = make(zero={"stage": 3, "offload_optimizer": "cpu", "offload_param": "cpu"}, batch={"micro_batch": 4})
    assert s.label == "z3 opt-off param-off bf16 mb4"
