"""Notebook panels: controls that build a ``Setup`` and show what ``kit`` says about it.

The panels never compute: every change builds a Setup from the controls and calls ``kit.estimate``;
every button calls a plain method (``write_config``, ``launch_command``, ``run``) that a notebook cell
can call too, so tests and CI exercise the same path as a click. Invalid combinations show the one-line
error of ``kit.schema.explain`` in the panel instead of a traceback.
"""

from __future__ import annotations

import contextlib
import html
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as w
from IPython.display import clear_output, display
from pydantic import ValidationError

from kit.gpus import gpu_names
from kit.rules import offload_problem
from kit.run.sweep import toy_setup
from kit.schema import ModelSpec, Setup, explain
from kit.units import GIB

#: bucket sliders span 1e4 .. 1e10 elements on a log scale (DeepSpeed's defaults are 5e7 .. 1e9).
BUCKET_MIN_EXP, BUCKET_MAX_EXP = 4, 10
ERRORS = (ValidationError, ValueError, OSError)
#: room for the longest control label ("allgather bucket") so none is cut off
DESCRIPTION_WIDTH = "110px"


class MemoryPanel:
    """Choose a model, cluster, ZeRO settings and batch; see bytes per GPU, whether it fits, and why.

    State after every change: ``setup`` (a Setup, or None while the controls are invalid), ``estimate``
    (``kit.estimate.Estimate`` or None) and ``error`` (the one-line reason, or None).
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
        self.model_source = w.ToggleButtons(
            options=sources, value="given" if given else "preset", description="model"
        )
        self.preset = w.Dropdown(
            options=presets, value=presets[0] if given else base.model.name, description="preset"
        )
        self.config_path = w.Text(placeholder="config.json or my_model.py", description="file")
        self.params = w.FloatText(value=float(base.model.params), description="parameters")
        self.largest_layer = w.FloatText(
            value=0.0, description="largest layer", tooltip="0 = derive from the count"
        )
        self.gpu = w.Dropdown(options=gpu_names(), value=base.cluster.gpu, description="GPU")
        self.nodes = w.BoundedIntText(value=base.cluster.nodes, min=1, max=4096, description="nodes")
        self.gpus_per_node = w.BoundedIntText(
            value=base.cluster.gpus_per_node, min=1, max=64, description="GPUs/node"
        )
        self.stage = w.ToggleButtons(options=[0, 1, 2, 3], value=z.stage, description="ZeRO stage")
        self.offload_optimizer = w.ToggleButtons(
            options=["none", "cpu"], value=z.offload_optimizer, description="offload opt."
        )
        self.offload_param = w.ToggleButtons(
            options=["none", "cpu"], value=z.offload_param, description="offload params"
        )
        self.offload_reason = w.HTML()
        self.precision = w.ToggleButtons(
            options=["fp32", "fp16", "bf16"], value=z.precision, description="precision"
        )
        self.optimizer = w.Dropdown(
            options=["adamw", "adam", "sgd"], value=z.optimizer, description="optimizer"
        )
        self.micro_batch = w.BoundedIntText(value=b.micro_batch, min=1, max=65536, description="micro batch")
        self.batch_by = w.ToggleButtons(
            options=[("grad accum", "grad_accum"), ("global batch", "train_batch")],
            value="grad_accum",
            description="fix",
        )
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=65536, description="grad accum")
        self.train_batch = w.BoundedIntText(
            value=b.train_batch, min=1, max=1 << 30, description="global batch"
        )
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=1, max=1_048_576, description="seq len")
        self.activation_checkpointing = w.Checkbox(
            value=z.activation_checkpointing, description="activation ckpt"
        )
        self.reduce_bucket = _bucket_slider("reduce bucket", z.reduce_bucket_size)
        self.allgather_bucket = _bucket_slider("allgather bucket", z.allgather_bucket_size)
        self.prefetch_bucket = _bucket_slider("s3 prefetch", z.prefetch_bucket_size)
        self.max_live_parameters = _bucket_slider("s3 max live", z.max_live_parameters)
        self.config_file = w.Text(value="ds_config.json", description="write to")
        self.write_button = w.Button(description="Write ds_config.json", icon="save")
        self.command_button = w.Button(description="Show launch command", icon="terminal")
        self.message = w.HTML()
        self.summary = w.HTML()
        self.formulas = w.HTML()
        self.plot = w.Output()
        self.command = w.Textarea(layout=w.Layout(width="100%", height="6em"), disabled=True)

        for control in self._inputs():
            control.style.description_width = DESCRIPTION_WIDTH
            control.observe(self.update, names="value")
        self.write_button.on_click(
            lambda _: self._report(lambda: f"wrote {self.write_config(self.config_file.value)}")
        )
        self.command_button.on_click(lambda _: self._report(self._show_command))
        self.widget = w.VBox(
            [
                w.HTML("<b>Memory before booking</b>: bytes per GPU for the settings below (kit.estimate)"),
                self.model_source,
                w.HBox([self.preset, self.config_path]),
                w.HBox([self.params, self.largest_layer]),
                w.HBox([self.gpu, self.nodes, self.gpus_per_node]),
                self.stage,
                w.HBox([self.offload_optimizer, self.offload_param]),
                self.offload_reason,
                w.HBox([self.precision, self.optimizer]),
                w.HBox([self.micro_batch, self.batch_by]),
                w.HBox([self.grad_accum, self.train_batch, self.seq_len]),
                self.activation_checkpointing,
                w.HBox([self.reduce_bucket, self.allgather_bucket]),
                w.HBox([self.prefetch_bucket, self.max_live_parameters]),
                self.message,
                w.HBox([self.plot, self.summary]),
                self.formulas,
                w.HBox([self.config_file, self.write_button, self.command_button]),
                self.command,
            ]
        )
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Rebuild the Setup from the controls and re-estimate (every control calls this on change)."""
        if self._quiet:
            return
        self._sync_controls()
        from kit.estimate import estimate

        try:
            setup = self._build_setup()
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
        """Write the current Setup as a DeepSpeed config (``kit.ds_config.write_ds_config``)."""
        from kit.ds_config import write_ds_config

        write_ds_config(self._valid_setup(), path)
        return Path(path)

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

    def _build_setup(self) -> Setup:
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
            "precision": self.precision.value,
            "optimizer": self.optimizer.value,
            "activation_checkpointing": self.activation_checkpointing.value,
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
        return Setup(model=self._model_spec(), cluster=cluster, zero=zero, batch=batch)

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
        if not self.params.value >= 1:
            raise ValueError(f"parameters: must be a count >= 1, got {self.params.value:g}")
        largest = round(self.largest_layer.value) or None
        return models.from_count(round(self.params.value), largest)

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
            self.offload_reason.value = "<br>".join(f"<i>{html.escape(r)}</i>" for r in reasons)
            source = self.model_source.value
            self.preset.disabled = source != "preset"
            self.config_path.disabled = source != "config"
            self.params.disabled = self.largest_layer.disabled = source != "count"
            self.grad_accum.disabled = self.batch_by.value != "grad_accum"
            self.train_batch.disabled = self.batch_by.value != "train_batch"
            self.prefetch_bucket.disabled = self.max_live_parameters.disabled = stage != 3
            self.allgather_bucket.disabled = stage not in (1, 2)

    def _render(self) -> None:
        from kit.lab.plots import estimated_memory

        if self.error:
            self.message.value = f"<span style='color:#b00'>{html.escape(self.error)}</span>"
            self.summary.value = self.formulas.value = ""
            self.plot.clear_output()
            return
        self.message.value = ""
        est, setup = self.estimate, self.setup
        c, b = setup.cluster, setup.batch
        capacity = _gpu_gib(setup.cluster.gpu)
        verdict = "fits" if est.fits[setup.cluster.gpu] else "does NOT fit"
        fitting = [name for name, ok in est.fits.items() if ok]
        self.summary.value = (
            f"<b>{setup.label}</b> on {c.nodes} x {c.gpus_per_node} {c.gpu}<br>"
            f"per GPU: <b>{est.per_gpu_bytes / GIB:.2f} GiB</b> of {capacity:g} GiB: <b>{verdict}</b><br>"
            f"model states: {est.model_states_bytes / GIB:.2f} GiB<br>"
            f"CPU RAM per node: {est.cpu_bytes_per_node / GIB:.2f} GiB<br>"
            f"batch: {b.micro_batch} x {setup.dp} x {b.grad_accum} = {b.train_batch}<br>"
            f"fits on: {html.escape(', '.join(fitting) or 'no GPU in the catalogue')}"
        )
        self.formulas.value = est.table().to_html(float_format=lambda x: f"{x:.3f}")
        _show_figure(self.plot, estimated_memory([est]))

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

    def _show_command(self) -> str:
        self.command.value = self.launch_command()
        return "launch command below"

    def _report(self, action) -> None:
        try:
            self.message.value = html.escape(action())
        except ERRORS as error:
            self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Set controls without each change triggering another update."""
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet


class ComparisonPanel:
    """Choose configurations to compare (stages, offload, micro batches, buckets), a toy model, ranks
    and steps; ``run`` measures them all in one launch (``kit.run.sweep.run_sweep``) and plots the answer.

    State: ``setups`` (the configurations the controls describe, or [] while invalid), ``estimates``
    (``kit.estimate`` of each), ``error`` (one line, or None) and ``results`` (after ``run``).
    """

    def __init__(
        self,
        setup: Setup | None = None,
        *,
        stages: tuple[int, ...] = (0, 1, 2, 3),
        nprocs: int = 2,
        steps: int = 3,
        runs_dir: str | Path = "runs",
        sweep: str = "compare",
    ):
        self.base = setup or toy_setup(nprocs)
        self.error: str | None = None
        self.setups: list[Setup] = []
        self.estimates: list[Any] = []
        self.results: Any = None
        m, z, b = self.base.model, self.base.zero, self.base.batch
        #: the toy GPT's shape is edited here; any other model (an HF config, a model file) runs as given
        self.toy = m.family == "gpt2" and m.name.startswith("toy-")
        self.stages = w.SelectMultiple(
            options=[0, 1, 2, 3], value=tuple(stages), description="stages", rows=4
        )
        self.offload_optimizer = w.Checkbox(value=False, description="+ optimizer offload (stages 1-3)")
        self.offload_param = w.Checkbox(value=False, description="+ stage 3 parameter offload")
        self.micro_batches = w.SelectMultiple(
            options=sorted({1, 2, 4, 8, 16, 32, b.micro_batch}),
            value=(b.micro_batch,),
            description="micro batch",
            rows=4,
        )
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=1024, description="grad accum")
        self.precision = w.ToggleButtons(
            options=["fp32", "fp16", "bf16"], value=z.precision, description="precision"
        )
        self.reduce_bucket = _bucket_slider("reduce bucket", z.reduce_bucket_size)
        self.prefetch_bucket = _bucket_slider("s3 prefetch", z.prefetch_bucket_size)
        self.layers = w.BoundedIntText(value=m.layers or 1, min=1, max=256, description="layers")
        self.hidden = w.BoundedIntText(value=m.hidden or 8, min=8, max=16384, step=8, description="hidden")
        self.heads = w.BoundedIntText(value=m.heads or 1, min=1, max=256, description="heads")
        self.vocab = w.BoundedIntText(value=m.vocab or 2, min=2, max=1 << 20, description="vocab")
        for control in (self.layers, self.hidden, self.heads, self.vocab):
            control.disabled = not self.toy
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=2, max=1 << 16, description="seq len")
        self.nprocs = w.BoundedIntText(value=nprocs, min=1, max=64, description="ranks")
        self.steps = w.BoundedIntText(value=steps, min=1, max=10_000, description="steps")
        self.sweep = w.Text(value=sweep, description="sweep")
        self.runs_dir = w.Text(value=str(runs_dir), description="runs dir")
        self.run_button = w.Button(description="Run", icon="play", button_style="primary")
        self.message = w.HTML()
        self.preview = w.HTML()
        self.progress = w.Output()
        self.plots = w.Output()
        self.table = w.Output()
        for control in self._inputs():
            control.style.description_width = DESCRIPTION_WIDTH
            control.observe(self.update, names="value")
        self.run_button.on_click(lambda _: self._run_clicked())
        self.widget = w.VBox(
            [
                w.HTML("<b>ZeRO stage comparison</b>: real short runs of every configuration, one launch"),
                w.HBox(
                    [self.stages, self.micro_batches, w.VBox([self.offload_optimizer, self.offload_param])]
                ),
                w.HBox([self.precision, self.grad_accum]),
                w.HBox([self.reduce_bucket, self.prefetch_bucket]),
                w.HBox([self.layers, self.hidden, self.heads]),
                w.HBox([self.vocab, self.seq_len]),
                w.HBox([self.nprocs, self.steps]),
                w.HBox([self.sweep, self.runs_dir, self.run_button]),
                self.message,
                self.preview,
                self.progress,
                self.plots,
                self.table,
            ]
        )
        self.update()

    def update(self, change: dict | None = None) -> None:
        """Rebuild the list of Setups from the controls and estimate each (controls call this on change)."""
        from kit.estimate import estimate

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
            f"{len(setups)} configurations, {self.nprocs.value} ranks, {self.steps.value} steps each"
        )
        rows = "".join(
            f"<tr><td>{html.escape(e.setup.label)}</td><td>{e.model_states_bytes / 2**20:,.1f}</td>"
            f"<td>{e.components['activations'] / 2**20:,.1f}</td></tr>"
            for e in estimates
        )
        self.preview.value = (
            "<table><tr><th>configuration</th><th>model states MiB/rank (estimate)</th>"
            f"<th>activations MiB/rank (estimate)</th></tr>{rows}</table>"
        )

    def run(self):
        """Run the sweep (``kit.run.sweep.run_sweep``, a subprocess launch with a live bar); show plots and
        the results table; return ``kit.run.results.Results``."""
        from kit.run.sweep import run_sweep

        if not self.setups:
            raise ValueError(self.error or "stages: choose at least one configuration")
        self.progress.clear_output()
        with self.progress:
            self.results = run_sweep(
                self.setups,
                sweep=self.sweep.value,
                runs_dir=self.runs_dir.value,
                nprocs=self.nprocs.value,
                steps=self.steps.value,
                progress=True,
            )
        self._show_results()
        return self.results

    def _build_setups(self) -> list[Setup]:
        from kit.models import toy_spec

        if not self.stages.value:
            raise ValueError("stages: choose at least one of 0, 1, 2, 3")
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
        none = {"offload_optimizer": "none", "offload_param": "none"}
        setups = []
        for stage in sorted(self.stages.value):
            variants = [none]
            if self.offload_optimizer.value and stage >= 1:
                variants.append({**none, "offload_optimizer": "cpu"})
            if self.offload_param.value and stage == 3:
                variants.append({"offload_optimizer": "cpu", "offload_param": "cpu"})
            for micro in sorted(self.micro_batches.value):
                for offload in variants:
                    setups.append(
                        base.replace(zero={"stage": stage, **offload}, batch={"micro_batch": micro})
                    )
        return setups

    def _show_results(self) -> None:
        from kit.lab import plots

        results = self.results
        self.plots.clear_output()
        for draw in (plots.throughput, plots.memory, plots.comm_volume, plots.loss_curves):
            _show_figure(self.plots, draw(results), clear=False)
        with self.table:
            clear_output(wait=True)
            display(results.summary())

    def _run_clicked(self) -> None:
        try:
            self.run()
        except ERRORS as error:
            self.message.value = f"<span style='color:#b00'>{html.escape(_one_line(error))}</span>"

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.stages,
            self.offload_optimizer,
            self.offload_param,
            self.micro_batches,
            self.grad_accum,
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


def default_setup() -> Setup:
    """A 7B-class preset on one node of 8 H100s, ZeRO-2 bf16, micro batch 1."""
    from kit import models

    names = models.preset_names()
    name = next((n for n in names if "7b" in n.lower()), names[0])
    return Setup(model=models.preset(name), batch={"micro_batch": 1})


def _bucket_slider(description: str, value: int) -> w.FloatLogSlider:
    value = min(max(value, 10**BUCKET_MIN_EXP), 10**BUCKET_MAX_EXP)
    return w.FloatLogSlider(
        value=value,
        base=10,
        min=BUCKET_MIN_EXP,
        max=BUCKET_MAX_EXP,
        step=0.1,
        description=description,
        readout_format=".2g",
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
