"""Real 2-rank runs of models that are not the kit's toys, stages 0-3 in one launch: a shrunk Llama
(Hugging Face), a shrunk Mixtral (mixture of experts; also with frozen embeddings at stages 2 and 3, and with
LoRA on every linear layer at stage 3, traced with them), a shrunk BART whose decoder learns 16 tokens of
32 (stages 0 and 3) and a model file.
Measured model-state bytes equal the estimate exactly on every rank; activations match the formula or
the trace; a model file that fails inside the ranks becomes an error record naming its line, and the
sweep goes on. They run in the session's shared 2-rank sweep (tests/conftest.py)."""

from pathlib import Path

import pytest

from kit import models
from kit.estimate import rank_states
from kit.paths import EXAMPLES
from kit.run.sweep import config_id, on_ranks
from kit.schema import Setup
from kit.toys import TOY_ZERO

NPROCS, STEPS, WARMUP = 2, 2, 1
SMALL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}
MIXTRAL = {
    "model_type": "mixtral", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "num_local_experts": 4,
}  # fmt: skip
#: an encoder-decoder whose decoder learns fewer tokens than the encoder reads (``batch.target_len``)
BART = {
    "model_type": "bart", "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 4, "decoder_attention_heads": 4, "encoder_ffn_dim": 128,
    "decoder_ffn_dim": 128, "vocab_size": 256,
}  # fmt: skip
FAILS_IN_RANKS = """import os
import torch

class Net(torch.nn.Linear):
    def forward(self, x):
        if "LOCAL_RANK" in os.environ:  # set by the launcher: the check before launch passes
            raise RuntimeError("the data loader lost its shard")
        return super().forward(x).square().mean()

def model():
    return Net(8, 4)

def batch(micro_batch):
    return (torch.randn(micro_batch, 8),)
"""
ACTIVATION_RTOL = 0.03


def setups(spec, stages=range(4), **zero):
    base = Setup(model=spec, zero={**TOY_ZERO, **zero}, batch={"micro_batch": 2, "seq_len": 32})
    return [on_ranks(base.replace(zero={"stage": stage}), NPROCS) for stage in stages]


def declared(root: Path) -> tuple[dict[str, list[Setup]], Setup, Path]:
    """The groups, the configuration whose model file fails inside the ranks, and that file (in ``root``)."""
    failing = root / "fails_in_ranks.py"
    if not failing.exists():  # the shared sweep's workers declare it too: written once, never rewritten
        failing.write_text(FAILS_IN_RANKS)
    groups = {
        "llama": setups(models.override(models.preset("llama-2-7b"), SMALL)),
        "mixtral": setups(models.from_hf_config(MIXTRAL)),
        "mixtral frozen embeddings": setups(models.from_hf_config(MIXTRAL), (2, 3), freeze_embeddings=True),
        # LoRA through peft on every linear layer and, as peft does for a mixture of experts, its experts
        "mixtral lora": setups(
            models.from_hf_config(MIXTRAL), (3,), lora_rank=4, lora_targets=("all-linear",)
        ),
        "file": setups(models.resolve(str(EXAMPLES / "conv_net.py"))),
        "bart, 16 target tokens": [
            s.replace(batch={"target_len": 16}) for s in setups(models.from_hf_config(BART), (0, 3))
        ],
    }
    broken = setups(models.resolve(str(failing)))[2]
    return groups, broken, failing


def TWO_RANK_SETUPS(root: Path) -> list[Setup]:  # noqa: N802 (what tests/conftest.py reads)
    """Run in the session's shared 2-rank sweep (tests/conftest.py)."""
    groups, broken, _ = declared(root)
    return [
        *groups["llama"],
        broken,
        *(s for name, group in groups.items() if name != "llama" for s in group),
    ]


@pytest.fixture(scope="module")
def sweep(two_rank_sweep):
    groups, broken, failing = declared(two_rank_sweep.root)
    order = [
        *groups["llama"],
        broken,
        *(s for name, group in groups.items() if name != "llama" for s in group),
    ]
    results = two_rank_sweep.results(order, warmup=WARMUP, steps=STEPS)
    return results, groups, broken, failing


@pytest.mark.distributed
def test_every_configuration_ran_but_the_failing_file(sweep):
    results, groups, broken, _ = sweep
    status = results.summary().set_index("config_id")["status"].to_dict()
    assert status.pop(config_id(broken)) == "error"
    assert status == {config_id(s): "ok" for group in groups.values() for s in group}


@pytest.mark.distributed
def test_the_failing_model_file_is_an_error_record_naming_its_line(sweep):
    results, _, broken, failing = sweep
    records = [r for r in results.records if r["setup"]["model"]["source"] == str(failing)]
    errors = {r["rank"]: r["error"] for r in records if r["status"] == "error"}
    assert errors == {
        rank: f"model: {failing}: forward(*batch(1)) raised RuntimeError: the data loader lost its shard "
        "(fails_in_ranks.py line 7, in forward)"
        for rank in range(NPROCS)
    }


@pytest.mark.distributed
@pytest.mark.parametrize(
    "group",
    ["llama", "mixtral", "mixtral frozen embeddings", "mixtral lora", "file", "bart, 16 target tokens"],
)
def test_measured_model_states_equal_the_estimate_on_every_rank(sweep, group):
    results, groups, _, _ = sweep
    wrong = {}
    for setup in groups[group]:
        for rank in range(NPROCS):
            mine = [
                r
                for r in results.records
                if r["config_id"] == config_id(setup) and r.get("rank") == rank and r["status"] == "ok"
            ]
            assert len(mine) == STEPS, (group, setup.label, rank)
            last = mine[-1]
            predicted = rank_states(setup, rank)
            measured = {k: v for k, v in last["measured"].items() if k != "activations"}
            if (measured, last["measured_host"]) != (predicted["device"], predicted["host"]):
                wrong[f"{setup.label} rank {rank}"] = (measured, predicted["device"])
    assert wrong == {}


@pytest.mark.distributed
@pytest.mark.parametrize(
    "group",
    ["llama", "mixtral", "mixtral frozen embeddings", "mixtral lora", "file", "bart, 16 target tokens"],
)
def test_measured_activations_match_the_estimate(sweep, group):
    """Llama by its formula, Mixtral (with frozen embeddings and LoRA too), the model file and BART with its
    own target length by their traces: within 3 % of autograd's."""
    results, groups, _, _ = sweep
    table = results.summary().set_index("config_id")
    for setup in groups[group]:
        row = table.loc[config_id(setup)]
        assert row["measured_activations"] == pytest.approx(row["estimate_activations"], rel=ACTIVATION_RTOL)
