"""The grid of valid configurations: every refused combination has DeepSpeed's reason (``kit.rules``),
every accepted one is a valid Setup that DeepSpeed's own parser and engine-start checks accept."""

from __future__ import annotations

import pytest

from kit import grid
from kit.ds_config import deepspeed_refusals, to_ds_config
from kit.rules import Offload, baseline_problem, hpz_cluster_problem, offload_problem, zeropp_problem
from kit.schema import Cluster, ModelSpec, Setup

MODEL = ModelSpec(name="t", params=10**9, largest_layer_params=10**8, layers=32, hidden=4096, heads=32)
CLUSTER = Cluster(nodes=2, gpus_per_node=4)
ZEROPP = [
    grid.ZEROPP_OFF,
    {"hpz_partition_size": 2},
    {"hpz_partition_size": 4, "quantized_weights": True, "quantized_gradients": True},
    {"quantized_gradients": True},
]
PRECISIONS = ("fp32", "fp16", "bf16")
#: every stage choice x offload x offload x precision, ZeRO++ on stage 3
FULL = grid.grid(
    offload_optimizer=tuple(Offload),
    offload_param=tuple(Offload),
    precision=PRECISIONS,
    zeropp=ZEROPP,
    cluster=CLUSTER,
)


def expected_problem(v: grid.Variant) -> tuple[str, str] | None:
    """The first of kit.rules' refusals the variant meets, in the schema's order."""
    return (
        offload_problem(v.stage, v.offload_optimizer, v.offload_param)
        or baseline_problem(v.engine, v.stage, v.offload_optimizer, v.offload_param, v.precision)
        or zeropp_problem(v.stage, v.hpz_partition_size, v.quantized_weights, v.quantized_gradients)
        or hpz_cluster_problem(v.hpz_partition_size, CLUSTER.gpus_per_node, CLUSTER.world_size)
    )


def setup_of(v: grid.Variant) -> Setup:
    nvme = {"nvme_path": "/local_nvme"} if Offload.NVME in (v.offload_optimizer, v.offload_param) else {}
    return Setup(model=MODEL, cluster=CLUSTER, zero={**v.zero, **nvme}, batch={"micro_batch": 2})


def test_the_full_grid_counted():
    # per precision: stage 0 1, stages 1-2 2 each (optimizer to cpu or not), stage 3 3 x 3 offloads x 4
    # ZeRO++ (the hpZ ones fit 4 GPUs per node); the baselines 3 except in fp16
    assert len(FULL.accepted) == 3 * (1 + 2 + 2 + 9 * 4) + 2 * 3
    assert len(FULL.accepted) == len(set(FULL.accepted))
    assert len(FULL.refused) == len({r.variant for r in FULL.refused})


def test_every_refused_combination_has_its_rule_and_the_setup_refuses_it_alike():
    assert FULL.refused
    for refused in FULL.refused:
        assert (refused.field, refused.reason) == expected_problem(refused.variant), refused
        if refused.field != "hpz_partition_size":  # the cluster's rule is the Setup's, checked below
            with pytest.raises(ValueError, match=refused.field):
                setup_of(refused.variant)
    three = grid.variants(("3",), zeropp=[{"hpz_partition_size": 3}], cluster=CLUSTER)
    assert [v.hpz_partition_size for v in three.accepted] == [1]
    assert [(r.field, r.reason) for r in three.refused] == [hpz_cluster_problem(3, 4, 8)]
    with pytest.raises(ValueError, match="hpz_partition_size: must divide gpus_per_node"):
        setup_of(three.refused[0].variant)


def test_every_accepted_combination_is_a_setup_deepspeed_accepts():
    for v in FULL.accepted:
        assert expected_problem(v) is None, v
        setup = setup_of(v)
        assert (setup.zero.engine, setup.zero.stage, setup.zero.precision) == (v.engine, v.stage, v.precision)
        if v.engine != "deepspeed":
            with pytest.raises(ValueError, match="PyTorch's own engine"):
                to_ds_config(setup)
            continue
        refusals, _ = deepspeed_refusals(to_ds_config(setup, torch_adam=True), setup.dp)
        assert refusals == [], (setup.label, refusals)


def test_variants_offload_levels_to_cpu_or_nvme():
    def labels(found):
        return [f"{v.choice} {v.offload_optimizer}/{v.offload_param}" for v in found.accepted]

    most = grid.variants(("0", "1", "2", "3", "ddp"), offload=("none", "most"))
    assert labels(most) == ["0 none/none", "1 none/none", "1 cpu/none", "2 none/none", "2 cpu/none"] + [
        "3 none/none",
        "3 cpu/cpu",
        "ddp none/none",
    ]
    # NVMe where the stage swaps to files (stage 3), CPU below it; parameters only at stage 3
    panel = grid.variants((2, 3, "fsdp"), offload=("none", "optimizer", "all"), to="nvme")
    assert labels(panel) == ["2 none/none", "2 cpu/none", "3 none/none", "3 nvme/none", "3 nvme/nvme"] + [
        "fsdp none/none"
    ]
    assert [(r.variant.choice, r.variant.offload_param, r.field) for r in panel.refused] == [
        ("2", "cpu", "offload_param"),
        ("fsdp", "none", "offload_optimizer"),
        ("fsdp", "cpu", "offload_optimizer"),
    ]
    assert "offload is DeepSpeed's" in panel.refused[1].reason


def test_variants_zeropp_of_stage_3_only_and_precision():
    hpz = {"hpz_partition_size": 4, "quantized_weights": True}
    found = grid.variants(("2", "3", "fsdp"), zeropp=[hpz], precision="fp16")
    assert [(v.choice, v.hpz_partition_size, v.quantized_weights) for v in found.accepted] == [
        ("2", 1, False),
        ("3", 1, False),
        ("3", 4, True),
    ]
    assert [(r.variant.choice, r.field) for r in found.refused] == [("fsdp", "precision")]
    assert all(v.zero["precision"] == "fp16" for v in found.accepted)
    assert "precision" not in grid.Variant.of(3).zero  # None: the Setup keeps its own


def test_bad_choices_name_the_argument():
    with pytest.raises(
        ValueError, match=r"^stages: choose from 0, 1, 2, 3, ddp, fsdp, fsdp-grad-op, got '4'"
    ):
        grid.variants(("4",))
    with pytest.raises(ValueError, match="^offload: choose from none, optimizer, all, most, got 'cpu'"):
        grid.variants(offload=("cpu",))
    with pytest.raises(ValueError, match="^to: choose cpu or nvme, got 'none'"):
        grid.variants(to="none")
