"""The memory panel: choose a model, cluster, ZeRO settings and batch; see bytes per GPU, whether it fits,
and why (``kit.estimate``), and export the choice (``write_config``, ``launch_command``).

The panel never computes: every change builds a Setup from the controls and calls ``kit.estimate``; the
verdict and "also fits on" are the one fit rule's (``kit.fit``: precision support included); every button
calls a plain method a notebook cell can call too, so tests and CI exercise the same path as a click.
"""

from __future__ import annotations

import contextlib
import hashlib
import html
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ipywidgets as w

from kit import checkpointing, settings
from kit.fit import FLUSHES, estimate_fit, shown_bytes
from kit.gpus import gpu_names
from kit.lab import ui
from kit.rules import Offload, offload_problem
from kit.schema import MAX_SEQ_LEN, ModelSpec, Setup
from kit.settings import SETTINGS, ZEROPP_OFF
from kit.units import GIB, parse_count

#: each panel control's setting (a composite's first)
BY_NAME = {s.name: s for s in reversed(SETTINGS)}
#: the settings whose enabling the panel decides itself (the offloads' reasons, the swap folder's, the
#: loss's choices for the model, DeepSpeed's checkpointing options with its checkpoint)
OWN_RULES = ("loss", "offload_optimizer", "offload_param", "nvme_path", *checkpointing.DEEPSPEED_FIELDS)
#: the tooltips of the controls that are not ZeRO settings (those carry their setting's help: ``ui.control``)
TIPS = {
    "model_source": "where the model comes from: a preset, a Hugging Face config.json or model file, or a "
    "bare parameter count",
    "preset": "a model the kit knows by name (data/models)",
    "config_path": "path to a Hugging Face config.json, or a Python file that builds the model",
    "params": "total parameters, e.g. 7e9, 7B or 350M (with 'parameter count')",
    "largest_layer": "parameters of the largest layer (stage 3 gathers it whole); empty: derived",
    "gpu": "the GPU type (data/gpus.csv): its memory is what the setting must fit",
    "own_gpu": "a GPU not in the list, by its figures: NAME:memory_gib=..,memory_gbps=..,bf16_tflops=..",
    "nodes": "machines in the cluster",
    "gpus_per_node": "GPUs in each machine; every GPU is a data-parallel rank",
    "micro_batch": "samples each GPU processes per forward and backward",
    "batch_by": "which stays fixed when the micro batch or the GPUs change: the accumulation steps or the "
    "global batch",
    "grad_accum": "micro batches each GPU runs before the optimizer steps",
    "train_batch": "samples per optimizer step over all GPUs: micro batch x GPUs x grad accum",
    "seq_len": "tokens per sample (at most the model's context)",
    "config_file": "where 'Write ds_config.json' writes the DeepSpeed config",
    "write_button": "write this setting as a DeepSpeed config file (with a warning when it does not fit)",
    "command_button": "show the deepspeed command that launches a training script with this setting",
    "command": "the launch command; copy it into a shell on the first node",
}


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
        self.model_source = ui.toggle(sources, "given" if given else "preset", "model", "auto")
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
        # a GPU not in data/gpus.csv, by its figures (kit.gpus.define_gpu): it replaces the list's choice
        self.own_gpu = w.Text(
            description="your GPU",
            placeholder="X1:memory_gib=96,memory_gbps=4000,bf16_tflops=800",
            continuous_update=False,
        )
        self.nodes = w.BoundedIntText(value=base.cluster.nodes, min=1, max=4096, description="nodes")
        self.gpus_per_node = w.BoundedIntText(
            value=base.cluster.gpus_per_node, min=1, max=64, description="GPUs per node"
        )
        #: a control per ZeRO setting (``kit.settings``), by its name, each also an attribute (``self.stage``,
        #: ``self.hpz``, ``self.reduce_bucket``): the main ones in the form, the rest under "More settings"
        self.controls: dict[str, w.ValueWidget] = {}
        for s in SETTINGS:
            if s.name not in self.controls:
                self.controls[s.name] = ui.control(s, z)
        self.offload_reason = w.HTML()
        self.micro_batch = w.BoundedIntText(value=b.micro_batch, min=1, max=65536, description="micro batch")
        self.batch_by = ui.toggle(
            [("grad accum", "grad_accum"), ("global batch", "train_batch")],
            "grad_accum",
            "keep fixed",
        )
        self.grad_accum = w.BoundedIntText(value=b.grad_accum, min=1, max=65536, description="grad accum")
        self.train_batch = w.BoundedIntText(
            value=b.train_batch, min=1, max=1 << 30, description="global batch"
        )
        self.seq_len = w.BoundedIntText(value=b.seq_len, min=1, max=MAX_SEQ_LEN, description="seq len")
        self.config_file = w.Text(value="ds_config.json", description="write to")
        self.write_button = ui.button("Write ds_config.json", "save")
        self.command_button = ui.button("Show launch command", "terminal")
        self.message = w.HTML()
        self.verdict = w.HTML()
        self.summary = w.HTML()
        self.formulas = w.HTML()
        self.plot = w.Image(format="png")
        # the predicted peak per phase of a step (kit.estimate.peak), before anything runs
        self.timeline_plot = w.Image(format="png")
        self.command = w.Textarea(layout=w.Layout(width="100%", height="5em", display="none"), disabled=True)

        ui.tips(self, TIPS)
        for control in self._inputs():
            ui.cell(control)
            control.observe(self.update, names="value")
        more = [c for name, c in self.controls.items() if not BY_NAME[name].main]
        self.more = w.Accordion([w.VBox(ui.rows(more))])
        title = (
            "More settings: stage 3's fetching, overlap, the allocator, sequence parallelism, NVMe "
            "swapping, aio"
        )
        self.more.set_title(0, title)
        self.more.selected_index = None
        self.more.add_class("zk-more")
        ui.cell(self.config_file)
        self.own_gpu.layout.width = ui.FIGURES
        self.write_button.on_click(lambda _: self._report(self._write_clicked))
        self.command_button.on_click(lambda _: self._report(self._show_command))
        self.widget = w.VBox(
            [
                w.HTML("<b>Memory before booking</b>: bytes per GPU for the settings below (kit.estimate)"),
                ui.section("Model"),
                self.model_source,
                ui.row(self.preset, self.config_path),
                ui.row(self.params, self.largest_layer),
                ui.section("Cluster"),
                ui.row(self.gpu, self.nodes, self.gpus_per_node),
                self.own_gpu,
                w.HTML(
                    "<span style='color:#666;font-size:12px'>your GPU: one not in the list, by its figures "
                    "(memory_gib, memory_gbps, bf16_tflops; fp16_tflops, fp32_tflops, sms, nvlink_gbps, "
                    "host_gbps); it replaces the list's choice while the box is filled</span>"
                ),
                ui.section("ZeRO"),
                ui.row(self.stage, self.precision),
                ui.row(self.offload_optimizer, self.offload_param),
                self.nvme_path,
                ui.row(self.optimizer, self.checkpointing),
                ui.row(self.trainable, self.loss),
                ui.row(self.hpz, self.quantized_weights, self.quantized_gradients),
                self.offload_reason,
                ui.section("Batch"),
                ui.row(self.micro_batch, self.batch_by),
                ui.row(self.grad_accum, self.train_batch, self.seq_len),
                ui.section("Buckets (elements)"),
                ui.row(self.reduce_bucket, self.allgather_bucket),
                ui.row(self.prefetch_bucket, self.max_live_parameters),
                self.more,
                self.verdict,
                w.HBox([self.plot, self.summary], layout=w.Layout(align_items="flex-start")),
                self.timeline_plot,
                self.formulas,
                ui.row(self.config_file, self.write_button, self.command_button),
                self.message,
                self.command,
            ]
        )
        self.widget.add_class("zk-memory-panel")
        for name in ("stage", "offload_optimizer", "offload_param", "micro_batch", "verdict", "summary"):
            getattr(self, name).add_class(f"zk-{name.replace('_', '-')}")
        self.update()

    def __getattr__(self, name: str) -> w.ValueWidget:
        """A setting's control by its name (``panel.stage``, ``panel.hpz``): ``self.controls[name]``."""
        controls = self.__dict__.get("controls", {})
        if name in controls:
            return controls[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def update(self, change: dict | None = None) -> None:
        """Rebuild the Setup from the controls and re-estimate (every control calls this on change)."""
        if self._quiet:
            return
        self._sync_controls()
        from kit.estimate import estimate

        # what a button said and showed was for the setting before this change
        self.message.value = ""
        self.command.layout.display = "none"

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
        except ui.ERRORS as error:
            self.setup, self.estimate, self.error = None, None, ui.one_line(error)
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
        """The paste-able ``deepspeed`` command for ``script`` with this Setup, as ``zerokit launch-cmd``
        makes it (``kit.scaleout.bundle``); several nodes read ``hostfile`` (write it with ``zerokit
        hostfile``) and meet at ``master_addr``."""
        from kit.scaleout.bundle import LaunchRequest, bundle

        request = LaunchRequest(
            script=script, hosts_later=True, master_addr=master_addr, ds_config=self.config_file.value
        )
        return bundle(self._valid_setup(), request).shell_lines()["deepspeed"]

    def _build_setup(self, spec: ModelSpec) -> Setup:
        base = self.base
        cluster = {
            **base.cluster.model_dump(),
            "gpu": self._gpu_name(),
            "nodes": self.nodes.value,
            "gpus_per_node": self.gpus_per_node.value,
        }
        zero = base.zero.model_dump()
        for name, control in self.controls.items():
            zero.update(ui.setting_values(BY_NAME[name], control))
        if "nvme" not in (self.offload_optimizer.value, self.offload_param.value):
            zero["nvme_path"] = base.zero.nvme_path  # the path box counts only when something goes to NVMe
        if self.optimizer.value != "sgd":
            zero["momentum"] = 0.0
        zero = settings.fields(zero)
        fixed = self.batch_by.value
        batch = {
            "micro_batch": self.micro_batch.value,
            fixed: getattr(self, fixed).value,
            "seq_len": self.seq_len.value,
        }
        return Setup(model=spec, cluster=cluster, zero=zero, batch=batch)

    def _gpu_name(self) -> str:
        """The "your GPU" box's GPU, defined for this process (ValueError in one line if its figures are
        wrong), else the list's."""
        from kit.gpus import define_gpu

        spec = self.own_gpu.value.strip()
        return define_gpu(spec, "your GPU").name if spec else self.gpu.value

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
                elif control.value == Offload.NVME and stage != 3:
                    control.value = "cpu"  # stages 1-2 have no NVMe swapper
                    reasons.append(": ".join(offload_problem(stage, **{**asked, field: "nvme"}) or ()))
            offloads = (self.offload_optimizer.value, self.offload_param.value)
            self.nvme_path.disabled = "nvme" not in offloads
            self.offload_reason.value = "".join(
                f"<div style='margin-left:{ui.DESCRIPTION_WIDTH};color:#666'><i>{html.escape(r)}</i></div>"
                for r in reasons
            )
            source = self.model_source.value
            self.preset.disabled = source != "preset"
            self.config_path.disabled = source != "config"
            self.params.disabled = self.largest_layer.disabled = source != "count"
            self.grad_accum.disabled = self.batch_by.value != "grad_accum"
            self.train_batch.disabled = self.batch_by.value != "train_batch"
            for name, control in self.controls.items():
                s = BY_NAME[name]
                if s.group or s.field in OWN_RULES:
                    continue  # what trains, the loss: own choices; offloads above, ckpt options below
                control.disabled = not settings.applies(s, stage, offloads, self.optimizer.value)
                if control.disabled and s.field in ZEROPP_OFF:
                    control.value = ZEROPP_OFF[s.field]  # ZeRO++ is stage 3 only (kit.rules.zeropp_problem)
            # DeepSpeed's checkpointing options act in its checkpoint: checkpointing on, policy full
            on, _, policy = self.checkpointing.value
            for field in checkpointing.DEEPSPEED_FIELDS:
                control = self.controls[field]
                control.disabled = not (on and policy == "full")
                if control.disabled:
                    control.value = False

    def _render(self) -> None:
        from kit.lab.plots import estimated_memory, peak_timeline

        if self.error:
            style = f"{ui.VERDICT_STYLE}color:{ui.RED}"
            self.verdict.value = f"<div style='{style}'>{html.escape(self.error)}</div>"
            self.summary.value = self.formulas.value = ""
            self.plot.layout.display = self.timeline_plot.layout.display = "none"
            return
        est, setup = self.estimate, self._valid_setup()
        c, b = setup.cluster, setup.batch
        self.verdict.value = verdict_html(est)
        # the verdict's bytes (where it fits past the memory, what it holds there), in the facts and chart
        need = shown_bytes(est, estimate_fit(est))
        ram = c.cpu_ram_per_node_bytes
        others = [name for name, ok in est.fits.items() if ok and name != c.gpu]
        facts = [
            ("setting", f"<b>{html.escape(setup.label)}</b>{ui.legend_html([setup])}"),
            ("cluster", f"{c.nodes} x {c.gpus_per_node} {html.escape(c.gpu)}"),
            (
                "per GPU",
                f"<b class='zk-per-gpu'>{need / GIB:,.2f} GiB</b> of {_gpu_gib(c.gpu):,.2f} GiB",
            ),
            ("model states", f"{est.model_states_bytes / GIB:,.2f} GiB per GPU"),
            *_reserved_facts(est),
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
        self.summary.value = ui.facts_html(facts) + (
            "<div style='font-size:12px;color:#555;margin:6px 0 0 12px;max-width:300px'>"
            f"also fits on: {also}</div>"
        )
        self.formulas.value = formula_table_html(est)
        with self.plot.hold_sync():  # the picture and what it shows reach the browser in one message
            self.plot.value = ui.figure_png(estimated_memory([est]))
            self.plot._dom_classes = ("zk-chart", chart_class(est))
        self.plot.layout.display = None
        with self.timeline_plot.hold_sync():  # the same for the peak chart, which carries the same class
            if est.timeline:
                room = (c.gpu, int(_gpu_gib(c.gpu) * GIB))
                line = peak_timeline(  # the peak phase's bar is the verdict's bytes
                    est.timeline,
                    overhead=est.peak_overhead.bytes,
                    capacity=room,
                    allocator=need - est.screen_bytes,
                )
                self.timeline_plot.value = ui.figure_png(line)
            else:
                self.timeline_plot.value = b""
            self.timeline_plot._dom_classes = ("zk-peak-chart", chart_class(est))
        self.timeline_plot.layout.display = None if est.timeline else "none"

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.model_source,
            self.preset,
            self.config_path,
            self.params,
            self.largest_layer,
            self.gpu,
            self.own_gpu,
            self.nodes,
            self.gpus_per_node,
            self.micro_batch,
            self.batch_by,
            self.grad_accum,
            self.train_batch,
            self.seq_len,
            *self.controls.values(),
        ]

    def _valid_setup(self) -> Setup:
        if self.setup is None:
            raise ValueError(self.error or "setup: the controls do not describe a valid Setup")
        return self.setup

    def _write_clicked(self) -> str:
        path = self.write_config(self.config_file.value)
        est, setup = self.estimate, self._valid_setup()
        if estimate_fit(est).ok:
            return f"wrote {path} ({setup.label}: fits the {setup.cluster.gpu})"
        return f"wrote {path}, but warning: {html.unescape(ui.strip_tags(verdict_html(est)))}"

    def _show_command(self) -> str:
        self.command.value = self.launch_command()
        self.command.layout.display = None
        return "launch command below"

    def _report(self, action) -> None:
        try:
            text = action()
        except ui.ERRORS as error:
            self.message.value = ui.colored(ui.one_line(error))
        else:
            self.message.value = ui.colored(text, ui.RED if "warning" in text else ui.GREEN)

    @contextlib.contextmanager
    def _holding(self) -> Iterator[None]:
        """Set controls without each change triggering another update."""
        quiet, self._quiet = self._quiet, True
        try:
            yield
        finally:
            self._quiet = quiet


def memory_panel(setup: Setup | None = None) -> MemoryPanel:
    """The memory panel, starting from ``setup`` (default: ``default_setup()``); display ``.widget``."""
    return MemoryPanel(setup)


def default_setup() -> Setup:
    """A 7B-class preset on one node of 8 H100s, ZeRO-2 bf16, micro batch 1."""
    from kit import models

    names = models.preset_names()
    name = next((n for n in names if "7b" in n.lower()), names[0])
    return Setup(model=models.preset(name), batch={"micro_batch": 1})


def verdict_html(est) -> str:
    """One line: the estimate's verdict for its GPU (``kit.fit``: the GPU's precision support and the node's
    CPU RAM included) and by how much: GiB free or over on the GPU, and the CPU RAM per node when given."""
    setup = est.setup
    verdict = estimate_fit(est)  # the one fit rule (kit.fit): precision support, GPU memory, CPU RAM
    name, need = setup.cluster.gpu, shown_bytes(est, verdict)  # fits past the memory: what it holds there
    capacity = _gpu_gib(name) * GIB
    room = capacity - need
    parts = [
        f"{need / GIB:,.2f} GiB per GPU of the {html.escape(name)}'s {capacity / GIB:,.2f} GiB, "
        + (
            f"{room / GIB:,.2f} GiB free ({need / capacity:.0%} used)"
            if room >= 0
            else f"{-room / GIB:,.2f} GiB over ({need / capacity:.0%})"
        )
    ]
    ram, cpu = setup.cluster.cpu_ram_per_node_bytes, est.cpu_bytes_per_node
    if ram is not None:
        over = f", {(cpu - ram) / GIB:,.2f} GiB over" if cpu > ram else ""
        parts.append(f"CPU RAM per node {cpu / GIB:,.2f} GiB of {ram / GIB:,.2f} GiB{over}")
    if verdict.problem == "precision":
        precision = setup.zero.precision
        parts.insert(0, f"the {html.escape(name)} has no {precision}; choose another GPU or precision")
    if verdict.flushes:
        parts.append(FLUSHES.removeprefix("fits "))
    text = ("&#10004; fits: " if verdict.ok else "&#10008; does not fit: ") + "; ".join(parts)
    color = ui.GREEN if verdict.ok else ui.RED
    return f"<div class='zk-verdict-line' style='{ui.VERDICT_STYLE}color:{color}'><b>{text}</b></div>"


def _reserved_facts(est) -> list[tuple[str, str]]:
    """The caching allocator's replay (``Estimate.reserved``): max reserved under the run's allocator, and
    the other one where expandable segments hold 5 % less; none where the kit does not replay the step."""
    plain, grown = est.reserved_plain_bytes, est.reserved_expandable_bytes
    if plain is None:
        return []
    expandable = est.setup.zero.expandable_segments
    how = "replayed with expandable segments" if expandable else "replayed"
    facts = [("max reserved", f"{est.reserved_bytes / GIB:,.2f} GiB ({how}: in the verdict)")]
    if plain - grown > 0.05 * plain:
        saving = f"{(plain - grown) / GIB:,.2f}"
        if expandable:
            facts.append(("plain allocator", f"{plain / GIB:,.2f} GiB ({saving} more)"))
        else:
            facts.append(("expandable segs.", f"{grown / GIB:,.2f} GiB ({saving} less)"))
    return facts


def chart_class(est) -> str:
    """The CSS class that names what the charts show: a digest of the setting and its bytes per GPU, the
    verdict's number (a browser test waits for it on both charts before a screenshot: a picture arrives
    after the text; an image widget has no tooltip to carry it)."""
    shows = f"{est.setup.label}: {est.per_gpu_bytes / GIB:,.2f} GiB per GPU"
    return f"zk-shows-{hashlib.sha1(shows.encode()).hexdigest()[:12]}"


def formula_table_html(est) -> str:
    """The estimate's components as a table: GiB, bytes with separators, and the formula behind each."""
    rows = [[name.replace("_", " "), t.bytes / GIB, t.bytes, t.formula] for name, t in est.terms.items()]
    whole = est.components_bytes
    rows.append(["sum of components", whole / GIB, whole, "every component at once (not the verdict)"])
    if est.timeline:
        peak, phase = est.per_gpu_bytes, est.peak_phase
        what = (
            f"the {phase} peak + the caching allocator's replayed share"
            if est.reserved
            else f"the {phase} peak"
        )
        verdict = estimate_fit(est)
        held = (  # past the GPU's memory the verdict weighs what the flushed allocator holds within it
            f"; within the {est.setup.cluster.gpu}'s memory it holds {verdict.need / GIB:,.2f} GiB, flushing "
            "its cache: the verdict's number"
            if verdict.flushes
            else ": the verdict's number"
        )
        rows.append(["peak per GPU", peak / GIB, peak, f"{what} + overhead{held}"])
    total_row = len(rows) - 1
    rows.append(
        ["CPU RAM per node", est.cpu_bytes_per_node / GIB, est.cpu_bytes_per_node, est.cpu_term.formula]
    )
    if est.nvme_bytes_per_node:
        rows.append(
            ["NVMe per node", est.nvme_bytes_per_node / GIB, est.nvme_bytes_per_node, est.nvme_term.formula]
        )
    return ui.table_html(
        ["component", "GiB", "bytes", "formula"],
        rows,
        ["{}", "{:,.2f}", "{:,}", "{}"],
        bold_rows=(total_row,),
    )


def _count(name: str, text: str) -> int:
    try:
        value = parse_count(text)
    except ValueError as error:
        raise ValueError(f"{name}: {error}") from None
    if value < 1:
        raise ValueError(f"{name}: must be a count >= 1, got {text.strip()}")
    return value


def _gpu_gib(name: str) -> float:
    from kit.gpus import gpu

    return gpu(name).memory_gib
