"""``kit.run.sweep.config_id``: resuming a sweep finds a configuration by it, so every field must count.

``LATER_FIELDS`` (left out of the hash while unset, so that older sweeps resume) is derived from the schema:
these tests fail when a field is missed by the hash, or when a later field is not left out while unset.
"""

from __future__ import annotations

import warnings

import pytest

from kit.models import toy_spec
from kit.run import sweep
from kit.schema import Setup

BASE = Setup(model=toy_spec(), zero={"stage": 2}, batch={"micro_batch": 2})
#: a value no field holds by default
CHANGED = "a value no field has"


def fields() -> list[tuple[str, str]]:
    return [
        (section, key) for section, info in Setup.model_fields.items() for key in info.annotation.model_fields
    ]


def with_field(setup: Setup, section: str, key: str, value) -> Setup:
    """``setup`` with one field set, unvalidated (any field, any value: what the hash must notice)."""
    part = getattr(setup, section).model_copy(update={key: value})
    return setup.model_copy(update={section: part})


def cid(setup: Setup) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # pydantic warns when serialising the unvalidated value
        return sweep.config_id(setup)


def test_every_field_is_a_first_or_a_later_one():
    for section, info in Setup.model_fields.items():
        later = set(sweep.LATER_FIELDS.get(section, {}))
        assert set(sweep.FIRST_FIELDS[section]) | later == set(info.annotation.model_fields), section
        assert not set(sweep.FIRST_FIELDS[section]) & later, section


@pytest.mark.parametrize(("section", "key"), fields())
def test_resuming_notices_every_field(section, key):
    """A configuration that differs in any one field is another configuration: a resumed sweep runs it."""
    assert cid(with_field(BASE, section, key, CHANGED)) != cid(BASE)


@pytest.mark.parametrize(("section", "key"), [(s, k) for s, keys in sweep.LATER_FIELDS.items() for k in keys])
def test_an_unset_later_field_hashes_as_before_it_existed(section, key):
    import hashlib
    import json

    data = BASE.model_dump(mode="json")
    assert data[section][key] == sweep.LATER_FIELDS[section][key]  # unset: the schema's default
    for s, keys in sweep.LATER_FIELDS.items():
        for k in keys:
            del data[s][k]
    assert cid(BASE) == hashlib.sha1(json.dumps(data, sort_keys=True).encode()).hexdigest()[:12]
    # the id runs/ folders hold for this configuration since before the NVMe, DDP/FSDP and ZeRO++ fields
    assert cid(BASE) == "819e332f4c18"


def test_a_later_field_without_a_default_is_refused(monkeypatch):
    monkeypatch.setitem(sweep.FIRST_FIELDS, "model", ())  # as if every model field came later
    with pytest.raises(TypeError, match=r"^model\.\w+: a field added to Setup needs a default"):
        sweep.later_fields()


def test_the_labels_legend_leaves_ids_and_labels_as_they_were():
    """Issue 43: a label's parts and their meanings (``Setup.label_parts``) are no field of the Setup:
    neither the id nor the label a record carries changes."""
    assert cid(BASE) == "819e332f4c18" and BASE.label == "z2 bf16 mb2"
    assert BASE.label_parts() == [
        ("z2", "ZeRO stage 2"), ("bf16", "bf16 mixed precision (an fp32 master copy)"),
        ("mb2", "micro batch 2 per rank (GPU or CPU process)"),
    ]  # fmt: skip
    assert not {"label", "label_parts"} & set(BASE.model_dump())
