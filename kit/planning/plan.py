"""Planning before booking: every setup that fits, its time and cost, and what makes a setup fit.

Every memory verdict is ``kit.estimate``'s and every time ``kit.steptime.perf``'s; these functions search
over Setups and arrange the answers as pandas tables (used by ``zerokit plan``, the notebooks and the
widgets). ``search`` enumerates GPU types x cluster sizes x ZeRO variants x checkpointing x every
(micro batch, grad accum) pair of a global batch; ``smallest_cluster`` and ``batch_options`` answer two
narrower questions (``kit.planning.fixes.make_it_fit``: the smallest changes that make one setup fit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TypeVar

import pandas as pd

from kit import batch as batch_math
from kit import grid, trainable
from kit import sequence_parallel as ulysses
from kit.components import Component
from kit.ds_keys import EXAMPLE_NVME_PATH
from kit.estimate import partition
from kit.fit import Fit, estimate_fit, shown_bytes
from kit.gpus import catalogue, gpu, prices
from kit.planning import plan_grid
from kit.rules import BASELINES, Offload
from kit.schema import Setup
from kit.settings import ZEROPP_OFF
from kit.steptime import perf
from kit.steptime.calibration import Calibration
from kit.units import GIB, whole_number

#: the share of GPU memory a plan keeps free unless told otherwise (fragmentation, spikes, the unknown)
DEFAULT_HEADROOM = 0.1
#: the global batch ``zerokit plan`` searches when none is given: Llama 2's 4M tokens at seq 4096
#: (Touvron et al. 2023), 1024 sequences
DEFAULT_TRAIN_BATCH = 1024
#: tokens per parameter when no run length is given: Chinchilla's compute-optimal ratio (Hoffmann et al. 2022)
TOKENS_PER_PARAM = 20

T = TypeVar("T")


def _index(picked: pd.DataFrame) -> Iterable[int]:
    return picked.index


@lru_cache(maxsize=4096)  # a plan searched again (another price, efficiency or limit) names the same rows
def _verdict(setup: Setup, headroom: float) -> Fit:
    from kit.estimate import estimate

    return estimate_fit(estimate(setup), headroom=headroom)


#: ZeRO's stages (``kit.grid.STAGES`` without the PyTorch baselines)
ZERO_STAGES = ("0", "1", "2", "3")
#: the common ZeRO variants ``smallest_cluster`` (and ``zerokit demo``) compare: each stage with nothing
#: offloaded and with the most it can offload to CPU (``kit.grid.variants``)
DEFAULT_VARIANTS = grid.variants(ZERO_STAGES, offload=("none", "most")).zero


def search_variants(setup: Setup, nodes: int) -> list[dict]:
    """What ``search`` tries on a cluster of ``nodes`` nodes (``kit.grid.variants``): each ZeRO stage with
    nothing, the optimizer, or the optimizer and the parameters offloaded to CPU, then stage 3 offloading
    to NVMe (optimizer, optimizer + parameters); on several nodes, where they pay, ZeRO++ (hpZ over the
    whole node, and hpZ + qwZ + qgZ: ``grid.zeropp_variants``); PyTorch's own engines beside them (the
    grid refuses them in fp16: they need a loss scaler). A trainable subset leaves out what
    ``kit.trainable.problem`` says is not modelled with it (NVMe offload, the PyTorch engines)."""
    found = [dict(v) for v in _search_variants(setup.zero.precision, setup.cluster.gpus_per_node, nodes > 1)]
    if not trainable.is_subset(setup.zero):
        return found
    return [v for v in found if not trainable.problem(setup.zero.model_copy(update={**ZEROPP_OFF, **v}))]


@lru_cache(maxsize=64)
def _search_variants(precision: str, per_node: int, several: bool) -> tuple[dict, ...]:
    named = grid.zeropp_variants(per_node)
    zeropp = [named["hpZ"], named["ZeRO++ (hpZ + qwZ + qgZ)"]] if several else []
    levels = ("none", "optimizer", "all")
    cpu = grid.variants(ZERO_STAGES, offload=levels, zeropp=zeropp, precision=precision)
    nvme = grid.variants(("3",), offload=levels[1:], to=Offload.NVME, precision=precision)
    baselines = grid.variants(BASELINES, precision=precision)
    return tuple(cpu.zero + nvme.zero + baselines.zero)


def _nvme_fields(setup: Setup, change: dict) -> dict:
    """The NVMe fields a planned variant needs: a swap folder, and a parameter ``buffer_size`` that holds
    the largest tensor, so any partition of it on any cluster (DeepSpeed asserts it;
    ``kit.estimate.nvme.problem``)."""
    if Offload.NVME not in (change["offload_optimizer"], change["offload_param"]):
        return {}
    fields: dict = {"nvme_path": setup.zero.nvme_path or EXAMPLE_NVME_PATH}
    if change["offload_param"] == Offload.NVME:
        fields["buffer_size"] = max(setup.zero.buffer_size, partition.largest_tensor(setup))
    return fields


def nvme_slowdown(plan: Plan, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
    """The NVMe rows of ``plan`` beside the same setup with CPU offload (optimizer, or optimizer and
    parameters): ``slowdown`` = step time / CPU offload's step time, ``nvme_gib_per_node`` the swap files,
    ``row`` the NVMe row's index in ``plan.table``. With ``max_hours`` or ``budget`` (USD), only the fitting
    NVMe rows within them (``Plan.fitting``)."""
    t = plan.table
    keys = ["gpu", "nodes", "gpus_per_node", "checkpointing", "micro_batch", "grad_accum"]
    cpu = t[(t.stage == 3) & (t.offload_optimizer == Offload.CPU) & (t.zeropp == "")]
    shown = t if max_hours is None and budget is None else plan.fitting(max_hours, budget)
    rows = []
    for param in (Offload.NONE, Offload.NVME):
        nv = shown[(shown.offload_optimizer == Offload.NVME) & (shown.offload_param == param)]
        nv = nv.rename_axis("row").reset_index()
        same = cpu[cpu.offload_param == (Offload.NONE if param is Offload.NONE else Offload.CPU)]
        merged = nv.merge(
            same[[*keys, "step_s", "per_gpu_gib", "cpu_gib_per_node"]], on=keys, suffixes=("", "_cpu")
        )
        rows.append(merged.assign(slowdown=merged.step_s / merged.step_s_cpu))
    return pd.concat(rows, ignore_index=True).sort_values(["gpu", "gpus", "slowdown"])


def _zeropp_fields(label: str) -> dict:
    """ZeroSettings fields back from ``ZeroSettings.zeropp_label``."""
    parts = label.split()
    hpz = next((int(p[3:]) for p in parts if p.startswith("hpz")), 1)
    return {
        "hpz_partition_size": hpz,
        "quantized_weights": "qwz" in parts,
        "quantized_gradients": "qgz" in parts,
    }


def smallest_cluster(setup: Setup, variants: list[dict] | None = None, max_nodes: int = 64) -> pd.DataFrame:
    """The fewest GPUs of ``setup``'s type on which each ZeRO variant fits (``kit.estimate``'s verdict).

    ``variants`` are ``zero`` changes (default: stages 0-3, plus optimizer offload at stage 2 and
    optimizer + parameter offload at stage 3). Candidates grow as 1, 2, 4 ... GPUs in one node, then
    whole nodes of ``setup.cluster.gpus_per_node``; micro batch and gradient accumulation stay fixed.
    """
    from kit.estimate import estimate

    whole_number("max_nodes", max_nodes, 1)
    variants = variants or DEFAULT_VARIANTS
    per_node = setup.cluster.gpus_per_node
    sizes = [(1, g) for g in _powers_of_two_up_to(per_node)] + [
        (n, per_node) for n in range(2, max_nodes + 1)
    ]
    rows = []
    for change in variants:
        found = None
        for nodes, gpus in sizes:
            if _refused(setup, nodes * gpus, {**ZEROPP_OFF, **change}):
                continue
            candidate = setup.replace(
                cluster={"nodes": nodes, "gpus_per_node": gpus}, zero={**ZEROPP_OFF, **change}, batch={}
            )
            est = estimate(candidate)
            verdict = estimate_fit(est)
            if verdict.ok:
                found = est
                break
        if not found and _refused(setup, max_nodes * per_node, {**ZEROPP_OFF, **change}):
            continue  # a variant sequence parallelism does not run on any cluster (NVMe offload, ZeRO++)
        label = (found.setup if found else setup.replace(zero={**ZEROPP_OFF, **change})).label
        rows.append(
            {
                "variant": label,
                "nodes": found.setup.cluster.nodes if found else None,
                "gpus": found.setup.cluster.world_size if found else None,
                "per_gpu_gib": round(verdict.need / GIB, 2) if found else None,
                "cpu_gib_per_node": round(found.cpu_bytes_per_node / GIB, 1) if found else None,
                "verdict": "fits" if found else f"does not fit on {max_nodes * per_node} GPUs",
            }
        )
    columns = ["variant", "nodes", "gpus", "per_gpu_gib", "cpu_gib_per_node", "verdict"]
    return pd.DataFrame(rows, columns=columns).astype({"nodes": "Int64", "gpus": "Int64"})


def batch_options(setup: Setup, train_batch: int) -> pd.DataFrame:
    """Every (micro batch, gradient accumulation) pair giving ``train_batch`` on setup's GPUs, estimated.

    Larger micro batches mean fewer, bigger steps (faster) but more activation memory per GPU.
    """
    from kit.estimate import estimate

    options = batch_math.decompositions(train_batch, setup.dp)
    if not options:
        raise batch_math.BatchError(
            f"train_batch: must be a multiple of the data-parallel size {setup.dp}, got {train_batch}; "
            + batch_math.nearest_valid(train_batch, setup.dp)
        )
    rows = []
    for d in options:
        est = estimate(setup.replace(batch={"micro_batch": d.micro_batch, "grad_accum": d.grad_accum}))
        verdict = estimate_fit(est)  # its bytes: past the GPU's memory, what the flushed allocator holds
        rows.append(
            {
                "micro_batch": d.micro_batch,
                "grad_accum": d.grad_accum,
                "train_batch": d.train_batch,
                "activations_gib": round(est.components[Component.ACTIVATIONS] / GIB, 2),
                "per_gpu_gib": round(shown_bytes(est, verdict) / GIB, 2),
                "fits": verdict.ok,
            }
        )
    return pd.DataFrame(rows)


def _powers_of_two_up_to(n: int) -> list[int]:
    sizes = [1]
    while sizes[-1] * 2 <= n:
        sizes.append(sizes[-1] * 2)
    return sizes if sizes[-1] == n else [*sizes, n]


def front(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``frame`` no other row beats on both wall-clock time and cost, fastest first."""
    ordered = frame.sort_values(["hours", "cost_usd"])
    cheapest_before = ordered.cost_usd.cummin().shift(fill_value=float("inf"))
    return ordered[ordered.cost_usd < cheapest_before]


@dataclass
class Plan:
    """Every setup ``search`` evaluated (``table``, one row each) and how fast it went.

    The grid screens each row on the bytes no setup of it needs less than (``Estimate.screen_bytes``:
    the peak's tensors, the CUDA context and NCCL's buffers), shared across GPU types; the rows the plan
    names (its recommendation and alternatives, the best per GPU type, the Pareto front, the rows printed)
    are confirmed first with the estimate's own verdict (``confirm``: the caching allocator's replay,
    ``kit.fit.estimate_fit``), which sets their ``fits``, ``flushes`` and ``per_gpu_gib``. A row the
    replay refuses leaves the answers, and the next is confirmed (``settle``). ``setup(i)`` rebuilds row
    ``i``'s Setup exactly.
    """

    base: Setup
    table: pd.DataFrame
    tokens: float
    headroom: float
    assumptions: perf.Assumptions
    seconds: float
    skipped: list[str] = field(default_factory=list)
    calibration: str = "uncalibrated"  # what the step times come from

    @property
    def setups_per_s(self) -> float:
        return len(self.table) / self.seconds if self.seconds else float("inf")

    def setup(self, i: int) -> Setup:
        row = self.table.loc[i]
        return self.base.replace(
            cluster={"nodes": int(row.nodes), "gpus_per_node": int(row.gpus_per_node), "gpu": row.gpu},
            zero={
                "engine": row.engine,
                "stage": int(row.stage),
                "offload_optimizer": row.offload_optimizer,
                "offload_param": row.offload_param,
                **self.base.zero.checkpointing(bool(row.checkpointing)),
                **_zeropp_fields(row.zeropp),
                **_nvme_fields(
                    self.base,
                    {"offload_optimizer": row.offload_optimizer, "offload_param": row.offload_param},
                ),
            },
            batch={"micro_batch": int(row.micro_batch), "grad_accum": int(row.grad_accum)},
        )

    def confirm(self, rows: Iterable[int]) -> bool:
        """Give each of ``rows`` not confirmed yet the estimate's verdict with the headroom (the allocator's
        replay: ``kit.fit.estimate_fit``): its ``fits``, ``flushes`` and ``per_gpu_gib`` (the verdict's
        bytes). Whether there was any."""
        new = [i for i in dict.fromkeys(rows) if not self.table.at[i, "confirmed"]]
        for i in new:
            verdict = _verdict(self.setup(i), self.headroom)
            self.table.loc[i, ["fits", "flushes", "confirmed"]] = [verdict.ok, verdict.flushes, True]
            self.table.loc[i, "per_gpu_gib"] = verdict.need / GIB
        return bool(new)

    @property
    def refused(self) -> int:
        """Rows the screen passed and the allocator's replay refused (``confirm``)."""
        return int((self.table.confirmed & ~self.table.fits).sum())

    def settle(self, pick: Callable[[], T], rows: Callable[[T], Iterable[int]] = _index) -> T:
        """``pick()`` once every row it picks (``rows`` of it: its index) is confirmed (``confirm``): a row
        the replay refuses no longer fits, and ``pick`` runs again without it."""
        while True:
            picked = pick()
            if not self.confirm(rows(picked)):
                return picked

    def fitting(self, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
        """The setups that fit with the headroom, screened or confirmed (``confirmed``), and finish within
        ``max_hours`` and cost at most ``budget`` USD, cheapest first. Every other table filters through
        it."""
        fit = self.table[self.table.fits]
        if max_hours is not None:
            fit = fit[fit.hours <= max_hours]
        if budget is not None:
            fit = fit[fit.cost_usd <= budget]
        return fit.sort_values(["cost_usd", "hours"])

    def options(self, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
        """``fitting``, keeping only the cheapest batch choice of each GPU type, cluster and ZeRO variant."""
        variant = ["gpu", "gpus", "engine", "stage", "offload_optimizer", "offload_param", "zeropp"]
        variant.append("checkpointing")
        return self.fitting(max_hours, budget).drop_duplicates(variant)

    def pareto(self, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
        """The fitting setups (within ``max_hours`` and ``budget``) no other beats on both wall-clock time
        and cost, fastest first, each confirmed."""
        return self.settle(lambda: front(self.fitting(max_hours, budget)))

    def best_per_gpu(self, max_hours: float | None = None, budget: float | None = None) -> pd.DataFrame:
        """Per GPU type, the cheapest and the fastest fitting setup (within ``max_hours`` and ``budget``),
        each confirmed."""

        def best() -> list[tuple[str, str, int]]:
            groups = self.fitting(max_hours, budget).groupby("gpu", sort=False)
            return [
                (name, pick, i)
                for name, group in groups
                for pick, i in (("cheapest", group.cost_usd.idxmin()), ("fastest", group.hours.idxmin()))
            ]

        picked = self.settle(best, lambda picks: [i for _, _, i in picks])
        return pd.DataFrame(
            [
                {"gpu": name, "pick": pick, **self.table.loc[i].drop("gpu").to_dict()}
                for name, pick, i in picked
            ]
        )

    def to_dict(
        self, limit: int | None = None, max_hours: float | None = None, budget: float | None = None
    ) -> dict:
        """The plan as JSON (docs/contracts.md): ``setups`` the fitting ones, cheapest first (the first
        ``limit``, confirmed; all: screened, each with ``confirmed``), the Pareto front and the best per GPU
        type (confirmed); ``confirmed``: how many rows the replay has weighed, ``refused`` how many of them
        it found past the memory (no longer fitting)."""
        pareto, best = self.pareto(max_hours, budget), self.best_per_gpu(max_hours, budget)
        fit = self.fitting(max_hours, budget)
        if limit is not None:
            fit = self.settle(lambda: self.fitting(max_hours, budget).head(limit))
        return {
            "evaluated": len(self.table),
            "fitting": len(self.fitting(max_hours, budget)),
            "confirmed": int(self.table.confirmed.sum()),
            "refused": self.refused,
            "seconds": self.seconds,
            "setups_per_s": self.setups_per_s,
            "tokens": self.tokens,
            "headroom": self.headroom,
            "assumptions": self.assumptions.__dict__,
            "calibration": self.calibration,
            "skipped": self.skipped,
            "setups": records(fit),
            "pareto": records(pareto),
            "best_per_gpu": records(best),
        }


def search(
    setup: Setup,
    *,
    train_batch: int | None = None,
    gpus: list[str] | None = None,
    max_nodes: int = 64,
    node_counts: list[int] | None = None,
    variants: list[dict] | None = None,
    checkpointing: tuple[bool, ...] = (False, True),
    headroom: float = DEFAULT_HEADROOM,
    tokens: float | None = None,
    price: dict[str, float] | None = None,
    assumptions: perf.Assumptions | None = None,
    fabric: str | None = None,
    calibration: Calibration | None = None,
) -> Plan:
    """Every setup of ``setup``'s model and precision: GPU types x cluster sizes x ZeRO variants x
    checkpointing x every (micro batch, grad accum) pair making ``train_batch`` (default: setup's).

    Cluster sizes: 1, 2, 4 ... GPUs in one node, then 2, 4, 8 ... ``max_nodes`` nodes of
    ``setup.cluster.gpus_per_node``, or ``node_counts`` (any, 2 and more) instead of the powers of two;
    sizes the global batch does not divide are skipped. A setup fits when its estimate leaves
    ``headroom`` of the GPU's memory free: the grid screens every row on its tensors and overheads, and
    the rows the plan names are confirmed with the allocator replayed (``Plan``). Time and cost are for a
    run of ``tokens`` (default ``TOKENS_PER_PARAM`` x params) at ``price`` USD per GPU-hour (default:
    data/prices.csv).
    With a ``calibration`` (``kit.steptime.calibration``) step times come from it, and only the GPU types
    it was measured on are planned (ValueError when none of ``gpus`` is).
    """
    start = time.perf_counter()

    whole_number("max_nodes", max_nodes, 1)
    for n in node_counts or ():
        if not isinstance(n, int) or not 1 <= n <= 4096:
            raise ValueError(f"node_counts: each must be a whole number in [1, 4096], got {n!r}")
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom: must be in [0, 1), got {headroom!r}")
    train_batch = train_batch or setup.batch.train_batch
    whole_number("train_batch", train_batch, 1)
    tokens = tokens or TOKENS_PER_PARAM * setup.model.params
    assume = assumptions or perf.Assumptions()
    names = gpus or list(catalogue())
    if calibration is not None:
        names = calibration.gpus(names)
        if not names:
            raise ValueError(
                f"calibration: measured on {calibration.device}, none of the GPU types planned; plan "
                "--gpus with its data/gpus.csv name, or calibrate on the GPU you plan for"
            )
    rates = {**{name: usd for name, (usd, _) in prices().items()}, **(price or {})}
    skipped, hardware = [], {}
    for name in names:
        g = gpu(name)
        if not g.peak_tflops(setup.zero.precision):
            skipped.append(f"{name}: no {setup.zero.precision} support")
        elif name not in rates:
            skipped.append(f"{name}: no price; pass one")
        else:
            hardware[name] = perf.hardware(setup.replace(cluster={"gpu": name}), fabric)
    if not hardware:
        raise ValueError(f"gpus: none of them can be planned for ({'; '.join(skipped)}); choose others")
    per_node = setup.cluster.gpus_per_node
    sizes = [(1, g) for g in _powers_of_two_up_to(per_node)]
    multi = sorted(set(node_counts) - {1}) if node_counts else _powers_of_two_up_to(max_nodes)[1:]
    sizes += [(n, per_node) for n in multi]
    groups = []
    for nodes, per in sizes:
        for change in variants or search_variants(setup, nodes):
            sharded = change["stage"] or change.get("engine", "deepspeed") != "deepspeed"
            if nodes * per == 1 and sharded and change["offload_optimizer"] == Offload.NONE:
                continue  # one GPU has nothing to partition or replicate: stage 0 alone, or offload
            zero = {"engine": "deepspeed", **ZEROPP_OFF, **change, **_nvme_fields(setup, change)}
            if _refused(setup, nodes * per, zero):
                continue  # sequence parallelism: a world it does not divide, or a variant it does not run
            groups.append((nodes, per, zero))
    table = plan_grid.evaluate(
        setup, groups, checkpointing, train_batch, hardware, rates, tokens, headroom, assume, calibration
    )
    across = any(nodes > 1 for nodes, _, _ in groups)
    label = (
        calibration.label_for(*_engines(setup, groups), across_nodes=across)
        if calibration
        else "uncalibrated"
    )
    return Plan(setup, table, tokens, headroom, assume, time.perf_counter() - start, skipped, label)


def _refused(setup: Setup, world: int, zero: dict) -> bool:
    """Whether ``setup``'s sequence parallelism refuses ``zero`` on ``world`` GPUs (``kit.sequence_parallel``:
    ``sp`` must divide the GPUs; no NVMe offload or ZeRO++ beside it)."""
    if setup.zero.sequence_parallel_size == 1:
        return False
    return ulysses.problem(setup.zero.model_copy(update=zero), setup.model, world, setup.batch) is not None


def _engines(setup: Setup, groups: list[tuple[int, int, dict]]) -> list[Setup]:
    """``setup`` once per engine the plan's groups run (stage, engine, offload): what a calibration must
    have measured for the plan's step times."""
    keys = ("engine", "stage", "offload_optimizer", "offload_param")
    engines = {tuple(zero[k] for k in keys): zero for _, _, zero in groups}
    return [setup.replace(zero=zero) for zero in engines.values()]


def records(frame: pd.DataFrame) -> list[dict]:
    """A table's rows as plain JSON-ready dicts (numpy scalars unwrapped)."""
    return [{k: _plain(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _plain(value):
    """A table cell as JSON: numpy scalars unwrapped, missing values (``pd.NA``, NaN) None."""
    if not isinstance(value, str | list | dict) and pd.isna(value):
        return None
    return value.item() if hasattr(value, "item") else value


#: how ``readable`` shows each column a plan's tables may have: GiB with 1 decimal, hours, dollars
_FORMATS = {
    "per_gpu_gib": "{:,.1f} GiB",
    "capacity_gib": "{:,.1f} GiB",
    "activations_gib": "{:,.1f} GiB",
    "cpu_gib_per_node": "{:,.1f} GiB",
    "nvme_gib_per_node": "{:,.1f} GiB",
    "comm_intra_gib": "{:,.1f} GiB",
    "comm_inter_gib": "{:,.1f} GiB",
    "step_s": "{:,.3g} s",
    "tokens_per_s": "{:,.0f}",
    "hours": "{:,.1f} h",
    "cost_usd": "${:,.0f}",
    "slowdown": "{:.2f}x",
}


#: the header a notebook shows over each column a plan's tables may have, its unit in words
#: (``readable(frame, units_in_headers=True)``); a column not named here shows its name with spaces
HEADERS = {
    "per_gpu_gib": "GiB per GPU",
    "capacity_gib": "GPU capacity GiB",
    "activations_gib": "activations GiB per GPU",
    "cpu_gib_per_node": "CPU RAM GiB per node",
    "nvme_gib_per_node": "NVMe GiB per node",
    "comm_intra_gib": "GiB sent per GPU per step inside nodes",
    "comm_inter_gib": "GiB sent per GPU per step across nodes",
    "step_s": "step s",
    "tokens_per_s": "tokens/s",
    "hours": "hours",
    "cost_usd": "USD",
    "slowdown": "slowdown, times",
    "gpu": "GPU",
    "gpus": "GPUs",
    "gpus_per_node": "GPUs per node",
    "zeropp": "ZeRO++",
}
#: the columns a notebook shows as whole numbers (dollars, tokens/s), as ``_FORMATS`` prints them
_WHOLE = ("cost_usd", "tokens_per_s")


def readable(frame: pd.DataFrame, units_in_headers: bool = False) -> pd.DataFrame:
    """The table with units and thousands separators (strings; a missing value blank) under its column
    names, for printing (``zerokit plan``'s tables). ``units_in_headers=True``, for notebooks: the units
    in the headers instead ("GiB per GPU", "USD": ``HEADERS``, other names with spaces for ``_``), the
    numbers left numbers (dollars and tokens/s whole) for the notebook's formatter to show
    (``kit.lab.notebook.readable``: ``kit.units.number``), right-aligned."""
    out = frame.copy()
    if units_in_headers:
        for column in _WHOLE:
            if column in out and pd.api.types.is_numeric_dtype(out[column]):
                out[column] = out[column].round(0)
        return out.rename(columns=lambda c: HEADERS.get(c, str(c).replace("_", " ")))
    for column, form in _FORMATS.items():
        if column in out:
            out[column] = out[column].map(lambda v, form=form: "" if _plain(v) is None else form.format(v))
    return out
