"""The kit's two vocabularies as ``StrEnum``s: offload devices (``kit.rules.Offload``, what the
``ZeroSettings.offload_*`` fields hold) and memory components (``kit.components.Component``). Members are
the strings records, JSON files, labels and table columns hold: validation turns strings into members,
and every way out turns members back into the same strings."""

from __future__ import annotations

import json

import pandas as pd

from kit.components import COMPONENTS, HELD, MEASURED, MODEL_STATES, Component
from kit.estimate import estimate, rank_states
from kit.models import toy_spec
from kit.rules import Offload
from kit.run import sweep
from kit.schema import Setup, ZeroSettings

OFFLOADED = Setup(
    model=toy_spec(),
    zero={"stage": 3, "offload_optimizer": "cpu", "offload_param": "nvme", "nvme_path": "/local_nvme"},
    batch={"micro_batch": 2},
)


def test_offload_fields_hold_members_after_validation_from_strings():
    z = OFFLOADED.zero
    assert z.offload_optimizer is Offload.CPU and z.offload_param is Offload.NVME
    assert ZeroSettings().offload_optimizer is Offload.NONE and ZeroSettings().offload_param is Offload.NONE
    back = Setup.model_validate_json(OFFLOADED.model_dump_json())
    assert back == OFFLOADED and back.zero.offload_param is Offload.NVME


def test_a_setup_with_offloads_round_trips_through_json_with_the_same_strings():
    dumped = OFFLOADED.model_dump()
    text = json.dumps(dumped)  # how records and the kit's JSON files are written
    assert '"offload_optimizer": "cpu"' in text and '"offload_param": "nvme"' in text
    assert json.loads(text) == OFFLOADED.model_dump(mode="json")
    assert type(OFFLOADED.model_dump(mode="json")["zero"]["offload_optimizer"]) is str
    assert Setup.model_validate(json.loads(text)) == OFFLOADED
    assert sweep.config_id(Setup.model_validate(json.loads(text))) == sweep.config_id(OFFLOADED)
    assert OFFLOADED.label == "z3 opt-off param-nvme bf16 mb2"


def test_offload_properties_say_what_the_comparisons_meant():
    assert not ZeroSettings().offloaded and not ZeroSettings().nvme
    assert ZeroSettings(stage=2, offload_optimizer="cpu").offloaded
    assert OFFLOADED.zero.offloaded and OFFLOADED.zero.nvme
    # an unvalidated copy holding plain strings (kit.planning.plan.search_variants) reads the same
    assert OFFLOADED.zero.model_copy(update={"offload_param": "nvme", "offload_optimizer": "none"}).nvme


def test_tables_show_the_offload_strings():
    table = pd.DataFrame(
        [{"offload_optimizer": z.offload_optimizer} for z in (OFFLOADED.zero, ZeroSettings())]
    )
    assert table.to_string().split() == ["offload_optimizer", "0", "cpu", "1", "none"]
    on_cpu = [True, False]
    assert (
        (table.offload_optimizer == "cpu").tolist()
        == (table.offload_optimizer == Offload.CPU).tolist()
        == on_cpu
    )


def test_components_are_the_strings_in_the_order_of_every_table():
    assert COMPONENTS == ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")
    assert MODEL_STATES == ("parameters", "gradients", "optimizer_states")
    assert HELD[3:] == ("buffers",) and MEASURED[4:] == ("activations",) and MEASURED[:4] == HELD
    assert all(isinstance(c, Component) for c in COMPONENTS)


def test_estimates_write_the_component_strings():
    e = estimate(OFFLOADED)
    assert list(e.components) == list(COMPONENTS)
    assert e.components["parameters"] == e.components[Component.PARAMETERS]
    written = json.loads(json.dumps(e.to_dict()))
    assert list(written["components"]) == ["parameters", "gradients", "optimizer_states", "activations",
                                           "buffers", "overhead"]  # fmt: skip
    states = json.loads(json.dumps(rank_states(OFFLOADED)))
    assert list(states["host"]) == ["parameters", "gradients", "optimizer_states", "buffers"]
