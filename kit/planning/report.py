"""What ``zerokit plan`` prints and the plan panel draws, computed once: the search over GPU types,
cluster sizes and ZeRO variants, the booking for a goal within limits, and what makes the starting setup
fit (``report`` -> ``Report``).

The front ends only show it: the CLI as text and JSON (``kit.cli.plan``), the panel as a plot and tables
(``kit.lab.plan_panel``). What it cannot see: how a front end words it, and which of its arguments the
user gave (the CLI decides the global batch and whether the setting is the user's own).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pandas as pd

from kit.planning import booking, plan
from kit.planning.booking import Booking
from kit.planning.fixes import make_it_fit
from kit.planning.plan import Plan
from kit.schema import Setup


@dataclass(frozen=True)
class Report:
    """``plan`` (every setup evaluated), ``booking`` (the recommendation and its alternatives within the
    limits), ``start`` (the setting the user brought, at the plan's global batch; None without one) and
    ``fixes`` (``kit.planning.fixes.make_it_fit(start)``: the smallest changes that make it fit; empty
    when it fits)."""

    plan: Plan
    booking: Booking
    start: Setup | None = None
    fixes: pd.DataFrame | None = None

    @property
    def limits(self) -> dict[str, float | None]:
        return {"max_hours": self.booking.max_hours, "budget": self.booking.budget}

    def rebooked(self, goal: str, max_hours: float | None = None, budget: float | None = None) -> Report:
        """The same search booked for another goal or other limits (they only filter: nothing is redone)."""
        return replace(self, booking=booking.recommend(self.plan, goal, max_hours, budget))

    def picks(self) -> pd.DataFrame:
        """The cheapest and the fastest setup of each GPU type within the limits."""
        return booking.picks(self.plan, **self.limits)

    def nvme(self) -> pd.DataFrame:
        """NVMe offload beside CPU offload: per GPU type and NVMe variant the fastest fitting setup within
        the limits, with its slowdown against the same setup offloading to the CPU (``nvme_slowdown``)."""

        def fastest() -> pd.DataFrame:
            slow = plan.nvme_slowdown(self.plan, **self.limits)
            slow = slow[slow.fits].round({"nvme_gib_per_node": 1, "slowdown": 2})
            return slow.sort_values("step_s").drop_duplicates(["gpu", "offload_param"])

        shown = self.plan.settle(fastest, lambda rows: rows.row)  # each confirmed
        return shown.drop(columns="row").sort_values(["gpu", "offload_param"])

    def tables(self) -> list[tuple[str, str, pd.DataFrame]]:
        """(kind, title, rows) of what is shown under the booking, each non-empty: the ``alternatives``,
        the ``picks`` per GPU type, and the ``fixes`` that make the starting setup fit."""
        b, out = self.booking, []
        if b.recommended is not None:
            out.append(("alternatives", f"Alternatives to the booking ({b.goal} first)", b.alternatives))
        out.append(("picks", "Cheapest and fastest per GPU type", self.picks()))
        if self.start is not None and self.fixes is not None:
            c = self.start.cluster
            where = f"{self.start.label} on {c.nodes}x{c.gpus_per_node} {c.gpu}"
            out.append(("fixes", f"{where} does not fit; what makes it fit", self.fixes))
        return [(kind, title, frame) for kind, title, frame in out if len(frame)]


def report(
    setup: Setup,
    *,
    goal: str = "cheapest",
    max_hours: float | None = None,
    budget: float | None = None,
    start: Setup | None = None,
    **search: Any,
) -> Report:
    """Search from ``setup`` (``plan.search``'s keywords in ``search``), book for ``goal`` within
    ``max_hours`` and ``budget`` USD, and for ``start`` (a setting of the user's own, at the plan's global
    batch) what makes it fit, at the search's headroom, assumptions and fabric."""
    found = plan.search(setup, **search)
    fixes = None
    if start is not None:
        fabric = search.get("fabric")
        fixes = make_it_fit(start, headroom=found.headroom, assumptions=found.assumptions, fabric=fabric)
    return Report(found, booking.recommend(found, goal, max_hours, budget), start, fixes)
