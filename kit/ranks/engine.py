"""One DeepSpeed engine for one Setup, inside a launched rank: build, feed, step, tear down.

``build_engine`` builds what the Setup's ModelSpec trains (``kit.workloads``: a toy, a Hugging Face
model or a model file), partitioned under ``deepspeed.zero.Init`` for stage 3, and hands it to
``deepspeed.initialize`` with the ds_config ``kit.ds_config`` exports. Data is synthetic and
deterministic: sample ``i`` depends only on (seed, i), and rank ``r`` of ``w`` takes samples
``r, r + w, ...`` of each global batch, so every stage sees exactly the same data.
``teardown`` frees everything so several engines can be built one after another in one process.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from kit import trainable
from kit.schema import Setup
from kit.specs import Spec

#: a launch spec model (``kit.specs``)
S = TypeVar("S", bound=Spec)


@dataclass
class Built:
    """One rank's engine, the module it wraps, what it trains (``kit.workloads``) and its activation
    checkpointing (None when off)."""

    engine: Any
    model: Any
    workload: Any
    checkpointing: Checkpointing | None = None


def build_engine(setup: Setup, seed: int = 0, *, comms_logger: bool = False) -> Built:
    """The engine for ``setup`` on this rank; weights depend only on ``seed``.

    ``comms_logger`` turns on DeepSpeed's communication logger for every collective
    (``"comms_logger": {"enabled": true, "prof_all": true}``), which ``kit.ranks.measure`` reads.
    """
    import deepspeed
    import torch
    from deepspeed.accelerator import get_accelerator

    from kit import workloads
    from kit.ds_config import to_ds_config
    from kit.workloads import ulysses

    baseline = setup.zero.engine != "deepspeed"
    config = {} if baseline else to_ds_config(setup, torch_adam=True)
    if comms_logger:
        config["comms_logger"] = {"enabled": True, "prof_all": True}
    init_distributed()
    if get_accelerator().device_name() != "cpu":
        get_accelerator().set_device(int(os.environ.get("LOCAL_RANK", 0)))
    workload = workloads.for_model(setup.model)
    torch.manual_seed(seed)
    zero_init = setup.zero.stage == 3 and setup.zero.zero_init and not baseline
    with workload.partitioned(config) if zero_init else contextlib.nullcontext():
        model = workload.build()
    z = setup.zero
    mpu = ulysses.register(model, setup) if z.sequence_parallel_size > 1 else None
    if trainable.is_subset(z):
        model = _train_subset(model, setup)
    checkpointing = Checkpointing.of(model, z) if z.activation_checkpointing else None
    if z.loss != "plain":  # the forward ends in the fused loss (kit.loss), the head never called
        from kit.workloads import chunked_loss

        model = chunked_loss.wrap(model, 0 if baseline else z.stage, z.loss)
    if baseline:  # PyTorch's DDP or FSDP, stepped as DeepSpeed steps its engine
        from kit.ranks import baselines

        return Built(baselines.wrap(model, setup), model, workload, checkpointing)
    # the optimizer gets the parameters that train, as the HF Trainer gives it
    params = [p for p in model.parameters() if p.requires_grad]
    engine, *_ = deepspeed.initialize(model=model, model_parameters=params, config=config, mpu=mpu)
    return Built(engine, model, workload, checkpointing)


def _train_subset(model, setup: Setup):
    """``model`` with ``setup``'s trainable subset (``kit.workloads.adapters``; LoRA adapters built after
    ``zero.Init``, which DeepSpeed's stage 3 partitions at ``initialize``). With checkpointing and every
    embedding frozen the blocks' inputs are made to need a gradient (``enable_input_require_grads``, as
    transformers does under gradient checkpointing), else a reentrant checkpoint would give the
    adapters none."""
    from kit.workloads import adapters

    model = adapters.apply(model, setup.zero)
    if setup.zero.activation_checkpointing and not adapters.listing(setup.model, setup.zero).inputs_need_grad:
        model.enable_input_require_grads()
    return model


def init_distributed() -> None:
    """Join the process group (NCCL on GPUs, gloo on the CPU accelerator) once per process.

    DeepSpeed's shared-memory all-reduce op only serves inference; it is marked incompatible first so
    that a fresh machine does not JIT-build it (~25 s).
    """
    import deepspeed
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed()


def preload(setups: list[Setup]) -> None:
    """Pay once per launch, before its first configuration, what the first engine build would pay: torch's
    optimizer constructor imports ``torch._dynamo`` and, when a ZeRO stage runs, DeepSpeed's ZeRO optimizer
    check imports its Muon optimizer, which compiles (``torch.compile`` imports inductor): 7.5 s on 2 CPU
    cores; the kit's rank modules too. Then ``gc.freeze()``: the full collections of every ``teardown``
    and of stage 3's ``defragment`` (0.7 s each after those imports, nearly all of it scanning their
    objects) see only what the configurations create."""
    import torch
    from deepspeed.runtime.zero.utils import is_zero_supported_optimizer

    from kit import estimate, workloads  # noqa: F401 (imported for the first configuration)
    from kit.ranks import comm_scopes, measure, memory_timeline, nvme_files, state_walk  # noqa: F401

    optimizer = torch.optim.AdamW([torch.zeros(2, requires_grad=True)])
    if any(s.zero.engine == "deepspeed" and s.zero.stage > 0 for s in setups):
        is_zero_supported_optimizer(optimizer)
    gc.collect()
    gc.freeze()


def join(argv: list[str] | None, description: str, kind: type[S]) -> tuple[S, int, int]:
    """A per-rank script's start: parse ``--spec FILE`` (and the deepspeed launcher's ``--local_rank``),
    read the spec as a ``kind`` (``kit.specs``: a spec that does not validate is one line naming the file
    and the field, before the process group), join the process group. Returns ``(spec, rank, world_size)``."""
    import argparse

    import deepspeed.comm as dist

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--spec", required=True, help="spec JSON written by the kit")
    parser.add_argument("--local_rank", type=int, help="set by the deepspeed launcher (LOCAL_RANK is used)")
    args = parser.parse_args(argv)
    try:
        spec = kind.read(args.spec)
    except ValueError as error:  # one line on stderr, not a traceback from every rank
        raise SystemExit(f"zerokit: launch spec {error}") from None
    init_distributed()
    return spec, dist.get_rank(), dist.get_world_size()


def micro_batch(workload, setup: Setup, step: int, rank: int, world: int, micro: int = 0, seed: int = 0):
    """``(args, kwargs)`` of micro-batch ``micro`` of training step ``step`` on ``rank`` of ``world``.

    Global sample indices of a step run over its ``train_batch`` samples, after those of the steps
    before it (``Setup.samples_before``: a batch schedule changes how many); this rank takes every
    ``world``-th one of its micro-batch's slice (as ``DistributedSampler`` does); under sequence parallelism
    each group of ``sp`` consecutive ranks is one data-parallel rank and each member keeps its part of the
    sequence (``kit.workloads.ulysses.shard``). CPU tensors, floats in fp32: ``train_step`` moves and
    casts them.
    """
    b = setup.batch
    if b.max_tokens:
        from kit.workloads import packed_lengths

        ids, lengths = packed_lengths(b, step, rank, world, micro, seed)
        return workload.micro_batch(ids, b.seq_len, seed, lengths=lengths)
    mb, sp = setup.at_step(step).batch.micro_batch, setup.zero.sequence_parallel_size
    group, member = divmod(rank, sp)  # a sequence-parallel group: sp consecutive ranks, the same samples
    replicas = world // sp
    first = setup.samples_before(step) + micro * mb * replicas
    indices = [first + group + replicas * k for k in range(mb)]
    decoder = {"target_len": b.target_len} if b.target_len else {}  # an encoder-decoder's labels
    args, kwargs = workload.micro_batch(indices, b.seq_len, seed, **decoder)
    if sp > 1:
        from kit.workloads import ulysses

        args, kwargs = ulysses.shard(args, kwargs, member, sp)
    return args, kwargs


def train_step(
    engine,
    workload,
    setup: Setup,
    step: int,
    rank: int,
    world: int,
    *,
    seed: int = 0,
    around_micro_step: Callable | None = None,
    after_backward: Callable | None = None,
    phase: Callable | None = None,
) -> float:
    """One optimizer step (``grad_accum`` micro-steps) of ``workload`` (``kit.workloads``); returns this
    rank's mean micro-batch loss.

    ``around_micro_step(micro)`` may return a context manager wrapped around forward, loss and backward
    of each micro-step (``kit.ranks.measure`` counts saved activations there); ``after_backward(micro)``
    is called between backward and ``engine.step()``, while the gradients are held (model states are
    read there). ``phase(name)`` may return a context manager wrapped around each phase of a micro-step
    (``kit.ranks.memory_timeline.PHASES``: the micro batch and forward, backward, ``engine.step()``).
    With a batch schedule the batch of ``step`` is set first (``set_batch``).
    """
    import torch

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(setup.zero.precision, torch.float32)
    scheduled = bool(setup.batch.schedule)
    gas = setup.at_step(step).batch.grad_accum
    if scheduled:
        set_batch(engine, setup.at_step(step))
    if setup.batch.max_tokens:
        scale_lr(engine, setup, step, world, seed)
    total = 0.0
    phase = phase or (lambda name: contextlib.nullcontext())
    for micro in range(gas):
        with phase("forward"):
            args, kwargs = micro_batch(workload, setup, step, rank, world, micro, seed)
            args = tuple(_to(x, engine.device, dtype) for x in args)
            kwargs = {k: _to(x, engine.device, dtype) for k, x in kwargs.items()}
        if scheduled:
            # DeepSpeed's boundary is (micro_steps + 1) % grad_accum == 0 over *all* micro-steps so far:
            # after a change of grad accum it would fall mid-step, so say where it is
            engine.set_gradient_accumulation_boundary(micro == gas - 1)
        with around_micro_step(micro) if around_micro_step else contextlib.nullcontext():
            with phase("forward"):
                loss = workload.loss(engine(*args, **kwargs))
            with phase("backward"):
                engine.backward(loss)
        if after_backward is not None:
            after_backward(micro)
        with phase("optimizer"):
            engine.step()
        total += loss.item()
        del loss, args, kwargs
    return total / gas


def scale_lr(engine, setup: Setup, step: int, world: int, seed: int) -> None:
    """Under a token budget each step holds a different number of samples: scale the learning rate
    linearly with it, against the nominal global batch (DeepSpeed's ``variable_batch_size_and_lr.scale_lr``,
    the rule its ``VariableBatchSizeLR`` applies)."""
    from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import scale_lr as rule

    from kit.workloads import packed_sizes

    samples = packed_sizes(setup.batch, step, world, seed)["train_batch"]
    lr = rule(
        setup.batch.train_batch, samples, base_lr=engine._config.optimizer_params["lr"], method="linear"
    )
    for group in engine.optimizer.param_groups:
        group["lr"] = lr


def set_batch(engine, setup: Setup) -> None:
    """Give the engine ``setup``'s batch with DeepSpeed's own setters: ``set_train_micro_batch_size``
    (keeps grad accum) for a new micro batch, then ``set_train_batch_size`` (keeps the micro batch,
    changes grad accum) for a new global batch. No-op when they already agree."""
    b = setup.batch
    if engine.train_micro_batch_size_per_gpu() != b.micro_batch:
        engine.set_train_micro_batch_size(b.micro_batch)
    if engine.train_batch_size() != b.train_batch:
        engine.set_train_batch_size(b.train_batch)


def teardown(engine) -> None:
    """Free an engine so the next one starts clean (drop your own references to it and its tensors first).

    Calls ``engine.destroy()``, clears ZeRO-3's global forward-module stack and the parameter
    coordinator's release cache (an ``lru_cache`` holding the engine), puts back ``F.linear``, forgets
    ZeRO++ hpZ's process group (DeepSpeed asserts that none exists when the next hpZ engine creates its
    own), then collects garbage.
    """
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import parameter_offload, partitioned_param_coordinator
    from deepspeed.utils import groups

    engine.destroy()
    _restore_linear()
    if getattr(engine, "sequence_parallel_size", 1) > 1:
        from kit.workloads import ulysses

        ulysses.unregister()
    hpz_group = groups._get_zero_param_intra_parallel_group()
    if hpz_group is not None:
        groups._release_process_group_references(hpz_group)
    parameter_offload.FWD_MODULE_STACK.clear()
    coordinator = partitioned_param_coordinator.PartitionedParameterCoordinator
    _lru_cache_of(coordinator._PartitionedParameterCoordinator__params_to_release).cache_clear()
    del engine
    gc.collect()
    get_accelerator().empty_cache()


def _restore_linear() -> None:
    """Put back ``torch.nn.functional.linear``: ``zero.Init`` replaces it with DeepSpeed's
    ``zero3_linear_wrap`` "unless manually reset", which saves every linear layer's input whether or not a
    gradient needs it, so a later engine in the same process would save more than a fresh process does."""
    import torch
    from deepspeed.runtime.zero.partition_parameters import InsertPostInitMethodToModuleSubClasses as patcher

    if hasattr(patcher, "linear_bk"):
        torch.nn.functional.linear = patcher.linear_bk


def _lru_cache_of(function):
    """The ``functools.lru_cache`` wrapper of ``function``, also under DeepSpeed's ``instrument_w_nvtx``."""
    while not hasattr(function, "cache_clear"):
        function = inspect.getclosurevars(function).nonlocals["func"]
    return function


def _to(x, device, dtype):
    if not hasattr(x, "is_floating_point"):
        return x  # a forward argument that is not a tensor
    if x.is_floating_point():
        return x.to(device=device, dtype=dtype)
    return x.to(device)


class Checkpointing:
    """Activation checkpointing of a model's blocks as ``kit.checkpointing`` says, and who watches it.

    The checkpointed blocks of the model's largest ModuleList (every ``every``-th) run under
    ``deepspeed.checkpointing.checkpoint`` (policy ``full``, configured with DeepSpeed's ``cpu`` and
    ``partition`` options: ``kit.checkpointing``), or under ``torch.utils.checkpoint``
    (non-reentrant) with the op policy's contexts (``selective-op``). Within
    ``with checkpointing.observed_by(observer):`` the observer gets ``checkpoint_inputs(tensors)``, what
    each block keeps for its recomputation (its inputs, or what DeepSpeed keeps of them on their device,
    and the outputs the op policy keeps: all held by the checkpoint, out of sight of
    ``saved_tensors_hooks``; not the inputs a GPU's offload engine keeps), and enters
    ``observer.recomputing()`` while a block is recomputed in backward; a non-reentrant recomputation
    saves out of the hooks' sight too, so the observer gets ``recomputed(storages)``, those it made that
    outlive it (its early stop is off while watched). ``kit.ranks.measure.SavedActivations`` is such an
    observer.
    """

    def __init__(
        self, model, every: int = 1, policy: str = "full", cpu: bool = False, partition: bool = False
    ):
        import deepspeed
        from deepspeed.accelerator import get_accelerator

        from kit import checkpointing, workloads

        self.observers: list = []
        self.selective = policy == "selective-op"
        problem = checkpointing.cpu_ranks_problem(cpu, partition)
        if problem and get_accelerator().device_name() == "cpu":
            raise ValueError(problem)
        if not workloads.blocks(model):
            raise ValueError("activation_checkpointing: the model has no list of blocks to checkpoint")
        if hasattr(getattr(model, "config", None), "use_cache"):
            # as transformers' gradient checkpointing does: a recomputed block would append to a KV cache
            model.config.use_cache = False
        if self.selective:
            import torch.utils.checkpoint

            checkpoint = functools.partial(
                torch.utils.checkpoint.checkpoint,
                use_reentrant=False,
                context_fn=checkpointing.selective_contexts,
            )
        else:
            deepspeed.checkpointing.configure(None, partition_activations=partition, checkpoint_in_cpu=cpu)
            checkpoint = deepspeed.checkpointing.checkpoint
        for i, block in enumerate(workloads.blocks(model)):
            if checkpointing.is_checkpointed(i, every):
                block.forward = self._checkpointed(block.forward, checkpoint)

    @classmethod
    def of(cls, model, zero) -> Checkpointing:
        """``model``'s blocks checkpointed as a ``ZeroSettings`` says."""
        z = zero
        return cls(
            model, z.checkpoint_every, z.checkpoint_policy, z.cpu_checkpointing, z.partition_activations
        )

    @contextlib.contextmanager
    def observed_by(self, observer):
        self.observers.append(observer)
        try:
            yield
        finally:
            self.observers.remove(observer)

    def _checkpointed(self, forward: Callable, checkpoint: Callable) -> Callable:
        import torch
        import torch.utils.checkpoint

        from kit.checkpointing import OpPolicy

        def run(*args: Any, **kwargs: Any) -> Any:
            # keyword arguments (Hugging Face layers get masks and rotary tables so) ride in a partial:
            # they are alive for the whole step anyway; the positional inputs are what is kept
            inputs = [a for a in args if isinstance(a, torch.Tensor)]
            if self.selective:  # before the op policy's kept outputs
                for observer in self.observers:
                    observer.checkpoint_inputs(inputs)
            watched = self.selective and bool(self.observers)
            calls: list[int] = []
            kept_storages: list = []  # weak references: held by the policy's cache until they are reused

            def block(*args, **kwargs):
                calls.append(len(calls))
                if len(calls) == 1:  # the forward
                    if not watched:
                        return forward(*args, **kwargs)
                    with _outputs(OpPolicy()) as kept:
                        out = forward(*args, **kwargs)
                    for observer in self.observers:
                        observer.checkpoint_inputs(kept.tensors)
                    kept_storages.extend(weakref.ref(t.untyped_storage()) for t in kept.tensors)
                    return out
                with contextlib.ExitStack() as stack:  # the recomputation in backward
                    for observer in self.observers:
                        stack.enter_context(observer.recomputing())
                    if not watched:
                        return forward(*args, **kwargs)
                    with _outputs(OpPolicy(), recompute=True) as made:
                        out = forward(*args, **kwargs)
                    for observer in self.observers:
                        observer.recomputed(made.outliving(out, kept_storages))
                    return out

            step = functools.partial(block, **kwargs)
            if not self.selective:
                # DeepSpeed's: partition_activations keeps a copy (``saved_data``) and frees the input,
                # cpu_checkpointing moves it off the device (on CPU ranks: stays, as the copy)
                devices = [a.device for a in inputs]
                out = checkpoint(step, *args)
                kept = [_held(a) for a in inputs]
                here = [t for t, device in zip(kept, devices, strict=True) if t.device == device]
                for observer in self.observers:
                    observer.checkpoint_inputs(here)
                return out
            if not watched:
                return checkpoint(step, *args)
            with torch.utils.checkpoint.set_checkpoint_early_stop(False):
                return checkpoint(step, *args)

        return run


def _held(tensor):
    """What DeepSpeed's checkpoint keeps of an input: the copy ``partition_activations`` saves in its
    ``saved_data`` (the input's own storage emptied), else the input."""
    saved = getattr(tensor, "saved_data", None)
    return tensor if saved is None else saved


def _outputs(rule, recompute: bool = False):
    """A dispatch mode that collects what ops output: in a forward, the tensors ``rule`` (an
    ``OpPolicy``) keeps (``tensors``); in a recomputation, a weak reference to the storage of every other
    op's output (the kept ones come back from the policy's cache), and ``outliving(out, kept)`` gives
    those still alive that are neither ``out``'s nor the ``kept`` storages (views of them)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Outputs(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.tensors: list = []
            self.storages: list = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            kept = rule.keeps(func, recompute)
            if recompute and not kept:
                self.storages += [weakref.ref(t.untyped_storage()) for t in leaves]
            elif kept and not recompute:
                self.tensors += leaves
            return out

        def outliving(self, out, kept: list) -> list:
            """The recomputation's storages still alive but ``out``'s and the kept ones still alive (weak
            references): a kept output the recomputation used and freed leaves its address to a new one."""
            leaves = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            held = {s.data_ptr() for s in (ref() for ref in kept) if s is not None}
            other = held | {t.untyped_storage().data_ptr() for t in leaves}  # views of these are theirs
            alive = [ref() for ref in self.storages]
            return [s for s in alive if s is not None and s.data_ptr() not in other]

    return Outputs()
