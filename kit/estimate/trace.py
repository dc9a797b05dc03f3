"""Activations by tracing: one forward and backward of the workload under ``FakeTensorMode``.

Fake tensors carry shapes, dtypes and storages but no data, so a 7B model at sequence 4096 is traced on
a laptop CPU in seconds with no memory allocated. Measured, per micro batch, in the run's precision:
- ``saved_bytes``: the unique storages autograd saves for backward, parameters excluded: the estimate's
  ``activations`` component without checkpointing (what ``kit.ranks.measure`` counts in real runs);
- ``checkpointed_bytes``: the same with each block of the model's largest ``ModuleList`` checkpointed
  as the runner does it (``kit.ranks.engine.Checkpointing``): the blocks' positional inputs, what is saved
  outside the blocks, and the largest block's saved tensors while it is recomputed in backward;
- ``peak_bytes``: the peak of live tensors over forward and backward, parameters and their gradients
  excluded (activations, saved or not, and backward's temporaries), a transient figure of its own:
  ``transient_bytes = peak_bytes - saved_bytes``. PyTorch's ``MemTracker`` measures the same under
  ``FakeTensorMode`` but took 6x as long on Llama-2-7B at sequence 4096, so a lean dispatch mode
  (``_LiveBytes``) counts it here.

Blind spots: data-dependent control flow sees fake values (mixture-of-experts routing is traced with
transformers' ``grouped_mm`` experts, whose shapes follow the routed tokens; that kernel needs bf16 under
``FakeTensorMode``); ops without a fake kernel fail the trace, which is then reported instead of a number;
the allocator's caching and fragmentation are not modelled (``kit.estimate.memory`` adds its slack).
Integer inputs (token ids, labels) stay real, and so does what is computed from them alone while it is
small (``_real_from_real``: at most ``SMALL`` elements, or an op whose result depends on values, such as
``nonzero`` or ``.item()``): under FakeTensorMode alone any op on them gave a fake tensor, so code that looks
at their values failed (``aten._local_scalar_dense``, ``aten.nonzero``). DeBERTa-v2 did twice: transformers'
``warn_if_padding_and_no_attention_mask`` asks whether the first or last id is the pad id, and its sequence
classifier picks the labelled rows with ``(labels >= 0).nonzero()``. Those ops now run as they would for
real; what autograd saves and the live bytes are counted alike for real and fake tensors.
Traces are cached per (model, micro batch, sequence length, precision, trainable subset, decoder length:
an encoder-decoder model reads ``seq_len`` tokens and learns ``Batch.target_len`` labels), in the process
and on disk (``kit.estimate.trace_store``: a notebook, a search, a panel reopened later read them back),
so panels stay live. A tensor's size is affine in the micro batch (the batch dimension, or none: a T5
position bias, a mask built once), and so are the live bytes after each allocation, though the moment of
their peak moves with the micro batch (T5's, until 4 samples). Once a second micro batch above
``LINE``'s is asked of the same model and lengths (a search: ``kit.planning.boundary.largest_micro_batch``),
it and every later one are drawn through the traces of 2, 3 and 4 samples: the saved bytes on their line,
the peak the largest of the live bytes after each allocation on theirs, where all lie on one
(``Trace.line``), else traced itself; one micro batch alone is traced, one trace rather than three, unless
asked inside ``searching()`` (a search declared as such: drawn from the first), and always inside ``alone()``
(one micro batch at several lengths).
"""

from __future__ import annotations

import json
import time
import weakref
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache

from kit import trainable
from kit.estimate.result import Term
from kit.schema import ModelSpec, Setup, ZeroSettings

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


@dataclass(frozen=True)
class Trace:
    """What one traced micro-step saves and holds (bytes; see the module docstring)."""

    saved_bytes: int
    checkpointed_bytes: int
    peak_bytes: int
    blocks: int
    seconds: float
    #: drawn through the traces of 2, 3 and 4 samples (``LINE``), not traced at its own micro batch
    line: bool = False
    #: the live bytes after each allocation, kept for the micro batches of ``LINE``
    levels: tuple[int, ...] = field(default=(), repr=False, compare=False)

    @property
    def transient_bytes(self) -> int:
        return max(0, self.peak_bytes - self.saved_bytes)

    def activations(self, checkpointing: bool) -> int:
        return self.checkpointed_bytes if checkpointing else self.saved_bytes

    def to_dict(self) -> dict:
        keys = ("saved_bytes", "checkpointed_bytes", "peak_bytes", "transient_bytes", "blocks", "seconds")
        return {k: getattr(self, k) for k in keys}


def traced(setup: Setup) -> Trace:
    """The trace of one micro-step of ``setup`` (cached); ValueError with one line when it cannot run."""
    b, z = setup.batch, setup.zero
    return trace(setup.model, b.micro_batch, b.seq_len, z.precision, trainable.key(z), b.target_len)


def activations(setup: Setup) -> Term:
    """The estimate's ``activations`` Term from the trace, with what was traced in its formula text."""
    from kit import hf_models

    t = traced(setup)
    b, ckpt = setup.batch, setup.zero.activation_checkpointing
    shape = f"b={b.micro_batch}" if setup.model.source else f"b={b.micro_batch}, s={b.seq_len}"
    shape += f", target {b.target_len}" if b.target_len else ""
    what = f"traced one micro-step (FakeTensorMode, {shape}, {setup.zero.precision}"
    what += ", on the line through b = 2, 3, 4)" if t.line else ")"
    how = (
        f"checkpointing: inputs of {t.blocks} blocks + saved outside them + the largest block recomputed"
        if ckpt
        else "unique storages saved for backward, parameters excluded"
    )
    formula = f"{what}: {how}"
    if setup.model.arch and not setup.model.source:
        moe = hf_models.experts(hf_models.config(json.loads(setup.model.arch)))
        if moe:
            formula += (
                f"; mixture of experts: activations follow the routed tokens (top-{moe[1]} of {moe[0]} "
                "experts per token), model states count every expert (ZeRO partitions them all)"
            )
    return Term(t.activations(ckpt), formula)


#: micro batches traced before a larger one is drawn through them (the module docstring)
LINE = (2, 3, 4)
#: the figures of a trace
FIGURES = ("saved_bytes", "checkpointed_bytes", "peak_bytes")
#: the micro batches above ``LINE`` asked of each (model, lengths, precision, subset): a second means a search
_ASKED: dict[tuple, set[int]] = {}
#: open ``searching()`` blocks: their micro batches above ``LINE`` are drawn at once; open ``alone()``
#: blocks: traced themselves
_SEARCHES = [0]
_ALONE = [0]


@contextmanager
def searching():
    """A block that will ask several micro batches of the same model (a search, a published row's checks):
    every one above ``LINE`` is drawn through the traces at ``LINE`` from the first, not only from the
    second (three small traces instead of one more large one)."""
    _SEARCHES[0] += 1
    try:
        yield
    finally:
        _SEARCHES[0] -= 1


@contextmanager
def alone():
    """A block that asks one micro batch at each of several lengths (``kit.planning.boundary``'s
    ``longest_sequence``, a padded published row's checks): each traced itself, never drawn, and not
    counted as a search of its lengths (one trace rather than three)."""
    _ALONE[0] += 1
    try:
        yield
    finally:
        _ALONE[0] -= 1


@lru_cache(maxsize=64)
def trace(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    precision: str,
    subset: tuple = (),
    target_len: int | None = None,
) -> Trace:
    """Trace ``spec``'s workload (``kit.workloads``) for one micro batch, trained with the trainable subset
    whose ``kit.trainable.key`` is ``subset`` (() or every parameter: the whole model), an encoder-decoder
    model learning ``target_len`` labels (None: ``seq_len``); from the second micro batch asked above
    ``LINE`` on the line through those where they lie on one; see the module docstring."""
    if micro_batch > LINE[-1] and not _ALONE[0]:
        asked = _ASKED.setdefault((spec, seq_len, precision, subset, target_len), set())
        asked.add(micro_batch)
        if len(asked) > 1 or _SEARCHES[0]:  # a search: three traces, then every micro batch off their lines
            first = [trace(spec, b, seq_len, precision, subset, target_len) for b in LINE]
            drawn = _drawn(first, micro_batch)
            if drawn is not None:
                return drawn
    traced = _stored(spec, micro_batch, seq_len, precision, subset, target_len)
    return traced if micro_batch in LINE else replace(traced, levels=())


def _stored(spec: ModelSpec, *figures) -> Trace:
    """``traced_at``'s trace, kept on disk by ``kit.estimate.trace_store`` (read back, or traced and kept)."""
    from kit.estimate import trace_store

    name = trace_store.key(spec, *figures)
    kept = trace_store.load(name)
    if kept is not None:
        return Trace(**{**kept, "levels": tuple(kept["levels"])})
    traced = traced_at(spec, *figures)
    trace_store.save(name, {**asdict(traced), "levels": list(traced.levels)})
    return traced


def _drawn(first: list[Trace], micro_batch: int) -> Trace | None:
    """A trace at ``micro_batch`` drawn through ``first`` (those at ``LINE``), or None where they do not
    lie on one line: the saved bytes, and the live bytes after each allocation (the peak their largest)."""
    import numpy as np

    saved = [(t.saved_bytes, t.checkpointed_bytes) for t in first]
    if len({t.blocks for t in first}) > 1 or len({len(t.levels) for t in first}) > 1:
        return None
    levels = np.array([t.levels for t in first], dtype=np.int64)
    steps = np.diff(levels, axis=0)
    if saved[2][0] - saved[1][0] != saved[1][0] - saved[0][0] or (steps[1] != steps[0]).any():
        return None
    if saved[2][1] - saved[1][1] != saved[1][1] - saved[0][1] or not len(levels[0]):
        return None
    n = micro_batch - LINE[0]
    return Trace(
        saved_bytes=saved[0][0] + n * (saved[1][0] - saved[0][0]),
        checkpointed_bytes=saved[0][1] + n * (saved[1][1] - saved[0][1]),
        peak_bytes=int((levels[0] + n * steps[0]).max()),
        blocks=first[0].blocks,
        seconds=sum(t.seconds for t in first),
        line=True,
    )


def traced_at(
    spec: ModelSpec,
    micro_batch: int,
    seq_len: int,
    precision: str,
    subset: tuple = (),
    target_len: int | None = None,
) -> Trace:
    """``trace``'s figures traced at ``micro_batch`` itself (uncached; ``trace`` draws large micro batches
    through small ones)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    from kit import workloads

    start = time.perf_counter()
    workload = workloads.for_model(spec)
    decoder = {"target_len": target_len} if target_len is not None else {}
    args, kwargs = workload.micro_batch(list(range(micro_batch)), seq_len, 0, **decoder)  # real, small: ids
    dtype = getattr(torch, DTYPES[precision])
    default = torch.get_default_dtype()
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    torch.set_default_dtype(dtype)  # modules cannot be cast under FakeTensorMode: build them in the dtype
    try:
        with mode:
            model = workload.shapes()
            if any(subset):  # the same LoRA or frozen parts the ranks apply (kit.workloads.adapters)
                model = _with_subset(model, ZeroSettings(**dict(zip(trainable.FIELDS, subset, strict=True))))
            fake = [_fake(mode, x, dtype) for x in args]
            fake_kw = {k: _fake(mode, x, dtype) for k, x in kwargs.items()}
            counter = _SavedByBlock(model)
            live = _LiveBytes(model)
            with _real_from_real(), live:
                with counter.watch():
                    loss = workload.loss(model(*fake, **fake_kw))
                loss.backward()
    except ValueError:
        raise
    except Exception as error:
        torch.set_default_dtype(default)
        if spec.source:
            _real_step(workload, spec.source)  # the user's code fails for real too: say where
        text = str(error).strip().splitlines()[0] if str(error).strip() else ""
        raise ValueError(
            f"trace: {spec.name} could not be traced under FakeTensorMode ({type(error).__name__}: {text})"
        ) from None
    finally:
        torch.set_default_dtype(default)
    return Trace(
        saved_bytes=counter.saved_bytes,
        checkpointed_bytes=counter.checkpointed_bytes,
        peak_bytes=live.peak,
        blocks=len(counter.blocks),
        seconds=round(time.perf_counter() - start, 3),
        levels=tuple(live.levels),
    )


def _with_subset(model, zero: ZeroSettings):
    """``kit.workloads.adapters.apply`` under FakeTensorMode. peft moves each new adapter to its base layer's
    device with ``Module.to``, which cannot swap a fake parameter (FakeTensorMode keeps a weak reference to
    it); adapters built on the meta device are left alone (peft skips those) and made fake parameters on the
    model's device here."""
    import torch

    from kit.workloads import adapters

    with torch.device("meta"):
        model = adapters.apply(model, zero)
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and p.device.type == "meta":
                fake = torch.empty(p.shape, dtype=p.dtype)
                module._parameters[name] = torch.nn.Parameter(fake, requires_grad=p.requires_grad)
    return model


class _SavedByBlock:
    """Counts what autograd saves (unique storages, parameters excluded) and which block saved it."""

    def __init__(self, model) -> None:
        import torch

        self.params = {p.untyped_storage()._cdata for p in model.parameters()}
        lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
        self.blocks = [*max(lists, key=len)] if lists else []
        self.seen: set[int] = set()
        self.inputs: dict[int, int] = {}
        self.freed_inputs = 0
        # storages are told apart by address, which a freed storage hands on to a later one: forget a
        # counted storage when it is freed, so the later one is counted too
        self.refs: dict[int, weakref.ref] = {}
        self.outside = 0
        self.per_block = [0] * len(self.blocks)
        self.current: int | None = None

    @property
    def saved_bytes(self) -> int:
        return self.outside + sum(self.per_block)

    @property
    def checkpointed_bytes(self) -> int:
        if not self.blocks:
            return self.saved_bytes
        return self.outside + sum(self.inputs.values()) + self.freed_inputs + max(self.per_block)

    def track(self, storage) -> None:
        key = storage._cdata
        if key not in self.refs:
            self.refs[key] = weakref.ref(storage, lambda _: self.freed(key))

    def freed(self, key: int) -> None:
        self.refs.pop(key, None)
        self.seen.discard(key)
        self.freed_inputs += self.inputs.pop(key, 0)

    def watch(self):
        import contextlib

        import torch

        def pack(t):
            storage = t.untyped_storage()
            key = storage._cdata
            if key in self.params or key in self.seen or not t.numel():
                return t
            self.seen.add(key)
            self.track(storage)
            if self.current is None:
                self.outside += storage.nbytes()
            else:
                self.per_block[self.current] += storage.nbytes()
            return t

        def enter(index):
            def hook(module, args, kwargs):
                self.current = index
                for a in args:
                    if isinstance(a, torch.Tensor) and a.untyped_storage()._cdata not in self.params:
                        storage = a.untyped_storage()
                        self.inputs.setdefault(storage._cdata, storage.nbytes())
                        self.track(storage)

            return hook

        def leave(module, args, output):
            self.current = None

        @contextlib.contextmanager
        def watching():
            handles = [
                b.register_forward_pre_hook(enter(i), with_kwargs=True) for i, b in enumerate(self.blocks)
            ]
            handles += [b.register_forward_hook(leave) for b in self.blocks]
            try:
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    yield
            finally:
                for h in handles:
                    h.remove()

        return watching()


class _LiveBytes:
    """Peak bytes of live storages created within (parameters and gradients excluded): a dispatch mode
    that adds each new output storage and a weakref finalizer that subtracts it when it is freed."""

    def __init__(self, model) -> None:
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode

        self.exclude = {p.untyped_storage()._cdata for p in model.parameters()}
        self.current = self.peak = 0
        self.levels: list[int] = []  # the live bytes after each allocation
        self.live: dict[int, tuple] = {}
        owner = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_leaves(out):
                    if isinstance(t, torch.Tensor):
                        owner.add(t.untyped_storage())
                return out

        self.mode = Mode()
        self.params = list(model.parameters())

    def add(self, storage) -> None:
        key = storage._cdata
        if key in self.live or key in self.exclude:
            return
        nbytes = storage.nbytes()
        self.live[key] = (nbytes, weakref.ref(storage, lambda _: self.drop(key)))
        self.current += nbytes
        self.levels.append(self.current)
        if self.current > self.peak:
            self.peak = self.current

    def drop(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry:
            self.current -= entry[0]

    def __enter__(self):
        def as_gradient(grad):  # a parameter's gradient is a model state, not a transient
            self.drop(grad.untyped_storage()._cdata)
            self.exclude.add(grad.untyped_storage()._cdata)

        self.hooks = [p.register_hook(as_gradient) for p in self.params if p.requires_grad]
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        self.mode.__exit__(*exc)
        for h in self.hooks:
            h.remove()


#: the most elements an op computed from real tensors alone returns for real (a sample's labels, ids)
SMALL = 1 << 16


def _real_from_real():
    """A dispatch mode, entered above FakeTensorMode: an op whose tensor arguments are all real (the integer
    inputs, constants, what was computed from them alone) runs for real when its result has at most
    ``SMALL`` elements or FakeTensorMode cannot tell it (a data-dependent shape or value); else it stays
    fake. Ops on fake tensors, and factories, go to FakeTensorMode as before."""
    import torch
    from torch._subclasses.fake_tensor import (
        DataDependentOutputException,
        DynamicOutputShapeException,
        FakeTensor,
        unset_fake_temporarily,
    )
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            if not tensors or any(isinstance(t, FakeTensor) for t in tensors):
                return func(*args, **kwargs)
            try:
                fake = func(*args, **kwargs)  # FakeTensorMode's answer gives the result's size
            except (DataDependentOutputException, DynamicOutputShapeException):
                fake = None
            leaves = [t for t in tree_leaves(fake) if isinstance(t, torch.Tensor)]
            if fake is not None and sum(t.numel() for t in leaves) > SMALL:
                return fake
            with unset_fake_temporarily():
                return func(*args, **kwargs)

    return Mode()


def _real_step(workload, source: str) -> None:
    """One real forward and backward at micro batch 1 on CPU: ValueError naming the user's file and
    function when it fails (then the trace's failure was the model's, not FakeTensorMode's)."""
    from kit import model_files

    try:
        args, kwargs = workload.micro_batch([0], 1, 0)
        workload.loss(workload.build()(*args, **kwargs)).backward()
    except ValueError:
        raise
    except Exception as error:
        raise ValueError(
            f"model: {source}: forward(*batch(1)) raised {model_files.where(error, source)}"
        ) from None


def _fake(mode, x, dtype):
    """A float input as a fake tensor in the run's dtype; integer inputs (token ids, labels) stay real
    and small, so that code looking at their values (a label check, a padding mask) can run."""
    if not hasattr(x, "is_floating_point") or not x.is_floating_point():
        return x
    return mode.from_tensor(x).to(dtype)
