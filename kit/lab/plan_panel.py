"""The planning panel: GPU types, cluster sizes, global batch, run length, limits (hours, budget), goal,
headroom, the performance model's assumptions and a calibration file in; the booking for the goal, a
time-vs-cost plot, the alternatives, the cheapest and fastest per GPU type and what makes the starting
setup fit out: ``kit.planning.report``, the report ``zerokit plan`` prints."""

from __future__ import annotations

import html
import os
from typing import Any

import ipywidgets as w
from IPython.display import HTML, clear_output, display

from kit.fit import FLUSHES
from kit.gpus import gpu_names
from kit.lab import ui
from kit.lab.memory_panel import default_setup
from kit.schema import Setup
from kit.units import count_text, parse_count

#: the panel's tables: header, formats (``ui.table_html``) and the Plan.table columns they show
_ALTERNATIVES = (
    ["setup", "GiB per GPU", "hours", "USD", "why it differs from the booking"],
    ["{}", "{:,.1f}", "{:,.1f}", "${:,.0f}", "{}"],
    ["label", "per_gpu_gib", "hours", "cost_usd", "why"],
)
_PICKS = (
    ["GPU", "pick", "setup", "GiB per GPU", "hours", "USD"],
    ["{}", "{}", "{}", "{:,.1f}", "{:,.1f}", "${:,.0f}"],
    ["gpu", "pick", "label", "per_gpu_gib", "hours", "cost_usd"],
)
_FIXES = (
    ["GiB per GPU", "step, s", "tokens/s", "change"],
    ["{:,.1f}", "{:,.3g}", "{:,.0f}", "{}"],
    ["per_gpu_gib", "step_s", "tokens_per_s", "change"],
)
#: each of the report's tables (``Report.tables``' kinds) and its layout
LAYOUTS = {"alternatives": _ALTERNATIVES, "picks": _PICKS, "fixes": _FIXES}
#: the run's time limit the panel starts with: two weeks (none would book whatever is cheapest, years long)
MAX_HOURS = 14 * 24
#: the tooltips of the panel's controls
TIPS = {
    "gpus": "the GPU types to plan on (ctrl-click: several); their prices: data/prices.csv",
    "max_nodes": "the most nodes a booking may take, each of the starting setup's GPUs per node",
    "train_batch": "samples per optimizer step over all GPUs, kept by every setup the search tries",
    "tokens": "the run's length in tokens (2T, 140B, 1e12); default: 20 per parameter",
    "max_hours": f"the longest run to book, in hours (default {MAX_HOURS} h, two weeks); 0: no limit",
    "budget": "the most the run may cost, in USD; 0: no limit",
    "goal": "book the cheapest setup within the time limit, or the fastest within the budget",
    "calibration": "a calibration.json from zerokit calibrate: measured speeds used instead of datasheets'",
    "headroom": "GPU memory kept free beyond the estimate (0.1: a setup must fit in 90 %)",
    "efficiency": "the share of the GPU's peak TFLOP/s a large matmul reaches (cuBLAS: 0.75-0.9)",
    "overlap": "the share of overlapped communication that really hides behind compute",
    "own_gpu": "a GPU not in the list, by its figures: NAME:memory_gib=..,memory_gbps=..,bf16_tflops=..",
    "own_price": "your GPU's price per GPU-hour, in USD",
}


class PlanPanel:
    """Plan a booking: GPU types, cluster sizes, global batch, run length, limits, goal, headroom, the
    performance model's assumptions and a calibration; see the booking, every setup that fits within
    the limits on a time-vs-cost plot, the alternatives, the cheapest and fastest per GPU type, and
    what makes the starting setup fit at the panel's global batch (``kit.planning.plan``).

    State after every change: ``report`` (``kit.planning.report.Report``, which holds the rest), ``plan``
    (``kit.planning.plan.Plan`` or None), ``booking``
    (``kit.planning.booking.Booking``), ``figure`` (the plot), ``fixes`` (the make-it-fit table of the
    starting setup at the panel's global batch), ``start`` (that setup; None when its micro batch cannot
    make the global batch) and ``error`` (one line, or None).
    """

    def __init__(
        self,
        setup: Setup | None = None,
        *,
        train_batch: int | None = None,
        max_nodes: int = 64,
        tokens: float | None = None,
        max_hours: float = MAX_HOURS,
        calibration: Any = None,
    ):
        from kit.planning import plan
        from kit.steptime.perf import Assumptions

        self.base = setup or default_setup()
        self.plan: Any = None
        self._searched: tuple[dict, Any] | None = None  # the last search's arguments and its Plan
        self.figure: Any = None
        self.booking: Any = None
        self.fixes: Any = None
        self.start: Setup | None = None
        self.report: Any = None
        self.error: str | None = None
        self._calibration = None if isinstance(calibration, str | os.PathLike) else calibration
        names = gpu_names()
        self.gpus = w.SelectMultiple(options=names, value=tuple(names), description="GPU types", rows=6)
        self.max_nodes = w.BoundedIntText(value=max_nodes, min=1, max=4096, description="max nodes")
        self.train_batch = w.BoundedIntText(
            value=train_batch or plan.DEFAULT_TRAIN_BATCH, min=1, max=1 << 24, description="global batch"
        )
        run = tokens or plan.TOKENS_PER_PARAM * self.base.model.params
        self.tokens = w.Text(value=count_text(run), description="tokens", placeholder="2T, 140B")
        self.max_hours = w.BoundedFloatText(value=max_hours, min=0, max=1e9, description="max hours")
        self.budget = w.BoundedFloatText(value=0, min=0, max=1e12, description="budget, USD")
        self.goal = ui.toggle(("cheapest", "fastest"), "cheapest", "goal", "80px")
        self.calibration = w.Text(
            value=os.fspath(calibration) if isinstance(calibration, str | os.PathLike) else "",
            description="calibration",
            placeholder="calibration.json" if self._calibration is None else self._calibration.label,
        )
        self.headroom = w.FloatSlider(
            value=plan.DEFAULT_HEADROOM, min=0, max=0.5, step=0.05, description="headroom"
        )
        assume = Assumptions()
        self.efficiency = w.FloatSlider(
            value=assume.efficiency, min=0.05, max=1, step=0.05, description="efficiency"
        )
        self.overlap = w.FloatSlider(value=assume.overlap, min=0, max=1, step=0.1, description="overlap")
        self.own_gpu = w.Text(
            description="your GPU", placeholder="X1:memory_gib=96,memory_gbps=4000,bf16_tflops=800,sms=120"
        )
        self.own_price = w.BoundedFloatText(value=0, min=0, max=1e6, description="its USD/GPU-h")
        self.verdict = w.HTML()
        self.plot = w.Output()
        self.table = w.Output()
        ui.tips(self, TIPS)
        for control in self._inputs():
            ui.cell(control)
            control.observe(self.update, names="value")
        self.gpus.layout.width = ui.CELL
        self.own_gpu.layout.width = ui.FIGURES
        self.widget = w.VBox(
            [
                w.HTML(
                    f"<b>Plan the booking</b> for {html.escape(self.base.label)} of {self.base.model.name}"
                ),
                ui.row(
                    self.gpus,
                    w.VBox([self.max_nodes, self.train_batch, self.tokens]),
                    w.VBox([self.max_hours, self.budget, self.calibration]),
                ),
                w.HTML(
                    "<span style='color:#666;font-size:12px'>max hours: two weeks unless changed; max hours, "
                    "budget: 0 = no limit</span>"
                ),
                ui.row(self.goal, self.headroom, self.efficiency, self.overlap),
                ui.row(self.own_gpu, self.own_price),
                w.HTML(
                    "<span style='color:#666;font-size:12px'>your GPU: one not in data/gpus.csv, by its "
                    "figures (memory_gib, memory_gbps, bf16_tflops; fp16_tflops, fp32_tflops, sms, "
                    "nvlink_gbps, host_gbps), planned beside the ticked types at its price</span>"
                ),
                self.verdict,
                self.plot,
                self.table,
            ]
        )
        self.update()

    @property
    def limits(self) -> dict:
        """``max_hours`` and ``budget`` as the controls give them (None: no limit)."""
        return {"max_hours": self.max_hours.value or None, "budget": self.budget.value or None}

    def update(self, change: dict | None = None) -> None:
        """Search again with the controls' values and redraw (controls call this on change)."""
        from kit.lab import plots
        from kit.planning.report import report
        from kit.steptime.perf import with_assumptions

        try:
            assume = with_assumptions(efficiency=self.efficiency.value, overlap=self.overlap.value)
            own, price = self._own_gpu()
            search = {
                "train_batch": self.train_batch.value,
                "gpus": (list(self.gpus.value) + own) or None,
                "price": price,
                "max_nodes": self.max_nodes.value,
                "headroom": self.headroom.value,
                "tokens": self._tokens(),
                "assumptions": assume,
                "calibration": self._loaded(),
            }
            if self._searched is None or self._searched[0] != search:  # the goal and limits only filter
                self._searched = (search, report(self.base, start=self._start(), **search))
            self.report = self._searched[1].rebooked(self.goal.value, **self.limits)
            self.plan, self.booking = self.report.plan, self.report.booking
            self.start, self.fixes = self.report.start, self.report.fixes
        except ui.ERRORS as error:
            self.plan, self.booking, self.error = None, None, ui.one_line(error)
            self.verdict.value = ui.colored(self.error)
            return
        self.error = None
        # the plot and the tables first: the rows they name are confirmed (Plan.settle) before the count
        self.figure = plots.pareto(self.plan, booked=self.booking, **self.limits)
        tables = self.tables_html()
        self.verdict.value = self._summary()
        ui.show_figure(self.plot, self.figure)
        with self.table:
            clear_output(wait=True)
            for part in tables:
                display(HTML(part))

    def tables_html(self) -> list[str]:
        """The tables under the plot as HTML, each under its title, every text in full (no "...")."""
        from kit.planning import booking

        out, flagged = [], False
        for title, frame, (header, formats, columns) in self._tables():
            if "zeropp" in frame:  # "!" before a setup that quantizes (booking.NOTE)
                flagged |= bool(booking.quantized(frame).any())
                frame = frame.assign(label=booking.marked(frame).str.strip())
            rows = [[row[c] for c in columns] for _, row in frame.iterrows()]
            out.append(f"<b>{html.escape(title)}</b>" + ui.table_html(header, rows, formats))
        if flagged:
            out.append(f"<span style='font-size:12px'>{html.escape(booking.NOTE)}</span>")
        return out

    def _start(self) -> Setup | None:
        """The starting setup at the panel's global batch (None when its micro batch cannot make that
        global batch: the plan does not need it)."""
        try:
            return self.base.replace(batch={"train_batch": self.train_batch.value})
        except ValueError:
            return None

    def _tokens(self) -> float:
        """The run's length from the tokens box ("2T", "140B", "1e12")."""
        try:
            tokens = parse_count(self.tokens.value)
        except ValueError as error:
            raise ValueError(f"tokens: {error}") from None
        if tokens < 1:
            raise ValueError(f"tokens: must be >= 1, got {self.tokens.value!r}")
        return tokens

    def _own_gpu(self) -> tuple[list[str], dict[str, float] | None]:
        """The GPU of the "your GPU" box (``kit.gpus.define_gpu``) and its price, or nothing when empty."""
        from kit.gpus import define_gpu

        spec = self.own_gpu.value.strip()
        if not spec:
            return [], None
        made = define_gpu(spec, "your GPU")
        if not self.own_price.value:
            raise ValueError(f"its USD/GPU-h: give {made.name}'s price per GPU-hour (> 0)")
        return [made.name], {made.name: self.own_price.value}

    def _loaded(self):
        """The calibration of the file box (a path), else the one given to the panel, else None."""
        from kit.steptime.calibration import Calibration

        path = self.calibration.value.strip()
        return Calibration.load(path) if path else self._calibration

    def _summary(self) -> str:
        """The verdict line: how many setups fit within the limits, and the booking (the table's first)."""
        found, b = self.plan, self.booking
        limits = [f"{b.max_hours:,g} h" if b.max_hours else "", f"${b.budget:,.0f}" if b.budget else ""]
        within = " and ".join(x for x in limits if x)
        fitting = len(found.fitting(**self.limits))
        some = f"{fitting:,} of" if fitting else "none of"
        screen = f"pass the memory screen with {self.headroom.value:.0%} headroom"
        counted = f"{some} {len(found.table):,} setups {screen}"
        counted += f" within {within}" if within else ""
        skipped = "".join(f"; skipped {html.escape(line)}" for line in found.skipped)
        if b.recommended is None:
            fit = found.fitting()
            nearest = (
                f"; the fastest that fits takes {fit.hours.min():,.1f} h, the cheapest costs "
                f"${fit.cost_usd.min():,.0f}"
                if len(fit)
                else ""
            )
            return f"<b style='color:{ui.RED}'>{html.escape(counted)}</b>{nearest}{skipped}"
        r = b.recommended
        flag = " (" + html.escape(b.fallback) + ")" if b.fallback else ""
        flag += f" ({FLUSHES})" if r.flushes else ""
        return (
            f"<b>{html.escape(counted)}</b> ({found.setups_per_s:,.0f}/s; {html.escape(found.calibration)}). "
            f"Book, the {b.goal}: <b>{html.escape(r.label)}</b>, {r.hours:,.1f} h, ${r.cost_usd:,.0f}{flag}"
            f"{skipped}."
        )

    def _tables(self) -> list[tuple[str, Any, tuple]]:
        """(title, rows, layout) of each table under the plot, all within the same limits."""
        return [(title, frame, LAYOUTS[kind]) for kind, title, frame in self.report.tables()]

    def _inputs(self) -> list[w.ValueWidget]:
        return [
            self.gpus, self.max_nodes, self.train_batch, self.tokens, self.max_hours, self.budget,
            self.goal, self.calibration, self.headroom, self.efficiency, self.overlap, self.own_gpu,
            self.own_price,
        ]  # fmt: skip


def plan_panel(setup: Setup | None = None, **options: Any) -> PlanPanel:
    """The planning panel (options: train_batch, max_nodes, tokens, max_hours: ``MAX_HOURS`` unless
    given, 0 for none; calibration: a ``kit.steptime.calibration.Calibration`` or a file path); display
    ``.widget``."""
    return PlanPanel(setup, **options)
