"""What a run trains: the model, how to make a micro batch, the loss. Imports torch.

``for_model(spec)`` gives the workload of a ModelSpec:
- ``Toy``: the kit's GPT-2 and DiT (``toymodels``: explicit attention, no dropout), for the families
  ``gpt2`` and ``dit`` (``kit.models.toy_spec``, the GPT-2 and DiT presets);
- ``HuggingFace``: what transformers builds from ``spec.arch`` (``kit.hf_models``): the llama, mistral,
  qwen2 and gpt_neox families and any other model_type, fed synthetic token streams or images by task;
- ``ModelFile``: a user's ``model()`` and ``batch(micro_batch)`` (``kit.model_files``).

Every workload is used the same way by the ranks (``kit.ranks.engine``, under ``deepspeed.zero.Init`` at
stage 3) and by the estimator's trace (``kit.estimate.trace``, under ``FakeTensorMode``)::

    model = workload.build()                 # (workload.shapes() for a trace: no weight initialisation)
    args, kwargs = workload.micro_batch(sample_indices, seq_len, seed)   # CPU tensors, floats in fp32
                                             # (+ target_len=: a seq-to-seq model's decoder tokens)
    loss = workload.loss(model(*args, **kwargs))                         # a scalar tensor

Data is synthetic and deterministic: a sample depends only on (seed, its global index), so every ZeRO
stage sees the same data (a model file's ``batch`` is called with the RNG seeded from both).
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from functools import lru_cache

from kit import hf_models, model_files
from kit.schema import ModelSpec

#: token stream of a synthetic sample: ``(start + stride * t) % vocab``, learnable by a small decoder
MAX_STRIDE = 7


def for_model(spec: ModelSpec):
    """The workload that trains ``spec``; ValueError (one line) for a spec that cannot be built."""
    if spec.source:
        return ModelFile(spec)
    if spec.family in ("gpt2", "dit"):
        return Toy(spec)
    if spec.arch:
        return HuggingFace(spec)
    raise ValueError(
        f"model: {spec.name!r} has no architecture to build (a bare parameter count); give a preset, "
        "a config.json or a model file"
    )


def blocks(model) -> list:
    """The model's blocks: the modules of its largest ModuleList (what activation checkpointing wraps and
    FSDP shards one by one); [] for a model without one."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    if not lists:
        return []
    longest = max(lists, key=len)  # not inside list(): mypy would infer max from that context, reject len
    return list(longest)


def generator(seed: int, index: int):
    """The RNG of one sample (seed, global index)."""
    import torch

    return torch.Generator().manual_seed(seed * 1_000_003 + index)


#: the shortest sequence of the variable-length synthetic data, as a share of ``seq_len``
SHORTEST = 0.125


def sequence_length(index: int, seq_len: int, seed: int) -> int:
    """The length of sample ``index`` of the variable-length synthetic data: uniform in
    [``SHORTEST`` x seq_len, seq_len], seeded per sample."""
    import torch

    low = max(1, int(SHORTEST * seq_len))
    return int(torch.randint(low, seq_len + 1, (), generator=generator(seed + 7, index)))


@lru_cache(maxsize=16)
def token_batches(max_tokens: int, seq_len: int, micro_per_step: int, steps: int, seed: int) -> tuple:
    """The first ``steps`` optimizer steps of the variable-length data packed by DeepSpeed's own
    ``batch_by_seqlens`` (``variable_batch_size_and_lr``): per step, ``micro_per_step`` micro batches of
    sample ids, each at most ``max_tokens`` tokens. Deterministic (data order), the same on every rank."""
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import batch_by_seqlens

    low = max(1, int(SHORTEST * seq_len))
    most = max_tokens // low  # no micro batch holds more samples: lets the packer skip early
    count = (steps + 1) * micro_per_step * most  # one step of margin: the last full step is not cut short
    lengths = [sequence_length(i, seq_len, seed) for i in range(count)]
    ids, _, _ = batch_by_seqlens(
        lengths, max_tokens, max_batch_size=most, effective_batch_size=micro_per_step, seed=seed
    )
    micro = [list(sample_ids) for _, sample_ids in ids]
    if len(micro) < steps * micro_per_step:
        raise ValueError(f"batch.max_tokens: the packed data holds fewer than {steps} steps")
    return tuple(tuple(micro[s * micro_per_step : (s + 1) * micro_per_step]) for s in range(steps))


def packed_step(batch, step: int, world: int, seed: int) -> tuple[tuple[int, ...], ...]:
    """The micro batches (sample ids) of optimizer step ``step`` under ``batch.max_tokens``: world x
    grad_accum of them; rank r's micro-step j takes number j x world + r (as DistributedSampler deals)."""
    steps = 1 << step.bit_length()  # > step; a power of two, so that the packing is rarely redone
    return token_batches(batch.max_tokens, batch.seq_len, world * batch.grad_accum, steps, seed)[step]


def packed_lengths(
    batch, step: int, rank: int, world: int, micro: int = 0, seed: int = 0
) -> tuple[list, list]:
    """The sample ids and their lengths of the micro batch rank ``rank`` of ``world`` takes at micro-step
    ``micro`` of ``step`` under ``batch.max_tokens`` (the collate pads them to the longest)."""
    ids = list(packed_step(batch, step, world, seed)[micro * world + rank])
    return ids, [sequence_length(i, batch.seq_len, seed) for i in ids]


def packed_sizes(batch, step: int, world: int, seed: int) -> dict[str, int]:
    """Samples, real tokens, tokens with the padding to each micro batch's longest sequence, and the
    largest micro batch (samples) of a packed step."""
    micro = packed_step(batch, step, world, seed)
    lengths = [[sequence_length(i, batch.seq_len, seed) for i in m] for m in micro]
    return {
        "train_batch": sum(len(m) for m in micro),
        "tokens": sum(map(sum, lengths)),
        "padded_tokens": sum(len(m) * max(m) for m in lengths),
        "micro_batch": max(len(m) for m in micro),
    }


def tokens(indices: list[int], seq_len: int, vocab: int, seed: int):
    """(len(indices), seq_len + 1) token ids: each sample an arithmetic stream mod ``vocab``."""
    import torch

    rows = []
    for i in indices:
        g = generator(seed, i)
        start = torch.randint(0, vocab, (1,), generator=g)
        stride = torch.randint(1, MAX_STRIDE + 1, (1,), generator=g)
        rows.append((start + stride * torch.arange(seq_len + 1)) % vocab)
    return torch.stack(rows)


@dataclass(frozen=True)
class Toy:
    """The kit's GPT-2 (next-token cross entropy) or DiT (MSE to a fixed function of the latent)."""

    spec: ModelSpec

    def build(self):
        from kit.workloads import toymodels

        return toymodels.build(self.spec)

    def partitioned(self, ds_config: dict):
        """The context ZeRO-3 builds the model in: ``deepspeed.zero.Init`` (the toys initialise their
        parameters in their constructors, before each module is partitioned)."""
        import deepspeed

        return deepspeed.zero.Init(config_dict_or_path=ds_config)

    def micro_batch(self, indices: list[int], seq_len: int, seed: int = 0, lengths: list[int] | None = None):
        """Inputs and targets of the samples ``indices``; ``lengths`` (GPT only) cuts each to its own
        length, padded to the longest of the micro batch with targets -100 (ignored by the loss)."""
        import torch

        from kit import models

        vocab = self.spec.vocab
        if self.spec.family == "gpt2":
            assert vocab is not None  # set for every gpt2 spec (models.config_of needs it to build the model)
            stream = tokens(indices, seq_len, vocab, seed)
            inputs, targets = stream[:, :-1], stream[:, 1:]
            if lengths is not None:
                longest = max(lengths)
                inputs, targets = inputs[:, :longest].clone(), targets[:, :longest].clone()
                for row, n in enumerate(lengths):
                    inputs[row, n:], targets[row, n:] = 0, -100
            return (inputs, targets), {}
        if lengths is not None:
            raise ValueError("batch.max_tokens: variable-length data is built for the toy GPT only")
        cfg = models.config_of(self.spec)
        assert vocab is not None  # config_of checked the shape
        channels, side = cfg["in_channels"], cfg["input_size"]
        out_channels = 2 * channels if cfg["learn_sigma"] else channels
        xs, ts, ys = [], [], []
        for i in indices:
            g = generator(seed, i)
            xs.append(torch.randn(channels, side, side, generator=g))
            ts.append(torch.randint(0, 1000, (), generator=g))
            ys.append(torch.randint(0, vocab, (), generator=g))
        x = torch.stack(xs)
        target = 0.5 * x.repeat(1, out_channels // channels, 1, 1)
        return (x, torch.stack(ts), torch.stack(ys), target), {}

    def shapes(self):
        return self.build()

    def loss(self, output):
        return output  # the toy models return the loss when given the target


@dataclass(frozen=True)
class HuggingFace:
    """A transformers model built from ``spec.arch``; its loss is the model's own (``output.loss``)."""

    spec: ModelSpec

    @property
    def config(self):
        return hf_models.config(json.loads(self.spec.arch))

    def build(self):
        cfg = self.config
        if hf_models.task(cfg) == "base":
            raise ValueError(
                f"model: {self.spec.name!r} ({cfg.model_type}) builds only a bare model without a loss; "
                "write a model file whose forward returns one"
            )
        return hf_models.build(cfg)

    @contextlib.contextmanager
    def partitioned(self, ds_config: dict):
        """ZeRO-3 the way transformers does it: with an ``HfDeepSpeedConfig`` alive, ``from_config``
        builds under ``deepspeed.zero.Init`` and initialises the weights gathered (a plain
        ``zero.Init`` around it would leave parameters that ``_init_weights`` sets, such as
        Mixtral's 3-D experts, uninitialised)."""
        from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

        keep = HfDeepSpeedConfig(ds_config)  # transformers holds only a weak reference to it
        try:
            yield
        finally:
            unset_hf_deepspeed_config()
            del keep

    def shapes(self):
        """The model without its weight initialisation (for a trace, where values do not matter and
        some initialisers, such as a truncated normal, look at values)."""
        from transformers.initialization import no_init_weights

        with no_init_weights():
            return self.build()

    def micro_batch(self, indices: list[int], seq_len: int, seed: int = 0, target_len: int | None = None):
        """Inputs and labels by the model's task (``kit.hf_models.task``): images and a class each;
        ``seq_len`` token ids and a class each (a sequence classifier); ``seq_len`` token ids as inputs and
        labels (a causal LM shifts them, a seq-to-seq LM builds its decoder's inputs from them); a seq-to-seq
        LM learns ``target_len`` labels when given (the first tokens of the sample's stream, as its inputs
        are; two tensors of their own, as a data loader gives them)."""
        import torch

        cfg = self.config
        kind = hf_models.task(cfg)
        if target_len is not None and kind != "seq2seq-lm":
            raise ValueError(f"batch.target_len: only a seq-to-seq model has decoder tokens, not {kind}")
        if kind == "image-classification":
            side, channels = cfg.image_size, cfg.num_channels
            gens = [generator(seed, i) for i in indices]
            pixels = torch.stack([torch.randn(channels, side, side, generator=g) for g in gens])
            labels = torch.stack([torch.randint(0, cfg.num_labels, (), generator=g) for g in gens])
            return (), {"pixel_values": pixels, "labels": labels}
        longest = max(seq_len, target_len or seq_len)
        stream = tokens(indices, longest - 1, cfg.get_text_config().vocab_size, seed)
        if kind == "sequence-classification":
            return (), {"input_ids": stream, "labels": classes(cfg, indices, seed)}
        if target_len is not None:
            return (), {"input_ids": stream[:, :seq_len].clone(), "labels": stream[:, :target_len].clone()}
        return (), {"input_ids": stream, "labels": stream}  # the model shifts labels for causal LMs

    def loss(self, output):
        return output.loss


def classes(cfg, indices: list[int], seed: int):
    """A sequence classifier's labels, one per sample (seeded by its index): a class in [0, num_labels);
    a float for a regression head (``num_labels`` 1); 0 / 1 per class for a multi-label one."""
    import torch

    gens = [generator(seed + 1, i) for i in indices]
    if cfg.problem_type == "multi_label_classification":
        return torch.stack([torch.randint(0, 2, (cfg.num_labels,), generator=g).float() for g in gens])
    if cfg.num_labels == 1 or cfg.problem_type == "regression":
        return torch.stack([torch.randn((), generator=g) for g in gens])
    return torch.stack([torch.randint(0, cfg.num_labels, (), generator=g) for g in gens])


@dataclass(frozen=True)
class ModelFile:
    """A user's ``model()``; ``batch(micro_batch)`` called with the RNG seeded by (seed, first sample)."""

    spec: ModelSpec

    def build(self):
        return model_files.build(self.spec.source)

    partitioned = Toy.partitioned
    shapes = build

    def micro_batch(self, indices: list[int], seq_len: int, seed: int = 0):
        import torch

        source = self.spec.source
        assert source is not None  # for_model gives a ModelFile only to a spec with a source
        state = torch.random.get_rng_state()
        torch.manual_seed(seed * 1_000_003 + indices[0])
        try:
            return model_files.make_batch(source, len(indices)), {}
        finally:
            torch.random.set_rng_state(state)

    def loss(self, output):
        model_files.check_loss(self.spec.source, output)
        return output
