"""ZeRO++ (Wang et al. 2023): hpZ, qwZ and qgZ in Setup, ds_config, estimate, communication, plan,
explain and the memory panel; hpZ measured on 4 CPU ranks as 2 simulated nodes x 2."""

from __future__ import annotations

import json
import math

import pytest

from kit import models, rules
from kit.cli import main
from kit.ds_config import read_ds_config, to_ds_config, validate_ds_config
from kit.estimate import estimate, partition, rank_states
from kit.lab.memory_panel import memory_panel
from kit.lab.teach.zero_plus_plus import zeropp_table
from kit.planning import plan
from kit.review import explain_ds_config
from kit.rules import DS_PERSISTENCE_THRESHOLD, wire_factor
from kit.run import launcher, sweep
from kit.run.local_nodes import per_node, run_setups_on_local_nodes
from kit.schema import Setup, one_line_error
from kit.steptime import perf
from kit.steptime.comm import (
    collective_calls,
    collectives,
    comm_by_scope,
    comm_bytes,
    frozen_released,
    tied_regathered,
)
from kit.toys import TOY_ZERO, hpz_toy_setups

LLAMA = models.preset("llama-2-7b")
TWO_NODES = {"nodes": 2, "gpus_per_node": 8}
ALL_THREE = {"hpz_partition_size": 8, "quantized_weights": True, "quantized_gradients": True}
#: measured on 2 simulated nodes x 2 (tests/conftest.py's shared session): stage 3, stage 3 + hpZ (persistence
#: threshold 1,000, no prefetch, no reuse), and hpZ with optimizer and parameters offloaded to CPU
HPZ_RUNS = list(hpz_toy_setups().values())
HPZ_RUNS.append(HPZ_RUNS[1].replace(zero={"offload_optimizer": "cpu", "offload_param": "cpu"}))
LOCAL_NODE_SETUPS = HPZ_RUNS


def llama(nodes: int = 2, **zero) -> Setup:
    return Setup(
        model=LLAMA,
        cluster={"nodes": nodes, "gpus_per_node": 8},
        zero={"stage": 3, **zero},
        batch={"micro_batch": 1, "seq_len": 4096},
    )


def error_line(**zero) -> str:
    with pytest.raises(ValueError) as error:
        Setup(model=LLAMA, cluster=TWO_NODES, zero=zero, batch={"micro_batch": 1})
    return one_line_error(error.value)


def test_setup_fields_validate_and_label():
    assert llama(**ALL_THREE).label == "z3 hpz8 qwz qgz bf16 mb1"
    assert error_line(stage=2, hpz_partition_size=8) == (
        "zero.hpz_partition_size: ZeRO++ needs ZeRO stage 3 (got stage 2); DeepSpeed ignores it below stage 3"
    )
    assert error_line(stage=1, quantized_gradients=True).startswith("zero.quantized_gradients: ZeRO++ needs")
    assert error_line(stage=3, hpz_partition_size=3) == (
        "hpz_partition_size: must divide gpus_per_node (8) and the data-parallel size (16), got 3: the "
        "secondary partition lives inside one node"
    )
    assert error_line(stage=3, hpz_partition_size=0).startswith("zero.hpz_partition_size: Input should be")
    # unset ZeRO++ fields hash as before they existed: older sweeps keep their config ids
    plain = llama()
    data = plain.model_dump(mode="json")
    for key in ("hpz_partition_size", "quantized_weights", "quantized_gradients"):
        assert sweep.LATER_FIELDS["zero"][key] == data["zero"][key]
    assert sweep.config_id(plain) != sweep.config_id(llama(hpz_partition_size=8))


def test_ds_config_export_import_and_deepspeeds_parser():
    s = llama(**ALL_THREE)
    config = to_ds_config(s)
    zero = config["zero_optimization"]
    assert (
        zero["zero_hpz_partition_size"],
        zero["zero_quantized_weights"],
        zero["zero_quantized_gradients"],
    ) == (
        8,
        True,
        True,
    )
    assert "zero_hpz_partition_size" not in to_ds_config(llama())["zero_optimization"]  # defaults left out
    parsed = validate_ds_config(config, s.dp).zero_config  # DeepSpeed's own parser reads the same
    assert (
        parsed.zero_hpz_partition_size,
        parsed.zero_quantized_weights,
        parsed.zero_quantized_gradients,
    ) == (
        8,
        True,
        True,
    )
    back, notes = read_ds_config(config, model=LLAMA, cluster=TWO_NODES, seq_len=4096)
    assert back.zero == s.zero and notes == []
    # below stage 3 DeepSpeed never reads them: the import ignores them and says so
    low = {"train_batch_size": 16, "zero_optimization": {"stage": 2, "zero_quantized_weights": True}}
    setup, notes = read_ds_config(low, model=LLAMA, cluster=TWO_NODES)
    assert setup.zero.quantized_weights is False
    assert notes[0] == "zero_optimization.zero_quantized_weights: ignored, ZeRO++ needs stage 3 (got stage 2)"


@pytest.mark.parametrize("key", ["mics_shard_size", "mics_hierarchical_params_gather"])
def test_mics_import_says_it_was_removed_and_points_to_hpz(key):
    config = {"train_batch_size": 16, "zero_optimization": {"stage": 3, key: 8}}
    with pytest.raises(ValueError) as error:
        read_ds_config(config, model=LLAMA, cluster=TWO_NODES)
    assert str(error.value) == (
        f"zero_optimization.{key}: MiCS was removed from DeepSpeed 0.19 (its config parser refuses the key); "
        'for a parameter partition inside each node use ZeRO++ hpZ, "zero_hpz_partition_size": <GPUs per '
        "node> (stage 3)"
    )


def test_hpz_secondary_partition_bytes():
    """What _partition_param_sec allocates: per released (non-persistent) tensor, numel padded to a
    multiple of dp, divided by hpz, in bf16; nothing for tensors kept whole."""
    tensors = models.tensor_numels(LLAMA)
    released = [t for t in tensors if t > DS_PERSISTENCE_THRESHOLD]
    expected = 2 * sum(math.ceil(t / 16) * 16 // 8 for t in released)
    base, hpz = rank_states(llama()), rank_states(llama(hpz_partition_size=8))
    assert hpz["device"]["parameters"] - base["device"]["parameters"] == expected
    assert expected == 2 * 842_268_672  # 1/8 of the 16-bit model, a whole node's share
    assert "hpZ secondary partition" in estimate(llama(hpz_partition_size=8)).formulas["parameters"]
    # with the parameters offloaded, the secondary partition is on the CPU too (Init's remote_device)
    off = rank_states(llama(hpz_partition_size=8, offload_param="cpu", offload_optimizer="cpu"))
    off0 = rank_states(llama(offload_param="cpu", offload_optimizer="cpu"))
    assert off["host"]["parameters"] - off0["host"]["parameters"] == expected
    assert off["device"]["parameters"] == off0["device"]["parameters"]
    # qwZ / qgZ add transient buffers only (int8 gather buffer, int4 gradient send + receive)
    z3, q = estimate(llama()), estimate(llama(quantized_weights=True, quantized_gradients=True))
    fetch = min(LLAMA.params, LLAMA.largest_layer_params + partition.prefetch_call(llama()))
    assert q.components["buffers"] - z3.components["buffers"] == fetch + LLAMA.largest_layer_params
    assert q.model_states_bytes == z3.model_states_bytes


def test_paper_table_reproduced():
    """ZeRO++ paper: ZeRO-3 moves 3M across nodes per step, ZeRO++ 0.5M + 0 + 0.25M = 0.75M."""
    table = zeropp_table(llama()).set_index("setting")
    assert table["paper cross-node (M)"].to_dict() == {
        "ZeRO-3": 3.0,
        "hpZ": 2.0,
        "qwZ": 2.0,
        "qgZ": 2.25,
        "ZeRO++ (hpZ + qwZ + qgZ)": 0.75,
    }
    row = table.loc["ZeRO++ (hpZ + qwZ + qgZ)"]
    assert (row["paper forward all-gather (M)"], row["paper backward all-gather (M)"]) == (0.5, 0.0)
    assert row["paper gradient reduce-scatter (M)"] == 0.25
    assert table.loc["ZeRO-3", "intra-node GiB/GPU"] == 0 and row["intra-node GiB/GPU"] > 0
    assert row["inter-node GiB/GPU"] < table.loc["ZeRO-3", "inter-node GiB/GPU"] / 5
    assert table.loc["hpZ", "per_gpu_gib"] > table.loc["ZeRO-3", "per_gpu_gib"]  # hpZ pays in memory


def test_collectives_per_gpu_split_intra_inter():
    m, n, g, nodes = 2 * LLAMA.params, 16, 8, 2
    # tensors kept whole (the norms, <= stage3_param_persistence_threshold) are gathered once after the step
    mp = 2 * sum(t for t in partition.numels(llama()) if t <= llama().zero.param_persistence_threshold)
    mg = m - mp
    z3 = {c.name: (c.scope, c.bytes) for c in collectives(llama())}
    assert z3 == {
        "forward all-gather": ("inter", round((n - 1) / n * mg)),
        "backward all-gather": ("inter", round((n - 1) / n * mg)),
        "persistent all-gather": ("inter", round((n - 1) / n * mp)),
        "gradient reduce-scatter": ("inter", round((n - 1) / n * m)),
    }
    assert 0 < mp < 1e-4 * m
    assert comm_bytes(llama())[0] == sum(b for _, b in z3.values())  # 3 (N-1)/N M, less M_p
    pp = {c.name: (c.scope, c.bytes) for c in collectives(llama(**ALL_THREE))}
    assert pp == {
        "forward all-gather": ("inter", round(0.5 * (n - 1) / n * mg)),
        "backward all-gather": ("intra", round(0.5 * (8 - 1) / 8 * mg)),
        "persistent all-gather": ("inter", round((n - 1) / n * mp)),
        "gradient reduce-scatter (qgZ hop 1)": ("intra", round(0.25 * (g - 1) / g * m)),
        "gradient reduce-scatter (qgZ hop 2)": ("inter", round(0.25 * (nodes - 1) / nodes * m / g)),
    }
    # the step-time model sends each scope over its own link
    s = llama(**ALL_THREE)
    hw, assume = perf.hardware(s), perf.Assumptions()
    scope = comm_by_scope(s)
    ring = min(hw.intra_gbps, hw.inter_gbps) * assume.link_efficiency * 1e9  # the node's NICs together
    rail = hw.inter_gbps / 8 * assume.link_efficiency * 1e9  # qgZ's all-to-all: one GPU's own NIC
    fast = hw.intra_gbps * assume.link_efficiency * 1e9
    hop2 = pp["gradient reduce-scatter (qgZ hop 2)"][1]
    t = perf.step_time(s, hw, assume)
    wire = (scope["inter"] - hop2) / ring + hop2 / rail + scope["intra"] / fast
    assert t.comm.seconds == pytest.approx(wire + perf.load(s).latency_s)
    assert "inter-node" in t.comm.formula and "intra-node" in t.comm.formula
    # one node: nothing crosses a NIC, hpZ's group is the whole world again
    one = {c.name: c.scope for c in collectives(llama(nodes=1, hpz_partition_size=8))}
    assert set(one.values()) == {"intra"}
    # qgZ's all-to-all needs several nodes (stage3.py: num_nodes > 1); one node reduce-scatters as usual
    single = llama(nodes=1, quantized_gradients=True)
    assert [c.name for c in collectives(single)][-1] == "gradient reduce-scatter"
    assert estimate(single).components["buffers"] == estimate(llama(nodes=1)).components["buffers"]


def test_hpz_toy_collectives_follow_deepspeeds_gathers():
    """The rehearsal's pair (``hpz_toy_setups``: no prefetch, no reuse, threshold 1,000): DeepSpeed gathers
    each released tensor for forward over all 4 ranks, copies its secondary partition at the release (no
    collective), gathers it for backward inside the node from there (h = 2), and gathers the tied
    embedding (512 x 64) a second time in each pass, the head's forward use and the embedding's backward
    one, both from the secondary partition with hpZ; the 18 norms and biases once after the step."""
    spec, (z3, hpz) = models.toy_spec(), hpz_toy_setups().values()
    numels = models.tensor_numels(spec)
    e, mg = 2 * 512 * 64, 2 * sum(t for t in numels if t > 1000)
    mp, m = 2 * sum(numels) - mg, 2 * spec.params
    assert tied_regathered(z3) == tied_regathered(hpz) == 512 * 64 and spec.tied_embeddings
    assert {c.name: (c.scope, c.bytes) for c in collectives(z3)} == {
        "forward all-gather": ("inter", 3 * mg // 4),
        "backward all-gather": ("inter", 3 * mg // 4),
        "tied embedding re-gather": ("inter", 2 * 3 * e // 4),
        "persistent all-gather": ("inter", 3 * mp // 4),
        "gradient reduce-scatter": ("inter", 3 * m // 4),
    }
    assert {c.name: (c.scope, c.bytes) for c in collectives(hpz)} == {
        "forward all-gather": ("inter", 3 * mg // 4),
        "backward all-gather": ("intra", mg // 2),
        "tied embedding re-gather": ("intra", 2 * e // 2),
        "persistent all-gather": ("inter", 3 * mp // 4),
        "gradient reduce-scatter": ("inter", 3 * m // 4),
    }
    assert comm_by_scope(hpz) == {"intra": 200_704, "inter": 410_880} and comm_bytes(hpz)[0] == 611_584
    assert comm_by_scope(z3) == {"intra": 0, "inter": 711_936}
    calls = [(op, n) for op, n, _ in collective_calls(hpz)]
    assert ("all_gather", 2) in calls  # the tied embedding's second gather, once per pass
    # kept gathered across its two uses, it is not gathered again: within max_reuse_distance (the
    # elements between them), inside the prefetch window, or whole (at most the persistence threshold)
    between = spec.params - 512 * 64
    assert tied_regathered(hpz.replace(zero={"max_reuse_distance": between + 1})) == 0
    assert tied_regathered(hpz.replace(zero={"max_reuse_distance": between})) == 512 * 64
    window = {"prefetch_bucket_size": 10**6, "max_live_parameters": 10**6}
    assert tied_regathered(hpz.replace(zero=window)) == 0
    assert tied_regathered(hpz.replace(zero={"param_persistence_threshold": 100_000})) == 0
    assert tied_regathered(llama()) == 0  # Llama's head is a tensor of its own
    # GPT-2 XL with DeepSpeed's defaults: 1.48e9 elements between the two uses, past the 1e9 reuse distance
    xl = Setup(model=models.preset("gpt2-xl"), cluster=TWO_NODES, zero={"stage": 3}, batch={"micro_batch": 1})
    assert tied_regathered(xl) == 50257 * 1600
    assert tied_regathered(xl.replace(model=models.preset("gpt2"))) == 0


def test_hpz_gathers_frozen_tensors_inside_the_node_in_forward_too():
    """A trainable subset's frozen tensors are in no optimizer group, so ``invalidate_secondary_tensor``
    never drops their secondary partition: with hpZ, forward gathers them inside the node as well."""
    lora = llama(hpz_partition_size=8, lora_rank=16)
    mf = 2 * frozen_released(lora)
    assert mf > 0.99 * 2 * LLAMA.params and rules.hpz_from_secondary(trains=False, first_of_step=True)
    parts = {c.name: (c.scope, c.bytes) for c in collectives(lora)}
    mg = 2 * sum(t for t in partition.numels(lora) if t > lora.zero.param_persistence_threshold)
    assert parts["forward all-gather (frozen, hpZ secondary)"] == ("intra", round(7 / 8 * mf))
    assert parts["forward all-gather"] == ("inter", round(15 / 16 * (mg - mf)))
    assert parts["backward all-gather"] == ("intra", round(7 / 8 * mg))
    plain = {c.name for c in collectives(llama(lora_rank=16))}  # without hpZ: over all ranks, as before
    assert "forward all-gather (frozen, hpZ secondary)" not in plain


def test_cpu_runs_refuse_quantized_weights_and_gradients(monkeypatch):
    toy = Setup(
        model=models.toy_spec(), cluster={"nodes": 1, "gpus_per_node": 2}, zero={**TOY_ZERO, "stage": 3}
    )
    monkeypatch.setattr(launcher, "ranks_accelerator", lambda: "cpu")
    for field in ("quantized_weights", "quantized_gradients"):
        with pytest.raises(ValueError) as error:
            sweep.check(toy.replace(zero={field: True}))
        assert str(error.value) == (
            f"zero.{field}: needs DeepSpeed's CUDA quantizer kernels (This op had not been implemented on "
            "CPU backend); estimate and export it here, run it on a GPU"
        )
    sweep.check(toy.replace(zero={"hpz_partition_size": 2}))  # hpZ runs on CPU
    monkeypatch.setattr(launcher, "ranks_accelerator", lambda: "cuda")
    sweep.check(toy.replace(zero={"quantized_weights": True, "quantized_gradients": True}))


def test_cli_flags_and_estimate_terms(capsys):
    argv = ["estimate", "--model", "llama-2-7b", "--nodes", "2", "--stage", "3", "--micro-batch", "1"]
    assert main([*argv, "--hpz", "8", "--quantized-weights", "--quantized-gradients", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {k: data["setup"]["zero"][k] for k in ALL_THREE} == ALL_THREE
    assert "hpZ secondary partition" in data["formulas"]["parameters"]
    assert "qwZ 1 B x" in data["formulas"]["buffers"] and "qgZ 2 x 0.5 B" in data["formulas"]["buffers"]
    assert main([*argv[:-4], "--stage", "2", "--hpz", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.endswith(
        "zero.hpz_partition_size: ZeRO++ needs ZeRO stage 3 (got stage 2); DeepSpeed ignores it below stage 3"
    )


def test_plan_searches_zeropp_on_several_nodes():
    found = plan.search(llama(), gpus=["H100-SXM-80GB"], max_nodes=4, train_batch=64, checkpointing=(False,))
    table = found.table
    zpp = table[table.zeropp != ""]
    assert set(zpp.zeropp) == {"hpz8", "hpz8 qwz qgz"} and (zpp.nodes > 1).all() and (zpp.stage == 3).all()
    row = zpp[zpp.zeropp == "hpz8 qwz qgz"].iloc[0]
    s = found.setup(row.name)
    assert s.zero.hpz_partition_size == 8 and s.zero.quantized_weights and s.zero.quantized_gradients
    assert row.comm_inter_gib * 2**30 == pytest.approx(comm_by_scope(s)["inter"])
    same = table[(table.zeropp == "") & (table.stage == 3) & (table.offload_optimizer == "none")]
    same = same[(same.nodes == row.nodes) & (same.micro_batch == row.micro_batch)].iloc[0]
    assert row.step_s < same.step_s and row.comm_inter_gib < same.comm_inter_gib / 5


def test_explain_reports_each_zeropp_key(tmp_path):
    path = tmp_path / "ds_config.json"
    config = {"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True}}
    config["zero_optimization"] = {"stage": 3, "zero_hpz_partition_size": 8}
    config["zero_optimization"] |= {"zero_quantized_weights": True, "zero_quantized_gradients": True}
    path.write_text(json.dumps(config))
    found = {f.key: f for f in explain_ds_config(path, model=LLAMA, cluster=TWO_NODES).findings}
    hpz = found["zero_optimization.zero_hpz_partition_size"]
    assert hpz.severity == "info" and "+1.57 GiB per GPU" in hpz.message
    assert "across nodes 11.96 GiB -> 6.08 GiB" in hpz.message
    assert "CUDA quantizer" in found["zero_optimization.zero_quantized_gradients"].message
    one = explain_ds_config(path, model=LLAMA, cluster={"nodes": 1, "gpus_per_node": 8}).findings
    assert next(f for f in one if f.key.endswith("hpz_partition_size")).severity == "warning"


def test_memory_panel_zeropp_controls():
    panel = memory_panel(llama())
    panel.hpz.value = 8
    panel.quantized_weights.value = True
    assert panel.error is None and panel.setup.label == "z3 hpz8 qwz bf16 mb1"
    assert (
        panel.estimate.per_gpu_bytes
        == estimate(llama(hpz_partition_size=8, quantized_weights=True)).per_gpu_bytes
    )
    panel.stage.value = 2  # ZeRO++ is stage 3 only: the controls turn off
    assert (panel.hpz.value, panel.hpz.disabled, panel.quantized_weights.value) == (1, True, False)
    assert panel.error is None
    panel.stage.value = 3
    panel.hpz.value = 3
    assert panel.error.startswith("hpz_partition_size: must divide gpus_per_node (8)")


@pytest.mark.distributed
def test_hpz_measured_on_two_simulated_nodes(local_nodes_run):
    """Stage 3 and stage 3 + hpZ=2 on 4 CPU ranks as 2 nodes x 2 (the shared local-node launch), step 1.

    Asserted: (1) every rank's measured model-state bytes equal ``rank_states`` exactly, so the
    secondary partition is what the estimate says (a third configuration offloads optimizer and
    parameters to CPU: the secondary partition is then in host memory); (2) per collective, the
    in-node and cross-node bytes ``CommScopes`` saw add up to what DeepSpeed's comms logger recorded;
    (3) without hpZ nothing runs in a group inside one node (every group spans both nodes), as the
    prediction says; (4) with hpZ the reduce-scatter is unchanged and still crosses nodes, the
    cross-node all-gathers shrink to one gather of each parameter partition per step (2 B x S), the
    other all-gathers run inside the node, and the cross-node bytes on the wire fall, as
    ``kit.steptime.comm.collectives`` predicts.
    """
    spec, setups = models.toy_spec(), HPZ_RUNS
    rows = local_nodes_run.of(setups, steps=(1,))
    labels = {"z3 bf16 mb1", "z3 hpz2 bf16 mb1", "z3 opt-off param-off hpz2 bf16 mb1"}
    assert {(r["label"], r["status"]) for r in rows} == {(label, "ok") for label in labels}
    by = {(r["label"], r["rank"]): r for r in rows}
    assert len(by) == 12
    for (label, rank), r in by.items():
        setup = Setup.model_validate(r["setup"])
        predicted = rank_states(setup, rank)
        assert {k: r["measured"][k] for k in predicted["device"]} == predicted["device"], (label, rank)
        assert r["measured_host"] == predicted["host"], (label, rank)  # offloaded: the secondary too
        scopes = r["comm_scope_bytes"]  # comm_bytes adds them up (DeepSpeed's logger agrees: test_runner)
        for op, sent in r["comm_bytes"].items():
            assert scopes["intra"].get(op, 0) + scopes["inter"].get(op, 0) == sent, (label, op)
    secondary = 2 * sum(math.ceil(t / 4) * 2 for t in models.tensor_numels(spec) if t > 1000)
    plain, hpz = by[("z3 bf16 mb1", 0)], by[("z3 hpz2 bf16 mb1", 0)]
    assert hpz["measured"]["parameters"] - plain["measured"]["parameters"] == secondary
    assert plain["comm_scope_bytes"]["intra"] == {} and plain["comm_scope_wire_bytes"]["intra"] == 0
    assert comm_by_scope(setups[0])["intra"] == 0
    s_elements = sum(math.ceil(t / 4) for t in models.tensor_numels(spec))
    assert hpz["comm_scope_bytes"]["inter"]["all_gather"] == 2 * s_elements
    assert hpz["comm_scope_bytes"]["intra"]["all_gather"] > 0
    assert hpz["comm_bytes"]["reduce_scatter"] == plain["comm_bytes"]["reduce_scatter"]
    assert hpz["comm_scope_bytes"]["inter"]["reduce_scatter"] == plain["comm_bytes"]["reduce_scatter"]
    assert "reduce_scatter" not in hpz["comm_scope_bytes"]["intra"]
    assert hpz["comm_scope_wire_bytes"]["inter"] < plain["comm_scope_wire_bytes"]["inter"]
    predicted = comm_by_scope(setups[1])
    assert predicted["intra"] > 0 and predicted["inter"] < comm_by_scope(setups[0])["inter"]
    # measured beside modelled, per rank and scope, within 1 % (tests/test_two_nodes.py's tolerance). In
    # the node: exactly, backward's gathers and the tied embedding's second one of each pass, all from the
    # secondary partition. Across nodes the estimate leaves out the gradient norm's all-reduce (8 B, or 4
    # B with the optimizer offloaded; 1.5 x on the wire) and, in this first measured step only, 1,320 B of
    # broadcasts: DeepSpeed checks that every rank recorded the same module and parameter order
    # (``reset_step``'s ``assert_ints_same_as_other_ranks``) once the warmup step's trace is complete.
    for (label, rank), r in by.items():
        expected = comm_by_scope(Setup.model_validate(r["setup"]))
        sent, logged = r["comm_scope_wire_bytes"], r["comm_scope_bytes"]["inter"]
        assert sent["intra"] == expected["intra"], (label, rank)
        assert logged["broadcast"] == 1_320 and logged["all_reduce"] in (4, 8), (label, rank)
        left_out = wire_factor("all_reduce", 4) * logged["all_reduce"] + logged["broadcast"]
        assert sent["inter"] - expected["inter"] == left_out, (label, rank)
        assert abs(sent["inter"] / expected["inter"] - 1) < 0.01, (label, rank)
    assert hpz["comm_scope_wire_bytes"]["intra"] == predicted["intra"] == 200_704
    # the per-node table: each row's ranks, their bytes inside and across nodes adding up to what each
    # rank sent in all, beside the estimate's split of ``comm_bytes`` (the record's prediction)
    nodes = per_node(rows, ("localhost", "127.0.0.1"))
    assert sorted((n["label"], n["node_rank"], n["ranks"]) for n in nodes) == [
        (label, node, [2 * node, 2 * node + 1]) for label in sorted(labels) for node in (0, 1)
    ]
    for n in nodes:
        mine = [by[(n["label"], rank)] for rank in n["ranks"]]
        each = {sum(r["comm_scope_wire_bytes"].values()) for r in mine}
        assert n["wire_bytes"] == n["intra_wire_bytes"] + n["inter_wire_bytes"] == each.pop() and not each
        assert n["estimate_wire_bytes"] == n["estimate_intra_wire_bytes"] + n["estimate_inter_wire_bytes"]
        assert {r["estimate_comm_wire_bytes"] for r in mine} == {n["estimate_wire_bytes"]}
        assert {r["comm_wire_bytes"] for r in mine} == {n["wire_bytes"]}  # the total: the rows
        assert abs(n["wire_bytes"] / n["estimate_wire_bytes"] - 1) < 0.01, n


def test_local_nodes_refuses_before_launch(tmp_path, monkeypatch):
    toys = hpz_toy_setups()
    with pytest.raises(ValueError, match=r"^cluster.nodes: must be >= 2 for a multi-node rehearsal, got 1$"):
        run_setups_on_local_nodes([toys["ZeRO-3"].replace(cluster={"nodes": 1})], tmp_path)
    with pytest.raises(ValueError, match=r"^setups: all must share one cluster shape"):
        run_setups_on_local_nodes([toys["ZeRO-3"], toys["ZeRO-3"].replace(cluster={"nodes": 4})], tmp_path)
    monkeypatch.setattr(launcher, "ranks_accelerator", lambda: "cpu")
    with pytest.raises(
        ValueError, match=r"^config 0 \(z3 qwz bf16 mb1\): zero.quantized_weights: needs Deep"
    ):
        run_setups_on_local_nodes([toys["ZeRO-3"].replace(zero={"quantized_weights": True})], tmp_path)
    assert not (tmp_path / "records.jsonl").exists()  # nothing launched


def test_zerokit_run_applies_zeropp_flags_to_the_stage3_configurations():
    from kit.cli import build_parser
    from kit.cli.run import setups_from_args

    args = build_parser().parse_args(["run", "--stages", "2,3", "--nprocs", "2", "--hpz", "2"])
    assert [s.label for s in setups_from_args(args)] == ["z2 bf16 mb2", "z3 hpz2 bf16 mb2"]
