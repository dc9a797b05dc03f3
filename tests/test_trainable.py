"""What trains (``kit.trainable``): LoRA through peft and frozen groups, counted on the meta device, estimated
op by op, refused in one line where the kit does not model them. The CPU-rank runs (model states to the
byte, the peak per phase within 3 %) are in tests/test_peak.py's launch."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from kit import models, trainable
from kit.cli import main
from kit.estimate import estimate, partition
from kit.schema import Setup
from kit.workloads import adapters
from tests.test_activations import DTYPES, TOLERANCE, config_and_setup, saved_by, saved_bytes

SUBSETS = {
    "lora q,v": {"lora_rank": 8},
    "lora all-linear": {"lora_rank": 8, "lora_targets": ("all-linear",)},
    "lora all-linear dropout": {"lora_rank": 8, "lora_targets": ("all-linear",), "lora_dropout": 0.1},
    "lora o": {"lora_rank": 4, "lora_targets": ("o_proj",)},
    "lora down,k": {"lora_rank": 4, "lora_targets": ("down_proj", "k_proj")},
    "frozen embeddings": {"freeze_embeddings": True},
    "first block frozen": {"frozen_blocks": 1},
    "both frozen": {"frozen_blocks": 1, "freeze_embeddings": True},
}


def _setup(model, **zero) -> Setup:
    return Setup(
        model=model,
        cluster={"gpus_per_node": 8},
        zero=zero,
        batch={"micro_batch": 1, "seq_len": min(4096, model.max_seq_len or 4096)},
    )


def _peft_counts(name: str, **lora) -> tuple[int, int]:
    """peft's own ``get_nb_trainable_parameters`` (what ``print_trainable_parameters`` prints) of the
    preset built on meta by transformers, apart from the kit."""
    from peft import LoraConfig, get_peft_model

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.for_model(**models.config_of(models.preset(name)))
        )
    config = LoraConfig(**{"lora_dropout": 0.0, **lora})
    return get_peft_model(model, config).get_nb_trainable_parameters()


@pytest.mark.parametrize(
    ("name", "zero", "lora"),
    [
        ("llama-2-7b", {"lora_rank": 16}, {"r": 16}),
        (
            "llama-2-7b",
            {"lora_rank": 16, "lora_targets": ("all-linear",)},
            {"r": 16, "target_modules": "all-linear"},
        ),
        (
            "qwen2.5-0.5b",
            {"lora_rank": 8, "lora_targets": ("q_proj", "o_proj")},
            {"r": 8, "target_modules": ["q_proj", "o_proj"]},
        ),
        ("qwen2.5-0.5b", {"lora_rank": 8, "lora_dropout": 0.1}, {"r": 8, "lora_dropout": 0.1}),
        # the kit's GPT against transformers' GPT-2: peft's default c_attn, all-linear without the head
        ("gpt2-xl", {"lora_rank": 16}, {"r": 16}),
        (
            "gpt2-medium",
            {"lora_rank": 8, "lora_targets": ("all-linear",)},
            {"r": 8, "target_modules": "all-linear"},
        ),
    ],
)
def test_lora_counts_are_pefts(name, zero, lora):
    s = _setup(models.preset(name), **zero)
    listing = adapters.listing(s.model, s.zero)
    assert (listing.trainable, listing.total) == _peft_counts(name, **lora)
    assert partition.trainable_params(s) == listing.trainable
    if name == "llama-2-7b" and "lora_targets" not in zero:  # peft's docs: 32 layers x q, v x r (4096 + 4096)
        assert listing.trainable == 32 * 2 * 16 * (4096 + 4096) == 8_388_608
    if name == "gpt2-xl":  # 48 layers x c_attn x r (1600 in + 4800 out)
        assert listing.trainable == 48 * 16 * (1600 + 4800) == 4_915_200


def test_frozen_groups_and_a_tied_head():
    qwen = models.preset("qwen2.5-0.5b")  # its head is its embedding
    frozen = adapters.listing(qwen, _setup(qwen, freeze_embeddings=True).zero)
    assert not frozen.embeddings and "lm_head" not in frozen.head and frozen.total == qwen.params
    assert qwen.params - frozen.trainable == qwen.vocab * qwen.hidden
    first = adapters.listing(qwen, _setup(qwen, frozen_blocks=23).zero)
    assert [b.params > 0 for b in first.blocks] == [False] * 23 + [True]
    assert first.embeddings and "lm_head" in first.head  # the tied embedding still trains, as the head


def test_model_states_follow_what_deepspeed_builds_for_the_trainable_part():
    """Optimizer states, master weights and gradients for the adapters only; frozen 16-bit weights whole
    at stages 0-2 and partitioned with the rest at stage 3 (to the byte on CPU ranks: tests/test_peak.py)."""
    m = models.preset("llama-2-7b")
    full, lora = _setup(m, stage=2), _setup(m, stage=2, lora_rank=16)
    t = partition.trainable_params(lora)
    assert t == 8_388_608
    p = estimate(lora).components
    flat = -(-t // 16) * 16  # padded to 2 x dp
    assert p["optimizer_states"] == 12 * flat // 8
    assert p["parameters"] == 2 * flat + 2 * (m.params)  # every base weight frozen, all of it on every GPU
    assert estimate(full).components["optimizer_states"] > 800 * p["optimizer_states"]
    z3 = estimate(_setup(m, stage=3, lora_rank=16)).components
    assert z3["parameters"] < p["parameters"] / 7  # stage 3 partitions the frozen weights too


@pytest.mark.parametrize("precision", ["bf16", "fp32"])
@pytest.mark.parametrize("config", ["llama-gqa", "qwen2"])
@pytest.mark.parametrize("subset", list(SUBSETS))
def test_activations_are_what_autograd_saves_with_a_subset(config, precision, subset):
    """HF's Llama and Qwen2 with the subset applied (``adapters.apply``: peft for LoRA), in the run's
    dtype, against ``_subset_saved``'s op-by-op account, as tests/test_activations.py does for full
    training (same tolerance: the O(s^2 + bs) tensors it leaves out)."""
    config, setup = config_and_setup(config, precision=precision, **SUBSETS[subset])
    torch.manual_seed(0)
    model = adapters.apply(AutoModelForCausalLM.from_config(config), setup.zero).to(DTYPES[precision]).train()
    measured = saved_bytes(model, 2, 96, config.vocab_size)
    assert measured == pytest.approx(estimate(setup).components["activations"], rel=TOLERANCE)


def test_lora_saves_less_than_training_every_parameter_and_stage_3_saves_every_linear_input():
    m = models.preset("llama-2-7b")
    full, lora = (
        estimate(_setup(m, stage=2, **z)).components["activations"] for z in ({}, {"lora_rank": 16})
    )
    assert 0.7 * full < lora < full  # the frozen projections' inputs, the norms' normalised inputs
    # zero.Init's zero3_linear_wrap saves every linear's input whether a gradient needs it or not
    z3 = estimate(_setup(m, stage=3, lora_rank=16)).components["activations"]
    assert lora < z3 < full


@pytest.mark.parametrize(
    ("zero", "message"),
    [
        ({"lora_targets": ("q_proj",)}, "lora_targets: applies with lora_rank > 0"),
        ({"lora_rank": 8, "freeze_embeddings": True}, "freeze_embeddings: LoRA already freezes"),
        (
            {"lora_rank": 8, "engine": "ddp", "stage": 0},
            "engine: a trainable subset is modelled for DeepSpeed",
        ),
        (
            {"lora_rank": 8, "lora_targets": ("all-linear", "q_proj")},
            "lora_targets: 'all-linear' stands alone",
        ),
        (
            {
                "lora_rank": 8,
                "qlora": True,
                "activation_checkpointing": True,
                "checkpoint_policy": "selective-op",
            },
            "checkpoint_policy: selective checkpointing with QLoRA is not modelled yet",
        ),
        ({"frozen_blocks": 32}, "frozen_blocks: must be in [0, 31]"),
        ({"lora_dropout": 0.1}, "lora_dropout: applies with lora_rank > 0"),
        ({"lora_rank": 8, "lora_dropout": 1.0}, "lora_dropout\n  Input should be less than 1"),
    ],
)
def test_what_is_not_modelled_is_refused_in_one_line(zero, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        _setup(models.preset("llama-2-7b"), **zero)


def test_a_family_without_the_op_account_is_refused():
    neox = models.preset("pythia-1b")
    with pytest.raises(
        ValueError, match="zero.freeze_embeddings: a trainable subset is modelled for llama, mistral, qwen2"
    ):
        Setup(model=neox, zero={"freeze_embeddings": True}, batch={"micro_batch": 1, "seq_len": 64})


def test_cli_flags_estimate_launch_and_plan(capsys, tmp_path):
    assert main(["estimate", "--model", "llama-2-7b", "--stage", "3", "--lora-rank", "16"]) == 0
    out = capsys.readouterr().out
    assert "LoRA r=16 on peft's default modules" in out and "over the 8,388,608 trainable" in out
    assert "checkpoint on disk        -  not modelled for a trainable subset yet" in out
    assert main(["estimate", "--model", "llama-2-7b", "--lora-targets", "q_proj"]) == 2
    assert capsys.readouterr().err.strip() == (
        "zerokit estimate: zero.lora_targets: applies with lora_rank > 0 (LoRA); lora_rank is 0"
    )
    argv = [
        "launch-cmd",
        "--model",
        "llama-2-7b",
        "--stage",
        "3",
        "--freeze-embeddings",
        "--out",
        str(tmp_path),
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert (
        "# what trains is your script's (no ds_config key says it):" in out and "requires_grad_(False)" in out
    )
    assert main(["plan", "--model", "llama-2-7b", "--lora-rank", "16", "--gpus", "H100-SXM-80GB"]) == 0
    out = capsys.readouterr().out
    assert "--lora-rank 16" in out.split("ds_config: ")[1].splitlines()[0]


def test_a_panel_choice_is_a_setting():
    for label, values in trainable.CHOICES:
        zero = dict(zip(trainable.FIELDS, values, strict=True))
        assert trainable.choices(_setup(models.preset("llama-2-7b"), **zero).zero) == list(
            trainable.CHOICES
        ), label
    own = _setup(models.preset("llama-2-7b"), lora_rank=4, lora_targets=("o_proj",)).zero
    assert trainable.choices(own)[-1] == (
        "LoRA r=4 on o_proj (peft), every base weight frozen",
        trainable.key(own),
    )


def test_a_traced_model_takes_frozen_embeddings_and_lora():
    """Mixtral and BART are traced (no formula): frozen embeddings and LoRA apply in the trace (peft's
    adapters built on the meta device, then made fake: ``kit.estimate.trace._with_subset``; measured on ranks
    in tests/test_own_model_runs.py). LoRA's trainable count is peft's own on transformers' model; with LoRA
    on BART what autograd saves in one process is the trace's; frozen blocks and QLoRA are refused, and what
    peft refuses is one line."""
    from peft import LoraConfig, get_peft_model

    from kit import workloads
    from tests.test_own_model_runs import BART, MIXTRAL

    mixtral = models.from_hf_config(MIXTRAL)
    batch = {"micro_batch": 2, "seq_len": 32}
    full = estimate(Setup(model=mixtral, batch=batch))
    frozen = estimate(Setup(model=mixtral, zero={"freeze_embeddings": True}, batch=batch))
    assert frozen.components["activations"] < full.components["activations"]  # the first norm saves nothing
    assert frozen.components["optimizer_states"] < full.components["optimizer_states"]
    lora = Setup(model=mixtral, zero={"lora_rank": 4, "lora_targets": ("q_proj", "v_proj")}, batch=batch)
    listing = adapters.listing(lora.model, lora.zero)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**MIXTRAL))
    peft = get_peft_model(
        hf, LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    ).get_nb_trainable_parameters()
    assert (
        (listing.trainable, listing.total)
        == peft
        == (2 * 4 * (64 + 64 + 64 + 32), mixtral.params + 1792)  # 2 blocks: q (64 -> 64), v (64 -> 2 x 16)
    )
    traced = estimate(lora).components
    assert traced["activations"] < full.components["activations"]
    assert traced["optimizer_states"] == 12 * listing.trainable // 8  # 1,792 adapters' elements on 8 GPUs
    bart = Setup(
        model=models.from_hf_config(BART), zero={"lora_rank": 4, "lora_targets": ("all-linear",)}, batch=batch
    )
    workload = workloads.for_model(bart.model)
    torch.manual_seed(0)
    model = adapters.apply(workload.build().to(torch.bfloat16), bart.zero).train()
    args, kwargs = workload.micro_batch([0, 1], 32, 0)
    assert saved_by(model, *args, **kwargs) == pytest.approx(
        estimate(bart).components["activations"], rel=TOLERANCE
    )
    with pytest.raises(
        ValueError, match="zero.frozen_blocks: mixtral is traced .* takes frozen embeddings and LoRA"
    ):
        Setup(model=mixtral, zero={"frozen_blocks": 1}, batch=batch)
    with pytest.raises(ValueError, match="zero.qlora: .*; mixtral's traced layers are not yet"):
        Setup(model=mixtral, zero={"lora_rank": 4, "qlora": True}, batch=batch)
    experts = Setup(
        model=mixtral,
        zero={"lora_rank": 4, "lora_targets": ("all-linear",), "lora_dropout": 0.1},
        batch=batch,
    )
    with pytest.raises(
        ValueError, match="^lora_rank: peft cannot build these adapters on the model: lora.Param"
    ):
        estimate(experts)
    default = Setup(model=mixtral, zero={"lora_rank": 4}, batch=batch)  # no target peft finds by default
    with pytest.raises(ValueError) as refused:
        estimate(default)
    assert str(refused.value) == (
        "lora_targets: peft found no default in the model; its linear layers: q_proj, k_proj, v_proj, "
        "o_proj, lm_head (or 'all-linear')"
    )


def test_a_panel_offers_only_what_its_model_takes():
    """The comparison panel's dropdowns for a fixed model (``kit.lab.ui.trainable`` / ``loss`` with the
    model): the toy GPT takes every subset (QLoRA estimated only, as for Llama) and every loss; a traced
    model frozen embeddings only (its LoRA targets are the user's: ``trainable.choices``) and the plain
    loss."""
    from kit import loss as losses
    from kit.lab import ui
    from kit.schema import ZeroSettings
    from tests.test_own_model_runs import MIXTRAL

    z = ZeroSettings()
    toy, mixtral = models.toy_spec(), models.from_hf_config(MIXTRAL)
    assert trainable.choices(z, toy) == list(trainable.CHOICES)
    assert [label for label, _ in trainable.choices(z, mixtral)] == ["every parameter", "frozen embeddings"]
    assert trainable.choices(z, models.preset("llama-2-7b")) == list(trainable.CHOICES)
    assert losses.choices(z, toy) == losses.choices(z, None) == list(losses.CHOICES)
    assert losses.choices(z, mixtral) == [("plain", "plain")]
    assert not ui.trainable(z, toy).disabled and not ui.trainable(z).disabled
    assert ui.trainable(z, models.preset("pythia-1b")).disabled  # GPT-NeoX: no op-by-op account


def test_the_notebook_tables_are_the_estimates():
    """Notebook 07's tables (``kit.lab.tables``): each row's numbers are its setting's estimate."""
    from kit.lab import tables
    from kit.units import GIB

    s = _setup(models.preset("llama-2-7b"), stage=3)
    subsets = tables.trainable_subsets(s)
    assert list(subsets.index) == [label for label, _ in trainable.CHOICES]
    lora = estimate(s.replace(zero={"lora_rank": 16}))
    row = subsets.loc["LoRA r=16"]
    assert row["trainable"] == "8,388,608" and row["peak / GPU GiB"] == round(lora.per_gpu_bytes / GIB, 2)
    losses = tables.loss_choices(s)
    chunked = estimate(s.replace(zero={"loss": "chunked"}))
    assert losses.loc["chunked (Liger)", "peak / GPU GiB"] == round(chunked.per_gpu_bytes / GIB, 2)
    assert losses.loc["plain", "activations GiB"] > losses.loc["chunked (Liger)", "activations GiB"]


def test_lora_dropout_saves_each_adapters_dropped_copy_and_its_mask():
    """peft's dropout before each adapter's A (``torch.native_dropout``, ``kit.workloads.adapters``): A
    saves the dropped copy (2 B x its input) instead of the input itself, the dropout a bool mask (1 B) where
    that input needs a gradient. Llama-2-7B, all-linear, stage 2, embeddings frozen: block 0's q, k, v
    input needs none (3 copies less the shared input: 4sbh), o's does (SDPA saves its input anyway: copy
    and mask 3sbh), gate and up 2 x 3sbh less their input (4sbh), down 3sbf less its input (sbf); the later
    blocks' q, k, v masks too (7sbh). Checkpointed, only the block recomputed in backward holds them.
    What autograd saves is measured in one process (``SUBSETS``) and on CPU ranks (tests/test_peak.py)."""
    m = models.preset("llama-2-7b")
    sbh, sbf = 4096 * m.hidden, 4096 * m.ffn

    def extra(**zero) -> int:
        lora = {"lora_rank": 16, "lora_targets": ("all-linear",), **zero}
        with_dropout, without = (
            estimate(_setup(m, lora_dropout=p, **lora)).components["activations"] for p in (0.05, 0.0)
        )
        return with_dropout - without

    assert extra() == (4 + 3 + 4) * sbh + sbf + (m.layers - 1) * ((7 + 3 + 4) * sbh + sbf)
    assert extra(activation_checkpointing=True) == (7 + 3 + 4) * sbh + sbf
    # peft's default q and v of a block after the first: 2 copies less the shared input, 2 masks
    default = [estimate(_setup(m, lora_rank=16, lora_dropout=p)).components["activations"] for p in (0.1, 0)]
    assert default[0] - default[1] == 2 * sbh + (m.layers - 1) * 4 * sbh
    with_dropout = _setup(m, lora_rank=16, lora_dropout=0.05).zero
    assert adapters.listing(m, with_dropout).trainable == 8_388_608  # the same adapters: dropout has none


def test_lora_dropout_in_the_label_and_the_script():
    z = _setup(models.preset("llama-2-7b"), lora_rank=8, lora_targets=("q_proj", "k_proj"), lora_dropout=0.1)
    assert z.label == "z2 bf16 mb1 lora8-d0.1 q,k"
    assert (
        trainable.describe(z.zero)
        == "LoRA r=8 on q_proj, k_proj (peft), dropout 0.1, every base weight frozen"
    )
    assert "target_modules=['q_proj', 'k_proj'], lora_dropout=0.1))" in trainable.in_your_script(z.zero)
    every = z.replace(zero={"lora_targets": ("all-linear",), "lora_dropout": 0.05})
    assert every.label == "z2 bf16 mb1 lora8-all-d0.05"


@pytest.mark.parametrize(
    "zero",
    [
        {"freeze_embeddings": True},
        {"frozen_blocks": 1},
        {"freeze_embeddings": True, "loss": "chunked"},
        {"lora_rank": 4},
        {"lora_rank": 4, "lora_targets": ("c_fc",)},
        {"lora_rank": 4, "lora_targets": ("all-linear",), "lora_dropout": 0.1},
        {"lora_rank": 8, "lora_targets": ("attn.c_proj", "mlp.c_proj"), "lora_dropout": 0.1},
    ],
)
def test_the_toy_gpts_subsets_save_what_the_estimate_says(zero):
    """The kit's GPT with a frozen group or LoRA (fp32, in one process): what autograd saves equals the GPT-2
    op-by-op account (``_gpt2_subset_saved``) within the O(b s) tensors it leaves out (the LayerNorms'
    statistics, the token ids); its trainable count is the listing's (QLoRA on it: tests/test_qlora.py)."""
    from kit.workloads import chunked_loss
    from kit.workloads.toymodels import GPT

    spec = models.resolve("toy")
    setup = Setup(model=spec, zero={"precision": "fp32", **zero}, batch={"micro_batch": 2, "seq_len": 32})
    torch.manual_seed(0)
    model = adapters.apply(GPT(spec), setup.zero)
    trains = sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert trains == adapters.listing(spec, setup.zero).trainable < spec.params
    if setup.zero.loss != "plain":
        model = chunked_loss.wrap(model, 0, setup.zero.loss)
    ids, labels = (
        torch.randint(0, spec.vocab, (2, 32), generator=torch.Generator().manual_seed(i)) for i in (0, 1)
    )
    saved = saved_by(model, ids, labels)
    assert saved == pytest.approx(estimate(setup).components["activations"], rel=TOLERANCE)
    llama_names = Setup(model=spec, zero={"lora_rank": 4, "lora_targets": ("q_proj",)}, batch=setup.batch)
    layers = r"c_attn, c_proj, c_fc, lm_head \(or 'all-linear'\)$"
    with pytest.raises(
        ValueError,
        match=r"^lora_targets: \['q_proj'\] name no layer of the model; its linear layers: " + layers,
    ):
        estimate(llama_names)


def test_transformers_kv_cache_is_counted_where_no_attention_saves_its_k_and_v():
    """A Hugging Face decoder keeps its KV cache in training (``use_cache``) to the loss: the k and v SDPA
    saves anyway, but for the blocks whose attention needs no gradient (LoRA on the MLP alone: the first
    block's), where only the cache holds them (measured on 2 CPU ranks: tests/test_peak.py "llama z2 lora
    up", +3.5 % at the loss without them)."""
    from kit.estimate import micro_step
    from kit.estimate.memory import peak_timeline

    m = models.preset("llama-2-7b")
    up = _setup(m, lora_rank=16, lora_targets=("up_proj",))
    cache = micro_step.kv_cache(up)
    assert cache.bytes == 1 * 2 * 2 * 1 * 4096 * 4096  # one block x k, v x 2 B x b s x kv (MHA: kv = h)
    assert cache.formula.startswith("1 blocks whose attention needs no gradient")
    forward = peak_timeline(up, 0).phases["forward"]["temporaries"]
    assert cache.formula in forward.formula
    for zero in (
        {"lora_rank": 16},
        {"lora_rank": 16, "lora_targets": ("up_proj",), "activation_checkpointing": True},
    ):
        assert micro_step.kv_cache(_setup(m, **zero)).bytes == 0  # every attention adapted; no cache
