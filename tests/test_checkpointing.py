"""Activation checkpointing as ``kit.checkpointing`` configures it: the op policy's decisions, the settings'
rules, and the estimate against what Hugging Face's Llama and Qwen2 keep under it (one CPU process, the
runner's own ``Checkpointing`` watched by its ``SavedActivations``). The phase peaks of real runs on 2
ranks are checked in tests/test_peak.py ("llama z2 ckpt-op", "llama z3 ckpt/2")."""

import copy
import json

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kit import checkpointing
from kit.cli import main
from kit.estimate import estimate
from kit.estimate.activations import also_saved, formula, kept_by_policy
from kit.models import from_hf_config, preset, resolve, toy_spec
from kit.ranks.engine import Checkpointing
from kit.ranks.measure import SavedActivations
from kit.schema import Setup
from kit.steptime import perf
from tests.test_activations import CONFIGS
from tests.test_runner import ACTIVATION_RTOL

SELECTIVE = {"activation_checkpointing": True, "checkpoint_policy": "selective-op"}


def test_the_op_policy_keeps_every_other_matmul_and_the_attention():
    rule = checkpointing.OpPolicy()
    mm = torch.ops.aten.mm.default
    assert [rule.keeps(mm) for _ in range(5)] == [True, False, True, False, True]
    assert [rule.keeps(mm, recompute=True) for _ in range(2)] == [True, False]  # counted apart
    assert rule.keeps(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default)
    assert not rule.keeps(torch.ops.aten.addmm.default)  # a linear with a bias
    assert not rule.keeps(torch.ops.aten.silu.default)


def test_every_kth_block_counts_from_one_as_torchtitan_does():
    assert [i for i in range(6) if checkpointing.is_checkpointed(i, 2)] == [1, 3, 5]
    assert [i for i in range(7) if checkpointing.is_checkpointed(i, 3)] == [2, 5]
    assert all(checkpointing.is_checkpointed(i, 1) for i in range(4))


class Recorded(SavedActivations):
    """The runner's counter, also keeping what each checkpointed block handed it (inputs, then kept)."""

    def __init__(self):
        super().__init__()
        self.handed: list[int] = []

    def checkpoint_inputs(self, tensors):
        self.handed.append(sum(t.untyped_storage().nbytes() for t in tensors))
        super().checkpoint_inputs(tensors)


#: what trains under the op policy: every parameter, LoRA (an adapter's A and B are two more matmuls each,
#: counted by the policy), frozen embeddings
SUBSETS = {
    "all": {},
    "lora q,v": {"lora_rank": 4},
    "lora all-linear dropout": {"lora_rank": 4, "lora_targets": ("all-linear",), "lora_dropout": 0.1},
    "lora v,up": {"lora_rank": 8, "lora_targets": ("v_proj", "up_proj")},
    "frozen embeddings": {"freeze_embeddings": True},
}


@pytest.mark.parametrize("subset", list(SUBSETS))
@pytest.mark.parametrize("name", ["llama-gqa", "qwen2"])
def test_selective_checkpointing_keeps_what_the_estimate_says(name, subset):
    from kit.workloads import adapters

    fields = dict(CONFIGS[name])
    implementation = fields.pop("attn_implementation")
    config = AutoConfig.for_model(**fields, max_position_embeddings=128, use_cache=False)
    config._attn_implementation = implementation
    batch, seq = 2, 96
    setup = Setup(
        model=from_hf_config(config.to_dict()),
        cluster={"nodes": 1, "gpus_per_node": 1},
        zero={"precision": "bf16", **SELECTIVE, **SUBSETS[subset]},
        batch={"micro_batch": batch, "seq_len": seq},
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()
    if subset != "all":  # as a rank does (kit.ranks.engine): the subset, the embeddings' output a leaf
        model = adapters.apply(model, setup.zero)
        model.enable_input_require_grads()
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    counter = Recorded()
    with counter.watch(model, Checkpointing(model, 1, "selective-op")):
        model(input_ids=ids, labels=ids).loss.backward()

    layers = config.num_hidden_layers
    kept = counter.handed[1::2]  # per block: its input, then what the op policy kept
    assert kept == [kept_by_policy(setup).bytes] * layers  # exact
    # in backward a block's recomputation saves what autograd saves in it, less what it kept and saves
    # too; with the inputs, the kept tensors and what is saved outside the blocks: the estimate
    predicted = estimate(setup).components["activations"]
    assert counter.bytes == pytest.approx(predicted, rel=ACTIVATION_RTOL), (counter.bytes, predicted)
    plain = formula(setup.replace(zero=setup.zero.checkpointing(False))).bytes
    assert 0 < also_saved(setup) < kept_by_policy(setup).bytes < plain / layers


def _llama(**zero) -> Setup:
    return Setup(
        model=preset("llama-3-8b"),
        cluster={"nodes": 1, "gpus_per_node": 8, "gpu": "H100-SXM-80GB"},
        zero={"stage": 3, **zero},
        batch={"micro_batch": 2, "seq_len": 8192},
    )


def test_the_policies_fall_between_no_checkpointing_and_full():
    none, full = _llama(), _llama(activation_checkpointing=True)
    op, half = _llama(**SELECTIVE), _llama(activation_checkpointing=True, checkpoint_every=2)
    act = {s.label: estimate(s).components["activations"] for s in (none, full, op, half)}
    assert (
        act["z3 bf16 mb2 ckpt"] < act["z3 bf16 mb2 ckpt-op"] < act["z3 bf16 mb2 ckpt/2"] < act["z3 bf16 mb2"]
    )
    flops = {s.label: perf.flops_per_token(s)[0] for s in (none, full, op, half)}
    assert flops["z3 bf16 mb2"] < flops["z3 bf16 mb2 ckpt-op"] < flops["z3 bf16 mb2 ckpt/2"]
    assert flops["z3 bf16 mb2 ckpt/2"] < flops["z3 bf16 mb2 ckpt"]
    # the op policy recomputes k, o and up of Llama's seven projections: their share of the FLOPs
    h, kv, f = 4096, 1024, 14336
    share = (kv + h + f) / (2 * h + 2 * kv + 3 * f)
    assert flops["z3 bf16 mb2 ckpt-op"] - flops["z3 bf16 mb2"] == pytest.approx(share * 2 * none.model.params)


def test_checkpointing_settings_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="checkpoint_every: applies with activation_checkpointing on"):
        _llama(checkpoint_every=2)
    with pytest.raises(ValueError, match=r"zero.checkpoint_every: must be in \[1, 32\]"):
        _llama(activation_checkpointing=True, checkpoint_every=33)
    assert _llama(
        activation_checkpointing=True, checkpoint_every=2, checkpoint_policy="selective-op"
    ).label == ("z3 bf16 mb2 ckpt-op/2")
    # a search that turns checkpointing off and on keeps the policy the user chose
    z = _llama(**SELECTIVE).zero
    assert z.checkpointing(True)["checkpoint_policy"] == "selective-op"
    assert _llama(**SELECTIVE).replace(zero=z.checkpointing(False)).label == "z3 bf16 mb2"


def test_a_traced_model_refuses_what_only_the_formulas_model():
    mlp = resolve("data/examples/mlp.py")
    setup = Setup(model=mlp, zero={"stage": 2, **SELECTIVE}, batch={"micro_batch": 2, "seq_len": 32})
    with pytest.raises(
        ValueError, match="zero.checkpoint_policy: 'selective-op' is modelled for the families"
    ):
        estimate(setup)


def test_deepspeed_stage_3_runs_no_selective_checkpointing_but_estimates_it():
    from kit.run.sweep import check

    toy = Setup(model=toy_spec(), zero={"stage": 3, **SELECTIVE}, batch={"micro_batch": 2})
    with pytest.raises(ValueError, match="DeepSpeed 0.19's ZeRO-3 fails"):
        check(toy)
    assert any("DeepSpeed 0.19's ZeRO-3 fails" in note for note in estimate(_llama(**SELECTIVE)).notes)


def test_the_cli_flags_turn_checkpointing_on(capsys):
    argv = ["estimate", "--model", "llama-3-8b", "--nodes", "1", "--gpus-per-node", "8", "--stage", "3"]
    argv += ["--micro-batch", "2", "--seq-len", "8192", "--checkpoint-policy", "selective-op", "--json"]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["setup"]["zero"]["checkpoint_policy"] == "selective-op"
    assert report["setup"]["zero"]["activation_checkpointing"] is True
    assert report["components"]["activations"] == estimate(_llama(**SELECTIVE)).components["activations"]


def test_the_notebooks_policy_table_reads_each_choice_from_the_estimate():
    from kit.lab import tables

    setup = _llama()
    table = tables.checkpointing_policies(setup)
    assert list(table.index) == [label for label, _ in checkpointing.CHOICES]
    op = _llama(**SELECTIVE)
    assert table.loc["selective (op policy)", "activations GiB"] == round(
        estimate(op).components["activations"] / 2**30, 2
    )
    ratio = perf.flops_per_token(op)[0] / perf.flops_per_token(setup)[0]
    assert table.loc["selective (op policy)", "compute per token"] == f"{ratio:.2f}x"
    assert table.loc["off", "compute per token"] == "1.00x" and table.loc["off", "fits"] == "no"
    # a traced model takes whole-block checkpointing only: the other choices say why, with no number
    mlp = Setup(model=resolve("data/examples/mlp.py"), zero={"stage": 2}, batch={"micro_batch": 2})
    traced = tables.checkpointing_policies(mlp)
    assert traced.loc["every block", "fits"] in ("yes", "no")
    assert "is modelled for the families" in traced.loc["selective (op policy)", "why not"]
    # DeepSpeed's CPU checkpoints stay on where DeepSpeed's checkpoint runs (the full policy), off elsewhere
    offloaded = tables.checkpointing_policies(_llama(**PART_CPU))
    assert offloaded.loc["every block", "activations GiB"] == round(
        estimate(_llama(**PART_CPU)).components["activations"] / 2**30, 2
    )
    assert offloaded.loc["every block", "activations GiB"] < table.loc["every block", "activations GiB"]
    assert offloaded.loc[["off", "selective (op policy)"]].equals(table.loc[["off", "selective (op policy)"]])


def test_launch_cmd_says_how_the_script_checkpoints_which_no_ds_config_key_turns_on(capsys):
    base = ["launch-cmd", "--model", "llama-2-7b", "--stage", "2", "--json"]
    for flags, says in (
        ([], None),
        (["--activation-checkpointing"], "HF Trainer: --gradient_checkpointing"),
        (["--checkpoint-every", "2"], "selective_ac_option 2"),
        (["--checkpoint-policy", "selective-op"], "context_fn=kit.checkpointing.selective_contexts"),
    ):
        assert main([*base, *flags]) == 0
        line = json.loads(capsys.readouterr().out)["checkpointing"]
        assert line is None if says is None else says in line
    assert main(base[:-1] + ["--checkpoint-policy", "selective-op"]) == 0
    out = capsys.readouterr().out
    assert "# activation checkpointing is your script's (no ds_config key says it):" in out
    assert all(len(line) <= 104 for line in out.splitlines() if line.startswith("#   "))


def test_tune_estimates_what_the_engine_cannot_run_and_says_why():
    """The op policy at DeepSpeed's stage 3 is left out of tune's launch (DeepSpeed 0.19 fails there); with
    nothing else to run, tune says why before anything launches."""
    from kit.run.tune import tune

    toy = Setup(model=toy_spec(), zero={"stage": 3, **SELECTIVE}, batch={"micro_batch": 2})
    with pytest.raises(ValueError, match="^zero.checkpoint_policy: 'selective-op' needs a non-reentrant"):
        tune(toy, stages=(3,), offloads=("none",), micro_batches=(2,), progress=False)


#: DeepSpeed's own options: each checkpoint partitioned (model-parallel size 1: a whole copy) into CPU RAM
PART_CPU = {"activation_checkpointing": True, "partition_activations": True, "cpu_checkpointing": True}


def test_deepspeeds_options_take_the_checkpoints_off_the_gpu_into_cpu_ram():
    """GPU estimate: plain checkpointing's activations less the inputs DeepSpeed moves (all but the async
    offload engine's newest two; with partition_activations all but the one a recomputation restores), CPU
    RAM per node plus its copies (all but the newest; with partition_activations all); partition_activations
    alone changes nothing. On CPU ranks the timeline keeps them in rank memory."""
    from kit.estimate.memory import PROCESS_BASE_BYTES, peak_timeline

    plain = _llama(activation_checkpointing=True)
    est = estimate(plain)
    one = 2 * 2 * 8192 * 4096  # bf16 x b s h, the input of one of Llama-3-8B's 32 blocks
    build = 4 * plain.model.largest_layer_params  # zero.Init's largest layer, below the checkpoints
    cases = {  # options: (inputs on the GPU, inputs in CPU RAM)
        "ckpt-cpu": ({"cpu_checkpointing": True}, 2, 31),
        "ckpt-part": ({"partition_activations": True}, 32, 0),
        "ckpt-part-cpu": (PART_CPU, 1, 32),
    }
    for token, (options, on_gpu, on_host) in cases.items():
        setup = plain.replace(zero=options)
        assert setup.label == f"z3 bf16 mb2 {token}"
        got = estimate(setup)
        assert got.components["activations"] == est.components["activations"] - (32 - on_gpu) * one
        assert got.per_gpu_bytes <= est.per_gpu_bytes - (32 - on_gpu) * one * 0.9
        assert est.cpu_bytes_per_node == 8 * (PROCESS_BASE_BYTES + build) and 31 * one > build
        expected = 8 * (PROCESS_BASE_BYTES + on_host * one) if on_host else est.cpu_bytes_per_node
        assert got.cpu_bytes_per_node == expected, token
        cpu_ranks = peak_timeline(setup, implementation="single", backend="gloo").totals
        assert cpu_ranks == peak_timeline(plain, implementation="single", backend="gloo").totals


def test_deepspeeds_options_are_checked_where_they_are_given_and_named_in_labels():
    for field in ("cpu_checkpointing", "partition_activations"):
        with pytest.raises(ValueError, match=f"{field}: applies with activation_checkpointing on; it is off"):
            _llama(**{field: True})
        with pytest.raises(ValueError, match=f"{field}: deepspeed.checkpointing's option, and checkpoint_"):
            _llama(**SELECTIVE, **{field: True})
    setup = _llama(**PART_CPU, checkpoint_every=2)
    assert setup.label == "z3 bf16 mb2 ckpt-part-cpu/2"
    assert setup.label_parts()[-1] == (
        "ckpt-part-cpu/2",
        "activation checkpointing: one block in 2, recomputed from its input, its input partitioned over the "
        "model-parallel group (one GPU: a whole copy), the inputs in CPU RAM",
    )
    # a search that turns checkpointing off and on keeps DeepSpeed's options
    off = setup.replace(zero=setup.zero.checkpointing(False))
    assert off.label == "z3 bf16 mb2" and off.replace(zero=setup.zero.checkpointing(True)) == setup
    # a traced model counts every checkpoint on the device
    mlp = Setup(
        model=resolve("data/examples/mlp.py"), zero={"stage": 2, **PART_CPU}, batch={"micro_batch": 2}
    )
    with pytest.raises(ValueError, match="^zero.cpu_checkpointing: True is modelled for the families"):
        estimate(mlp)


def test_deepspeeds_options_are_its_config_keys_with_its_defaults_and_the_script_calls_configure(capsys):
    from kit.ds_config import to_ds_config
    from kit.settings import CHECKPOINTING_KEYS

    argv = ["launch-cmd", "--model", "llama-2-7b", "--stage", "2", "--activation-checkpointing", "--json"]
    assert main([*argv, "--cpu-checkpointing"]) == 0
    line = json.loads(capsys.readouterr().out)["checkpointing"]
    assert "deepspeed.checkpointing.configure(None, deepspeed_config=ds_config)" in line
    assert "torch.utils.checkpoint, which reads none of them" in line
    from deepspeed.runtime.activation_checkpointing.config import (
        ACT_CHKPT_DEFAULT,
        DeepSpeedActivationCheckpointingConfig,
    )

    assert [k.field for k in CHECKPOINTING_KEYS] == list(checkpointing.DEEPSPEED_FIELDS)
    assert all(ACT_CHKPT_DEFAULT[k.key] == k.default is False for k in CHECKPOINTING_KEYS)
    written = to_ds_config(_llama(**PART_CPU))
    read = DeepSpeedActivationCheckpointingConfig(written)  # DeepSpeed's own reading of the section
    assert (read.cpu_checkpointing, read.partition_activations) == (True, True)
    assert not read.contiguous_memory_optimization and read.number_checkpoints is None


def _tiny_llama():
    """A 3-block Llama as small as the shared sweep's (tests/test_peak.py's SMALL_LLAMA), bf16, SDPA."""
    sizes = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4)
    config = AutoConfig.for_model("llama", **sizes, vocab_size=256, max_position_embeddings=64)
    config.use_cache = False
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return config, AutoModelForCausalLM.from_config(config).to(torch.bfloat16).train()


def test_deepspeeds_cpu_checkpoints_are_the_inputs_the_blocks_hand_over(monkeypatch):
    """The ranks' wrapper under partition_activations and cpu_checkpointing, in one process on the CPU: what
    DeepSpeed keeps of each block's input (its partition, at model-parallel size 1 a whole copy) is the
    estimate's CPU RAM for the checkpoints to the byte; here it stays in this process, so what autograd and
    the checkpoints hold is the GPU estimate plus what it moves off the GPU; the gradients are plain
    checkpointing's. CPU checkpointing alone fails on the CPU (DeepSpeed 0.19.8): one line, before a step."""
    import deepspeed
    import deepspeed.comm

    from kit.estimate.activations import host_checkpoints, moved_checkpoints

    monkeypatch.setattr(deepspeed.comm, "get_rank", lambda group=None: 0)  # configure logs on rank 0
    config, built = _tiny_llama()
    with pytest.raises(ValueError, match="^zero.cpu_checkpointing: DeepSpeed 0.19.8's CPU checkpointing"):
        Checkpointing(built, cpu=True)  # refused before it wraps a block
    batch, seq = 2, 32
    ids = torch.randint(0, config.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(0))
    grads = []
    try:
        for zero in ({"activation_checkpointing": True}, PART_CPU):
            setup = Setup(
                model=from_hf_config(config.to_dict()),
                cluster={"nodes": 1, "gpus_per_node": 1},
                zero={"precision": "bf16", **zero},
                batch={"micro_batch": batch, "seq_len": seq},
            )
            model = copy.deepcopy(built)  # the same weights, checkpointed each way
            counter = Recorded()
            with counter.watch(model, Checkpointing.of(model, setup.zero)):
                model(input_ids=ids, labels=ids).loss.backward()
            grads.append([p.grad for p in model.parameters()])
            predicted = estimate(setup).components["activations"] + moved_checkpoints(setup).bytes
            assert counter.bytes == pytest.approx(predicted, rel=ACTIVATION_RTOL), (counter.bytes, predicted)
        one = 2 * batch * seq * config.hidden_size
        assert counter.handed == [one] * 3 and sum(counter.handed) == host_checkpoints(setup).bytes
        assert all(torch.equal(a, b) for a, b in zip(*grads, strict=True))
    finally:
        deepspeed.checkpointing.configure(None)  # DeepSpeed's module state back to its defaults


def test_a_cpu_rank_run_of_cpu_checkpointing_alone_is_refused_before_launch(monkeypatch):
    """DeepSpeed 0.19.8's CPU checkpointing without partition_activations empties each input on a CPU
    accelerator: ``sweep.check`` refuses it there in one line; with partition_activations, or on a GPU, it
    goes ahead."""
    from kit.run import launcher, sweep

    toy = Setup(model=toy_spec(), cluster={"nodes": 1, "gpus_per_node": 2}, zero=PART_CPU)
    monkeypatch.setattr(launcher, "ranks_accelerator", lambda: "cpu")
    sweep.check(toy)
    alone = toy.replace(zero={"partition_activations": False})
    with pytest.raises(
        ValueError, match="^zero.cpu_checkpointing: DeepSpeed 0.19.8's CPU checkpointing fails"
    ):
        sweep.check(alone)
    monkeypatch.setattr(launcher, "ranks_accelerator", lambda: "cuda")
    sweep.check(alone)
