"""Memory per GPU and CPU RAM per node for a Setup, each number with the formula behind it.

Two formulas:
- ``"deepspeed"`` (default), implementation-faithful: the buffers DeepSpeed 0.19 really allocates,
  read from ``deepspeed/runtime/zero/stage_1_and_2.py`` and ``stage3.py`` and checked byte for byte
  against a live engine (``kit.states`` measures the same structures; tests compare the two):
  * stages 0-2 flatten the 16-bit parameters into one buffer padded to a multiple of
    ``2 x dp`` elements (``nccl_start_alignment_factor``), partition ``P = padded / dp`` per rank;
  * stage 1/2 keep a 16-bit gradient buffer sized by every parameter that *touches* the rank's
    partition (``params_in_partition``), so ranks differ; we report the worst rank;
  * stage 3 partitions every tensor separately, ``ceil(numel / dp)`` each, keeps tensors of at most
    ``stage3_param_persistence_threshold`` elements whole on every rank, and allocates one
    ``reduce_bucket_size`` gradient bucket up front (``contiguous_gradients``);
  * the fp32 master copy exists even when training in fp32 (stages 1-3).
- ``"zero-paper"``: the ZeRO paper's idealised model states (Rajbhandari et al. 2020, section 3 and
  Table 1): ``(2 + 2 + K) Psi`` with ``K = 12`` for mixed-precision Adam, divided by ``Nd`` per stage.

Activations follow Korthikanti et al. 2022 (Table 2), derived per architecture family below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

from kit.gpus import catalogue
from kit.setup import Setup

Formula = Literal["deepspeed", "zero-paper"]
FORMULAS: tuple[str, ...] = ("deepspeed", "zero-paper")
COMPONENTS = ("parameters", "gradients", "optimizer_states", "activations", "buffers", "overhead")
STATES = ("parameters", "gradients", "optimizer_states", "buffers")
GIB = 1024**3
MIB = 1024**2

#: Runtime overhead constants (explicit allowances, not derived from a Setup).
#: CUDA context + cuBLAS/cuDNN workspaces of a PyTorch process on an H100: ~500 MiB in nvidia-smi
#: beyond what torch.cuda.memory_reserved() reports.
CUDA_CONTEXT_BYTES = 512 * MIB
#: NCCL communicator buffers: NCCL_BUFFSIZE (4 MiB) x channels (up to 32 on NVLink) x 2 directions.
NCCL_BUFFER_BYTES = 256 * MIB
#: Caching-allocator slack: reserved minus allocated, as a fraction of the allocated peak.
ALLOCATOR_FRAGMENTATION = 0.05
#: CPU RAM of one rank's process before any model: Python, torch with CUDA libraries, DeepSpeed.
PROCESS_BASE_BYTES = 2 * GIB
#: stage 1/2 pad the flat 16-bit buffer to a multiple of this x dp (``nccl_start_alignment_factor``).
NCCL_ALIGNMENT = 2
#: DeepSpeed's ZeRO-3 ``sub_group_size`` default (elements stepped at a time).
DS_SUB_GROUP_SIZE = 1_000_000_000
#: Bytes per fp32 optimizer state element and states per parameter, by optimizer.
OPTIMIZER_STATES = {"adamw": 2, "adam": 2, "sgd": 0}


@dataclass(frozen=True)
class Term:
    """One number of the estimate and how it was computed (shown by the CLI table and the notebooks)."""

    bytes: int
    formula: str


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU by component, CPU RAM per node, and the fit per GPU type."""

    setup: Setup
    formula: str
    terms: dict[str, Term]
    host_terms: dict[str, Term]
    cpu_term: Term
    notes: tuple[str, ...] = field(default=())

    @property
    def components(self) -> dict[str, int]:
        return {k: self.terms[k].bytes for k in COMPONENTS}

    @property
    def host(self) -> dict[str, int]:
        """Bytes per rank kept in CPU RAM by offload."""
        return {k: self.host_terms[k].bytes for k in STATES}

    @property
    def formulas(self) -> dict[str, str]:
        out = {k: t.formula for k, t in self.terms.items()}
        out.update({f"host.{k}": t.formula for k, t in self.host_terms.items() if t.bytes})
        out["cpu_per_node"] = self.cpu_term.formula
        return out

    @property
    def per_gpu_bytes(self) -> int:
        return sum(self.components.values())

    @property
    def model_states_bytes(self) -> int:
        c = self.components
        return c["parameters"] + c["gradients"] + c["optimizer_states"]

    @property
    def cpu_bytes_per_node(self) -> int:
        return self.cpu_term.bytes

    @cached_property
    def fits(self) -> dict[str, bool]:
        """Whether the per-GPU bytes fit each GPU in data/gpus.csv (and the node's CPU RAM, if given)."""
        ram = self.setup.cluster.cpu_ram_per_node_bytes
        cpu_ok = ram is None or self.cpu_bytes_per_node <= ram
        return {name: cpu_ok and self.per_gpu_bytes <= g.memory_bytes for name, g in catalogue().items()}

    @cached_property
    def checkpoint_bytes(self) -> int:
        """Size on disk of one saved checkpoint tag, all ranks (``kit.checkpoints.checkpoint_bytes``)."""
        from kit.checkpoints import checkpoint_bytes

        return checkpoint_bytes(self.setup)["total_bytes"]

    def to_dict(self) -> dict:
        """The ``zerokit estimate --json`` object (DESIGN.md contract)."""
        s = self.setup
        return {
            "formula": self.formula,
            "params": s.model.params,
            "largest_layer_params": s.model.largest_layer_params,
            "per_gpu_bytes": self.per_gpu_bytes,
            "model_states_bytes": self.model_states_bytes,
            "components": self.components,
            "host_bytes_per_rank": self.host,
            "cpu_bytes_per_node": self.cpu_bytes_per_node,
            "checkpoint_bytes": self.checkpoint_bytes,
            "fits": self.fits,
            "formulas": self.formulas,
            "notes": list(self.notes),
            "setup": s.model_dump(mode="json"),
        }

    def table(self):
        """Components as a pandas DataFrame: bytes, GiB and the formula, one row each."""
        import pandas as pd

        rows = [(k, t.bytes, t.bytes / GIB, t.formula) for k, t in self.terms.items()]
        rows.append(("total per GPU", self.per_gpu_bytes, self.per_gpu_bytes / GIB, "sum of the above"))
        cpu = self.cpu_bytes_per_node
        rows.append(("CPU RAM per node", cpu, cpu / GIB, self.cpu_term.formula))
        return pd.DataFrame(rows, columns=["component", "bytes", "GiB", "formula"]).set_index("component")


def estimate(setup: Setup, formula: Formula = "deepspeed") -> Estimate:
    """Estimate memory for ``setup`` (see the module docstring for the two formulas)."""
    if formula == "zero-paper":
        return _paper(setup)
    if formula != "deepspeed":
        raise ValueError(f"formula: must be one of {', '.join(FORMULAS)}, got {formula!r}")
    states = _faithful_states(setup, rank=_worst_rank(setup))
    device, host = states["device"], states["host"]
    act = activations(setup)
    transient = _transient(setup)
    terms = {
        "parameters": device["parameters"],
        "gradients": _add(device["gradients"], transient.pop("gradients", None)),
        "optimizer_states": device["optimizer_states"],
        "activations": act,
        "buffers": _add(device["buffers"], transient.pop("buffers", None)),
    }
    allocated = sum(t.bytes for t in terms.values())
    slack = int(allocated * ALLOCATOR_FRAGMENTATION)
    nccl = NCCL_BUFFER_BYTES if setup.dp > 1 else 0
    terms["overhead"] = Term(
        CUDA_CONTEXT_BYTES + nccl + slack,
        f"CUDA context {_gib(CUDA_CONTEXT_BYTES)} + NCCL buffers {_gib(nccl)} + allocator slack "
        f"{ALLOCATOR_FRAGMENTATION:.0%} x {_gib(allocated)} = {_gib(CUDA_CONTEXT_BYTES + nccl + slack)}",
    )
    return Estimate(setup, "deepspeed", terms, host, _cpu_per_node(setup, host), _notes(setup))


def rank_states(setup: Setup, rank: int = 0) -> dict[str, dict[str, int]]:
    """Exact model-state bytes one rank holds right after a boundary micro-step's backward.

    ``{"device": {parameters, gradients, optimizer_states, buffers}, "host": {...}}``: the
    prediction ``kit.states.model_state_bytes`` measures on a live engine (scalars excluded).
    """
    states = _faithful_states(setup, rank)
    return {where: {k: t.bytes for k, t in terms.items()} for where, terms in states.items()}


def partition_numel(setup: Setup) -> int:
    """Elements of the fp32 master partition one rank holds (what its optimizer-state file stores):
    stages 1-2, the 16-bit flat buffer padded to a multiple of ``2 x dp`` divided by dp; stage 3, the
    sum over tensors of ``ceil(numel / dp)``; stage 0, every parameter."""
    n = setup.dp
    if setup.zero.stage == 3:
        return sum(-(-t // n) for t in _tensor_numels(setup))
    if setup.zero.stage in (1, 2):
        return _round_up(setup.model.params, NCCL_ALIGNMENT * n) // n
    return setup.model.params


# --------------------------------------------------------------------------------------------
# implementation-faithful model states


def _faithful_states(setup: Setup, rank: int) -> dict[str, dict[str, Term]]:
    z, n = setup.zero, setup.dp
    if not 0 <= rank < n:
        raise ValueError(f"rank: must be in 0..{n - 1}, got {rank}")
    psi = setup.model.params
    p = _param_bytes(setup)
    k = _states_per_param(setup)
    opt = f"for {k} fp32 optimizer states" if k else "(no optimizer state)"
    zeros = {key: Term(0, "none") for key in STATES}
    device, host = dict(zeros), dict(zeros)

    if z.stage == 0:
        device["parameters"] = Term(p * psi, f"{p} B x Psi = {p} x {psi:,}")
        device["gradients"] = Term(p * psi, f"{p} B x Psi (full gradients, all-reduced)")
        master = 4 * psi if z.mixed_precision else 0
        device["optimizer_states"] = Term(
            master + 4 * k * psi,
            f"({4 if z.mixed_precision else 0} fp32 master + {4 * k} {opt}) B x Psi",
        )
        return {"device": device, "host": host}

    if z.stage in (1, 2):
        part = partition_numel(setup)
        flat = part * n
        touched = _touched_all_ranks(setup, part)[rank]
        where = host if z.offload_optimizer == "cpu" else device
        device["parameters"] = Term(
            p * flat, f"{p} B x Psi padded to a multiple of 2 x dp = {p} x {flat:,} (bit16_groups_flat)"
        )
        where["optimizer_states"] = Term(
            (4 + 4 * k) * part,
            f"(4 fp32 master + {4 * k} {opt}) B x P, P = padded Psi / dp = {part:,}",
        )
        if z.offload_optimizer == "cpu":
            largest = _largest_tensor(setup)
            host["gradients"] = Term(4 * part, f"4 B x P = fp32 gradient partition on CPU ({part:,})")
            host["buffers"] = Term(
                p * part + p * largest,
                f"{p} B x P (16-bit param staging) + {p} B x largest tensor {largest:,} (grad staging)",
            )
            device["buffers"] = Term(p * largest, f"{p} B x largest tensor {largest:,} (grad staging)")
        else:
            device["gradients"] = Term(
                p * touched,
                f"{p} B x {touched:,} (every tensor touching rank {rank}'s partition: params_in_partition)",
            )
        return {"device": device, "host": host}

    # stage 3
    numels = _tensor_numels(setup)
    part = partition_numel(setup)
    persistent = [t for t in numels if t <= z.param_persistence_threshold]
    persist_bytes = p * sum(-(-t // n) * n for t in persistent)
    params_where = host if z.offload_param == "cpu" else device
    params_where["parameters"] = Term(
        p * part, f"{p} B x S, S = sum of ceil(numel / dp) over tensors = {part:,}"
    )
    if persist_bytes:
        device["parameters"] = _add(
            device["parameters"],
            Term(persist_bytes, f"{len(persistent)} tensors <= {z.param_persistence_threshold:,} kept whole"),
        )
    opt_where = host if z.offload_optimizer == "cpu" else device
    opt_where["optimizer_states"] = Term((4 + 4 * k) * part, f"(4 fp32 master + {4 * k} {opt}) B x S")
    opt_where["gradients"] = Term(p * part, f"{p} B x S (grad_partitions_flat_buffer)")
    if z.offload_optimizer == "cpu":
        host["gradients"] = _add(host["gradients"], Term(4 * part, "4 B x S (fp32 gradient on CPU)"))
    if z.contiguous_gradients:
        device["buffers"] = Term(
            p * z.reduce_bucket_size, f"{p} B x reduce_bucket_size {z.reduce_bucket_size:,} (ipg bucket)"
        )
    return {"device": device, "host": host}


def _transient(setup: Setup) -> dict[str, Term]:
    """Peaks beyond the resident states: buckets during backward, copies during the step."""
    z, p = setup.zero, _param_bytes(setup)
    psi = setup.model.params
    out: dict[str, Term] = {}
    if z.stage in (1, 2):
        part = partition_numel(setup)
        buffers = []
        if z.contiguous_gradients:
            count = 2 if z.overlap else 1
            buffers.append(
                Term(count * p * z.reduce_bucket_size, f"{count} x {p} B x reduce_bucket_size (ipg buffer)")
            )
        if z.offload_optimizer == "none":
            buffers.append(Term(4 * part, "4 B x P (fp32 gradient copy during step)"))
        if buffers:
            out["buffers"] = _sum(buffers)
        if z.stage == 1 and setup.batch.grad_accum > 1:
            out["gradients"] = Term(p * psi, f"{p} B x Psi (stage 1 keeps full gradients across micro-steps)")
    if z.stage == 3:
        largest = setup.model.largest_layer_params
        fetch = min(psi, largest + z.prefetch_bucket_size, max(largest, z.max_live_parameters))
        gathered = Term(
            p * fetch + p * largest,
            f"{p} B x min(Psi, largest layer + prefetch bucket, max live) = {fetch:,} gathered params "
            f"+ {p} B x largest layer {largest:,} full gradient before reduce-scatter",
        )
        if z.offload_optimizer == "none":
            # _prepare_fp32_grad_for_sub_group: an fp32 copy of one sub group's gradient partition
            sub = min(partition_numel(setup), DS_SUB_GROUP_SIZE)
            gathered = _add(gathered, Term(4 * sub, "4 B x min(S, sub_group_size) (fp32 gradient in step)"))
        out["buffers"] = gathered
    return out


# --------------------------------------------------------------------------------------------
# activations (Korthikanti et al. 2022, Table 2, per architecture family)


def activations(setup: Setup) -> Term:
    """Bytes of activations saved for backward on one GPU at the micro batch.

    Checked against what ``torch.autograd.graph.saved_tensors_hooks`` sees: the toy GPT-2 and DiT in
    real runs (``tests/test_runner.py``), Hugging Face's Llama / Qwen2 / GPT-2 in one process
    (``tests/test_activations.py``). Left out are tensors of O(s^2 + bs + bh) bytes (causal mask,
    norm statistics, token ids, rotary tables, adaLN vectors): up to 1.4 % on tiny models, less at
    real sizes. GPT-2-style models are assumed to train without dropout.
    """
    m, b, s = setup.model, setup.batch.micro_batch, setup.batch.seq_len
    if not m.is_transformer:
        return Term(0, "unknown architecture (bare parameter count): activations not estimated")
    scale = 2 if setup.zero.precision == "fp32" else 1  # the formulas count 16-bit bytes
    h, a, layers = m.hidden, m.heads, m.layers
    kv = (m.kv_heads or a) * (h // a)
    ffn = m.ffn or 4 * h
    sbh, sbf, as2b = s * b * h, s * b * ffn, a * s * s * b
    family = m.family or "gpt2"
    if family in ("llama", "mistral", "qwen2"):
        # Hugging Face's decoder, SDPA attention (flash / memory-efficient: no s^2 term), fitted to
        # what autograd saves (tests/test_activations.py). 16-bit: each RMSNorm keeps its fp32 input
        # 4sbh, the normalised 2sbh and the weighted output 2sbh; rotated q 2sbh, k and v 2 x 2sb(kv),
        # SDPA output and o_proj input 4sbh, fp32 logsumexp 4abs; SwiGLU: gate, up, silu and product
        # 4 x 2sbf. In fp32 the upcast is free but every tensor is twice as wide.
        if scale == 1:
            per_layer = 20 * sbh + 4 * s * b * kv + 4 * a * b * s + 8 * sbf
            how = "RMSNorm + SwiGLU + SDPA: 20sbh + 4sb(kv) + 4abs + 8sbf"
        else:
            per_layer = 32 * sbh + 8 * s * b * kv + 4 * a * b * s + 16 * sbf
            how = "fp32 RMSNorm + SwiGLU + SDPA: 32sbh + 8sb(kv) + 4abs + 16sbf"
    elif family == "dit":
        # adaLN-Zero: as GPT-2 plus both norms' outputs (modulate), the modulated inputs and the two
        # gated branch outputs: 24sbh + 2as^2b + 4sbf.
        per_layer = (24 * sbh + 2 * as2b + 4 * sbf) * scale
        how = "adaLN-Zero block: 24sbh + 2as^2b + 4sbf (eager attention)"
    else:
        # gpt2 / gpt_neox, eager attention, no dropout: LayerNorm inputs 4sbh, QKV input 2sbh,
        # q,k,v 6sbh, softmax output 2as^2b, projection input 2sbh, MLP input 2sbh, GELU input and
        # output 2 x 2sbf (Korthikanti's 34sbh + 5as^2b keeps dropout masks and outputs as well).
        per_layer = (16 * sbh + 2 * as2b + 4 * sbf) * scale
        how = "16sbh + 2as^2b + 4sbf (eager attention, no dropout)"
    if setup.zero.activation_checkpointing:
        body = Term(
            layers * 2 * sbh * scale + per_layer,
            f"checkpointing: {layers} layers x 2sbh (layer inputs) + one layer recomputed ({how})",
        )
    else:
        body = Term(layers * per_layer, f"{layers} layers x ({how}), s={s} b={b} h={h} a={a} f={ffn}")
    return _add(body, _head_activations(setup, scale))


def _head_activations(setup: Setup, scale: int) -> Term:
    """What the model saves outside its blocks (16-bit byte counts times ``scale``)."""
    m, b, s = setup.model, setup.batch.micro_batch, setup.batch.seq_len
    sbh = s * b * m.hidden
    if m.family == "dit":
        from kit.models import DIT_DEFAULTS

        pixels = b * s * DIT_DEFAULTS["patch_size"] ** 2  # latent pixels per channel in the micro batch
        channels = DIT_DEFAULTS["in_channels"]
        out_channels = channels * (2 if DIT_DEFAULTS["learn_sigma"] else 1)
        mse = 2 * 4 * pixels * out_channels  # fp32 output and target of the MSE loss
        return Term(
            (6 * sbh + 2 * pixels * channels) * scale + mse,
            "final layer 6sbh + patch-embed input + fp32 MSE output and target",
        )
    if not m.vocab:
        return Term(0, "no head")
    logits = 4 * s * b * m.vocab  # the fp32 log-softmax output of the loss (16-bit logits are not saved)
    if m.family in ("llama", "mistral", "qwen2"):
        norm = 8 * sbh if scale == 1 else 12 * sbh  # final RMSNorm (fitted, as its per-layer twins)
        return Term(
            norm + logits, f"head: final RMSNorm {norm // sbh}sbh, fp32 log-softmax 4sbv, v={m.vocab:,}"
        )
    # final norm input and lm_head input 2 x 2sbh
    return Term(
        4 * sbh * scale + logits,
        f"head: norm + lm_head inputs 4sbh, fp32 log-softmax 4sbv, v={m.vocab:,}",
    )


# --------------------------------------------------------------------------------------------
# the ZeRO paper's idealised formula


def _paper(setup: Setup) -> Estimate:
    z, n, psi = setup.zero, setup.dp, setup.model.params
    p = _param_bytes(setup)
    k = (4 if z.mixed_precision else 0) + 4 * _states_per_param(setup)
    div = {0: (1, 1, 1), 1: (1, 1, n), 2: (1, n, n), 3: (n, n, n)}[z.stage]
    names = ("parameters", "gradients", "optimizer_states")
    per = (p, p, k)
    terms = {
        name: Term(int(b * psi / d), f"{b} B x Psi / {d} = {b} x {psi:,} / {d}")
        for name, b, d in zip(names, per, div, strict=True)
    }
    for name in ("activations", "buffers", "overhead"):
        terms[name] = Term(0, "not part of the ZeRO paper's model-state formula")
    host = {key: Term(0, "none") for key in STATES}
    cpu = Term(0, "not part of the ZeRO paper's model-state formula")
    note = f"ZeRO paper: (2 + 2 + K) Psi model states with K = {k}, stage {z.stage} shards by Nd = {n}"
    return Estimate(setup, "zero-paper", terms, host, cpu, (note,))


# --------------------------------------------------------------------------------------------
# CPU RAM per node


def _cpu_per_node(setup: Setup, host: dict[str, Term]) -> Term:
    z, g, psi = setup.zero, setup.cluster.gpus_per_node, setup.model.params
    offloaded = sum(t.bytes for t in host.values())
    if z.stage == 3 and z.zero_init:
        build = 4 * setup.model.largest_layer_params
        how = "zero.Init: 4 B x largest layer"
    else:
        build = 4 * psi
        how = "full fp32 model built on CPU by every rank: 4 B x Psi"
    base = PROCESS_BASE_BYTES
    total = g * (base + max(build, offloaded))
    return Term(
        total,
        f"{g} ranks x (process {_gib(base)} + max(model construction {_gib(build)} [{how}], "
        f"offloaded states {_gib(offloaded)}))",
    )


# --------------------------------------------------------------------------------------------
# helpers


def _worst_rank(setup: Setup) -> int:
    """The rank whose stage 1/2 gradient buffer is largest (ranks differ only there)."""
    if setup.zero.stage not in (1, 2) or setup.zero.offload_optimizer == "cpu":
        return 0
    touched = _touched_all_ranks(setup, partition_numel(setup))
    return max(range(setup.dp), key=touched.__getitem__)


def _touched_all_ranks(setup: Setup, part: int) -> list[int]:
    """Elements of every tensor overlapping each rank's flat range [r P, (r+1) P)."""
    n = setup.dp
    numels = _tensor_numels(setup, exact_required=False)
    if numels is None:
        return [part] * n
    touched = [0] * n
    start = 0
    for t in numels:
        first, last = start // part, min((start + t - 1) // part, n - 1)
        for r in range(first, last + 1):
            touched[r] += t
        start += t
    touched[-1] += part * n - start  # the last rank's flat partition also carries the alignment padding
    return touched


def _tensor_numels(setup: Setup, exact_required: bool = True) -> list[int] | None:
    from kit.models import tensor_numels

    numels = tensor_numels(setup.model)
    if numels is None and exact_required:
        # bare parameter count: one tensor per largest layer, the rest in one piece
        m = setup.model
        rest = m.params - m.largest_layer_params
        return [m.largest_layer_params] + ([rest] if rest else [])
    return numels


def _largest_tensor(setup: Setup) -> int:
    numels = _tensor_numels(setup, exact_required=False)
    return max(numels) if numels else setup.model.largest_layer_params


def _param_bytes(setup: Setup) -> int:
    return 4 if setup.zero.precision == "fp32" else 2


def _states_per_param(setup: Setup) -> int:
    z = setup.zero
    return 1 if z.optimizer == "sgd" and z.momentum else OPTIMIZER_STATES[z.optimizer]


def _notes(setup: Setup) -> tuple[str, ...]:
    z, notes = setup.zero, []
    if z.stage == 3 and z.reduce_bucket_size * _param_bytes(setup) > GIB / 2:
        notes.append(
            f"stage 3 allocates reduce_bucket_size ({z.reduce_bucket_size:,} elements) up front; "
            "HF's 'auto' sets it to hidden^2"
        )
    if z.stage == 1 and setup.batch.grad_accum > 1:
        notes.append("stage 1 holds full gradients between micro-steps; stage 2 partitions them")
    if setup.model.family in ("gpt2", "gpt_neox") and not z.activation_checkpointing:
        notes.append(
            "activations assume a fused GELU (gelu_pytorch_tanh) and no dropout; Hugging Face's default "
            "gelu_new with dropout 0.1 saves 2.1x as much (measured on GPT-2 small, seq 1024)"
        )
    if _tensor_numels(setup, exact_required=False) is None:
        notes.append("bare parameter count: per-tensor padding and stage 3 persistence approximated")
    return tuple(notes)


def _round_up(x: int, multiple: int) -> int:
    return -(-x // multiple) * multiple


def _add(a: Term, b: Term | None) -> Term:
    if b is None or not b.bytes:
        return a
    if not a.bytes:
        return b
    return Term(a.bytes + b.bytes, f"{a.formula} + {b.formula}")


def _sum(terms: list[Term]) -> Term:
    out = Term(0, "none")
    for t in terms:
        out = _add(out, t)
    return out


def _gib(x: float) -> str:
    return f"{x / GIB:.2f} GiB"
