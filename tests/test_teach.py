"""Tutorial tables and pictures: ranks, shards, bytes per parameter, the ZeRO paper, what fits where."""

import pytest

from kit import models
from kit.components import MODEL_STATES
from kit.lab import teach
from kit.schema import Setup

#: ZeRO paper (arXiv 1910.02054) Table 1, GB per device for 7.5B parameters
PAPER_TABLE_1 = {
    "P_os (ZeRO-1)": [120, 52.5, 35.6, 31.4, 30.4, 30.1],
    "P_os+g (ZeRO-2)": [120, 41.3, 21.6, 16.6, 15.4, 15.1],
    "P_os+g+p (ZeRO-3)": [120, 30, 7.5, 1.88, 0.47, 0.12],
}


@pytest.fixture(scope="module")
def llama7b():
    return Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 2048})


def test_rank_table_two_nodes_of_four():
    table = teach.rank_table(2, 4)
    assert table["rank"].tolist() == list(range(8))
    assert table["node_rank"].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert table["local_rank"].tolist() == [0, 1, 2, 3, 0, 1, 2, 3]
    assert set(table["world_size"]) == {8}


def test_rank_table_rejects_zero_nodes():
    with pytest.raises(ValueError, match=r"^nodes: must be a whole number >= 1, got 0$"):
        teach.rank_table(0, 4)


@pytest.mark.parametrize(
    ("precision", "optimizer", "momentum", "optimizer_bytes", "total"),
    [
        ("bf16", "adamw", 0.0, 12, 16),  # the paper's K = 12
        ("fp16", "adam", 0.0, 12, 16),
        ("fp32", "adamw", 0.0, 8, 16),  # no master copy, 4 + 4 + 8
        ("bf16", "sgd", 0.0, 4, 8),  # master copy only
        ("fp32", "sgd", 0.9, 4, 12),  # momentum buffer only
    ],
)
def test_bytes_per_param(precision, optimizer, momentum, optimizer_bytes, total):
    table = teach.bytes_per_param(precision, optimizer, momentum)
    by = table.groupby("component")["bytes_per_param"].sum()
    assert by["optimizer_states"] == optimizer_bytes
    assert by["total"] == total
    assert by["parameters"] == by["gradients"] == (4 if precision == "fp32" else 2)


def test_bytes_per_param_rejects_unknown_precision():
    with pytest.raises(ValueError, match=r"^precision: choose fp32, fp16 or bf16, got 'int8'$"):
        teach.bytes_per_param("int8")


@pytest.mark.parametrize(("stage", "per_param"), [(0, 16), (1, 4 + 12 / 4), (2, 2 + 14 / 4), (3, 16 / 4)])
def test_shards_held_add_up_to_the_paper_formula(stage, per_param):
    held = teach.shards_held(stage, 4)
    widths = {"parameters": 2, "gradients": 2, "optimizer_states": 12}
    for rank in range(4):
        total = sum(widths[s] * len(held.loc[rank, s]) / 4 for s in MODEL_STATES)
        assert total == per_param
    if stage:
        assert held.loc[2, "optimizer_states"] == [2]
    assert held.loc[3, "parameters"] == ([3] if stage == 3 else [0, 1, 2, 3])


def test_shard_figure_draws_held_shards():
    import matplotlib.pyplot as plt

    fig = teach.shard_figure(ranks=2, stages=(0, 3))
    top, bottom = fig.axes[:2]
    white = (1.0, 1.0, 1.0, 1.0)
    # 3 states x 2 shards x 2 ranks cells per panel; stage 0 fills all 12, stage 3 half of them
    assert len(top.patches) == len(bottom.patches) == 12
    assert sum(p.get_facecolor() != white for p in top.patches) == 12
    assert sum(p.get_facecolor() != white for p in bottom.patches) == 6
    assert top.get_title().startswith("stage 0") and "(2+2+K)Ψ/N" in bottom.get_title()
    plt.close(fig)


def test_zero_paper_table_reproduces_table_1():
    table = teach.zero_paper_table()
    assert list(table.columns) == [1, 4, 16, 64, 256, 1024]
    for row, values in PAPER_TABLE_1.items():
        digits = [0, 1, 1, 1, 1, 1] if row != "P_os+g+p (ZeRO-3)" else [0, 0, 1, 2, 2, 2]
        for ours, paper, d in zip(table.loc[row], values, digits, strict=True):
            assert abs(ours - paper) <= 0.5 * 10**-d + 1e-9, (row, ours, paper)  # the paper rounds half up
    assert set(table.loc["baseline DP"]) == {120.0}


def _toy(**zero) -> Setup:
    spec = models.from_hf_config(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    )
    return Setup(model=spec, cluster={"gpus_per_node": 2}, zero=zero, batch={"micro_batch": 2})


def _record(setup: Setup, config_id: str, rank: int, step: int, **fields) -> dict:
    record = {"sweep": "t", "run_id": "r1", "config_id": config_id, "label": setup.label, "rank": rank}
    record.update(setup=setup.model_dump(mode="json"), world_size=2, step=step, status="ok", error=None)
    return {**record, **fields}


def test_states_check_compares_every_rank_with_rank_states():
    from kit.estimate import rank_states
    from kit.run.results import Results

    setup = _toy(stage=2)
    records = []
    for rank in (0, 1):
        exact = rank_states(setup, rank)
        measured = dict(exact["device"], gradients=exact["device"]["gradients"] + (2 if rank else 0))
        records.append(_record(setup, "a", rank, 2, measured=measured, measured_host=exact["host"]))
    records.append(_record(setup, "a", 0, 3, measured={}, measured_host={}, status="error"))  # ignored
    check = teach.states_check(Results(records))
    assert len(check) == 2 * 8
    wrong = check[check["difference"] != 0]
    assert wrong[["rank", "where", "component", "difference"]].values.tolist() == [
        [1, "device", "gradients", 2]
    ]
    # stage 2 shards gradients by the tensors touching each rank's partition: the two ranks differ
    grads = check[(check["component"] == "gradients") & (check["where"] == "device")]["predicted"].tolist()
    assert grads == [
        rank_states(setup, 0)["device"]["gradients"],
        rank_states(setup, 1)["device"]["gradients"],
    ]
    assert grads[0] != grads[1]


def test_sweep_table_medians_per_configuration():
    from kit.run.results import Results

    small, large = _toy(stage=3, reduce_bucket_size=10_000), _toy(stage=3, reduce_bucket_size=1_000_000)
    records = [
        _record(s, cid, 0, step, step_time_s=t, measured_buffers=b)
        for s, cid, b in ((small, "s", 20_000), (large, "l", 2_000_000))
        for step, t in ((2, 1.0), (3, 3.0), (4, 2.0))
    ]
    records.append(_record(small, "s", 1, 2, step_time_s=9.0, measured_buffers=0))  # rank 1: not shown
    table = teach.sweep_table(
        Results(records), ("zero.reduce_bucket_size",), ("step_time_s", "measured_buffers")
    )
    assert table.to_dict("records") == [
        {
            "label": small.label,
            "zero.reduce_bucket_size": 10_000,
            "step_time_s": 2.0,
            "measured_buffers": 20_000,
        },
        {
            "label": large.label,
            "zero.reduce_bucket_size": 1_000_000,
            "step_time_s": 2.0,
            "measured_buffers": 2e6,
        },
    ]
    with pytest.raises(ValueError, match=r"^settings/metrics: no column setup_zero_nope"):
        teach.sweep_table(Results(records), ("zero.nope",))
