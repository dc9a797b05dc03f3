"""JupyterLab driven by a headless browser for the end-to-end tests (``make e2e``).

``lab_server`` starts JupyterLab on a free loopback port with a token, in a temporary directory (copies
of the notebooks, its own settings, runtime and ``TMPDIR``) with ``ZEROKIT_SMOKE=1``; ``browser`` starts
the system Chromium (Debian's ``chromium``, never a Playwright download) headless. Both are context
managers that clean up when the test fails: the server's kernels are shut down, its process group is
killed, and so is every process whose command line names the temporary directory (a sweep a kernel
launched: the launches run in their own process groups).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.lab import server
from kit.run.launcher import free_port, kill_launch

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
CHROMIUM = Path(os.environ.get("ZEROKIT_CHROMIUM", "/usr/bin/chromium"))
#: JupyterLab settings for a test: every cell drawn (no windowing: panels below the fold render too),
#: no news or update checks (they would reach the internet)
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {
        "fetchNews": "false",
        "checkForUpdates": False,
    },
}


@dataclass
class Lab:
    url: str
    token: str
    root: Path  # the notebooks' folder the server serves
    tmp: Path  # the whole temporary directory
    proc: subprocess.Popen = field(repr=False)

    def api(self, path: str, method: str = "GET"):
        request = urllib.request.Request(
            f"{self.url}/api/{path}", method=method, headers={"Authorization": f"token {self.token}"}
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read()
        return json.loads(body) if body else None

    def notebook_url(self, name: str) -> str:
        return f"{self.url}/lab/tree/{name}?token={self.token}"


@contextlib.contextmanager
def lab_server(tmp: Path, startup_s: float = 90.0) -> Iterator[Lab]:
    """JupyterLab serving copies of ``notebooks/`` from ``tmp/notebooks``."""
    root = tmp / "notebooks"
    shutil.copytree(NOTEBOOKS, root)
    settings = tmp / "settings"
    for name, values in SETTINGS.items():
        path = settings / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    (tmp / "tmp").mkdir()
    port, token = free_port(), uuid.uuid4().hex
    # started as `make lab` starts it (kit.lab.server), with its own folders and port
    base = {k: v for k, v in os.environ.items() if k not in ("JUPYTER_CONFIG_DIR", "DS_ACCELERATOR")}
    env = server.environment(dict(base, ZEROKIT_SMOKE="1", TMPDIR=str(tmp / "tmp")))
    env.update(JUPYTER_RUNTIME_DIR=str(tmp / "runtime"), IPYTHONDIR=str(tmp / "ipython"))
    argv = server.command(
        root, "--no-browser",
        "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={settings}", f"--LabApp.workspaces_dir={tmp / 'workspaces'}",
        "--LabApp.expose_app_in_browser=True", "--LabApp.news_url=",
    )  # fmt: skip
    log = open(tmp / "server.log", "w")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(
        argv, env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    lab = Lab(f"http://127.0.0.1:{port}", token, root, tmp, proc)
    try:
        stop = time.monotonic() + startup_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}: {_tail(tmp / 'server.log')}")
            with contextlib.suppress(OSError):
                lab.api("status")
                break
            if time.monotonic() > stop:
                raise RuntimeError(
                    f"jupyter lab did not answer in {startup_s:g} s: {_tail(tmp / 'server.log')}"
                )
            time.sleep(0.5)
        yield lab
    finally:
        with contextlib.suppress(OSError, ValueError):
            for kernel in lab.api("kernels"):
                lab.api(f"kernels/{kernel['id']}", method="DELETE")
        kill_launch(proc)
        log.close()
        kill_processes_naming(tmp)


def processes_naming(text: str) -> dict[int, int]:
    """``{pid: process group}`` of the processes whose command line contains ``text``."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            argv = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if text in argv:
                found[int(proc.name)] = os.getpgid(int(proc.name))
    return found


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` still exists (zombies aside: ``killpg(pgid, 0)``
    succeeds until they are reaped)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_processes_naming(tmp: Path) -> None:
    for pgid in set(processes_naming(str(tmp)).values()) - {os.getpgid(0)}:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def browser(width: int = 1280, height: int = 3600):
    """A page of the system Chromium, headless, with console errors and page errors collected in
    ``page.errors``; tall enough that the whole memory panel (about 2,500 px with its two charts and
    its table) fits in the notebook's scrolling area, or its screenshot is cut at the bottom."""
    from playwright.sync_api import sync_playwright

    if not CHROMIUM.exists():
        raise RuntimeError(f"no browser at {CHROMIUM}: apt-get install chromium (make e2e does)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=["--no-sandbox"])
        try:
            page = chromium.new_page(viewport={"width": width, "height": height})
            page.errors = []
            page.on("console", lambda m: m.type == "error" and page.errors.append(f"console: {m.text}"))
            page.on("pageerror", lambda e: page.errors.append(f"page error: {e}"))
            yield page
        finally:
            chromium.close()


OPEN_AND_RUN = """
async (name) => {
  const app = window.jupyterapp;
  const panel = await app.commands.execute('docmanager:open', {path: name, factory: 'Notebook'});
  await panel.context.ready;
  await panel.sessionContext.ready;
  const kernel = () => panel.sessionContext.session && panel.sessionContext.session.kernel;
  while (!kernel() || kernel().status !== 'idle') { await new Promise(r => setTimeout(r, 200)); }
  await app.commands.execute('notebook:run-all-cells');
  while (kernel().status !== 'idle') { await new Promise(r => setTimeout(r, 200)); }
  return true;
}
"""

OUTPUTS = """
() => {
  const panel = window.jupyterapp.shell.currentWidget;
  return panel.content.model.toJSON().cells.filter(c => c.cell_type === 'code')
    .map(c => ({count: c.execution_count, source: (Array.isArray(c.source) ? c.source.join('') : c.source),
                outputs: c.outputs}));
}
"""


def open_lab(page, lab: Lab) -> None:
    page.goto(f"{lab.url}/lab?token={lab.token}")
    page.wait_for_function("() => window.jupyterapp && window.jupyterapp.started", timeout=60_000)
    page.evaluate("() => window.jupyterapp.started")
    page.evaluate("() => window.jupyterapp.shell.collapseLeft()")  # the notebook as wide as the window


def run_notebook(page, name: str, timeout_s: float = 600) -> list[dict]:
    """Open ``name``, run all its cells and wait for the kernel to go idle; the code cells' JSON."""
    page.evaluate(OPEN_AND_RUN, name)
    return page.evaluate(OUTPUTS)


def errors_in(cells: list[dict]) -> list[str]:
    """An error output or a cell that never ran, one line each."""
    bad = []
    for i, cell in enumerate(cells):
        first = cell["source"].splitlines()[0] if cell["source"] else ""
        if cell["count"] is None:
            bad.append(f"cell {i} ({first}) did not run")
        for out in cell["outputs"]:
            if out["output_type"] == "error":
                bad.append(f"cell {i} ({first}): {out['ename']}: {out['evalue']}")
    return bad


#: what a figure printed as text looks like (a matplotlib Figure returned without an inline backend)
FIGURE_AS_TEXT = "<Figure size"
#: library chatter kit keeps out of a notebook's output (kit.hf_models, kit.scaleout.checkpoints)
CHATTER = ("must be `None` or an integer within the vocabulary", "Processing zero checkpoint")


def figures_as_text(cells: list[dict]) -> list[str]:
    """A cell whose output shows a figure as text (``<Figure size 600x350 with 1 Axes>``), one line each."""
    bad = []
    for i, cell in enumerate(cells):
        for out in cell["outputs"]:
            data = out.get("data", {})
            text = "".join(out.get("text", "")) + "".join(data.get("text/plain", "")) * (
                "image/png" not in data
            )
            if FIGURE_AS_TEXT in text:
                bad.append(f"cell {i} ({cell['source'].splitlines()[0]}): a figure printed as text")
    return bad


def stderr_in(cells: list[dict]) -> list[str]:
    """A cell that writes to stderr (JupyterLab shows it as a red block), with its first line; and a pandas
    Series printed as text (its ``dtype:`` line) instead of a table."""
    bad = []
    for i, cell in enumerate(cells):
        for out in cell["outputs"]:
            text = "".join(out.get("text", ""))
            if out["output_type"] == "stream" and out.get("name") == "stderr" and text.strip():
                bad.append(f"cell {i}: red stderr: {text.strip().splitlines()[0][:120]}")
            plain = "".join(out.get("data", {}).get("text/plain", ""))
            series = re.search(r"^(Name: .*, )?dtype: \w+$", plain, re.MULTILINE)
            if series and "text/html" not in out.get("data", {}):
                bad.append(f"cell {i}: a pandas Series printed as text: {plain.splitlines()[0][:80]}")
    return bad


def chatter(cells: list[dict]) -> list[str]:
    """A cell whose output carries one of the known library messages (``CHATTER``)."""
    return [
        f"cell {i}: {known!r}"
        for i, cell in enumerate(cells)
        for out in cell["outputs"]
        if out["output_type"] == "stream"
        for known in CHATTER
        if known in "".join(out["text"])
    ]


#: what a reader cannot read in the notebook on screen: a control's label or a button's text cut (its
#: content wider than its box), a table cell ending in "..." (pandas cuts long text so), a table wider than
#: the notebook (its right-hand columns cut), a float as Python prints it (more than 4 significant digits,
#: or in e-notation), a progress bar's description broken over lines
UNREADABLE = r"""
() => {
  const root = window.jupyterapp.shell.currentWidget.node, bad = [];
  const shown = (e) => e.offsetParent !== null && e.clientWidth > 0;
  const controls = '.jp-OutputArea-output .widget-label, .jp-OutputArea-output button';
  for (const e of root.querySelectorAll(controls)) {
    if (shown(e) && e.scrollWidth > e.clientWidth + 1) bad.push('text cut: ' + e.textContent.trim());
  }
  for (const e of root.querySelectorAll('.jp-OutputArea-output td, .jp-OutputArea-output th')) {
    const text = e.textContent.trim();
    if (text.endsWith('...') || text.endsWith('\u2026')) bad.push('table cell cut: ' + text.slice(-60));
  }
  for (const e of root.querySelectorAll('.jp-OutputArea-output td')) {  // a float as Python prints it
    const text = e.textContent.trim(), digits = text.replace(/^[-+]/, '').replace('.', '').replace(/^0+/, '');
    if (/^[-+]?\d+\.\d+$/.test(text) && digits.length > 4) bad.push('raw float in a table: ' + text);
    if (/^[-+]?\d+(\.\d+)?e[-+]\d+$/i.test(text)) bad.push('float in e-notation in a table: ' + text);
  }
  for (const t of root.querySelectorAll('.jp-OutputArea-output table')) {
    const area = t.closest('.jp-OutputArea-output'), right = area.getBoundingClientRect().right;
    if (t.getClientRects().length && t.getBoundingClientRect().right > right + 1)
      bad.push('table wider than the notebook, right-hand columns cut: ' + t.rows[0].textContent.trim());
  }
  for (const p of root.querySelectorAll('.jp-OutputArea-output .widget-hprogress')) {
    const desc = p.parentElement.firstElementChild;
    if (desc && desc !== p && desc.getClientRects().length && desc.textContent.trim()) {
      const line = parseFloat(getComputedStyle(desc).lineHeight) || 28;
      if (desc.getBoundingClientRect().height > 1.5 * line)
        bad.push('progress description wraps: ' + desc.textContent.trim());
    }
  }
  return bad;
}
"""


def _tail(path: Path, lines: int = 20) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
