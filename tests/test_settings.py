"""Issue 40: every ZeRO setting is declared once (``kit.settings.SETTINGS``) and the CLI, both panels and
the ds_config writer and reader follow the declaration: each is walked here against the registry."""

import argparse

import pytest

from kit import checkpointing, settings, trainable
from kit.cli import build_parser
from kit.cli.args import setup_from_args
from kit.ds_config import from_ds_config, to_ds_config
from kit.schema import AioSettings, Setup, ZeroSettings
from kit.settings import SETTINGS

MODEL = "llama-2-7b"
#: the other settings a setting needs to be read at all (momentum: SGD; NVMe's knobs: an NVMe offload)
NVME = {"stage": 3, "offload_optimizer": "nvme", "offload_param": "nvme", "nvme_path": "/local_nvme"}
CONTEXT = {
    "momentum": {"optimizer": "sgd"},
    "lora_targets": {"lora_rank": 8},
    "lora_dropout": {"lora_rank": 8},
    "qlora": {"lora_rank": 8},
    "checkpoint_every": {"activation_checkpointing": True},
    "checkpoint_policy": {"activation_checkpointing": True},
    "cpu_checkpointing": {"activation_checkpointing": True},
    "partition_activations": {"activation_checkpointing": True},
    "nvme_path": NVME,
    "pin_memory": {"stage": 3, "offload_optimizer": "cpu"},
}


def context(s: settings.Setting) -> dict:
    """What ``s`` is changed beside: the last stage that reads it, plus its needs."""
    return {"stage": s.stages[-1], **(NVME if s.section == settings.NVME else {}), **CONTEXT.get(s.field, {})}


def other(s: settings.Setting):
    """A valid value of ``s`` other than its default."""
    special = {"stage": 2, "overlap_comm": False, "lora_targets": ("q_proj",), "nvme_path": "/nvme2"}
    special |= {"offload_optimizer": "cpu", "offload_param": "cpu"}
    if s.field in special:
        return special[s.field]
    if isinstance(s.default, bool):
        return not s.default
    if s.choices:
        return next(c for c in reversed(s.choices) if c != s.default)
    if isinstance(s.default, float):
        return 0.5
    return s.default * 2 if s.default else 2


def changed(s: settings.Setting) -> ZeroSettings:
    return ZeroSettings(**settings.fields({**context(s), s.field: other(s)}))


def parser_flags(command: str) -> dict[str, argparse.Action]:
    sub = next(a for a in build_parser(command)._actions if isinstance(a, argparse._SubParsersAction))
    return {o: a for a in sub.choices[command]._actions for o in a.option_strings}


def test_the_registry_covers_every_field_of_zero_settings_once():
    fields = [s.field for s in SETTINGS]
    assert len(fields) == len(set(fields))
    every = {*ZeroSettings.model_fields, *(f"aio.{f}" for f in AioSettings.model_fields)}
    assert set(fields) == every - set(settings.NOT_SETTINGS)
    # the composite controls' values are their modules' field tuples, in order
    assert tuple(s.field for s in settings.group("checkpointing")) == checkpointing.FIELDS
    assert tuple(s.field for s in settings.group("trainable")) == trainable.FIELDS


@pytest.mark.parametrize("command", ["estimate", "plan", "launch-cmd", "checkpoint"])
def test_each_setting_is_a_flag_and_each_zero_flag_a_setting(command):
    if command == "checkpoint":  # `zerokit checkpoint size`
        sub = next(
            a for a in build_parser("checkpoint")._actions if isinstance(a, argparse._SubParsersAction)
        )
        size = sub.choices["checkpoint"]
        inner = next(a for a in size._actions if isinstance(a, argparse._SubParsersAction))
        flags = {o: a for a in inner.choices["size"]._actions for o in a.option_strings}
    else:
        flags = parser_flags(command)
    for s in SETTINGS:
        assert s.option in flags, (command, s.field)
        assert flags[s.option].dest == s.dest and flags[s.option].default is None
    declared = {o for s in SETTINGS for o in (s.option, *s.aliases, "--no-" + s.option.removeprefix("--"))}
    zero_groups = {s.section for s in SETTINGS}
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    groups = (
        [g for g in sub.choices[command]._action_groups if g.title in zero_groups]
        if command != "checkpoint"
        else []
    )
    for g in groups:
        assert {o for a in g._group_actions for o in a.option_strings} <= declared, g.title


def test_run_takes_every_setting_it_does_not_sweep():
    from kit.cli.run import SWEPT

    flags = parser_flags("run")
    assert [s.field for s in SETTINGS if s.option not in flags] == list(SWEPT[:1])  # --stages instead
    assert {"--stages", "--offload-optimizer", "--offload-param", "--precision"} <= set(flags)


@pytest.mark.parametrize("s", SETTINGS, ids=lambda s: s.field)
def test_each_setting_travels_from_the_flags_it_writes_back_to_the_same_settings(s):
    """``settings.argv`` (what ``zerokit plan`` prints as its launch-cmd line) parsed by ``estimate``'s
    flags gives the very ZeroSettings, for a value of each setting away from its default."""
    zero = changed(s)
    argv = settings.argv(zero)
    assert s.option in argv or f"--no-{s.option[2:]}" in argv
    args = build_parser().parse_args(["estimate", "--model", MODEL, *argv])
    assert setup_from_args(args).zero == zero, argv


@pytest.mark.parametrize("s", [s for s in SETTINGS if not s.script], ids=lambda s: s.field)
def test_each_ds_config_setting_is_written_and_read_back(s):
    """The writer puts each setting with a ds_config key in the file (the file differs from the default's)
    and the reader gives it back; the training script's settings (``script``) have no key."""
    from kit import models

    spec = models.resolve(MODEL)
    cluster = {"nodes": 1, "gpus_per_node": 8}
    base = Setup(model=spec, cluster=cluster, zero=settings.fields(context(s)), batch={"micro_batch": 1})
    setup = base.replace(zero={**changed(s).model_dump()})
    written = to_ds_config(setup)
    assert written != to_ds_config(base), s.field
    back = from_ds_config(written, model=spec, cluster=setup.cluster)
    assert s.value(back.zero) == s.value(setup.zero), s.field


def test_the_training_scripts_settings_are_those_without_a_key():
    assert {s.field for s in SETTINGS if s.script} == {
        *checkpointing.FIELDS, *trainable.FIELDS, "loss", "zero_init", "expandable_segments",
    }  # fmt: skip


def test_the_memory_panel_has_a_control_per_setting_and_each_sets_its_fields(monkeypatch):
    from kit.lab.memory_panel import BY_NAME, MemoryPanel

    panel = MemoryPanel()
    monkeypatch.setattr(panel, "_render", lambda: None)
    assert list(panel.controls) == list(dict.fromkeys(s.name for s in SETTINGS))
    assert set(BY_NAME) == set(panel.controls)
    main = [name for name in panel.controls if BY_NAME[name].main]
    assert {"stage", "hpz", "reduce_bucket", "checkpointing", "trainable", "loss"} <= set(main)
    # the others are in the "More settings" section, none left out
    inside = {c for row in panel.more.children[0].children for c in row.children}
    assert inside == {c for name, c in panel.controls.items() if name not in main}


def test_the_memory_panel_disables_what_the_stage_does_not_read(monkeypatch):
    from kit.lab.memory_panel import BY_NAME, OWN_RULES, MemoryPanel

    panel = MemoryPanel()
    monkeypatch.setattr(panel, "_render", lambda: None)
    for stage in (0, 1, 2, 3):
        panel.stage.value = stage
        for name, control in panel.controls.items():
            s = BY_NAME[name]
            if s.group or s.field in OWN_RULES:
                continue
            offloads = (panel.offload_optimizer.value, panel.offload_param.value)
            assert control.disabled is not settings.applies(s, stage, offloads, panel.optimizer.value), name
    panel.stage.value = 3
    panel.offload_param.value = "nvme"
    assert not panel.aio_block_size.disabled and not panel.buffer_count.disabled and panel.setup is not None
    panel.buffer_count.value = 7
    assert panel.setup.zero.buffer_count == 7
    # a setting whose default is "DeepSpeed's" (None) shows it as a word, never an empty dropdown
    assert panel.overlap_comm.value == "default" and panel.setup.zero.overlap_comm is None
    panel.overlap_comm.value = "off"
    assert panel.setup.zero.overlap_comm is False


def test_the_comparison_panel_offers_what_the_registry_says():
    from kit.lab.comparison_panel import APPLIED, comparison_panel

    panel = comparison_panel(stages=(2, 3), nprocs=2)
    offered = {s.comparison for s in SETTINGS if s.comparison}
    assert all(hasattr(panel, name) for name in offered)
    assert {"stages", "precision", "reduce_bucket", "trainable", "loss", "hpz"} <= offered
    # what it sets on every configuration is made from the registry, as the memory panel's controls are
    for name, s in APPLIED.items():
        assert getattr(panel, name).description == ("trains" if s.group == "trainable" else s.label), name
    panel.reduce_bucket.value = 1e6
    panel.precision.value = "fp32"
    assert {(z.reduce_bucket_size, z.precision) for z in (s.zero for s in panel.setups)} == {(10**6, "fp32")}
