"""The planning panel: GPU types, cluster sizes, global batch, run length, headroom and the performance
model's assumptions in; every setup that fits on a time-vs-cost plot, the cheapest and fastest per GPU
type, and what makes the starting setup fit out (``kit.estimate.plan``)."""

from __future__ import annotations

import html
from typing import Any

import ipywidgets as w
from IPython.display import clear_output, display

from kit.gpus import gpu_names
from kit.lab import ui
from kit.lab.memory_panel import default_setup
from kit.schema import Setup


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
            control.style.description_width = ui.DESCRIPTION_WIDTH
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
        except ui.ERRORS as error:
            self.plan, self.error = None, ui.one_line(error)
            self.verdict.value = ui.colored(self.error)
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
        ui.show_figure(self.plot, plots.pareto(found))
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
