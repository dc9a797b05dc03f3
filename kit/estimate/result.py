"""What an estimate is: ``Term`` (a number and its formula) and ``Estimate`` (bytes per GPU by component)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from kit.components import COMPONENTS, HELD, MODEL_STATES, Component
from kit.fit import estimate_fit
from kit.gpus import catalogue
from kit.schema import Setup
from kit.units import size

#: the ranks' accelerators an estimate describes (DeepSpeed's names, ``kit.run.launcher.ranks_accelerator``)
ACCELERATORS = ("cuda", "cpu")


@dataclass(frozen=True)
class Term:
    """One number of the estimate and how it was computed (shown by the CLI table and the notebooks)."""

    bytes: int
    formula: str

    def __add__(self, other: Term | None) -> Term:
        """The sum, formulas joined with ``+``; a zero term (or None) leaves the other unchanged."""
        if other is None or not other.bytes:
            return self
        if not self.bytes:
            return other
        return Term(self.bytes + other.bytes, f"{self.formula} + {other.formula}")


NONE = Term(0, "none")


def cpu_overheads(setup: Setup) -> Term:
    """What a CPU rank holds beside its tensors where a GPU holds ``kit.estimate.memory.gpu_overheads``:
    nothing. It has no CUDA context, no NCCL (gloo's collectives copy into host tensors, which the
    timeline's ``backend="gloo"`` counts) and no caching allocator (host tensors are freed at once); what
    its process itself takes (Python, torch, DeepSpeed) is in CPU RAM per node (``PROCESS_BASE_BYTES`` a
    rank)."""
    ranks = f"{setup.zero_dp} CPU rank{'s' if setup.zero_dp > 1 else ''}"
    return Term(
        0,
        f"not applicable on {ranks}: no CUDA context, NCCL buffers or caching allocator (each process's "
        "own RAM is in CPU RAM per node)",
    )


def total(terms: list[Term]) -> Term:
    """All ``terms`` added up (``NONE`` for an empty list)."""
    out = NONE
    for t in terms:
        out = out + t
    return out


@dataclass(frozen=True)
class Estimate:
    """Bytes per GPU by component, CPU RAM per node, and the fit per GPU type; ``on_accelerator("cpu")``:
    the same per CPU rank (no GPU overheads)."""

    setup: Setup
    formula: str
    terms: dict[str, Term]
    host_terms: dict[str, Term]
    cpu_term: Term
    notes: tuple[str, ...] = field(default=())
    #: the activations trace (``kit.estimate.trace.Trace``) when one was made, beside the formula
    trace: Any = None
    #: ZeRO-Infinity: bytes of swap files on one node's NVMe drives (``kit.estimate.nvme``)
    nvme_term: Term = NONE
    #: the predicted peak per phase of a step (``kit.estimate.peak.Timeline``; None for the paper's formula)
    timeline: Any = None
    #: the GPU-only overheads beside the tensors: CUDA context, NCCL buffers (an allocator slack on the peak
    #: where the allocator is not replayed)
    #: (on CPU ranks ``cpu_overheads``: none)
    peak_overhead: Term = NONE
    #: the caching allocator's replay of its steps, run when asked (``kit.estimate.reserved.reserved``;
    #: ``implementation=`` another torch optimizer path than the fused default)
    replay: Callable[..., Any] | None = field(default=None, compare=False, repr=False)
    #: what the ranks run on (``ACCELERATORS``): ``"cuda"`` (GPUs, the default) or ``"cpu"`` (CPU ranks)
    accelerator: str = "cuda"

    def on_accelerator(self, accelerator: str) -> Estimate:
        """This estimate for ranks on ``accelerator`` (``"cuda"`` or ``"cpu"``; where the ranks run:
        ``kit.run.launcher.ranks_accelerator()``, a record's ``device``). ``"cuda"``: the estimate as it is.
        ``"cpu"``: the same tensors, with what a CPU rank holds beside them instead of a GPU's CUDA
        context, NCCL buffers and allocator slack (``cpu_overheads``: nothing, its process's own RAM is in
        CPU RAM per node) and no caching allocator's replay (``reserved`` None).
        Its timeline stays the GPU path's (DeepSpeed's FusedAdam over NCCL); the path the kit's runner
        takes on CPU ranks (torch's single-tensor Adam over gloo, its copies) is
        ``kit.estimate.memory.peak_timeline(..., backend="gloo")``, the records' ``estimate.phases``."""
        if accelerator not in ACCELERATORS:
            raise ValueError(f"accelerator: choose one of {', '.join(ACCELERATORS)}, got {accelerator!r}")
        if accelerator == self.accelerator:
            return self
        if accelerator == "cuda":
            raise ValueError("accelerator: back to cuda from cpu: call estimate(setup) again")
        if self.formula != "deepspeed":  # the paper's formula counts no overhead
            return dataclasses.replace(self, accelerator=accelerator)
        overhead = cpu_overheads(self.setup)
        terms = {**self.terms, Component.OVERHEAD: overhead}
        return dataclasses.replace(
            self, terms=terms, peak_overhead=overhead, replay=None, accelerator=accelerator
        )

    @property
    def device(self) -> str:
        """What the per-device numbers are per: ``"GPU"``, or ``"rank"`` on CPU ranks."""
        return "rank" if self.accelerator == "cpu" else "GPU"

    @property
    def components(self) -> dict[str, int]:
        return {k: self.terms[k].bytes for k in COMPONENTS}

    @property
    def host(self) -> dict[str, int]:
        """Bytes per rank kept in CPU RAM by offload."""
        return {k: self.host_terms[k].bytes for k in HELD}

    @property
    def formulas(self) -> dict[str, str]:
        out = {k: t.formula for k, t in self.terms.items()}
        out.update({f"host.{k}": t.formula for k, t in self.host_terms.items() if t.bytes})
        out["cpu_per_node"] = self.cpu_term.formula
        if self.timeline:
            out.update({f"phase.{k}": v for k, v in self.timeline.formulas().items()})
            out["peak_overhead"] = self.peak_overhead.formula
            if self.reserved:
                out["reserved"] = self.reserved.term().formula
        if self.nvme_term.bytes:
            out["nvme_per_node"] = self.nvme_term.formula
        return out

    @property
    def components_bytes(self) -> int:
        """Every component at once, each buffer at its largest: a view by component, never the verdict (it
        leaves out the loss's temporaries the peak holds, and adds buffers that are never live together)."""
        return sum(self.components.values())

    @property
    def per_gpu_bytes(self) -> int:
        """The predicted peak per GPU, the one number "fits" is decided on (``kit.fit``): predicted max
        reserved (the peak phase's tensors and what the caching allocator's replay holds beyond them,
        ``reserved_bytes``) plus what the GPU runtime holds outside the allocator (``peak_overhead``); where
        the allocator is not replayed, ``screen_bytes`` (its overhead has a share for it). The ZeRO paper's
        formula has no timeline: its components' sum. On CPU ranks (``on_accelerator("cpu")``): the peak
        per rank, its tensors alone."""
        if self.timeline is None:
            return self.components_bytes
        return self.screen_bytes + (self.reserved.cached if self.reserved else 0)

    @property
    def screen_bytes(self) -> int:
        """The peak phase's tensors plus ``peak_overhead``, before the allocator's replayed share: what
        ``kit.planning.plan_grid`` screens thousands of setups on (nothing needs less), ``per_gpu_bytes``
        without a timeline."""
        if self.timeline is None:
            return self.components_bytes
        return self.timeline.peak_tensor_bytes + self.peak_overhead.bytes

    @property
    def peak_tensor_bytes(self) -> int | None:
        """The largest phase's live device-tensor bytes (``kit.estimate.peak``)."""
        return self.timeline.peak_tensor_bytes if self.timeline else None

    @property
    def peak_phase(self) -> str | None:
        return self.timeline.peak_phase if self.timeline else None

    @property
    def phases(self) -> dict[str, int] | None:
        """``{phase: bytes}``, the peak of each phase of a step."""
        return self.timeline.totals if self.timeline else None

    @property
    def peak_per_gpu_bytes(self) -> int | None:
        """``per_gpu_bytes`` where there is a timeline (the JSON's older name for it), else None."""
        return self.per_gpu_bytes if self.timeline else None

    @cached_property
    def reserved(self):
        """The caching allocator's replay of two steps (``kit.estimate.reserved.Reserved``): what
        ``torch.cuda.max_memory_reserved()`` would report beyond the tensors; None without a timeline or
        for what it does not replay (PyTorch's baselines, offloaded parameters)."""
        return self.replay() if self.timeline is not None and self.replay else None

    @property
    def reserved_bytes(self) -> int | None:
        """Predicted ``max_memory_reserved`` under the run's allocator (``zero.expandable_segments``): the
        tensor peak plus the replay's cached bytes beyond its own tensor peak (``Reserved.cached``); None
        without a timeline."""
        r = self.reserved
        return None if r is None else self.timeline.peak_tensor_bytes + r.cached

    @property
    def reserved_expandable_bytes(self) -> int | None:
        """``reserved_bytes`` with ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``."""
        r = self.reserved
        return None if r is None else self.timeline.peak_tensor_bytes + r.expandable_cached

    @property
    def reserved_plain_bytes(self) -> int | None:
        """``reserved_bytes`` without expandable segments (PyTorch's default allocator)."""
        r = self.reserved
        return None if r is None else self.timeline.peak_tensor_bytes + r.plain_cached

    @property
    def model_states_bytes(self) -> int:
        return sum(self.components[k] for k in MODEL_STATES)

    @property
    def nvme_bytes_per_node(self) -> int:
        """Bytes of NVMe swap files per node (0 without NVMe offload)."""
        return self.nvme_term.bytes

    @property
    def cpu_bytes_per_node(self) -> int:
        return self.cpu_term.bytes

    @cached_property
    def fits(self) -> dict[str, bool]:
        """Whether the setup fits each GPU in data/gpus.csv (``kit.fit.fit``: the precision, the per-GPU
        bytes, and the node's CPU RAM if given)."""
        return {name: estimate_fit(self, name).ok for name in catalogue()}

    @cached_property
    def checkpoint_bytes(self) -> int | None:
        """Size on disk of one saved checkpoint tag, all ranks (``kit.estimate.checkpoint_size``); None
        where it is not modelled (a trainable subset)."""
        from kit.estimate.checkpoint_size import checkpoint_bytes
        from kit.trainable import is_subset

        return None if is_subset(self.setup.zero) else checkpoint_bytes(self.setup)["total_bytes"]

    def to_dict(self) -> dict:
        """The ``zerokit estimate --json`` object (docs/contracts.md, "CLI and JSON")."""
        s = self.setup
        return {
            "formula": self.formula,
            "params": s.model.params,
            "largest_layer_params": s.model.largest_layer_params,
            "per_gpu_bytes": self.per_gpu_bytes,
            "screen_bytes": self.screen_bytes,
            "components_bytes": self.components_bytes,
            "peak_tensor_bytes": self.peak_tensor_bytes,
            "peak_phase": self.peak_phase,
            "phases": self.phases,
            "peak_per_gpu_bytes": self.peak_per_gpu_bytes,
            "reserved_bytes": self.reserved_bytes,
            "reserved_expandable_bytes": self.reserved_expandable_bytes,
            "reserved_plain_bytes": self.reserved_plain_bytes,
            "model_states_bytes": self.model_states_bytes,
            "components": self.components,
            "host_bytes_per_rank": self.host,
            "cpu_bytes_per_node": self.cpu_bytes_per_node,
            "nvme_bytes_per_node": self.nvme_bytes_per_node,
            "checkpoint_bytes": self.checkpoint_bytes,
            "fits": self.fits,
            "formulas": self.formulas,
            "notes": list(self.notes),
            "activations_trace": self.trace.to_dict() if self.trace else None,
            "setup": s.model_dump(mode="json"),
        }

    def table(self):
        """Components as a pandas DataFrame, one row each: bytes, the size a reader reads (``kit.units.size``:
        GiB from 1 GiB, else MiB, so a small model's rows are not 0.0002 GiB) and the formula; then the sum,
        the peak per GPU (per rank on CPU ranks), CPU RAM and NVMe per node."""
        import pandas as pd

        rows = [(k, t.bytes, t.formula) for k, t in self.terms.items()]
        rows.append(("sum of components", self.components_bytes, "every component at once (not the verdict)"))
        if self.timeline:
            plus = " (CPU ranks: no GPU overheads)" if self.accelerator == "cpu" else " + overhead"
            if self.reserved:
                plus = " + the caching allocator's replayed share + overhead"
            verdict = f"the {self.peak_phase} peak{plus} (the verdict)"
            rows.append((f"peak per {self.device}", self.per_gpu_bytes, verdict))
        rows.append(("CPU RAM per node", self.cpu_bytes_per_node, self.cpu_term.formula))
        if self.nvme_bytes_per_node:
            rows.append(("NVMe per node", self.nvme_bytes_per_node, self.nvme_term.formula))
        table = pd.DataFrame(rows, columns=["component", "bytes", "formula"]).set_index("component")
        table.insert(1, "size", [size(b) for b in table["bytes"]])
        return table
