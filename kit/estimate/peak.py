"""The peak of device-tensor bytes in each phase of a training step, predicted from the code paths.

A step's phases are those ``kit.ranks.memory_timeline`` measures: ``forward`` (the micro batch, the
forward and the loss), ``backward`` and ``optimizer`` (``engine.step()``). In each phase the model
takes the largest of a few moments, each a sum of ``Term``s by category (``CATEGORIES``):

- **forward**, at the loss: the resident states, the activations saved so far (with checkpointing the
  blocks' inputs, not the block recomputed in backward), the 16-bit logits and their fp32 upcast
  (Hugging Face's loss calls ``logits.float()``; the log-softmax output is a saved activation), the
  micro batch's token ids; at stage 3 the parameters gathered in flight (``kit.rules.stage3_gathered``
  over the tensors it releases) and those ``max_reuse_distance`` keeps gathered until their backward;
  at stage 1 with gradient accumulation the ipg bucket of micro-step 0 (released at the boundary); with
  FSDP the root unsharded (every unit with ``fsdp-grad-op``) and the last all-gather's output. At stage 3
  over gloo also at the last all-gather (the blocks' activations, every tensor gathered so far and gloo's
  flat copy of the one it gathers), and with checkpointing in the last block's forward (every block's
  input, the block's working set without autograd: ``micro_step._block_forward``; under a fused loss it
  can exceed the loss's), if that is larger.
- **backward**, (a) at the loss's backward: every saved activation, plus the fp32 gradients of the
  logits ``nll_loss_backward`` and ``log_softmax_backward`` make (4 B x b s v each); (b) in the last
  block's backward: the gradient bucket stages 1-2 allocate at the first gradient hook
  (``stage_1_and_2.py``: ``reduce_bucket_size`` elements, two with ``overlap_comm``), the blocks' saved
  activations (the head's are freed), a tied embedding's gradient from the head (autograd holds it until
  the embedding's own use adds to it) and the block's backward working set (the MLP's down-projection:
  its input gradient b s f, its weight gradient f h, the incoming gradient b s h); (c) at its end: the
  gradients of this rank (and the bucket); (d) at stage 2, at each reduction of the bucket (a gradient
  hook finding it full, and the epilogue): ``allreduce_bucket``'s flat copy of the bucket's gradients
  (none when they are all one rank's: one slice, reduced in place);
  (e) at stage 3, at each reduce-scatter of the bucket: ``reduce_scatter_coalesced``'s padded flat
  copy, with only the tensors not yet through their backward still gathered ((d) and (e):
  ``kit.estimate.reductions``).
- **optimizer**: with gradient accumulation, ``engine.step()`` between micro-steps (the held gradients
  and, at stage 1, the bucket); stages 1-2 flatten this rank's gradient partition into an fp32 copy
  (4 B x P) and step the torch optimizer on it; stage 3 first partitions its persistent parameters
  (``_partition_all_parameters``: their full copies are freed, regathered after the update) and steps
  one sub group with its fp32 gradient; FSDP steps each rank's shards; stage 0's ``BF16_Optimizer``
  keeps the 16-bit gradients and their fp32 copy (4 B x Psi); with DeepSpeed's FusedAdam (a GPU's default)
  a 16-bit stage 0 steps through ``FP16_Optimizer`` (bf16 too: ``_do_optimizer_sanity_check``'s
  ``DDP_BFLOAT16``), which makes a list of every gradient's fp32 copy and flattens it, both live with the
  16-bit gradients (4 B x Psi more). The optimizer's temporaries follow
  torch's ``adam.py``: the single-tensor path (a CPU tensor's default) allocates ``exp_avg_sq.sqrt()``
  and its quotient, 2 x 4 B x the largest tensor it steps; ``_multi_tensor_adam`` (foreach, CUDA's
  default for ``torch_adam``) one ``_foreach_sqrt`` copy of every tensor, 4 B x their sum; fused
  kernels (DeepSpeed's FusedAdam, what a ds_config without ``torch_adam`` gets on CUDA) none.

``backend="gloo"`` (the CPU accelerator) adds the copies gloo's collectives make where NCCL writes in
place: the all-gather of the updated 16-bit partitions (16-bit Psi, stages 1-2) and of a stage-3
tensor (the largest persistent one in the optimizer phase, the largest released one in the forward), and
the clone of a stage-3 gradient reduce-scatter's input, at the moment they are made
(``kit.ranks.memory_timeline`` settles each collective, so a CPU measurement sees these copies freed when
they really are).

On CPU (``"gloo"``) in bf16 the last block's backward adds the scratch oneDNN allocates inside the
down-projection's weight-gradient ``mm`` (``kit.estimate.cpu_matmul``: 148,608 B for the toy's x^T of
256 x 128 by 128 x 64 on one thread); a GPU prediction has no such term.

What it cannot see: the temporaries inside other ops (kernels' workspaces; cuBLAS's workspace on a GPU),
the head's loss for models without a language-model head (a formula family's head only), the backward
working set of a model traced rather than given by a formula (its largest layer's gradient stands for it)
and the outputs its forward holds without saving them (data/examples/conv_net.py at stage 2: +7.9 %
forward, +11.4 % backward, oneDNN's convolution outputs and backward buffers), step 0 (Adam's states are
created during its optimizer phase: the model is of step 1 on), NCCL's own buffers and the caching
allocator's slack (``kit.estimate.memory`` adds both as overheads); DDP under ``torch.autocast`` keeps
norms and the residual stream in fp32 (the activations formula counts them in bf16: 1.3 % of the toy's
forward); FSDP2's units come from the shape fields (a block is (Psi - embeddings) / layers); stage 3's
reuse distance is walked per tensor in the model's order, not per module in the trace's; a stage-2 bucket
flush counts the end of backward's states, not the saved activations still live at it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from kit import sequence_parallel as ulysses
from kit.components import MEASURED, Component
from kit.estimate import baselines, micro_step, partition, reductions
from kit.estimate.cpu_matmul import CpuMatmul
from kit.estimate.result import NONE, Term
from kit.models import spec_shapes
from kit.rules import (
    DS_SUB_GROUP_SIZE,
    FP32,
    Offload,
    element_bytes,
    fallback_copies,
    optimizer_states,
    stage3_gathered,
)
from kit.schema import ModelSpec, Setup

#: the phases of a step, in order (``kit.ranks.memory_timeline.PHASES``)
PHASES = ("forward", "backward", "optimizer")
#: what each byte of a phase is (the plot's stack): the measured components and the step's temporaries
CATEGORIES = (*MEASURED, "temporaries")
#: the torch optimizer's implementation: its temporaries
Implementation = Literal["fused", "foreach", "single"]
Backend = Literal["nccl", "gloo"]


def runner_path(device: str) -> tuple[Implementation, Backend]:
    """The optimizer implementation and backend the kit's runner steps on ``device`` (a record's
    ``device``): ``torch_adam``'s single-tensor path over gloo on the CPU accelerator, foreach over NCCL
    on a GPU."""
    return ("single", "gloo") if device == "cpu" else ("foreach", "nccl")


@dataclass(frozen=True)
class Timeline:
    """Per phase, the terms live at its peak moment, by category; ``moments`` says which moment."""

    phases: dict[str, dict[str, Term]]
    moments: dict[str, str]

    @property
    def totals(self) -> dict[str, int]:
        return {name: sum(t.bytes for t in terms.values()) for name, terms in self.phases.items()}

    @property
    def peak_tensor_bytes(self) -> int:
        return max(self.totals.values())

    @property
    def peak_phase(self) -> str:
        totals = self.totals
        return max(PHASES, key=totals.__getitem__)

    def formulas(self) -> dict[str, str]:
        """One line per phase: the moment and its terms."""
        return {
            name: f"{self.moments[name]}: "
            + " + ".join(f"{k} [{t.formula}]" for k, t in terms.items() if t.bytes)
            for name, terms in self.phases.items()
        }


def timeline(
    setup: Setup,
    rank: int,
    device: dict[str, Term],
    activations: Term,
    *,
    implementation: Implementation = "fused",
    backend: Backend = "nccl",
    cpu: CpuMatmul | None = None,
) -> Timeline:
    """The predicted peak per phase of a step (from the second on) of rank ``rank`` of ``setup``, from
    the states it holds on the device (``device``, ``kit.estimate.memory``'s) and its saved activations.

    ``implementation``: the torch optimizer's path (``"fused"`` for DeepSpeed's FusedAdam; the kit's runs
    use ``torch_adam``: ``"foreach"`` on CUDA, ``"single"`` on CPU); ``backend``: the collectives' (see the
    module's doc); ``cpu``: with ``"gloo"``, how the ranks' CPU matmuls run (default: one thread of
    AVX-512 bf16). ``kit.estimate.memory.peak_timeline`` fills in the states."""
    act = activations
    shape = micro_step.Shape(setup, act, (cpu or CpuMatmul()) if backend == "gloo" else None)
    resident = _resident(setup, device)
    forward = {
        **resident,
        Component.ACTIVATIONS: shape.forward,
        "temporaries": shape.loss + shape.batch + micro_step.kv_cache(setup),
    }
    moments = {}
    gathered = _gathered(setup)
    # what the forward and the loss's backward hold besides (the head the tensor in use)
    held = _gathered(setup, at_head=True) + _held_bucket(setup)
    forward[Component.BUFFERS] += held + baselines.unsharded_at_loss(setup)
    forward["temporaries"] += _autocast_copies(setup)
    forwards = {"at the loss": forward}
    copy = _gather_copy(setup) if backend == "gloo" else NONE
    if copy.bytes:  # stage 3 over gloo: the last released tensor's all-gather, everything gathered so far
        forwards["at the last all-gather"] = {
            **resident,
            Component.BUFFERS: resident[Component.BUFFERS] + held,
            Component.ACTIVATIONS: shape.blocks,
            "temporaries": shape.batch + copy,
        }
    if shape.block_forward.bytes:  # checkpointed: the last block's forward, its inputs so far held
        forwards["in the last block's forward"] = {
            **resident,
            Component.BUFFERS: resident[Component.BUFFERS] + held,
            Component.ACTIVATIONS: shape.checkpoints,
            "temporaries": shape.batch + shape.block_forward,
        }
    moments["forward"], forward = _largest(forwards)
    backward_at_loss = {
        **resident,
        Component.ACTIVATIONS: shape.forward,
        "temporaries": shape.loss_grads + shape.batch + _autocast_copies(setup),
    }
    backward_at_loss[Component.BUFFERS] += held + baselines.unsharded_at_loss(setup, backward=True)
    bucketed = resident[Component.BUFFERS] + _bucket(setup)
    first_block = setup.zero.activation_checkpointing or (backend == "nccl" and setup.zero.stage == 0)
    block = {
        **resident,
        # stage 0 without checkpointing: on CPU ranks the last block's backward holds the head's gradients
        # only (measured: the chunked loss's z0), on an H200 it held every later one (GPT-2 XL z0: +0.1 %
        # with them, -1.4 % without), a difference between the two paths not yet explained; stage 1 without
        # overlap_comm holds the head's on both (GPT-2 XL z1 on an H200: -0.2 %; with every later one
        # +3.5 %); checkpointed, the peak is the first block's recomputation, every later gradient held
        Component.GRADIENTS: resident[Component.GRADIENTS]
        + _grads_so_far(setup, device, resident[Component.GRADIENTS], first=first_block),
        Component.BUFFERS: bucketed + gathered,
        Component.ACTIVATIONS: shape.blocks,
        "temporaries": shape.tied + shape.block_backward + shape.batch + _autocast_copies(setup, head=False),
    }
    end = {**resident, Component.BUFFERS: resident[Component.BUFFERS] + _bucket(setup)}
    end[Component.GRADIENTS] = _end_gradients(setup, device, resident[Component.GRADIENTS])
    end["temporaries"] = _allreduce_copy(setup)
    late = {}
    if shape.late:  # a trainable subset's first gradient hook comes inside the last block
        hooked = {**block, Component.BUFFERS: bucketed + gathered}
        late[f"{shape.late.where}, after the first gradient hook"] = {
            **hooked,
            Component.ACTIVATIONS: shape.late.at_hook,
            "temporaries": shape.late.hook_work + shape.batch,
        }
        late["in the block below's backward, after the first gradient hook"] = {
            **hooked,
            Component.ACTIVATIONS: shape.late.below,
        }
        block[Component.BUFFERS] = resident[Component.BUFFERS] + gathered  # the bucket is not there yet
    candidates = {"at the loss's backward": backward_at_loss, "in the last block's backward": block, **late}
    if shape.attention:  # the kit's GPT: the last block's softmax backward, its MLP's and projections' done
        at, work = shape.attention
        candidates["in the last block's attention backward"] = {
            **block,
            Component.GRADIENTS: resident[Component.GRADIENTS]
            + _grads_so_far(setup, device, resident[Component.GRADIENTS], first=first_block, mlp=True),
            Component.ACTIVATIONS: at,
            "temporaries": shape.tied + work + shape.batch + _autocast_copies(setup, head=False),
        }
    first = _grads_so_far(setup, device, resident[Component.GRADIENTS])
    if first.bytes and shape.first and not setup.zero.activation_checkpointing:
        # stage 0: the first block's backward, its own activations beside every later gradient
        candidates["in the first block's backward"] = {
            **block,
            Component.GRADIENTS: resident[Component.GRADIENTS] + first,
            Component.ACTIVATIONS: shape.first,
        }
    candidates["at its end"] = end
    candidates.update(reductions.flushes(setup, rank, end, resident[Component.GRADIENTS]))
    candidates.update(reductions.scatters(setup, block, bucketed, end, gathered, backend))
    moments["backward"], backward = _largest(candidates)
    steps = _optimizer(setup, rank, device, resident, implementation, backend)
    if setup.batch.grad_accum > 1:  # engine.step() of a micro-step before the boundary updates nothing
        steps["between micro-steps"] = {
            **resident,
            Component.BUFFERS: resident[Component.BUFFERS] + _held_bucket(setup),
        }
    moments["optimizer"], optimizer = _largest(steps)
    for terms in (forward, backward, optimizer):
        terms.update({k: terms.get(k, NONE) for k in CATEGORIES if k not in terms})
    rng = micro_step.rng_states(setup) if backend == "gloo" else NONE
    forward["temporaries"] += rng
    backward["temporaries"] += rng
    reentrant = setup.zero.checkpoint_policy == "full"  # DeepSpeed's checkpoint, not torch's (the op policy)
    optimizer["temporaries"] += (rng if reentrant else NONE) + micro_step.input_leaf(setup)
    phases = {
        name: {k: terms[k] for k in CATEGORIES}
        for name, terms in zip(PHASES, (forward, backward, optimizer), strict=True)
    }
    return Timeline(phases, moments)


def _largest(candidates: dict[str, dict[str, Term]]) -> tuple[str, dict[str, Term]]:
    name = max(candidates, key=lambda k: _total(candidates[k]))
    return name, dict(candidates[name])


def _total(moment: dict[str, Term]) -> int:
    return sum(t.bytes for t in moment.values())


def _resident(setup: Setup, device: dict[str, Term]) -> dict[str, Term]:
    """The states held between steps (and between micro-steps): stages 0-2 free the gradients after the
    step (``zero_grad(set_to_none=True)``), except across micro-steps of gradient accumulation."""
    z = setup.zero
    out: dict[str, Term] = {
        k: device[k] for k in (Component.PARAMETERS, Component.OPTIMIZER_STATES, Component.BUFFERS)
    }
    held = z.engine == "deepspeed" and z.stage == 3
    if held or setup.batch.grad_accum > 1:
        grads = device[Component.GRADIENTS]
        if z.engine == "deepspeed" and z.stage in (0, 1) and setup.batch.grad_accum > 1:
            p, psi = element_bytes(z.precision), partition.trainable_params(setup)
            grads = Term(p * psi, f"{p} B x Psi (full gradients accumulated across micro-steps)")
        out[Component.GRADIENTS] = (
            grads if held else Term(grads.bytes, f"{grads.formula}, held across micro-steps")
        )
    else:
        out[Component.GRADIENTS] = NONE
    return out


def _grads_so_far(
    setup: Setup, device: dict[str, Term], held: Term, first: bool = True, mlp: bool = False
) -> Term:
    """DeepSpeed's stage 0 reduces after backward, and so does stage 1 without ``overlap_comm`` (its
    gradient hooks reduce only when ``partition_gradients or overlap_comm``; ``reduce_gradients`` walks
    every ``.grad`` after backward): when the first block's backward runs (``first``), ``.grad`` holds every
    gradient but the first block's and the embedding's (a block: the parameters outside the embeddings
    over the layers; a tied embedding's gradient from the head is autograd's until the embedding's own
    backward adds to it: ``tied``); when the last block's runs, the head's (an untied ``lm_head`` that
    trains, the final norm), and with ``mlp`` in its attention's backward also its MLP's, second norm's and
    output projection's (the kit's GPT). Nothing where they were held already or are reduced as they
    come."""
    m, z = setup.model, setup.zero
    after = z.engine == "deepspeed" and (z.stage == 0 or (z.stage == 1 and not z.overlap))
    if not after or held.bytes or not (m.layers and m.hidden and m.vocab):
        return NONE
    psi = partition.trainable_params(setup)
    listing = partition.listing(setup)
    # stage 0's gradients are the device's (DeepSpeed's fp16 optimizer: the parameters' own); stage 1's
    # .grad is a 16-bit (or fp32) gradient of every parameter, outside the partitioned states
    grads = (
        device[Component.GRADIENTS]
        if z.stage == 0
        else Term(element_bytes(z.precision) * psi, f"{element_bytes(z.precision)} B x Psi (.grad, stage 1)")
    )
    if not first:
        head = m.vocab * (not m.tied_embeddings and (listing is None or "lm_head" in listing.head))
        n = (head + 1) * m.hidden
        what = "the head's gradients"
        if mlp:  # c_proj (h h + h), ln_2 (2 h), c_fc (h f + f), the MLP's c_proj (f h + h)
            h, f = m.dims.hidden, m.dims.ffn
            n += h * h + 4 * h + 2 * h * f + f
            what += " and the last block's MLP's, second norm's and output projection's"
        return Term(grads.bytes * n // psi, f"{what}: {n:,} elements")
    if listing:  # a trainable subset's own first block and embedding (kit.trainable)
        embedding = m.vocab * m.hidden if listing.embeddings else 0
        later = psi - listing.blocks[0].params - embedding
    else:
        embedding = m.vocab * m.hidden
        block = (m.params - embedding * (1 if m.tied_embeddings else 2)) // m.layers
        later = m.params - block - embedding
    return Term(
        grads.bytes * later // psi,
        f"{grads.formula} x {later:,} / {psi:,} (all but the first block's and the embedding's)",
    )


def _allreduce_copy(setup: Setup) -> Term:
    """DeepSpeed's stage 0 all-reduces ``.grad`` after backward (``buffered_allreduce_fallback``, every
    precision: 16-bit runs step through ``FP16_Optimizer`` or its unfused twin, whose gradients are the
    parameters' own), each bucket flattened into one copy (``kit.rules.fallback_copies``): the largest."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage != 0:
        return NONE
    largest, p = max(fallback_copies(partition.trainable(setup)), default=0), element_bytes(z.precision)
    copy = Term(p * largest, f"{p} B x {largest:,} (the all-reduce's flat copy of the largest bucket)")
    c = ulysses.reduction_bytes(z, p)  # engine.allreduce_bucket upcasts it under sequence parallelism
    return copy + Term(c * largest, f"{c} B x {largest:,} (its fp32 copy)") if c != p else copy


def _end_gradients(setup: Setup, device: dict[str, Term], held: Term) -> Term:
    if setup.zero.engine == "deepspeed" and setup.zero.stage == 3:
        return held
    return device[Component.GRADIENTS]


def _bucket(setup: Setup) -> Term:
    """Stages 1-2: the ipg bucket(s) allocated at the first gradient hook, freed after backward; DDP's
    and FSDP's staging (``kit.estimate.baselines.transient``)."""
    from kit.estimate import baselines

    z = setup.zero
    if z.engine != "deepspeed":
        return baselines.transient(setup).get(Component.BUFFERS, NONE)
    if z.stage not in (1, 2) or not z.contiguous_gradients:
        return NONE
    p, count = element_bytes(z.precision), 2 if z.overlap else 1
    return Term(
        count * p * z.reduce_bucket_size,
        f"{count} x {p} B x reduce_bucket_size {z.reduce_bucket_size:,} (ipg bucket)",
    )


@lru_cache(maxsize=256)
def _matrices(model: ModelSpec) -> int | None:
    """Elements of the model's tensors of two or more dimensions (None without its shapes)."""
    shapes = spec_shapes(model)
    return None if shapes is None else sum(math.prod(shape) for shape in shapes if len(shape) >= 2)


def _autocast_copies(setup: Setup, head: bool = True) -> Term:
    """DDP in bf16 runs under ``torch.autocast``: every matmul casts its fp32 weight to bf16, autocast
    caches the copy of a leaf that requires grad (``cached_cast``) until the forward's autocast exits,
    and the matmul saves it for its backward. The weights are the tensors of two or more dimensions but
    the lookup tables (position embeddings, an untied input embedding); without ``head`` the language
    model head's copy is left out (freed by its backward)."""
    z, m = setup.zero, setup.model
    if z.engine != "ddp" or z.precision == "fp32":
        return NONE
    n = _matrices(m)
    if n is None:
        return NONE
    tables = (m.max_seq_len or 0) * (m.hidden or 0) if m.family == "gpt2" else 0
    if m.vocab and m.hidden:
        tables += 0 if m.tied_embeddings else m.vocab * m.hidden
        if not head:
            tables += m.vocab * m.hidden
    n -= tables
    p = element_bytes(z.precision)
    what = "" if head else ", the head's freed"
    return Term(p * n, f"{p} B x {n:,} (torch.autocast's cached weight copies, saved for backward{what})")


def _gather_copy(setup: Setup) -> Term:
    """Stage 3 over gloo: ``_allgather_base`` allocates a flat copy of the tensor it gathers while it
    runs (NCCL gathers in place); the largest released tensor's, padded to the ranks."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage != 3 or partition.gathers_in_place(setup):
        return NONE
    released = partition.released(setup)
    if not released:
        return NONE
    p, n = element_bytes(z.precision), partition.padded(max(released), setup.zero_dp)
    return Term(p * n, f"{p} B x {n:,} (gloo's all-gather copy of the largest released tensor)")


def _held_bucket(setup: Setup) -> Term:
    """Stage 1 with gradient accumulation: the ipg bucket(s) ``setup_buckets`` allocates at micro-step
    0's first gradient hook are released only by the boundary's epilogue (stage 1 reduces at the boundary
    only, ``engine.allreduce_gradients``), so they are live in the later micro-steps' forward too."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage != 1 or setup.batch.grad_accum == 1:
        return NONE
    bucket = _bucket(setup)
    return Term(bucket.bytes, f"{bucket.formula}, held across micro-steps") if bucket.bytes else NONE


def _gathered(setup: Setup, at_head: bool = False) -> Term:
    """Stage 3: parameters gathered in flight, of the tensors it releases (persistent ones are resident).

    ``release_sub_module`` keeps a module's parameters gathered after its forward when they recur within
    ``max_reuse_distance`` (``kit.estimate.partition.kept_to_backward``): those stay gathered until their
    backward; beside them, the layer in use and the prefetch (``kit.rules.stage3_gathered``), and a head
    weight used outside its module, held all step (``kit.estimate.partition.external_head``): ``at_head``,
    at the loss, that head is the tensor in use, beside it the prefetch only. One rank gathers in place
    (``kit.estimate.partition.gathers_in_place``): nothing."""
    z = setup.zero
    if z.engine != "deepspeed" or z.stage != 3 or partition.gathers_in_place(setup):
        return NONE
    released = list(partition.released(setup))
    if not released:
        return NONE
    p = element_bytes(z.precision)
    padded, kept = partition.gathered_padded(setup)
    m, tensors = setup.model, partition.numels(setup)
    vh = (m.vocab or 0) * (m.hidden or 0)  # the head's weight
    head_kept = bool(vh) and any(tensors[i] == vh for i in partition.kept_to_backward(setup))
    head = partition.external_head(setup)
    head = head if head in released else 0
    if head:  # held for the whole step: the rest are gathered around it (an untied head is kept anyway)
        if head_kept:
            kept -= partition.padded(head, setup.zero_dp)
        released.remove(head)
        head = partition.padded(head, setup.zero_dp)
    # at the loss the head is the tensor in use: already counted where it is held or kept
    in_use = 0 if at_head and (head or head_kept) else max(released, default=0)
    live = max(0, z.max_live_parameters - head)  # the held head counts among the live parameters
    flight = stage3_gathered(sum(released), in_use, partition.prefetch_call(setup, at_head), live)
    n = head + min(padded - head, kept + flight)
    how = "largest released tensor + prefetch, capped by max_live"
    if kept:
        how = f"{kept:,} kept to their backward (reuse within max_reuse_distance) + {how}"
    if head:
        how = f"the head's weight {head:,}, an external parameter of the top module held all step + {how}"
    return Term(p * n, f"{p} B x {n:,} gathered ({how}; at most every released tensor)")


def optimizer_temporaries(setup: Setup, tensors: list[int], implementation: Implementation) -> Term:
    """The torch optimizer's own allocations stepping fp32 tensors of ``tensors`` elements."""
    z = setup.zero
    if not optimizer_states(z.optimizer, z.momentum) or z.optimizer == "sgd" or implementation == "fused":
        return NONE
    if implementation == "foreach":
        n = sum(tensors)
        return Term(FP32 * n, f"_foreach_sqrt: 4 B x {n:,} (every tensor)")
    n = max(tensors)
    return Term(2 * FP32 * n, f"sqrt and its quotient: 2 x 4 B x {n:,} (the largest tensor)")


def _optimizer(setup, rank, device, resident, implementation, backend) -> dict[str, dict[str, Term]]:
    z, psi = setup.zero, partition.trainable_params(setup)
    p = element_bytes(z.precision)
    gloo = backend == "gloo"
    base = dict(resident)
    if z.engine != "deepspeed":  # FSDP steps each rank's shards (DTensors: their local tensors)
        tensors = list(baselines.local_shards(setup, rank) if z.engine == "fsdp" else partition.numels(setup))
        return {
            "during the update": {
                **base,
                Component.GRADIENTS: device[Component.GRADIENTS],
                "temporaries": optimizer_temporaries(setup, tensors, implementation),
            }
        }
    if z.stage == 0:
        tensors = list(partition.trainable(setup))
        grads = device[Component.GRADIENTS]
        if p != FP32:  # BF16_Optimizer / FP16: an fp32 copy of every gradient
            grads += Term(FP32 * psi, "4 B x Psi (fp32 gradient copies)")
        out = {
            "during the update": {
                **base,
                Component.GRADIENTS: grads,
                "temporaries": optimizer_temporaries(setup, tensors, implementation),
            }
        }
        if p != FP32 and implementation == "fused":
            # FP16_Optimizer.step (fused_optimizer.py; bf16 too: _do_optimizer_sanity_check's DDP_BFLOAT16)
            # flattens a list of every gradient's fp32 copy: the list, its flat copy and the 16-bit
            # gradients are live together
            out["at the gradients' flattening"] = {
                **base,
                Component.GRADIENTS: grads,
                "temporaries": Term(FP32 * psi, "4 B x Psi (FP16_Optimizer's per-tensor fp32 copies)"),
            }
        return out
    if z.stage in (1, 2):
        part = partition.partition_numel(setup)
        out = {}
        if z.offload_optimizer is Offload.NONE:
            out["during the update"] = {
                **base,
                Component.GRADIENTS: Term(FP32 * part, f"4 B x P (fp32 gradient partition, P = {part:,})"),
                "temporaries": optimizer_temporaries(setup, [part], implementation),
            }
        else:
            out["during the update"] = base
        if gloo:
            flat = part * setup.zero_dp
            out["at the all-gather"] = {
                **base,
                "temporaries": Term(p * flat, f"{p} B x padded Psi (gloo's all-gather copy)"),
            }
        return out
    # stage 3
    persistent = partition.persistent(setup)
    whole = p * partition.persistent_padded(setup)
    out = {}
    if z.offload_optimizer is Offload.NONE:
        sub = min(partition.partition_numel(setup), DS_SUB_GROUP_SIZE)
        params = Term(
            base[Component.PARAMETERS].bytes - whole,
            f"{base[Component.PARAMETERS].formula} - persistent tensors partitioned for the step",
        )
        out["during the update"] = {
            **base,
            Component.PARAMETERS: params,
            Component.GRADIENTS: base[Component.GRADIENTS]
            + Term(FP32 * sub, f"4 B x {sub:,} (a sub group's fp32 gradient)"),
            "temporaries": optimizer_temporaries(setup, [sub], implementation),
        }
    else:
        out["during the update"] = base
    if gloo and persistent:
        largest = partition.padded(max(persistent), setup.zero_dp)
        out["at the persistent all-gather"] = {
            **base,
            "temporaries": Term(p * largest, f"{p} B x {largest:,} (gloo's all-gather copy)"),
        }
    return out


__all__ = ["CATEGORIES", "PHASES", "Timeline", "runner_path", "timeline"]
