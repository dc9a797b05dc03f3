"""The comparison panel: choose configurations (ZeRO stages beside PyTorch's DDP and FSDP, offload to CPU
or NVMe, a ZeRO++ variant of stage 3, micro batches, buckets), a toy model, ranks and steps; Run measures
them all in one launch (``kit.run.sweep.run_sweep``) and plots the answer beside the estimate. Given a
hostfile, the launch spans its nodes (``local``: every host's launcher started on this machine, a rehearsal
of the cluster) and a table per node puts the bytes each rank sent inside and across nodes beside the
estimate.

The panel never computes: its Setups go to ``kit.estimate`` (the preview) and ``run_sweep`` (Run); the
plots and the table arrange the ``Results``. Run, Stop and the monitor are plain methods (``start``,
``run``, ``stop``, ``wait``, ``monitor``) that a notebook cell calls as a click does.
"""

from __future__ import annotations

import atexit
import html
import inspect
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as w

from kit import grid, monitor
from kit.components import Component
from kit.lab import ui
from kit.lab.monitor_panel import MonitorPanel
from kit.rules import BASELINES, Offload
from kit.run import launcher
from kit.run import sweep as sweeps
from kit.schema import Setup
from kit.settings import SETTINGS, ZEROPP_OFF
from kit.toys import toy_setup
from kit.units import MB, MIB

#: the warm-up steps a comparison run starts with (not measured): ``run_sweep``'s default
WARMUP = inspect.signature(sweeps.run_sweep).parameters["warmup"].default
#: how ``results_html`` formats the columns of ``Results.brief()``
BRIEF_FORMATS = {
    "step ms": "{:,.1f}", "samples/s": "{:,.1f}", "loss": ui.NUMBER, "model states MiB": ui.NUMBER,
    "estimate MiB": ui.NUMBER, "peak RSS MiB": "{:,.0f}", "wire MB/step": ui.NUMBER,
    "estimate wire MB": ui.NUMBER,
}  # fmt: skip
#: the comparison panel's controls that set one value on every configuration (by their name there), each
#: a ``kit.settings`` setting; the panel's other settings make variants (stages, offloads, ZeRO++)
APPLIED = {
    name: next(s for s in SETTINGS if s.comparison == name)  # a composite control by its first field
    for name in ("precision", "checkpointing", "trainable", "loss", "reduce_bucket", "prefetch_bucket")
}
#: the tooltips of the controls that are not ``kit.settings``' (those carry their setting's help)
TIPS = {
    "stages": "the engines to compare: ZeRO stages 0-3 and PyTorch's DDP and FSDP (ctrl-click: several)",
    "micro_batches": "micro batches per rank to try, each a configuration of its own (several: ctrl-click)",
    "offload_optimizer": "also run each stage 1-3 with its optimizer states offloaded",
    "offload_param": "also run stage 3 with its parameters offloaded too",
    "offload_to": "where the offload variants put their states: CPU RAM, or NVMe files (stage 3)",
    "nvme_path": "a folder on an NVMe drive for the swap files (with offload to nvme)",
    "hpz": "ZeRO++ hpZ: > 1 adds a stage 3 variant gathering parameters within groups of this many ranks",
    "quantized_weights": "ZeRO++ qwZ: add a stage 3 variant that all-gathers weights in int8",
    "quantized_gradients": "ZeRO++ qgZ: add a stage 3 variant that reduces gradients in int4",
    "grad_accum": "micro batches each rank runs before the optimizer steps",
    "batch_schedule": "a batch schedule: from step S the global batch is B, as S=B pairs (2=16,4=32)",
    "layers": "the toy GPT's transformer blocks",
    "hidden": "the toy GPT's hidden size (a multiple of 8 and of the heads)",
    "heads": "the toy GPT's attention heads (divide the hidden size)",
    "vocab": "the toy GPT's vocabulary size",
    "seq_len": "tokens per sample",
    "nprocs": "ranks the launch starts: a process per GPU, or CPU processes where there is no GPU",
    "steps": "measured steps per configuration, after the warm-up",
    "warmup": "steps run first and not measured (allocator and kernels settle)",
    "sweep": "the sweep's name: its records go to runs dir/sweep; a finished name is reused, not rerun",
    "runs_dir": "the folder that holds every sweep's records",
    "memory_timeline": "also measure each phase's peak (the profiler: slow on CPU), plotted by the estimate",
    "run_button": "run every configuration in one launch (in the background; the kernel stays free)",
    "stop_button": "kill the running launch; the records so far are kept",
}


class ComparisonPanel:
    """Choose configurations to compare (stages and the PyTorch baselines, offload to CPU or NVMe, a ZeRO++
    variant of stage 3, micro batches, buckets), a toy model, ranks and steps; Run measures them all in
    one launch (``kit.run.sweep.run_sweep``) and plots the answer.

    State: ``setups`` (the configurations the controls describe, or [] while invalid), ``estimates``
    (``kit.estimate`` of each), ``error`` (one line, or None), ``busy`` (a sweep is running) and
    ``results`` (after a run). ``run()`` runs and returns (a notebook cell); the Run button calls
    ``start()``, which runs in a background thread so that the kernel stays free: the bar moves, the
    controls are off until the sweep ends, and Stop (``stop()``) kills the launch's process group (the
    records so far are kept; the configuration under way is recorded as ``cancelled``).
    """

    def __init__(
        self,
        setup: Setup | None = None,
        *,
        stages: tuple[int | str, ...] = (0, 1, 2, 3),
        nprocs: int = 2,
        steps: int = 5,
        warmup: int = WARMUP,
        runs_dir: str | Path = "runs",
        sweep: str = "compare",
        hostfile: str | Path | None = None,
        local: bool = True,
    ):
        from kit.scaleout.hostfile import nodes_from_hostfile

        self.base = setup or toy_setup(nprocs)
        #: the hostfile's hosts (checked now, before anything launches), or () on this machine alone
        self.hostfile, self.local = hostfile, local
        self.node_names = nodes_from_hostfile(hostfile, nprocs, local=local).names if hostfile else ()
        self.error: str | None = None
        self.setups: list[Setup] = []
        self.estimates: list[Any] = []
        self.results: Any = None
        self.busy = False
        self._cancel = threading.Event()
        self._thread: threading.Thread | None = None
        self._progress: dict = {}
        m, z, b = self.base.model, self.base.zero, self.base.batch
        #: the toy GPT's shape is edited here; any other model (an HF config, a model file) runs as given
        self.toy = m.family == "gpt2" and m.name.startswith("toy-")
        #: ZeRO stages (ints) and PyTorch's own engines beside them (their names, kit.rules.BASELINES)
        self.stages = w.SelectMultiple(
            options=[*BASELINES, 0, 1, 2, 3], value=tuple(stages), description="stages", rows=7
        )
        self.micro_batches = w.SelectMultiple(
            options=sorted({1, 2, 4, 8, 16, 32, b.micro_batch}),
            value=(b.micro_batch,),
            description="micro batch",
            rows=4,
        )
        self.offload_optimizer = w.Checkbox(value=False, description="+ optimizer offload (stages 1-3)")
        self.offload_param = w.Checkbox(value=False, description="+ stage 3 parameter offload")
        # where the offload variants go: CPU RAM, or NVMe (ZeRO-Infinity, stage 3) under a folder
        self.offload_to = ui.toggle(["cpu", "nvme"], "cpu", "offload to")
        self.nvme_path = w.Text(
            value=z.nvme_path or "", description="NVMe path", placeholder="a folder on NVMe"
        )
        # ZeRO++ (stage 3): a variant of each stage 3 configuration with these set
        self.hpz = w.BoundedIntText(value=z.hpz_partition_size, min=1, max=64, description="+ hpZ size")
        self.quantized_weights = w.Checkbox(value=z.quantized_weights, description="+ qwZ (int8 weights)")
        self.quantized_gradients = w.Checkbox(value=z.quantized_gradients, description="+ qgZ (int4 grads)")
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=1024, description="grad accum")
        self.batch_schedule = w.Text(value="", description="batch by step", placeholder="e.g. 2=16,4=32")
        # the settings every configuration takes, one control each, made as the memory panel's
        # (kit.settings; what trains and the loss offer what this panel's model takes)
        (self.precision, self.checkpointing, self.trainable, self.loss, self.reduce_bucket,
         self.prefetch_bucket) = (ui.control(s, z, m) for s in APPLIED.values())  # fmt: skip
        self.layers = w.BoundedIntText(value=m.layers or 1, min=1, max=256, description="layers")
        self.hidden = w.BoundedIntText(value=m.hidden or 8, min=8, max=16384, step=8, description="hidden")
        self.heads = w.BoundedIntText(value=m.heads or 1, min=1, max=256, description="heads")
        self.vocab = w.BoundedIntText(value=m.vocab or 2, min=2, max=1 << 20, description="vocab")
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=2, max=1 << 16, description="seq len")
        self.nprocs = w.BoundedIntText(value=nprocs, min=1, max=64, description="ranks")
        self.steps = w.BoundedIntText(value=steps, min=1, max=10_000, description="steps")
        self.warmup = w.BoundedIntText(value=warmup, min=0, max=10_000, description="warm-up steps")
        self.sweep = w.Text(value=sweep, description="sweep")
        self.runs_dir = w.Text(value=str(runs_dir), description="runs dir")
        # each phase's measured peak beside the predicted timeline; on CPU the profiler costs ~19x a toy step
        self.memory_timeline = w.Checkbox(value=False, description="memory timeline", indent=False)
        self.memory_timeline.layout.width = "auto"
        self.run_button = ui.button("Run", "play", button_style="primary")
        self.stop_button = ui.button("Stop", "stop", button_style="danger", disabled=True)
        self.message = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="220px", visibility="hidden"))
        self.bar.add_class("zk-bar")
        self.preview = w.HTML()
        self.plots = w.GridBox(
            [], layout=w.Layout(grid_template_columns="repeat(auto-fill, minmax(440px, 1fr))", grid_gap="6px")
        )
        self.table = w.HTML()
        ui.tips(self, TIPS)
        for control in self._inputs():
            ui.cell(control)
            control.observe(self.update, names="value")
        for control in (self.sweep, self.runs_dir):
            ui.cell(control)
        for control in (self.offload_optimizer, self.offload_param, self.quantized_weights):
            control.layout.width, control.indent = "auto", False
        self.quantized_gradients.layout.width, self.quantized_gradients.indent = "auto", False
        self.run_button.on_click(lambda _: self._clicked(self.start))
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = w.VBox(
            [
                w.HTML("<b>ZeRO stage comparison</b>: real short runs of every configuration, one launch"),
                ui.section("Configurations"),
                ui.row(self.stages, self.micro_batches, w.VBox([self.offload_optimizer, self.offload_param])),
                ui.row(self.offload_to, self.nvme_path),
                ui.row(self.hpz, self.quantized_weights, self.quantized_gradients),
                ui.row(self.precision, self.grad_accum),
                ui.row(self.batch_schedule, self.checkpointing),
                ui.row(self.trainable, self.loss),
                ui.row(self.reduce_bucket, self.prefetch_bucket),
                ui.section("Toy model" if self.toy else f"Model: {html.escape(m.name)}"),
                ui.row(self.layers, self.hidden, self.heads),
                ui.row(self.vocab, self.seq_len),
                ui.section("Run"),
                ui.row(self.nprocs, self.steps, self.warmup, self.memory_timeline),
                ui.row(self.sweep, self.runs_dir, self.run_button, self.stop_button),
                w.HBox(
                    [self.bar, self.message], layout=w.Layout(align_items="center", flex_flow="row nowrap")
                ),
                self.preview,
                self.plots,
                self.table,
            ]
        )
        self.widget.add_class("zk-comparison-panel")
        for name in ("run_button", "stop_button", "message", "plots", "table", "sweep", "runs_dir", "stages",
                     "steps", "memory_timeline"):  # fmt: skip
            getattr(self, name).add_class(f"zk-{name.replace('_', '-')}")
        self._set_busy(False)
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Rebuild the list of Setups from the controls and estimate each (controls call this on change)."""
        from kit.estimate import estimate

        if self.busy:
            return  # the controls are off while a sweep runs; what runs is what was shown
        try:
            setups = self._build_setups()
            estimates = [estimate(s) for s in setups]
        except ui.ERRORS as error:
            self.setups, self.estimates, self.error = [], [], ui.one_line(error)
            self.message.value = ui.colored(self.error)
            self.preview.value = ""
            return
        self.setups, self.estimates, self.error = setups, estimates, None
        self.message.value = (
            f"{len(setups)} configurations, {self._where()}, {self.steps.value} steps each after "
            f"{self.warmup.value} warm-up: press Run"
        )
        on_cpu = launcher.ranks_accelerator() == "cpu"

        def total(e) -> int:  # a CPU rank holds no CUDA context, NCCL buffers or caching allocator
            return (e.peak_tensor_bytes or e.components_bytes) if on_cpu else e.per_gpu_bytes

        rows = [
            [
                e.setup.label,
                e.model_states_bytes / MIB,
                e.components[Component.ACTIVATIONS] / MIB,
                total(e) / MIB,
            ]
            for e in estimates
        ]
        peak = "peak tensors MiB per rank" if on_cpu else "peak MiB per GPU"
        header = ["configuration", "model states MiB", "activations MiB", peak]
        table = ui.table_html(header, rows, ["{}", "{:,.1f}", "{:,.1f}", "{:,.1f}"])
        self.preview.value = (
            f"<div style='color:#666'>estimate before running:</div>{table}{ui.legend_html(setups)}"
        )

    def run(self):
        """Run the sweep and wait for it (``kit.run.sweep.run_sweep``, one subprocess launch); show the
        plots and the results table; return ``kit.run.results.Results``."""
        self._check_can_run()
        self._set_busy(True)
        try:
            return self._sweep()
        finally:
            self._set_busy(False)

    def start(self) -> threading.Thread:
        """What Run does: the sweep of ``run()`` in a background thread (``wait()`` joins it)."""
        self._check_can_run()
        self._set_busy(True)
        if not self._thread:
            atexit.register(self._stop_at_exit)  # a kernel restart does not orphan the ranks
        self._thread = threading.Thread(target=self._background, name="zerokit-sweep", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self) -> None:
        """What Stop does: cancel the running sweep; its process group is killed within a second or two,
        the records so far are kept and the configuration under way is recorded as ``cancelled``."""
        if self.busy:
            self._cancel.set()
            self.stop_button.disabled = True
            self.message.value = "stopping: killing the launch's process group..."

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for a sweep started by ``start()``; True once none is running."""
        if self._thread is not None:
            self._thread.join(timeout)
        return not self.busy

    def monitor(self, **options: Any) -> MonitorPanel:
        """The live view of every rank of this panel's sweep (``monitor_panel(runs_dir/sweep)``): display
        its ``.widget`` in another cell while the sweep runs."""
        return MonitorPanel(Path(self.runs_dir.value) / self.sweep.value, **options)

    def _check_can_run(self) -> None:
        if self.busy:
            raise ValueError("run: a sweep is already running; wait for it or press Stop")
        if not self.setups:
            raise ValueError(self.error or "stages: choose at least one configuration")

    def _background(self) -> None:
        try:
            self._sweep()
        except Exception as error:  # shown in the panel: a thread's traceback would go nowhere
            self.message.value = ui.colored(ui.one_line(error))
        finally:
            self._set_busy(False)

    def _sweep(self):
        from kit.run.sweep import run_sweep

        self._cancel.clear()
        self._progress = {"total": len(self.setups), "done": 0, "reused": 0, "records": "", "label": ""}
        self.bar.max, self.bar.value = max(1, len(self.setups)), 0
        self.bar.layout.visibility = "visible"
        self.plots.children, self.table.value, self.results = (), "", None
        from kit.scaleout.hostfile import nodes_from_hostfile

        nodes = None
        if self.hostfile:  # ranks per node as the panel now says, checked against the slots again
            nodes = nodes_from_hostfile(self.hostfile, self.nprocs.value, local=self.local)
        self.message.value = f"starting {len(self.setups)} configurations on {self._where()}..."
        started = time.monotonic()
        self.results = run_sweep(
            list(self.setups),
            sweep=self.sweep.value,
            runs_dir=self.runs_dir.value,
            nprocs=self.nprocs.value,
            steps=self.steps.value,
            warmup=self.warmup.value,
            progress=False,
            memory_timeline=self.memory_timeline.value,
            cancel=self._cancel.is_set,
            on_event=self._on_event,
            nodes=nodes,
        )
        self._show_results()
        self.message.value = self._outcome(time.monotonic() - started)
        return self.results

    def _on_event(self, event: dict) -> None:
        p, kind = self._progress, event["event"]
        if kind == "sweep":
            p.update(
                total=event["total"], reused=event["reused"], done=event["reused"], records=event["records"]
            )
            self.bar.max, self.bar.value = max(1, p["total"]), p["done"]
            return
        if kind == "done":
            p["done"] += 1
            self.bar.value = p["done"]
            return
        p["label"] = event.get("label", p["label"])
        where = f"running {p['done'] + 1} of {p['total']}: {html.escape(p['label'])}"
        if kind == "step":
            where += f", {monitor.step_label(event['step'], self.warmup.value, self.steps.value)}"
            where += f", {event['samples_per_s']:,.1f} samples/s"
        self.message.value = where + " (Stop cancels)"

    def _outcome(self, seconds: float) -> str:
        p, results = self._progress, self.results
        summary = results.summary()
        where = html.escape(p["records"])
        if self._cancel.is_set():
            cancelled = summary.loc[summary["status"] == "cancelled", "label"].tolist()
            ok = int((summary["status"] == "ok").sum())
            return (
                f"<b>stopped</b> after {seconds:,.0f} s: {html.escape(', '.join(cancelled) or 'nothing')} "
                f"cancelled; {ok} of {p['total']} configurations measured; records kept in {where}"
            )
        if p["reused"] == p["total"]:
            return (
                f"{p['total']} of {p['total']} configurations reused from {where}, nothing run "
                "(choose another sweep name to measure again)"
            )
        failed = summary.loc[summary["status"] != "ok", "label"].tolist()
        text = f"ran {p['total'] - p['reused']} configurations in {seconds:,.0f} s"
        if p["reused"]:
            text += f" ({p['reused']} of {p['total']} reused from earlier runs)"
        if failed:
            text += "; " + ui.colored(f"not ok: {', '.join(failed)}")
        return text + f"; records in {where}; every column: <code>panel.results.summary()</code>"

    def _show_results(self) -> None:
        from kit.lab import plots

        results = self.results
        draws = (plots.throughput, plots.memory, plots.comm_volume, plots.loss_curves)
        figures = [] if results.steps().empty else [draw(results) for draw in draws]
        figures += [peak_plot(record) for record in peak_records(results)]
        images: list[w.Widget] = [
            w.Image(value=ui.figure_png(f), format="png", layout=w.Layout(max_width="100%")) for f in figures
        ]
        # no axes without a measured step (a run stopped in its warm-up): they would hold only ticks
        self.plots.children = images or [w.HTML(f"<i style='color:#666'>{plots.NOTHING_MEASURED}</i>")]
        self.table.value = results_html(results)
        if self.node_names:
            from kit.run.local_nodes import per_node

            self.table.value += nodes_html(per_node(results.records, self.node_names))

    def _where(self) -> str:
        ranks = f"{self.nprocs.value} rank{'s' if self.nprocs.value > 1 else ''}"
        return f"{len(self.node_names)} nodes x {ranks}" if self.node_names else ranks

    def _set_busy(self, busy: bool) -> None:
        """Run off, Stop on, controls off while a sweep runs (and the other way round after)."""
        self.busy = busy
        self.run_button.disabled = busy
        self.run_button.description = "Running..." if busy else "Run"
        self.run_button.icon = "hourglass-half" if busy else "play"
        self.stop_button.disabled = not busy
        shape = (self.layers, self.hidden, self.heads, self.vocab)
        for control in (*self._inputs(), self.sweep, self.runs_dir, self.memory_timeline):
            control.disabled = busy or (control in shape and not self.toy)
        if busy:
            self.widget.add_class("zk-busy")
        else:
            self.widget.remove_class("zk-busy")

    def _stop_at_exit(self) -> None:
        if self.busy and self._thread is not None:
            self._cancel.set()
            self._thread.join(timeout=10)

    def _clicked(self, action) -> None:
        try:
            action()
        except ui.ERRORS as error:
            self.message.value = ui.colored(ui.one_line(error))

    def _build_setups(self) -> list[Setup]:
        from kit.models import toy_spec

        if not self.stages.value:
            raise ValueError(f"stages: choose at least one of {', '.join(BASELINES)}, 0, 1, 2, 3")
        if not self.micro_batches.value:
            raise ValueError("micro_batch: choose at least one micro batch")
        spec = (
            toy_spec(
                "gpt2",
                self.layers.value,
                self.hidden.value,
                self.heads.value,
                self.vocab.value,
                self.seq_len.value,
            )
            if self.toy
            else self.base.model
        )
        base = self.base.replace(
            model=spec,
            cluster={"nodes": max(1, len(self.node_names)), "gpus_per_node": self.nprocs.value},
            zero={
                field: value
                for name, s in APPLIED.items()
                for field, value in ui.setting_values(s, getattr(self, name)).items()
            },
            batch={"grad_accum": self.grad_accum.value, "seq_len": self.seq_len.value},
        )
        zeropp = {
            "hpz_partition_size": self.hpz.value,
            "quantized_weights": self.quantized_weights.value,
            "quantized_gradients": self.quantized_gradients.value,
        }
        levels = ["none"] + ["optimizer"] * self.offload_optimizer.value + ["all"] * self.offload_param.value
        where = {"nvme_path": self.nvme_path.value.strip() or None}
        # a schedule of global batches keeps each configuration's micro batch (more grad accum)
        schedule = self.batch_schedule.value.strip() or ()
        setups = []
        for choice in (c for c in self.stages.options if c in self.stages.value):
            # offload and ZeRO++ only where the stage takes them (kit.grid); NVMe holds stage 3's states
            found = grid.variants(
                [choice],
                offload=levels,
                to=self.offload_to.value,
                zeropp=[zeropp] if zeropp != ZEROPP_OFF else [],
            ).accepted
            for micro in sorted(self.micro_batches.value):
                for v in found:
                    nvme = where if Offload.NVME in (v.offload_optimizer, v.offload_param) else {}
                    setups.append(
                        base.replace(
                            zero={**v.zero, **nvme}, batch={"micro_batch": micro, "schedule": schedule}
                        )
                    )
        return setups

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.stages, self.offload_optimizer, self.offload_param, self.offload_to, self.nvme_path,
            self.hpz, self.quantized_weights, self.quantized_gradients, self.micro_batches, self.grad_accum,
            self.batch_schedule, self.precision, self.checkpointing, self.trainable, self.loss,
            self.reduce_bucket, self.prefetch_bucket, self.layers, self.hidden, self.heads, self.vocab,
            self.seq_len, self.nprocs, self.steps, self.warmup,
        ]  # fmt: skip


def comparison_panel(setup: Setup | None = None, **options: Any) -> ComparisonPanel:
    """The comparison panel (options: stages, nprocs, steps, warmup, runs_dir, sweep, hostfile, local);
    display ``.widget``."""
    return ComparisonPanel(setup, **options)


def results_html(results) -> str:
    """A sweep's few comparable columns (``Results.brief()``), formatted with units, and what its labels'
    tokens mean (``ui.legend_html``); every column of every configuration stays one call away:
    ``results.summary()``."""
    brief = results.brief()
    formats = [BRIEF_FORMATS.get(c, "{}") for c in brief.columns]
    table = ui.table_html(list(brief.columns), brief.values.tolist(), formats)
    return table + ui.legend_html(brief["configuration"])


def nodes_html(rows: list[dict]) -> str:
    """Per configuration and node (``kit.run.local_nodes.per_node``): its ranks, their model states (MiB,
    as the estimates show memory), and the MB (1e6 bytes, as traffic is counted) each rank sent inside and
    across nodes, each beside its estimate."""
    header = ["configuration", "node", "host", "ranks", "model states MiB", "estimate MiB", "intra-node MB",
              "estimate MB", "inter-node MB", "estimate MB"]  # fmt: skip
    table = [
        [
            r["label"],
            r["node_rank"],
            r["host"],
            ", ".join(map(str, r["ranks"])),
            r["model_states_bytes"] / MIB,
            r["estimate_model_states_bytes"] / MIB,
            r["intra_wire_bytes"] / MB,
            r["estimate_intra_wire_bytes"] / MB,
            r["inter_wire_bytes"] / MB,
            r["estimate_inter_wire_bytes"] / MB,
        ]  # fmt: skip
        for r in rows
    ]
    formats = ["{}", "{}", "{}", "{}"] + [ui.NUMBER] * 6
    caption = "per node (model states in MiB; MB each rank sent per step, averaged over the node's ranks):"
    caption = f"<div style='color:#666;margin-top:6px'>{caption}</div>"
    return caption + ui.table_html(header, table, formats)


def peak_records(results) -> list[dict]:
    """Per configuration, rank 0's last measured step that carries a memory timeline (a sweep run with
    ``memory_timeline=True``; on a GPU always), in the sweep's order."""
    last: dict[str, dict] = {}
    for r in results.records:
        timed = r.get("status") == "ok" and r["rank"] == 0 and "phases" in r.get("measured", {})
        if timed and r["step"] >= last.get(r["config_id"], r)["step"]:
            last[r["config_id"]] = r
    return list(last.values())


def record_timeline(record: dict):
    """The timeline predicted for one record's setting, rank and device (``kit.estimate.peak.runner_path``:
    the optimizer path and backend its run stepped) and CPU matmuls (``cpu_matmul``), as its
    ``estimate.phases`` were."""
    from kit.estimate.cpu_matmul import CpuMatmul
    from kit.estimate.memory import peak_timeline
    from kit.estimate.peak import runner_path

    implementation, backend = runner_path(record["device"])
    setup = Setup.model_validate(record["setup"])
    cpu = CpuMatmul.from_record(record["cpu_matmul"]) if "cpu_matmul" in record else None
    return peak_timeline(setup, record["rank"], implementation=implementation, backend=backend, cpu=cpu)


def peak_plot(record: dict):
    """``plots.peak_timeline`` of one record: its predicted timeline beside the phases it measured."""
    from kit.lab import plots

    line = record_timeline(record)
    peak, measured = line.peak_phase, record["measured"]["phases"]
    title = (
        f"{record['label']}: predicted peak in {peak} ({line.totals[peak] / MIB:,.2f} MiB), "
        f"measured {measured[peak] / MIB:,.2f} MiB"
    )
    where = "in a CPU rank" if record.get("device") == "cpu" else "on the GPU"
    return plots.peak_timeline(line, measured, title=title, where=where)
