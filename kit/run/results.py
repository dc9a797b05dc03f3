"""What real runs measured: a sweep's records.jsonl as pandas DataFrames.

``Results.df`` has one row per record (nested fields flattened with ``_``: ``measured_parameters``,
``estimate_activations``, ``setup_zero_stage``, ``comm_bytes_all_gather``...). ``summary()`` has one
row per configuration (machine-readable: bytes, seconds, its column names what users' scripts read);
``readable()`` is the same table as a reader reads it (headers in words with their units: memory in MiB,
bytes sent in MB).
``states()`` is the one table of bytes measured beside the estimate (every rank, device, host and NVMe);
``summary()``, ``brief()``, ``zerokit run``'s table and the notebooks' engine report read it. When a
configuration was attempted more than once (a resumed sweep), only its latest launch counts.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from kit.components import HELD, MEASURED, MODEL_STATES
from kit.records import load_records
from kit.schema import Setup
from kit.units import MB, MIB, first_line

#: a configuration's status is its worst record's: error > oom > timeout > cancelled (stopped by the
#: user, ``run_sweep(cancel=...)``) > ok
SEVERITY = {"error": 4, "oom": 3, "timeout": 2, "cancelled": 1, "ok": 0}
#: where a rank keeps its states, and the record fields that measured and estimated them there
PLACES = {
    "device": ("measured", "estimate"),
    "host": ("measured_host", "estimate_host"),
    "nvme": ("measured_nvme", "estimate_nvme"),
}
#: the columns of ``Results.states()``
STATE_COLUMNS = ["config_id", "label", "rank", "step", "where", "component", "measured", "estimate"]
#: how ``Results.readable`` shows each of ``summary()``'s columns: its header (the unit in it) and what
#: one of the header's unit is in the summary's (memory in MiB, 2**20, as the estimates show it; bytes
#: sent in MB, 1e6, as network traffic is counted; a step in ms); ``measured_<component>`` /
#: ``estimate_<component>`` are "measured <component> MiB" / "estimated <component> MiB"
READABLE: dict[str, tuple[str, float]] = {
    "config_id": ("config id", 1),
    "label": ("configuration", 1),
    "status": ("status", 1),
    "error": ("error", 1),
    "start_s": ("start s", 1),
    "step_time_s": ("step ms", 1e-3),
    "step_time_min_s": ("fastest step ms", 1e-3),
    "step_time_max_s": ("slowest step ms", 1e-3),
    "samples_per_s": ("samples/s", 1),
    "tokens_per_s": ("tokens/s", 1),
    "tflops": ("TFLOP/s", 1),
    "loss": ("last loss", 1),
    "comm_wire_bytes": ("MB sent per step", MB),
    "estimate_comm_wire_bytes": ("estimated MB sent per step", MB),
    "peak_allocated_bytes": ("peak allocated MiB", MIB),
    "peak_rss_bytes": ("peak RSS MiB", MIB),
    "estimate_peak_bytes": ("estimated peak per GPU MiB", MIB),
    "measured_peak_tensor_bytes": ("measured peak tensors MiB", MIB),
}
#: the record fields a component's pair of summary columns comes from, and the word its header says
SIDES = {"measured": "measured", "estimate": "estimated"}


class Results:
    """A sweep's records: ``df`` (one row per record) and ``summary()`` (one row per configuration)."""

    def __init__(self, records: list[dict], path: Path | None = None):
        self.path = path
        #: the records of each configuration's latest launch, as written (``kit.records.Record``s)
        self.records = _latest_attempts(records)
        #: each configuration's place, first seen first (the ``order`` column of ``df``)
        self.order = {cid: i for i, cid in enumerate(dict.fromkeys(r["config_id"] for r in self.records))}
        self.df = pd.json_normalize(self.records, sep="_") if self.records else pd.DataFrame()
        if self.records:
            self.df["order"] = self.df["config_id"].map(self.order)

    @classmethod
    def load(cls, path: str | Path) -> Results:
        """Results of a sweep folder (``runs/<sweep>``) or of a records.jsonl file."""
        path = Path(path)
        file = path / "records.jsonl" if path.is_dir() else path
        if not file.exists():
            raise FileNotFoundError(2, "no records.jsonl", str(file))
        return cls(load_records(file), file)

    def steps(self) -> pd.DataFrame:
        """The ok step records of rank 0, in configuration order."""
        if self.df.empty:
            return self.df
        ok = self.df[(self.df["status"] == "ok") & (self.df["rank"] == 0)]
        return ok.sort_values(["order", "step"])

    def summary(self) -> pd.DataFrame:
        """One row per configuration: label, status, error, its start cost (``start_s``: seconds from
        the configuration's start to its first step on rank 0), median step time and throughput over the
        measured steps (and the fastest and slowest step: ``step_time_min_s``, ``step_time_max_s``), last
        loss, peak memory, bytes on the wire per step, and each model-state component as measured on rank
        0 beside the estimator's prediction for that rank (and the whole-GPU peak estimate beside the
        measured peak)."""
        if self.df.empty:
            return pd.DataFrame(columns=["config_id", "label", "status", "error"])
        device = self.states(MEASURED).query("rank == 0 and where == 'device'")
        rank0: dict[str, dict[str, tuple[int, int]]] = {}
        for r in device.itertuples():
            rank0.setdefault(r.config_id, {})[r.component] = (int(r.measured), int(r.estimate))
        rows = []
        for cid, group in self.df.groupby("config_id", sort=False):
            status = worst_status(group["status"], cid)
            # the runner's own record (no rank) says why a launch failed; rank errors follow from it
            errors = group.sort_values("rank", na_position="first")["error"].dropna()
            row = {"config_id": cid, "label": group["label"].iloc[0], "status": status}
            row["error"] = errors.iloc[0] if len(errors) else None
            steps = group[(group["status"] == "ok") & (group["rank"] == 0)].sort_values("step")
            if len(steps):
                if "start_s" in steps:  # older sweeps lack it
                    row["start_s"] = float(steps["start_s"].iloc[0])
                keys = ("step_time_s", "samples_per_s", "tokens_per_s", "tflops", "comm_wire_bytes")
                for key in (*keys, "estimate_comm_wire_bytes"):
                    if key in steps:
                        row[key] = float(steps[key].median())
                if "step_time_s" in steps:
                    row["step_time_min_s"] = float(steps["step_time_s"].min())
                    row["step_time_max_s"] = float(steps["step_time_s"].max())
                row["loss"] = float(steps["loss"].iloc[-1])
                peaks = (
                    "peak_allocated_bytes",
                    "peak_rss_bytes",
                    "estimate_peak_bytes",
                    "measured_peak_tensor_bytes",
                )
                for key in peaks:
                    if key in steps:
                        row[key] = steps[key].max()
                for part, pair in rank0.get(cid, {}).items():  # none in a bare (uninstrumented) run
                    row[f"measured_{part}"], row[f"estimate_{part}"] = pair
            rows.append(row)
        return pd.DataFrame(rows)

    def readable(self, columns: list[str] | tuple[str, ...] | None = None) -> pd.DataFrame:
        """``summary()`` as a reader reads it: ``columns`` of it (named as ``summary()`` names them, in
        that order; None: all but ``config_id``) under headers in words with their units (``READABLE``:
        memory in MiB, bytes sent in MB, a step in ms), numbers left numeric for the notebook's formatter
        (``kit.lab.notebook.readable``), an error's first line. A column the summary lacks (nothing of it
        was measured) is blank. On CPU ranks there is no GPU: the whole-GPU estimate
        (``estimate_peak_bytes``: a GPU's CUDA context and NCCL buffers, ``kit.estimate``) is blank there,
        not a GPU's overheads beside a CPU process (the records keep it). ``summary()`` stays the frame
        scripts read; this is only its view."""
        table = self.summary()
        chosen = [c for c in table.columns if c != "config_id"] if columns is None else list(columns)
        out = pd.DataFrame(index=table.index)
        for column in chosen:
            header, unit = _readable_header(column)
            if column not in table:
                out[header] = float("nan")
                continue
            values = table[column]
            if column == "error":
                values = values.map(lambda e: first_line(e) if isinstance(e, str) else None)
            elif unit != 1:  # ms: x 1000, not / 0.001 (0.0125 s is 12.5 ms, not 12.499999999999998)
                values = values.astype(float) / unit if unit > 1 else values.astype(float) * round(1 / unit)
            if column == "estimate_peak_bytes":
                values = values.where(~table["config_id"].isin(self._on_cpu()))
            out[header] = values
        return out

    def _on_cpu(self) -> set[str]:
        """The configurations whose ranks ran on CPU (their records' ``device``)."""
        if self.df.empty or "device" not in self.df:
            return set()
        return set(self.df.loc[self.df["device"] == "cpu", "config_id"])

    def rank_word(self) -> str:
        """What one rank of this sweep is, for the human views' "MiB per ...": ``"GPU"`` where every
        record with a ``device`` ran on one, ``"CPU rank"`` where every one ran on CPU, else ``"rank"``
        (both, or no record says)."""
        devices = set(self.df["device"].dropna()) if "device" in self.df else set()
        if not devices:
            return "rank"
        return "CPU rank" if devices == {"cpu"} else "GPU" if "cpu" not in devices else "rank"

    def states(self, components: tuple[str, ...] = HELD) -> pd.DataFrame:
        """Bytes measured beside the estimate: one row per ok configuration, rank, place and component,
        from each rank's last measured step. ``where`` is ``device`` (the GPU), ``host`` (offloaded to CPU
        RAM) or ``nvme`` (this rank's swap files); ``estimate`` is what ``kit.estimate`` predicted in the
        rank for it (``rank_states``; ``activations``, on the device, the whole-GPU estimate's);
        ``difference = measured - estimate``, 0 when the estimator knows exactly what was allocated.
        ``components``: the model states and buffers by default, ``kit.components.MEASURED`` adds the
        activations. A bare (uninstrumented) run has no rows."""
        last: dict[tuple[str, int], dict] = {}
        for r in self.records:
            if r.get("status") == "ok" and r.get("rank") is not None and r.get("measured"):
                key = (r["config_id"], r["rank"])
                if key not in last or r["step"] >= last[key]["step"]:
                    last[key] = r
        rows = [
            [cid, r["label"], rank, r["step"], where, c, measured[c], estimated[c]]
            for (cid, rank), r in sorted(last.items(), key=lambda kv: (self.order[kv[0][0]], kv[0][1]))
            for where, (m, e) in PLACES.items()
            for measured, estimated in [(r.get(m) or {}, r.get(e) or {})]
            for c in components
            if c in measured and c in estimated
        ]
        table = pd.DataFrame(rows, columns=STATE_COLUMNS)
        table["difference"] = table["measured"] - table["estimate"]
        return table

    def brief(self) -> pd.DataFrame:
        """The few columns a reader compares, one row per configuration, in units (``summary()`` has
        them all): step time in ms, samples/s, last loss, rank 0's model states measured and estimated
        (MiB, as the estimates show memory), peak RSS (MiB), bytes sent per step (MB, 1e6: traffic), and the
        first line of the error of a failed one."""
        table = self.summary()

        def column(key: str, scale: float = 1.0) -> pd.Series:
            return table[key] * scale if key in table else pd.Series([float("nan")] * len(table))

        out = pd.DataFrame({"configuration": table["label"], "status": table["status"]})
        out["step ms"] = column("step_time_s", 1e3)
        out["samples/s"] = column("samples_per_s")
        out["loss"] = column("loss")
        for name, side in (("model states MiB", "measured"), ("estimate MiB", "estimate")):
            out[name] = sum(column(f"{side}_{part}", 1 / MIB) for part in MODEL_STATES)
        out["peak RSS MiB"] = column("peak_rss_bytes", 1 / MIB)
        out["wire MB/step"] = column("comm_wire_bytes", 1 / MB)
        if "estimate_comm_wire_bytes" in table:  # recorded since the baselines came (older sweeps lack it)
            out["estimate wire MB"] = column("estimate_comm_wire_bytes", 1 / MB)
        if (table["status"] != "ok").any():
            out["error"] = [e.splitlines()[0][:80] if isinstance(e, str) else None for e in table["error"]]
        return out

    def token_budget(self, setup: Setup, seed: int = 0) -> pd.DataFrame:
        """Rank 0's steps of ``setup`` (a token budget, ``batch.max_tokens``): its first micro batch as the
        model saw it (samples, longest sequence, padded tokens: the collate pads every sequence to the
        longest), the activations measured there, the estimate at the budget (before padding) and at that
        padded shape (``kit.estimate.activations``)."""
        from kit.estimate.activations import activations
        from kit.workloads import packed_lengths

        steps = self.steps()
        rows = []
        for r in steps[steps.label == setup.label].itertuples():
            ids, lengths = packed_lengths(setup.batch, r.step, 0, r.world_size, 0, seed)
            shape = {"micro_batch": len(ids), "seq_len": max(lengths), "max_tokens": None}
            padded = setup.model_copy(update={"batch": setup.batch.model_copy(update=shape)})
            rows.append(
                {
                    "step": r.step,
                    "samples": len(ids),
                    "longest": max(lengths),
                    "tokens": sum(lengths),
                    "padded tokens": len(ids) * max(lengths),
                    "measured B": r.measured_activations,
                    "estimate, budget B": r.estimate_activations,
                    "estimate, padded B": activations(padded).bytes,
                }
            )
        return pd.DataFrame(rows)

    def configs(self) -> list[dict]:
        """Per configuration, the fields of ``zerokit run --json``: label, setup, status, error,
        samples_per_s (median), estimate (the estimator's components) and measured (rank 0's), bytes."""
        out = []
        for cid, row in self.summary().set_index("config_id").iterrows():
            mine = [r for r in self.records if r["config_id"] == cid]
            ok = [r for r in mine if r.get("rank") == 0 and r.get("status") == "ok"]
            item = {"config_id": cid, "label": mine[0]["label"], "setup": mine[0]["setup"]}
            item.update(status=row["status"], error=row["error"])
            item["samples_per_s"] = float(row["samples_per_s"]) if ok else None
            item["estimate"] = ok[-1].get("estimate") if ok else None  # a bare run measures only time
            item["measured"] = ok[-1].get("measured") if ok else None
            out.append(item)
        return out


def _readable_header(column: str) -> tuple[str, float]:
    """``Results.readable``'s header of a ``summary()`` column and its unit in the summary's (``READABLE``);
    ValueError for a name that is not one of its columns."""
    if column in READABLE:
        return READABLE[column]
    side, _, part = column.partition("_")
    if side in SIDES and part in MEASURED:
        return f"{SIDES[side]} {part.replace('_', ' ')} MiB", MIB
    known = [*READABLE, *(f"{side}_{part}" for side in SIDES for part in MEASURED)]
    raise ValueError(f"columns: {column!r} is not a column of Results.summary(), one of {', '.join(known)}")


def worst_status(statuses, config_id: str = "") -> str:
    """The worst of a configuration's record statuses (``SEVERITY``); an unknown one is an error."""
    unknown = sorted(set(statuses) - set(SEVERITY))
    if unknown:
        raise ValueError(
            f"status: {', '.join(map(repr, unknown))} in the records of {config_id or 'a configuration'} "
            f"is not one of {', '.join(SEVERITY)}"
        )
    return max(statuses, key=SEVERITY.__getitem__)


def _latest_attempts(records: list[dict]) -> list[dict]:
    """Keep, per configuration, the records of its latest launch (``run_id``), in first-seen order."""
    latest: dict[str, str] = {}
    for r in records:
        latest[r["config_id"]] = max(latest.get(r["config_id"], ""), r.get("run_id") or "")
    return [r for r in records if (r.get("run_id") or "") == latest[r["config_id"]]]
