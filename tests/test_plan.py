"""Planning: the smallest cluster per ZeRO variant, the largest micro batch, a global batch's choices."""

import pandas as pd
import pytest

from kit import models
from kit.estimate import estimate, plan
from kit.schema import Setup
from kit.units import GIB


@pytest.fixture(scope="module")
def llama7b():
    return Setup(model=models.preset("llama-2-7b"), batch={"micro_batch": 1, "seq_len": 2048})


def test_smallest_cluster_is_the_first_that_fits(llama7b):
    table = plan.smallest_cluster(llama7b, max_nodes=4)
    assert len(table) == 6
    # 7B x 16 B = 108 GB of model states alone: plain data parallelism never fits an 80 GB GPU
    assert table.loc[0, "verdict"] == "does not fit on 32 GPUs"
    assert pd.isna(table.loc[0, "gpus"]) and pd.isna(table.loc[0, "per_gpu_gib"])
    sizes = [(1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8)]
    for row in table.itertuples():
        if row.verdict != "fits":
            continue
        change = plan.DEFAULT_VARIANTS[row.Index]
        i = sizes.index((row.nodes, row.gpus // row.nodes))

        def fits(nodes, gpus, change=change):
            s = llama7b.replace(cluster={"nodes": nodes, "gpus_per_node": gpus}, zero=change, batch={})
            return estimate(s)

        found = fits(*sizes[i])
        assert found.fits["H100-SXM-80GB"] and round(found.per_gpu_bytes / GIB, 2) == row.per_gpu_gib
        assert all(not fits(*smaller).fits["H100-SXM-80GB"] for smaller in sizes[:i])
    # ZeRO-1/2 need 4 GPUs, ZeRO-3 only 2, optimizer offload 1: the verdicts the README teaches
    assert list(table["gpus"].iloc[1:]) == [4, 4, 1, 2, 1]


def test_largest_micro_batch_is_the_boundary(llama7b):
    ckpt = llama7b.replace(zero={"stage": 3, "activation_checkpointing": True})
    micro = plan.largest_micro_batch(ckpt)
    assert micro == 49  # 8 x H100 80 GB, seq 2048: 2sbh per layer kept, one layer recomputed
    assert estimate(ckpt.replace(batch={"micro_batch": micro})).fits["H100-SXM-80GB"]
    assert not estimate(ckpt.replace(batch={"micro_batch": micro + 1})).fits["H100-SXM-80GB"]
    too_big = Setup(
        model=models.preset("llama-2-70b"), cluster={"gpus_per_node": 1}, batch={"micro_batch": 1}
    )
    assert plan.largest_micro_batch(too_big) == 0


def test_batch_options_for_a_global_batch(llama7b):
    table = plan.batch_options(llama7b, 64)
    assert [(r.micro_batch, r.grad_accum) for r in table.itertuples()] == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert set(table["train_batch"]) == {64}
    one = estimate(llama7b.replace(batch={"micro_batch": 1, "grad_accum": 8}))
    assert table.loc[3, "activations_gib"] == round(one.components["activations"] / GIB, 2)
    assert table["activations_gib"].is_monotonic_decreasing
    with pytest.raises(
        ValueError, match=r"^train_batch: must be a multiple of the data-parallel size 8, got 60"
    ):
        plan.batch_options(llama7b, 60)
