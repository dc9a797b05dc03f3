"""Notebook panels: controls that build a ``Setup`` and show what ``kit`` says about it.

The panels never compute: every change builds a Setup from the controls and calls ``kit.estimate``;
every button calls a plain method (``write_config``, ``launch_command``, ``start``/``run``, ``stop``) that a
notebook cell can call too, so tests and CI exercise the same path as a click. Invalid combinations show
the one-line error of ``kit.schema.explain`` in the panel instead of a traceback. The forms are columns of
one width (``CELL``) with every label ``DESCRIPTION_WIDTH`` wide; numbers carry units and separators.
"""

from __future__ import annotations

import atexit
import contextlib
import html
import io
import re
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import ipywidgets as w
from IPython.display import clear_output, display
from pydantic import ValidationError

from kit import monitor
from kit.estimate.perf import ZEROPP_OFF
from kit.gpus import gpu_names
from kit.rules import BASELINES, offload_problem
from kit.run.sweep import toy_setup
from kit.schema import ModelSpec, Setup, explain
from kit.units import GIB, MIB, parse_count

#: bucket sliders span 1e4 .. 1e10 elements on a log scale (DeepSpeed's defaults are 5e7 .. 1e9).
BUCKET_MIN_EXP, BUCKET_MAX_EXP = 4, 10
ERRORS = (ValidationError, ValueError, OSError)
#: room for the longest control label ("offload optimizer") so none is cut off; every label of a panel
#: has this width, so that the labels line up in columns
DESCRIPTION_WIDTH = "115px"
#: the swap folder the memory panel offers for NVMe offload (it estimates; nothing is written)
NVME_PATH = "/local_nvme"
#: the width of one control, its label included: the forms are columns of this width
CELL = "265px"
#: a slider's width: two to a row, with room for the track
SLIDER = "400px"
#: warm-up steps of a comparison run (not measured)
WARMUP = 2
#: the verdict line: large enough to be read first
VERDICT_STYLE = "font-size:1.25em;margin:6px 0;"


class MemoryPanel:
    """Choose a model, cluster, ZeRO settings and batch; see bytes per GPU, whether it fits, and why.

    State after every change: ``setup`` (a Setup, or None while the controls are invalid), ``estimate``
    (``kit.estimate.Estimate`` or None) and ``error`` (the one-line reason, or None). ``verdict`` is the
    one line that says whether it fits and by how much.
    """

    def __init__(self, setup: Setup | None = None):
        from kit import models

        self.base = setup or default_setup()
        self.error: str | None = None
        self.setup: Setup | None = None
        self.estimate: Any = None
        self._quiet = False
        base, z, b = self.base, self.base.zero, self.base.batch
        presets = models.preset_names()
        sources = [("preset", "preset"), ("config.json / model.py", "config"), ("parameter count", "count")]
        given = base.model.name not in presets
        if given:
            sources.insert(0, (f"{base.model.name} (given)", "given"))
        self.model_source = _toggle(sources, "given" if given else "preset", "model", "auto")
        self.preset = w.Dropdown(
            options=presets, value=presets[0] if given else base.model.name, description="preset"
        )
        self.config_path = w.Text(placeholder="config.json or my_model.py", description="file")
        self.params = w.Text(
            value=f"{base.model.params:,}", description="parameters", continuous_update=False
        )
        self.largest_layer = w.Text(
            value="",
            placeholder="derived from the count",
            description="largest layer",
            continuous_update=False,
        )
        self.gpu = w.Dropdown(options=gpu_names(), value=base.cluster.gpu, description="GPU")
        self.nodes = w.BoundedIntText(value=base.cluster.nodes, min=1, max=4096, description="nodes")
        self.gpus_per_node = w.BoundedIntText(
            value=base.cluster.gpus_per_node, min=1, max=64, description="GPUs per node"
        )
        self.stage = _toggle([0, 1, 2, 3], z.stage, "ZeRO stage", "42px")
        self.offload_optimizer = _toggle(
            ["none", "cpu", "nvme"], z.offload_optimizer, "offload optimizer", "56px"
        )
        self.offload_param = _toggle(["none", "cpu", "nvme"], z.offload_param, "offload params", "56px")
        # ZeRO-Infinity: the swap folder NVMe offload writes to (one for both offloads)
        self.nvme_path = w.Text(value=z.nvme_path or NVME_PATH, description="NVMe path")
        self.offload_reason = w.HTML()
        # ZeRO++ (stage 3): hpZ's in-node secondary partition, qwZ int8 weights, qgZ int4 gradients
        self.hpz = w.BoundedIntText(value=z.hpz_partition_size, min=1, max=64, description="hpZ size")
        self.quantized_weights = w.Checkbox(value=z.quantized_weights, description="qwZ int8 weights")
        self.quantized_gradients = w.Checkbox(value=z.quantized_gradients, description="qgZ int4 gradients")
        self.precision = _toggle(["fp32", "fp16", "bf16"], z.precision, "precision", "56px")
        self.optimizer = w.Dropdown(
            options=["adamw", "adam", "sgd"], value=z.optimizer, description="optimizer"
        )
        self.micro_batch = w.BoundedIntText(value=b.micro_batch, min=1, max=65536, description="micro batch")
        self.batch_by = _toggle(
            [("grad accum", "grad_accum"), ("global batch", "train_batch")],
            "grad_accum",
            "keep fixed",
            "110px",
        )
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=65536, description="grad accum")
        self.train_batch = w.BoundedIntText(
            value=b.train_batch, min=1, max=1 << 30, description="global batch"
        )
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=1, max=1_048_576, description="seq len")
        self.activation_checkpointing = w.Checkbox(
            value=z.activation_checkpointing, description="activation checkpointing", indent=True
        )
        self.reduce_bucket = _bucket_slider("reduce bucket", z.reduce_bucket_size)
        self.allgather_bucket = _bucket_slider("allgather bucket", z.allgather_bucket_size)
        self.prefetch_bucket = _bucket_slider("s3 prefetch", z.prefetch_bucket_size)
        self.max_live_parameters = _bucket_slider("s3 max live", z.max_live_parameters)
        self.config_file = w.Text(value="ds_config.json", description="write to")
        self.write_button = _button("Write ds_config.json", "save")
        self.command_button = _button("Show launch command", "terminal")
        self.message = w.HTML()
        self.verdict = w.HTML()
        self.summary = w.HTML()
        self.formulas = w.HTML()
        self.plot = w.Image(format="png")
        self.command = w.Textarea(layout=w.Layout(width="100%", height="5em", display="none"), disabled=True)

        for control in self._inputs():
            _cell(control)
            control.observe(self.update, names="value")
        _cell(self.config_file)
        self.activation_checkpointing.layout.width = "auto"
        self.write_button.on_click(lambda _: self._report(self._write_clicked))
        self.command_button.on_click(lambda _: self._report(self._show_command))
        self.widget = w.VBox(
            [
                w.HTML("<b>Memory before booking</b>: bytes per GPU for the settings below (kit.estimate)"),
                _section("Model"),
                self.model_source,
                _row(self.preset, self.config_path),
                _row(self.params, self.largest_layer),
                _section("Cluster"),
                _row(self.gpu, self.nodes, self.gpus_per_node),
                _section("ZeRO"),
                _row(self.stage, self.precision),
                _row(self.offload_optimizer, self.offload_param),
                self.nvme_path,
                _row(self.optimizer, self.activation_checkpointing),
                _row(self.hpz, self.quantized_weights, self.quantized_gradients),
                self.offload_reason,
                _section("Batch"),
                _row(self.micro_batch, self.batch_by),
                _row(self.grad_accum, self.train_batch, self.seq_len),
                _section("Buckets (elements)"),
                _row(self.reduce_bucket, self.allgather_bucket),
                _row(self.prefetch_bucket, self.max_live_parameters),
                self.verdict,
                w.HBox([self.plot, self.summary], layout=w.Layout(align_items="flex-start")),
                self.formulas,
                _row(self.config_file, self.write_button, self.command_button),
                self.message,
                self.command,
            ]
        )
        self.widget.add_class("zk-memory-panel")
        for name in ("stage", "offload_optimizer", "offload_param", "micro_batch", "verdict", "summary"):
            getattr(self, name).add_class(f"zk-{name.replace('_', '-')}")
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Rebuild the Setup from the controls and re-estimate (every control calls this on change)."""
        if self._quiet:
            return
        self._sync_controls()
        from kit.estimate import estimate

        if change and change.get("owner") is self.model_source and change.get("new") == "count":
            with self._holding():  # a typed count derives its largest layer unless one is given
                self.largest_layer.value = ""
        try:
            spec = self._model_spec()
            with self._holding():  # the count boxes show the model in use, whichever source chose it
                self.params.value = f"{spec.params:,}"
                if self.model_source.value != "count" or self.largest_layer.value.strip():
                    self.largest_layer.value = f"{spec.largest_layer_params:,}"
            setup = self._build_setup(spec)
            result = estimate(setup)
        except ERRORS as error:
            self.setup, self.estimate, self.error = None, None, _one_line(error)
        else:
            self.setup, self.estimate, self.error = setup, result, None
            with self._holding():
                self.grad_accum.value = setup.batch.grad_accum
                self.train_batch.value = setup.batch.train_batch
        self._render()

    def write_config(self, path: str | Path = "ds_config.json") -> Path:
        """Write the current Setup as a DeepSpeed config (``kit.ds_config.write_ds_config``); returns the
        file's absolute path."""
        from kit.ds_config import write_ds_config

        write_ds_config(self._valid_setup(), path)
        return Path(path).resolve()

    def launch_command(self, script: str = "train.py", master_addr: str = "$MASTER_ADDR") -> str:
        """The paste-able ``deepspeed`` command for ``script`` with this Setup (``kit.scaleout.commands``);
        several nodes read ``hostfile`` (write it with ``zerokit hostfile``) and meet at ``master_addr``."""
        from kit.scaleout import commands

        setup = self._valid_setup()
        nodes = setup.cluster.nodes > 1
        argv = commands.deepspeed_command(
            setup,
            script,
            ds_config=self.config_file.value,
            hostfile="hostfile" if nodes else None,
            master_addr=master_addr if nodes else None,
        )
        return commands.shell_line(argv)

    def _build_setup(self, spec: ModelSpec) -> Setup:
        base = self.base
        cluster = {
            **base.cluster.model_dump(),
            "gpu": self.gpu.value,
            "nodes": self.nodes.value,
            "gpus_per_node": self.gpus_per_node.value,
        }
        zero = {
            **base.zero.model_dump(),
            "stage": self.stage.value,
            "offload_optimizer": self.offload_optimizer.value,
            "offload_param": self.offload_param.value,
            # the path box counts only when something goes to NVMe (else the Setup keeps its own)
            "nvme_path": (self.nvme_path.value.strip() or None)
            if "nvme" in (self.offload_optimizer.value, self.offload_param.value)
            else base.zero.nvme_path,
            "precision": self.precision.value,
            "optimizer": self.optimizer.value,
            "activation_checkpointing": self.activation_checkpointing.value,
            "hpz_partition_size": self.hpz.value,
            "quantized_weights": self.quantized_weights.value,
            "quantized_gradients": self.quantized_gradients.value,
            "reduce_bucket_size": round(self.reduce_bucket.value),
            "allgather_bucket_size": round(self.allgather_bucket.value),
            "prefetch_bucket_size": round(self.prefetch_bucket.value),
            "max_live_parameters": round(self.max_live_parameters.value),
        }
        if self.optimizer.value != "sgd":
            zero["momentum"] = 0.0
        fixed = self.batch_by.value
        batch = {
            "micro_batch": self.micro_batch.value,
            fixed: getattr(self, fixed).value,
            "seq_len": self.seq_len.value,
        }
        return Setup(model=spec, cluster=cluster, zero=zero, batch=batch)

    def _model_spec(self) -> ModelSpec:
        from kit import models

        source = self.model_source.value
        if source == "given":
            return self.base.model
        if source == "preset":
            return models.preset(self.preset.value)
        if source == "config":
            if not self.config_path.value.strip():
                raise ValueError("config.json: give the path to a Hugging Face config.json or a model file")
            return models.resolve(self.config_path.value.strip())
        count = _count("parameters", self.params.value)
        largest = (
            _count("largest layer", self.largest_layer.value) if self.largest_layer.value.strip() else None
        )
        return models.from_count(count, largest)

    def _sync_controls(self) -> None:
        """Enable only what the stage and choices allow, saying why a control is off."""
        with self._holding():
            stage = self.stage.value
            reasons = []
            for field, control in (
                ("offload_optimizer", self.offload_optimizer),
                ("offload_param", self.offload_param),
            ):
                asked = {"offload_optimizer": "none", "offload_param": "none", field: "cpu"}
                problem = offload_problem(stage, **asked)
                control.disabled = problem is not None
                if problem:
                    control.value = "none"
                    reasons.append(": ".join(problem))
                elif control.value == "nvme" and stage != 3:
                    control.value = "cpu"  # stages 1-2 have no NVMe swapper
                    reasons.append(": ".join(offload_problem(stage, **{**asked, field: "nvme"})))
            self.nvme_path.disabled = "nvme" not in (self.offload_optimizer.value, self.offload_param.value)
            self.offload_reason.value = "".join(
                f"<div style='margin-left:{DESCRIPTION_WIDTH};color:#666'><i>{html.escape(r)}</i></div>"
                for r in reasons
            )
            source = self.model_source.value
            self.preset.disabled = source != "preset"
            self.config_path.disabled = source != "config"
            self.params.disabled = self.largest_layer.disabled = source != "count"
            self.grad_accum.disabled = self.batch_by.value != "grad_accum"
            self.train_batch.disabled = self.batch_by.value != "train_batch"
            self.prefetch_bucket.disabled = self.max_live_parameters.disabled = stage != 3
            for control, off in (
                (self.hpz, 1),
                (self.quantized_weights, False),
                (self.quantized_gradients, False),
            ):
                control.disabled = stage != 3  # ZeRO++ is stage 3 only (kit.rules.zeropp_problem)
                if stage != 3:
                    control.value = off
            self.allgather_bucket.disabled = stage not in (1, 2)

    def _render(self) -> None:
        from kit.lab.plots import estimated_memory

        if self.error:
            self.verdict.value = f"<div style='{VERDICT_STYLE}color:#b00'>{html.escape(self.error)}</div>"
            self.summary.value = self.formulas.value = ""
            self.plot.layout.display = "none"
            return
        est, setup = self.estimate, self.setup
        c, b = setup.cluster, setup.batch
        self.verdict.value = verdict_html(est)
        ram = c.cpu_ram_per_node_bytes
        others = [name for name, ok in est.fits.items() if ok and name != c.gpu]
        facts = [
            ("setting", f"<b>{html.escape(setup.label)}</b>"),
            ("cluster", f"{c.nodes} x {c.gpus_per_node} {html.escape(c.gpu)}"),
            (
                "per GPU",
                f"<b class='zk-per-gpu'>{est.per_gpu_bytes / GIB:,.2f} GiB</b> of {_gpu_gib(c.gpu):,.2f} GiB",
            ),
            ("model states", f"{est.model_states_bytes / GIB:,.2f} GiB per GPU"),
            (
                "CPU RAM per node",
                f"{est.cpu_bytes_per_node / GIB:,.2f} GiB" + (f" of {ram / GIB:,.0f} GiB" if ram else ""),
            ),
            *(
                [("NVMe per node", f"<span class='zk-nvme'>{est.nvme_bytes_per_node / GIB:,.2f} GiB</span>")]
                if est.nvme_bytes_per_node
                else []
            ),
            ("batch", f"{b.micro_batch} x {setup.dp} x {b.grad_accum} = {b.train_batch:,}"),
            ("", "<span style='color:#666'>micro x GPUs x grad accum</span>"),
        ]
        also = html.escape(", ".join(others) or "no other GPU in the catalogue")
        self.summary.value = _facts_html(facts) + (
            "<div style='font-size:12px;color:#555;margin:6px 0 0 12px;max-width:300px'>"
            f"also fits on: {also}</div>"
        )
        self.formulas.value = formula_table_html(est)
        self.plot.value = figure_png(estimated_memory([est]))
        self.plot.layout.display = None

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.model_source,
            self.preset,
            self.config_path,
            self.params,
            self.largest_layer,
            self.gpu,
            self.nodes,
            self.gpus_per_node,
            self.stage,
            self.offload_optimizer,
            self.offload_param,
            self.hpz,
            self.quantized_weights,
            self.quantized_gradients,
            self.precision,
            self.optimizer,
            self.micro_batch,
            self.batch_by,
            self.grad_accum,
            self.train_batch,
            self.seq_len,
            self.activation_checkpointing,
            self.reduce_bucket,
            self.allgather_bucket,
            self.prefetch_bucket,
            self.max_live_parameters,
        ]

    def _valid_setup(self) -> Setup:
        if self.setup is None:
            raise ValueError(self.error or "setup: the controls do not describe a valid Setup")
        return self.setup

    def _write_clicked(self) -> str:
        path = self.write_config(self.config_file.value)
        est, gpu = self.estimate, self.setup.cluster.gpu
        if est.fits[gpu]:
            return f"wrote {path} ({self.setup.label}: fits the {gpu})"
        return f"wrote {path}, but warning: {html.unescape(_strip_tags(verdict_html(est)))}"

    def _show_command(self) -> str:
        self.command.value = self.launch_command()
        self.command.layout.display = None
        return "launch command below"

    def _report(self, action) -> None:
        try:
            text = action()
        except ERRORS as error:
            self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"
        else:
            color = "#b00" if "warning" in text else "#1a7f37"
            self.message.value = f"<span style='color:{color}'>{html.escape(text)}</span>"

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Set controls without each change triggering another update."""
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet


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
        runs_dir: str | Path = "runs",
        sweep: str = "compare",
    ):
        self.base = setup or toy_setup(nprocs)
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
        self.offload_to = _toggle(["cpu", "nvme"], "cpu", "offload to", "56px")
        self.nvme_path = w.Text(
            value=z.nvme_path or "", description="NVMe path", placeholder="a folder on the NVMe drive"
        )
        # ZeRO++ (stage 3): a variant of each stage 3 configuration with these set
        self.hpz = w.BoundedIntText(value=z.hpz_partition_size, min=1, max=64, description="+ hpZ size")
        self.quantized_weights = w.Checkbox(value=z.quantized_weights, description="+ qwZ (int8 weights)")
        self.quantized_gradients = w.Checkbox(value=z.quantized_gradients, description="+ qgZ (int4 grads)")
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=1024, description="grad accum")
        self.batch_schedule = w.Text(
            value="", description="batch by step", placeholder="e.g. 2=16,4=32 (global batch from that step)"
        )
        self.precision = _toggle(["fp32", "fp16", "bf16"], z.precision, "precision", "56px")
        self.reduce_bucket = _bucket_slider("reduce bucket", z.reduce_bucket_size)
        self.prefetch_bucket = _bucket_slider("s3 prefetch", z.prefetch_bucket_size)
        self.layers = w.BoundedIntText(value=m.layers or 1, min=1, max=256, description="layers")
        self.hidden = w.BoundedIntText(value=m.hidden or 8, min=8, max=16384, step=8, description="hidden")
        self.heads = w.BoundedIntText(value=m.heads or 1, min=1, max=256, description="heads")
        self.vocab = w.BoundedIntText(value=m.vocab or 2, min=2, max=1 << 20, description="vocab")
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=2, max=1 << 16, description="seq len")
        self.nprocs = w.BoundedIntText(value=nprocs, min=1, max=64, description="ranks")
        self.steps = w.BoundedIntText(value=steps, min=1, max=10_000, description="steps")
        self.sweep = w.Text(value=sweep, description="sweep")
        self.runs_dir = w.Text(value=str(runs_dir), description="runs dir")
        self.run_button = _button("Run", "play", button_style="primary")
        self.stop_button = _button("Stop", "stop", button_style="danger", disabled=True)
        self.message = w.HTML()
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width="220px", visibility="hidden"))
        self.bar.add_class("zk-bar")
        self.preview = w.HTML()
        self.plots = w.GridBox(
            [], layout=w.Layout(grid_template_columns="repeat(auto-fill, minmax(440px, 1fr))", grid_gap="6px")
        )
        self.table = w.HTML()
        for control in self._inputs():
            _cell(control)
            control.observe(self.update, names="value")
        for control in (self.sweep, self.runs_dir):
            _cell(control)
        for control in (self.offload_optimizer, self.offload_param, self.quantized_weights):
            control.layout.width, control.indent = "auto", False
        self.quantized_gradients.layout.width, self.quantized_gradients.indent = "auto", False
        self.run_button.on_click(lambda _: self._clicked(self.start))
        self.stop_button.on_click(lambda _: self.stop())
        self.widget = w.VBox(
            [
                w.HTML("<b>ZeRO stage comparison</b>: real short runs of every configuration, one launch"),
                _section("Configurations"),
                _row(self.stages, self.micro_batches, w.VBox([self.offload_optimizer, self.offload_param])),
                _row(self.offload_to, self.nvme_path),
                _row(self.hpz, self.quantized_weights, self.quantized_gradients),
                _row(self.precision, self.grad_accum, self.batch_schedule),
                _row(self.reduce_bucket, self.prefetch_bucket),
                _section("Toy model" if self.toy else f"Model: {html.escape(m.name)}"),
                _row(self.layers, self.hidden, self.heads),
                _row(self.vocab, self.seq_len),
                _section("Run"),
                _row(self.nprocs, self.steps),
                _row(self.sweep, self.runs_dir, self.run_button, self.stop_button),
                w.HBox(
                    [self.bar, self.message], layout=w.Layout(align_items="center", flex_flow="row nowrap")
                ),
                self.preview,
                self.plots,
                self.table,
            ]
        )
        self.widget.add_class("zk-comparison-panel")
        for name in (
            "run_button",
            "stop_button",
            "message",
            "plots",
            "table",
            "sweep",
            "runs_dir",
            "stages",
            "steps",
        ):
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
        except ERRORS as error:
            self.setups, self.estimates, self.error = [], [], _one_line(error)
            self.message.value = f"<span style='color:#b00'>{html.escape(self.error)}</span>"
            self.preview.value = ""
            return
        self.setups, self.estimates, self.error = setups, estimates, None
        self.message.value = (
            f"{len(setups)} configurations, {self.nprocs.value} ranks, {self.steps.value} steps each: "
            "press Run"
        )
        rows = [
            [
                e.setup.label,
                e.model_states_bytes / MIB,
                e.components["activations"] / MIB,
                e.per_gpu_bytes / MIB,
            ]
            for e in estimates
        ]
        header = ["configuration", "model states MiB", "activations MiB", "total MiB per rank"]
        self.preview.value = "<div style='color:#666'>estimate before running:</div>" + table_html(
            header, rows, ["{}", "{:,.1f}", "{:,.1f}", "{:,.1f}"]
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
            self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"
        finally:
            self._set_busy(False)

    def _sweep(self):
        from kit.run.sweep import run_sweep

        self._cancel.clear()
        self._progress = {"total": len(self.setups), "done": 0, "reused": 0, "records": "", "label": ""}
        self.bar.max, self.bar.value = max(1, len(self.setups)), 0
        self.bar.layout.visibility = "visible"
        self.plots.children, self.table.value, self.results = (), "", None
        self.message.value = f"starting {len(self.setups)} configurations on {self.nprocs.value} ranks..."
        started = time.monotonic()
        self.results = run_sweep(
            list(self.setups),
            sweep=self.sweep.value,
            runs_dir=self.runs_dir.value,
            nprocs=self.nprocs.value,
            steps=self.steps.value,
            warmup=WARMUP,
            progress=False,
            cancel=self._cancel.is_set,
            on_event=self._on_event,
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
            where += f", step {event['step'] - WARMUP + 1} of {self.steps.value}"
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
            text += f"; <span style='color:#b00'>not ok: {html.escape(', '.join(failed))}</span>"
        return text + f"; records in {where}; every column: <code>panel.results.summary()</code>"

    def _show_results(self) -> None:
        from kit.lab import plots

        results = self.results
        images = []
        if not results.steps().empty:
            for draw in (plots.throughput, plots.memory, plots.comm_volume, plots.loss_curves):
                image = w.Image(value=figure_png(draw(results)), format="png")
                image.layout.max_width = "100%"
                images.append(image)
        self.plots.children = images
        self.table.value = results_html(results)

    def _set_busy(self, busy: bool) -> None:
        """Run off, Stop on, controls off while a sweep runs (and the other way round after)."""
        self.busy = busy
        self.run_button.disabled = busy
        self.run_button.description = "Running..." if busy else "Run"
        self.run_button.icon = "hourglass-half" if busy else "play"
        self.stop_button.disabled = not busy
        shape = (self.layers, self.hidden, self.heads, self.vocab)
        for control in (*self._inputs(), self.sweep, self.runs_dir):
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
        except ERRORS as error:
            self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"

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
            cluster={"nodes": 1, "gpus_per_node": self.nprocs.value},
            zero={
                "precision": self.precision.value,
                "reduce_bucket_size": round(self.reduce_bucket.value),
                "prefetch_bucket_size": round(self.prefetch_bucket.value),
            },
            batch={"grad_accum": self.grad_accum.value, "seq_len": self.seq_len.value},
        )
        none = {"offload_optimizer": "none", "offload_param": "none", **ZEROPP_OFF}
        to = self.offload_to.value
        where = {"nvme_path": self.nvme_path.value.strip() or None} if to == "nvme" else {}
        zeropp = {
            "hpz_partition_size": self.hpz.value,
            "quantized_weights": self.quantized_weights.value,
            "quantized_gradients": self.quantized_gradients.value,
        }
        setups = []
        for choice in (c for c in self.stages.options if c in self.stages.value):
            engine, stage = BASELINES.get(choice, ("deepspeed", choice))
            deepspeed = engine == "deepspeed"
            variants = [none]  # the baselines run without offload or ZeRO++
            # NVMe holds stage 3's states only (DeepSpeed has no swapper below it): CPU offload there
            here = to if stage == 3 else "cpu"
            if self.offload_optimizer.value and stage >= 1 and deepspeed:
                variants.append({**none, "offload_optimizer": here, **(where if here == "nvme" else {})})
            if self.offload_param.value and stage == 3 and deepspeed:
                variants.append({**none, "offload_optimizer": to, "offload_param": to, **where})
            if stage == 3 and deepspeed and zeropp != ZEROPP_OFF:
                variants.append({**none, **zeropp})
            for micro in sorted(self.micro_batches.value):
                for offload in variants:
                    # a schedule of global batches keeps each configuration's micro batch (more grad accum)
                    batch = {"micro_batch": micro, "schedule": self.batch_schedule.value.strip() or ()}
                    zero = {"engine": engine, "stage": stage, **offload}
                    setups.append(base.replace(zero=zero, batch=batch))
        return setups

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.stages,
            self.offload_optimizer,
            self.offload_param,
            self.offload_to,
            self.nvme_path,
            self.hpz,
            self.quantized_weights,
            self.quantized_gradients,
            self.micro_batches,
            self.grad_accum,
            self.batch_schedule,
            self.precision,
            self.reduce_bucket,
            self.prefetch_bucket,
            self.layers,
            self.hidden,
            self.heads,
            self.vocab,
            self.seq_len,
            self.nprocs,
            self.steps,
        ]


class PlanPanel:
    """Plan a booking: GPU types, cluster sizes, global batch, run length, headroom and the performance
    model's assumptions; see every setup that fits on a time-vs-cost plot, the cheapest and fastest per
    GPU type, and what makes the starting setup fit (``kit.estimate.plan``).

    State after every change: ``plan`` (``kit.estimate.plan.Plan`` or None), ``fixes`` (the make-it-fit
    table of the starting setup) and ``error`` (one line, or None).
    """

    def __init__(self, setup: Setup | None = None, *, train_batch: int | None = None, max_nodes: int = 64):
        from kit.estimate import plan
        from kit.estimate.perf import Assumptions

        self.base = setup or default_setup()
        self.plan: Any = None
        self.fixes: Any = None
        self.error: str | None = None
        names = gpu_names()
        self.gpus = w.SelectMultiple(options=names, value=tuple(names), description="GPU types", rows=6)
        self.max_nodes = w.BoundedIntText(value=max_nodes, min=1, max=4096, description="max nodes")
        self.train_batch = w.BoundedIntText(
            value=train_batch or plan.DEFAULT_TRAIN_BATCH, min=1, max=1 << 24, description="global batch"
        )
        default_tokens = plan.TOKENS_PER_PARAM * self.base.model.params / 1e9
        self.tokens = w.BoundedFloatText(value=default_tokens, min=1e-6, max=1e7, description="B tokens")
        self.max_hours = w.BoundedFloatText(value=0, min=0, max=1e7, description="max hours (0: any)")
        self.headroom = w.FloatSlider(
            value=plan.DEFAULT_HEADROOM, min=0, max=0.5, step=0.05, description="headroom"
        )
        assume = Assumptions()
        self.efficiency = w.FloatSlider(
            value=assume.efficiency, min=0.05, max=1, step=0.05, description="efficiency"
        )
        self.overlap = w.FloatSlider(value=assume.overlap, min=0, max=1, step=0.1, description="overlap")
        self.verdict = w.HTML()
        self.plot = w.Output()
        self.table = w.Output()
        for control in self._inputs():
            control.style.description_width = DESCRIPTION_WIDTH
            control.observe(self.update, names="value")
        self.widget = w.VBox(
            [
                w.HTML(
                    f"<b>Plan the booking</b> for {html.escape(self.base.label)} of {self.base.model.name}"
                ),
                w.HBox([self.gpus, w.VBox([self.max_nodes, self.train_batch, self.tokens, self.max_hours])]),
                w.HBox([self.headroom, self.efficiency, self.overlap]),
                self.verdict,
                self.plot,
                self.table,
            ]
        )
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Search again with the controls' values and redraw (controls call this on change)."""
        from kit.estimate import plan
        from kit.estimate.perf import with_assumptions
        from kit.lab import plots

        try:
            assume = with_assumptions(efficiency=self.efficiency.value, overlap=self.overlap.value)
            self.plan = plan.search(
                self.base,
                train_batch=self.train_batch.value,
                gpus=list(self.gpus.value) or None,
                max_nodes=self.max_nodes.value,
                headroom=self.headroom.value,
                tokens=self.tokens.value * 1e9,
                assumptions=assume,
            )
            self.fixes = plan.make_it_fit(self.base, headroom=self.headroom.value, assumptions=assume)
        except ERRORS as error:
            self.plan, self.error = None, _one_line(error)
            self.verdict.value = f"<span style='color:#b00'>{html.escape(self.error)}</span>"
            return
        self.error = None
        found = self.plan
        fit = found.fitting(self.max_hours.value or None)
        if fit.empty:
            self.verdict.value = (
                f"<b style='color:#b00'>none of {len(found.table):,} setups fits</b> with "
                f"{self.headroom.value:.0%} headroom{' in time' if self.max_hours.value else ''}"
            )
        else:
            cheap, fast = fit.iloc[0], fit.loc[fit.hours.idxmin()]
            self.verdict.value = (
                f"<b>{len(fit):,} of {len(found.table):,} setups fit</b> ({found.setups_per_s:,.0f}/s). "
                f"Cheapest: {html.escape(cheap.label)}, {cheap.hours:,.0f} h, ${cheap.cost_usd:,.0f}. "
                f"Fastest: {html.escape(fast.label)}, {fast.hours:,.1f} h, ${fast.cost_usd:,.0f}."
            )
        _show_figure(self.plot, plots.pareto(found))
        with self.table:
            clear_output(wait=True)
            columns = ["gpu", "pick", "label", "per_gpu_gib", "hours", "cost_usd"]
            display(plan.readable(found.best_per_gpu()[columns]).style.hide(axis="index"))
            if self.fixes is not None and not self.fixes.empty:
                display(
                    w.HTML(f"<b>{html.escape(self.base.label)} does not fit</b>; changes that make it fit:")
                )
                display(plan.readable(self.fixes[["change", "per_gpu_gib", "step_s", "tokens_per_s"]]))

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.gpus, self.max_nodes, self.train_batch, self.tokens, self.max_hours,
            self.headroom, self.efficiency, self.overlap,
        ]  # fmt: skip


def plan_panel(setup: Setup | None = None, **options: Any) -> PlanPanel:
    """The planning panel (options: train_batch, max_nodes); display ``.widget``."""
    return PlanPanel(setup, **options)


def memory_panel(setup: Setup | None = None) -> MemoryPanel:
    """The memory panel, starting from ``setup`` (default: ``default_setup()``); display ``.widget``."""
    return MemoryPanel(setup)


def comparison_panel(setup: Setup | None = None, **options: Any) -> ComparisonPanel:
    """The comparison panel (options: stages, nprocs, steps, runs_dir, sweep); display ``.widget``."""
    return ComparisonPanel(setup, **options)


class MonitorPanel:
    """Every rank of a running job, from the heartbeats its ranks append to ``folder`` (``kit.monitor``: a
    sweep folder ``runs/NAME``, or the folder a training loop passes to ``kit.monitor.heartbeat``).

    A line for the job, a table of averages per node, a row per rank (state: online, stale, offline,
    finished or failed; step, samples/s, loss, memory now and its peak, age of its last heartbeat) and the
    memory and throughput of every rank over time (``kit.lab.plots.heartbeats``). ``refresh()`` reads the
    folder again (the Refresh button calls it); "auto refresh" (``start()`` / ``stop()``) calls it every
    ``interval_s`` seconds from a background timer. State: ``snapshot`` (the last ``kit.monitor.Snapshot``,
    None while the folder holds no heartbeats) and ``error`` (one line, or None).
    """

    def __init__(
        self,
        folder: str | Path,
        *,
        interval_s: float = 2.0,
        stale_s: float = monitor.STALE_S,
        offline_s: float = monitor.OFFLINE_S,
        auto: bool = False,
    ):
        self.folder, self.interval_s, self.stale_s, self.offline_s = (
            Path(folder),
            interval_s,
            stale_s,
            offline_s,
        )
        self.snapshot: monitor.Snapshot | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        self.refresh_button = _button("Refresh", "refresh")
        self.auto = w.Checkbox(value=False, description=f"auto refresh every {interval_s:g} s", indent=False)
        self.message = w.HTML()
        self.nodes = w.HTML()
        self.ranks = w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%"))
        self.refresh_button.on_click(lambda _: self.refresh())
        self.auto.observe(lambda change: self.start() if change["new"] else self.stop(), names="value")
        self.widget = w.VBox(
            [
                w.HTML(
                    f"<b>Live view of every rank</b>: heartbeats in <code>{html.escape(str(folder))}</code>"
                ),
                _row(self.refresh_button, self.auto),
                self.message,
                self.nodes,
                self.ranks,
                self.plot,
            ]
        )
        self.widget.add_class("zk-monitor-panel")
        self.refresh()
        self.auto.value = auto

    def refresh(self) -> monitor.Snapshot | None:
        """Read the heartbeats again and redraw; returns the snapshot (None while there is none)."""
        from kit.lab import plots

        try:
            snap = monitor.read(self.folder, stale_s=self.stale_s, offline_s=self.offline_s)
        except ValueError as error:
            self.snapshot, self.error = None, _one_line(error)
            self.message.value = f"<span style='color:#b00'>{html.escape(self.error)}</span>"
            self.nodes.value = self.ranks.value = ""
            return None
        self.snapshot, self.error, job = snap, None, snap.job
        states = ", ".join(f"{n} {s}" for s, n in job["states"].items() if n)
        stamp = time.strftime("%H:%M:%S", time.localtime(snap.time))
        self.message.value = (
            f"{job['ranks']} rank(s) of world size {job['world_size']} on {job['nodes']} node(s): "
            f"<b>{html.escape(states)}</b> at {stamp} (stale after {snap.stale_s:g} s without a heartbeat, "
            f"offline after {snap.offline_s:g} s)"
        )
        groups = [*snap.nodes, {"node": "job", **job}]
        self.nodes.value = table_html(
            ["node", "ranks", "states", "steps", "mean samples/s", "mean memory MiB", "peak MiB",
             "mean util %"],
            [
                [
                    g["node"], g["ranks"], ", ".join(f"{n} {s}" for s, n in g["states"].items() if n),
                    f"{g['step_min']}-{g['step_max']}" if g["step_min"] != g["step_max"] else g["step_min"],
                    g["samples_per_s_mean"], _mib(g["memory_bytes_mean"]), _mib(g["peak_bytes_max"]),
                    g["gpu_util_percent_mean"],
                ]
                for g in groups
            ],
            ["{}", "{:,}", "{}", "{}", "{:,.1f}", "{:,.1f}", "{:,.1f}", "{:.0f}"],
            bold_rows=(len(groups) - 1,),
        )  # fmt: skip
        self.ranks.value = table_html(
            ["node", "rank", "state", "age s", "step", "samples/s", "loss", "memory MiB", "peak MiB",
             "util %", "configuration"],
            [
                [
                    r["node"], r["rank"], r["state"], r["age_s"], r["step"], r["samples_per_s"], r["loss"],
                    _mib(r["memory_bytes"]), _mib(r["peak_bytes"]), r["gpu_util_percent"],
                    " ".join(filter(None, (r["label"], r["error"]))),
                ]
                for r in snap.ranks
            ],
            ["{}", "{}", "{}", "{:,.1f}", "{}", "{:,.1f}", "{:.4f}", "{:,.1f}", "{:,.1f}", "{:.0f}", "{}"],
        )  # fmt: skip
        self.plot.value = figure_png(plots.heartbeats(snap))
        return snap

    def start(self) -> None:
        """Refresh every ``interval_s`` seconds from a background timer, until ``stop()``."""
        if self._timer is not None and self._timer.is_alive():
            return
        self._stop.clear()
        self._timer = threading.Thread(target=self._tick, name="zerokit-monitor", daemon=True)
        self._timer.start()

    def stop(self) -> None:
        """Stop the timer (the last view stays)."""
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=10)
        self.auto.value = False

    def _tick(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.refresh()
            except Exception as error:  # shown in the panel: a thread's traceback would go nowhere
                self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"


def monitor_panel(folder: str | Path, **options: Any) -> MonitorPanel:
    """The live view of every rank from ``folder``'s heartbeats (options: interval_s, stale_s, offline_s,
    auto); display ``.widget``."""
    return MonitorPanel(folder, **options)


def default_setup() -> Setup:
    """A 7B-class preset on one node of 8 H100s, ZeRO-2 bf16, micro batch 1."""
    from kit import models

    names = models.preset_names()
    name = next((n for n in names if "7b" in n.lower()), names[0])
    return Setup(model=models.preset(name), batch={"micro_batch": 1})


def verdict_html(est) -> str:
    """One line: does the estimate fit its GPU (and the node's CPU RAM), and by how much."""
    setup = est.setup
    name, need = setup.cluster.gpu, est.per_gpu_bytes
    capacity = _gpu_gib(name) * GIB
    ram, cpu = setup.cluster.cpu_ram_per_node_bytes, est.cpu_bytes_per_node
    gpu_line = f"{need / GIB:,.2f} GiB per GPU of the {html.escape(name)}'s {capacity / GIB:,.2f} GiB"
    if need > capacity:
        over = f"{(need - capacity) / GIB:,.2f} GiB over ({need / capacity:.0%})"
        text = f"&#10008; does not fit: {gpu_line}, {over}"
        color = "#b00"
    elif ram is not None and cpu > ram:
        text = (
            f"&#10008; does not fit: CPU RAM per node {cpu / GIB:,.2f} GiB of {ram / GIB:,.2f} GiB, "
            f"{(cpu - ram) / GIB:,.2f} GiB over (GPU: {gpu_line})"
        )
        color = "#b00"
    else:
        text = (
            f"&#10004; fits: {gpu_line}, {(capacity - need) / GIB:,.2f} GiB free ({need / capacity:.0%} used)"
        )
        color = "#1a7f37"
    return f"<div class='zk-verdict-line' style='{VERDICT_STYLE}color:{color}'><b>{text}</b></div>"


def formula_table_html(est) -> str:
    """The estimate's components as a table: GiB, bytes with separators, and the formula behind each."""
    rows = [[name.replace("_", " "), t.bytes / GIB, t.bytes, t.formula] for name, t in est.terms.items()]
    rows.append(["total per GPU", est.per_gpu_bytes / GIB, est.per_gpu_bytes, "sum of the above"])
    total_row = len(rows) - 1
    rows.append(
        ["CPU RAM per node", est.cpu_bytes_per_node / GIB, est.cpu_bytes_per_node, est.cpu_term.formula]
    )
    if est.nvme_bytes_per_node:
        rows.append(
            ["NVMe per node", est.nvme_bytes_per_node / GIB, est.nvme_bytes_per_node, est.nvme_term.formula]
        )
    return table_html(
        ["component", "GiB", "bytes", "formula"],
        rows,
        ["{}", "{:,.2f}", "{:,}", "{}"],
        bold_rows=(total_row,),
    )


def results_html(results) -> str:
    """A sweep's few comparable columns (``Results.brief()``), formatted with units; every column of every
    configuration stays one call away: ``results.summary()``."""
    brief = results.brief()
    formats = {
        "step ms": "{:,.1f}", "samples/s": "{:,.1f}", "loss": "{:.4f}", "model states MB": "{:,.3f}",
        "estimate MB": "{:,.3f}", "peak RSS MiB": "{:,.0f}", "wire MB/step": "{:,.3f}",
    }  # fmt: skip
    return table_html(
        list(brief.columns), brief.values.tolist(), [formats.get(c, "{}") for c in brief.columns]
    )


def table_html(
    header: Sequence[str], rows: Sequence[Sequence], formats: Sequence[str], bold_rows: Sequence[int] = ()
) -> str:
    """A compact HTML table: numbers right-aligned in ``formats`` (missing ones as a dash), labels on one
    line, only the last (free-text) column wrapping."""
    cell = "padding:2px 7px;border-bottom:1px solid #e4e4e4;"
    head = "".join(
        f"<th style='{cell}text-align:{'left' if f == '{}' else 'right'};white-space:nowrap'>"
        f"{html.escape(h)}</th>"
        for h, f in zip(header, formats, strict=True)
    )
    body = []
    for i, row in enumerate(rows):
        cells = []
        for j, (value, fmt) in enumerate(zip(row, formats, strict=True)):
            text = "&ndash;" if _missing(value) else html.escape(fmt.format(value))
            wrap = "normal" if j == len(row) - 1 and fmt == "{}" and j > 0 else "nowrap"
            align = "left" if fmt == "{}" else "right"
            weight = "font-weight:bold;" if i in bold_rows else ""
            cells.append(f"<td style='{cell}{weight}text-align:{align};white-space:{wrap}'>{text}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        "<table class='zk-html-table' style='border-collapse:collapse;font-size:12px;"
        "font-variant-numeric:tabular-nums;margin:4px 0'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def figure_png(fig, dpi: int = 100) -> bytes:
    """``fig`` (a Figure outside pyplot's state) as PNG bytes, for an ``ipywidgets.Image``."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return buffer.getvalue()


def _facts_html(facts: list[tuple[str, str]]) -> str:
    rows = "".join(
        f"<tr><td style='color:#666;padding:1px 10px 1px 0;white-space:nowrap;vertical-align:top'>{k}</td>"
        f"<td style='padding:1px 0;white-space:nowrap'>{v}</td></tr>"
        for k, v in facts
    )
    return f"<table style='font-size:13px;margin-left:12px'>{rows}</table>"


def _mib(nbytes) -> float | None:
    return None if nbytes is None else nbytes / MIB


def _missing(value) -> bool:
    return value is None or (isinstance(value, float) and value != value)


def _strip_tags(text: str) -> str:
    return re.sub(r"<[^>]+>", "", text)


def _count(name: str, text: str) -> int:
    try:
        value = parse_count(text)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    if value < 1:
        raise ValueError(f"{name}: must be a count >= 1, got {text.strip()}")
    return value


def _toggle(options, value, description: str, button_width: str) -> w.ToggleButtons:
    """Toggle buttons with their label inline, as every other control's (ipywidgets puts it above)."""
    toggle = w.ToggleButtons(
        options=options,
        value=value,
        description=description,
        style={"description_width": DESCRIPTION_WIDTH, "button_width": button_width},
    )
    toggle.add_class("widget-inline-hbox")
    return toggle


def _button(description: str, icon: str, **options) -> w.Button:
    """A button as wide as its label (ipywidgets' fixed width cuts long labels off)."""
    return w.Button(
        description=description, icon=icon, layout=w.Layout(width="auto", min_width="90px"), **options
    )


def _cell(control: w.Widget) -> w.Widget:
    control.style.description_width = DESCRIPTION_WIDTH
    if isinstance(control, w.FloatLogSlider):
        control.layout.width = SLIDER
    elif not isinstance(control, w.ToggleButtons):
        control.layout.width = CELL
    return control


def _row(*controls: w.Widget) -> w.HBox:
    return w.HBox(
        list(controls), layout=w.Layout(flex_flow="row wrap", align_items="center", grid_gap="4px 12px")
    )


def _section(title: str) -> w.HTML:
    return w.HTML(
        f"<div style='margin:8px 0 2px;color:#555;font-size:11px;font-weight:bold;letter-spacing:.06em;"
        f"text-transform:uppercase;border-bottom:1px solid #ddd'>{html.escape(title)}</div>",
        layout=w.Layout(width="100%"),
    )


def _bucket_slider(description: str, value: int) -> w.FloatLogSlider:
    value = min(max(value, 10**BUCKET_MIN_EXP), 10**BUCKET_MAX_EXP)
    return w.FloatLogSlider(
        value=value,
        base=10,
        min=BUCKET_MIN_EXP,
        max=BUCKET_MAX_EXP,
        step=0.1,
        description=description,
        readout_format=".3s",
        continuous_update=False,
    )


def _gpu_gib(name: str) -> float:
    from kit.gpus import gpu

    return gpu(name).memory_gib


def _one_line(error: BaseException) -> str:
    if isinstance(error, ValidationError | ValueError):
        return explain(error)
    if isinstance(error, OSError) and error.filename:
        return f"config.json: {error.filename}: {error.strerror}"
    return str(error).splitlines()[0]


def _show_figure(output: w.Output, fig, clear: bool = True) -> None:
    """Show ``fig`` (a Figure outside pyplot's state) as a PNG in ``output``, whatever the backend."""
    import io

    from IPython.display import Image

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    with output:
        if clear:
            clear_output(wait=True)
        display(Image(buffer.getvalue()))
