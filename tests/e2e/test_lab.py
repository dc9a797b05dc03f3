"""The notebooks as a user meets them: JupyterLab in headless Chromium (``make e2e``).

Every notebook runs all its cells with no error output, no red stderr and no browser console error, shows
no figure or pandas Series as text, no known library chatter, no cut label, button or table cell, no raw
float in a table and no wrapped progress description.
In 01 the memory panel is clicked (stage, offload, micro batch) and must show what ``kit.estimate`` says,
its chart too (the screenshot waits for the chart of that setting); its labels sit beside their controls.
In 02 the comparison panel's Run shows its busy state, then the plots (drawn before the screenshot); a
second run is stopped and its process group must be gone, its records kept. Screenshots of both panels
and of the comparison plots go to ``docs/screenshots/`` (the README and docs/notebooks.md show them).
"""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path

import pytest

from kit import models
from kit.estimate import estimate
from kit.lab.memory_panel import chart_class
from kit.records import load_records
from kit.schema import Setup
from kit.units import GIB
from tests.e2e.lab import (
    NOTEBOOKS,
    REPO,
    UNREADABLE,
    browser,
    chatter,
    errors_in,
    figures_as_text,
    group_alive,
    lab_server,
    open_lab,
    processes_naming,
    run_notebook,
    stderr_in,
)

pytestmark = pytest.mark.e2e

SCREENSHOTS = REPO / "docs" / "screenshots"
NAMES = sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))

CLOSE = """
async (name) => {
  const app = window.jupyterapp;
  const panel = app.shell.currentWidget;
  await panel.sessionContext.shutdown();
  panel.context.model.dirty = false;  // its outputs live in the temporary copy only: no prompt
  panel.close();
}
"""

#: labels of toggle buttons beside (not above) their buttons; buttons whose label does not fit
LAYOUT_PROBLEMS = """
(root) => {
  const panel = document.querySelector(root);
  const bad = [];
  for (const t of panel.querySelectorAll('.widget-toggle-buttons')) {
    const label = t.querySelector('.widget-label'), first = t.querySelector('button');
    if (label.getBoundingClientRect().bottom <= first.getBoundingClientRect().top + 2)
      bad.push('label above its buttons: ' + label.textContent);
  }
  for (const b of panel.querySelectorAll('button')) {
    if (b.scrollWidth > b.clientWidth + 1) bad.push('button label cut off: ' + b.textContent);
  }
  for (const s of panel.querySelectorAll('select:not([multiple])')) {  // a dropdown's chosen text
    if (s.offsetParent === null || s.selectedIndex < 0) continue;
    const probe = document.createElement('span');
    const font = getComputedStyle(s).font;
    probe.style.cssText = 'position:absolute;visibility:hidden;white-space:pre;font:' + font;
    probe.textContent = s.options[s.selectedIndex].text;
    document.body.appendChild(probe);
    if (probe.offsetWidth > s.clientWidth - 20) bad.push('choice cut off: ' + probe.textContent);
    probe.remove();
  }
  for (const l of panel.querySelectorAll('.widget-label')) {  // its text's own width (an ellipsis hides it)
    if (l.offsetParent === null || !l.textContent.trim()) continue;
    const probe = document.createElement('span'), style = getComputedStyle(l);
    probe.style.cssText = 'position:absolute;visibility:hidden;white-space:pre;font:' + style.font;
    probe.textContent = l.textContent;
    document.body.appendChild(probe);
    const room = l.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    if (l.scrollWidth > l.clientWidth + 1 || probe.offsetWidth > room + 1)
      bad.push('label cut off: ' + l.textContent);
    probe.remove();
  }
  for (const c of panel.querySelectorAll('.widget-label-basic')) {  // a checkbox's text, right of its box
    const text = c.querySelector('span') || c;
    if (c.offsetParent === null || !text.textContent.trim()) continue;
    const probe = document.createElement('span'), style = getComputedStyle(text);
    probe.style.cssText = 'position:absolute;visibility:hidden;white-space:pre;font:' + style.font;
    probe.textContent = text.textContent;
    document.body.appendChild(probe);
    const box = c.getBoundingClientRect(), room = box.right - text.getBoundingClientRect().left
      - parseFloat(getComputedStyle(c).paddingRight);
    if (probe.offsetWidth > room + 1) bad.push('checkbox label cut off: ' + text.textContent);
    probe.remove();
  }
  return bad;
}
"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    with lab_server(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def page(lab):
    with browser() as p:
        open_lab(p, lab)
        yield p


@pytest.mark.parametrize("name", NAMES)
def test_notebook_runs_in_jupyterlab(page, lab, name):
    started = time.monotonic()
    cells = run_notebook(page, name)
    assert errors_in(cells) == []
    assert figures_as_text(cells) == []
    assert chatter(cells) == []
    assert stderr_in(cells) == []
    page.wait_for_timeout(500)  # widgets render after the kernel goes idle
    assert page.locator(".jp-OutputArea-output:has-text('Error displaying widget')").count() == 0
    assert page.evaluate(UNREADABLE) == []
    if name.startswith("01_"):
        memory_panel(page)
    if name.startswith("02_"):
        comparison_panel(page, lab)
    assert page.errors == []
    page.evaluate(CLOSE, name)
    print(f"{name}: {time.monotonic() - started:.1f} s")


def memory_panel(page) -> None:
    panel = page.locator(".zk-memory-panel")
    assert page.evaluate(LAYOUT_PROBLEMS, ".zk-memory-panel") == []
    panel.locator(".zk-stage button", has_text=re.compile("^1$")).click()
    panel.locator(".zk-offload-optimizer button", has_text=re.compile("^cpu$")).click()
    micro = panel.locator(".zk-micro-batch input")
    micro.fill("2")
    micro.press("Enter")
    # the notebook's parameters, with what its cells and the clicks above chose
    expected = estimate(
        Setup(
            model=models.preset("llama-2-7b"),
            cluster={"gpu": "H100-SXM-80GB", "gpus_per_node": 8, "cpu_ram_per_node_bytes": 2048 * 2**30},
            zero={"stage": 1, "offload_optimizer": "cpu", "activation_checkpointing": True},
            batch={"micro_batch": 2, "seq_len": 4096},
        )
    )
    shown = f"{expected.per_gpu_bytes / GIB:,.2f} GiB"
    per_gpu = panel.locator(".zk-per-gpu")
    deadline = time.monotonic() + 30
    while per_gpu.inner_text() != shown and time.monotonic() < deadline:
        page.wait_for_timeout(200)
    assert per_gpu.inner_text() == shown
    assert "z1 opt-off bf16 mb2 ckpt" in panel.locator(".zk-summary").inner_text()
    verdict = panel.locator(".zk-verdict").inner_text()
    assert verdict.startswith("✔ fits: " + shown.replace(" GiB", " GiB per GPU")), verdict
    # the charts come after the text: wait for both pictures of this setting (its bytes, its peak), drawn
    charts = panel.locator(f"img.{chart_class(expected)}")
    wait_for(lambda: charts.count() == 2, 30, "the charts of the setting the verdict names")
    drawn = "is => is.every(i => i.complete && i.naturalWidth > 0)"
    wait_for(lambda: charts.evaluate_all(drawn), 30, "the charts drawn")
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(SCREENSHOTS / "memory_panel.png"))
    # every other setting (kit.settings) under "More settings": opened, nothing cut or overlapping
    more = panel.locator(".zk-more")
    more.locator(".jupyter-widget-Collapse-header, .p-Collapse-header").first.click()
    wait_for(lambda: more.locator(".widget-hslider").first.is_visible(), 10, "More settings open")
    assert page.evaluate(LAYOUT_PROBLEMS, ".zk-memory-panel") == []
    more.screenshot(path=str(SCREENSHOTS / "memory_more_settings.png"))


def comparison_panel(page, lab) -> None:
    panel = page.locator(".zk-comparison-panel")
    assert panel.locator(".zk-plots img").count() == 4  # the notebook's own run
    assert page.evaluate(LAYOUT_PROBLEMS, ".zk-comparison-panel") == []
    runs_dir = Path(panel.locator(".zk-runs-dir input").input_value())
    run, stop = panel.locator(".zk-run-button"), panel.locator(".zk-stop-button")
    message = panel.locator(".zk-message")

    # Run: busy while it goes, the plots after
    set_text(panel.locator(".zk-sweep input"), "e2e-run")
    panel.locator(".zk-stages select").select_option(label=["0", "2"])
    wait_for(lambda: "3 configurations" in message.inner_text(), 30, "the controls' 3 configurations")
    run.click()
    wait_for(lambda: page.locator(".zk-comparison-panel.zk-busy").count() == 1, 10, "the busy state")
    assert run.is_disabled() and stop.is_enabled() and "Running" in run.inner_text()
    assert panel.locator(".zk-stages select").is_disabled()
    wait_for(lambda: message.inner_text().startswith("running "), 120, "the status line")
    panel.scroll_into_view_if_needed()
    panel.screenshot(path=str(SCREENSHOTS / "comparison_panel.png"))
    wait_for(lambda: page.locator(".zk-comparison-panel.zk-busy").count() == 0, 400, "the sweep to end")
    assert message.inner_text().startswith("ran 3 configurations in"), message.inner_text()
    assert run.is_enabled() and stop.is_disabled()
    plots = panel.locator(".zk-plots")
    assert plots.locator("img").count() == 4
    drawn = "els => els.every(i => i.complete && i.naturalWidth > 0)"
    wait_for(lambda: plots.locator("img").evaluate_all(drawn), 30, "the 4 plots drawn")
    plots.scroll_into_view_if_needed()
    plots.screenshot(path=str(SCREENSHOTS / "comparison_plots.png"))
    panel.locator(".zk-table").screenshot(path=str(SCREENSHOTS / "comparison_table.png"))

    # Run again under the same name: nothing runs, and the panel says so
    run.click()
    wait_for(lambda: "reused" in message.inner_text(), 60, "the reuse message")
    assert message.inner_text().startswith(f"3 of 3 configurations reused from {runs_dir / 'e2e-run'}")

    # Stop: the launch's process group is killed, the records so far are kept
    sweep = f"e2e-stop-{uuid.uuid4().hex[:8]}"
    set_text(panel.locator(".zk-sweep input"), sweep)
    set_text(panel.locator(".zk-steps input"), "500", enter=True)
    wait_for(lambda: "500 steps each" in message.inner_text(), 30, "500 steps")
    run.click()
    wait_for(lambda: re.search(r"step [3-9]\d* of 500", message.inner_text()), 180, "a few steps")
    groups = set(processes_naming(str(runs_dir / sweep)).values())
    assert groups, "no process of the launch found"
    stop.click()
    wait_for(lambda: page.locator(".zk-comparison-panel.zk-busy").count() == 0, 30, "Stop to end the run")
    assert message.inner_text().startswith("stopped after"), message.inner_text()
    assert [g for g in groups if group_alive(g)] == []
    for pgid in groups:
        with pytest.raises(ProcessLookupError):
            os.killpg(pgid, 0)
    records = load_records(runs_dir / sweep / "records.jsonl")
    assert [r["label"] for r in records if r["status"] == "cancelled"] == ["z0 bf16 mb2"]
    assert any(r["status"] == "ok" and r["rank"] == 0 for r in records)
    assert "cancelled" in panel.locator(".zk-table").inner_text()


def set_text(locator, value: str, enter: bool = False) -> None:
    locator.fill(value)
    if enter:
        locator.press("Enter")
    else:
        locator.dispatch_event("change")


def wait_for(condition, timeout_s: float, what: str) -> None:
    stop = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > stop:
            pytest.fail(f"waited {timeout_s:g} s for {what}")
        time.sleep(0.2)
