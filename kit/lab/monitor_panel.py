"""The monitor panel: every rank of a running job, from the heartbeats its ranks append to a folder
(``kit.monitor``), refreshed by a button or a background timer."""

from __future__ import annotations

import html
import threading
import time
from pathlib import Path
from typing import Any

import ipywidgets as w

from kit import monitor
from kit.lab import ui

#: the tooltips of the panel's controls
TIPS = {
    "refresh_button": "read the heartbeat files again and redraw",
    "auto": "refresh by itself from a background timer until unticked",
}


class MonitorPanel:
    """Every rank of a running job, from the heartbeats its ranks append to ``folder`` (``kit.monitor``: a
    sweep folder ``runs/NAME``, or the folder a training loop passes to ``kit.monitor.heartbeat``).

    A line for the job, a table of averages per node, a row per rank (state: online, stale, offline,
    finished or failed; step, samples/s, loss, memory now and its peak, age of its last heartbeat; a kit
    sweep's steps as every view numbers them: "warm-up 1 of 2", then "step 1 of N") and the
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
        self.refresh_button = ui.button("Refresh", "refresh")
        self.auto = w.Checkbox(value=False, description=f"auto refresh every {interval_s:g} s", indent=False)
        self.message = w.HTML()
        self.nodes = w.HTML()
        self.ranks = w.HTML()
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%", display="none"))
        ui.tips(self, TIPS)
        self.refresh_button.on_click(lambda _: self.refresh())
        self.auto.observe(lambda change: self.start() if change["new"] else self.stop(), names="value")
        self.widget = w.VBox(
            [
                w.HTML(
                    f"<b>Live view of every rank</b>: heartbeats in <code>{html.escape(str(folder))}</code>"
                ),
                ui.row(self.refresh_button, self.auto),
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
            self.snapshot, self.nodes.value, self.ranks.value = None, "", ""
            self.plot.layout.display = "none"  # no empty image (a browser draws it broken)
            if _waiting(self.folder, error):  # not an error: the job has not written its first heartbeat
                self.error = None
                self.message.value = (
                    f"<span class='zk-waiting' style='color:#666'>waiting for the first heartbeat in "
                    f"<code>{html.escape(str(self.folder))}</code> (Refresh, or tick auto refresh)</span>"
                )
            else:
                self.error = ui.one_line(error)
                self.message.value = ui.colored(self.error)
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
        self.nodes.value = ui.table_html(
            ["node", "ranks", "states", "progress", "mean samples/s", "mean memory MiB", "peak MiB",
             "mean util %"],
            [
                [
                    g["node"], g["ranks"], ", ".join(f"{n} {s}" for s, n in g["states"].items() if n),
                    monitor.steps_range(g),
                    g["samples_per_s_mean"], ui.mib(g["memory_bytes_mean"]), ui.mib(g["peak_bytes_max"]),
                    g["gpu_util_percent_mean"],
                ]
                for g in groups
            ],
            ["{}", "{:,}", "{}", "{}", "{:,.1f}", "{:,.1f}", "{:,.1f}", "{:.0f}"],
            bold_rows=(len(groups) - 1,),
        )  # fmt: skip
        self.ranks.value = ui.table_html(
            ["node", "rank", "state", "age s", "progress", "samples/s", "loss", "memory MiB", "peak MiB",
             "util %", "configuration"],
            [
                [
                    r["node"], r["rank"], r["state"], r["age_s"], r["progress"], r["samples_per_s"],
                    r["loss"], ui.mib(r["memory_bytes"]), ui.mib(r["peak_bytes"]), r["gpu_util_percent"],
                    " ".join(filter(None, (r["label"], r["error"]))),
                ]
                for r in snap.ranks
            ],
            ["{}", "{}", "{}", "{:,.1f}", "{}", "{:,.1f}", ui.NUMBER, "{:,.1f}", "{:,.1f}", "{:.0f}", "{}"],
        )  # fmt: skip
        if snap.history_frame()["seconds"].nunique() > 1:  # one instant would draw an axis of 0.002 s
            self.plot.value = ui.figure_png(plots.heartbeats(snap))
            self.plot.layout.display = None
        else:
            self.plot.layout.display = "none"
            self.message.value += (
                "<br><span style='color:#666'>the plots start at the second heartbeat</span>"
            )
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
                self.message.value = ui.colored(ui.one_line(error))


def monitor_panel(folder: str | Path, **options: Any) -> MonitorPanel:
    """The live view of every rank from ``folder``'s heartbeats (options: interval_s, stale_s, offline_s,
    auto); display ``.widget``."""
    return MonitorPanel(folder, **options)


def _waiting(folder: Path, error: ValueError) -> bool:
    """Whether ``monitor.read``'s ``error`` means only that no rank has written a whole heartbeat yet."""
    text = str(error)  # the folder's error, not a bad stale_s / offline_s
    folder_error = text.startswith("folder: ")
    return folder_error and (
        not monitor.heartbeat_files(folder) or text.endswith("no complete heartbeat yet")
    )
