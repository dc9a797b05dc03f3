"""What every notebook shares: its sizes (``profile``), in one place. Small under ``ZEROKIT_SMOKE=1``
(what ``make test`` runs: a tiny GPT-2 on 2 CPU ranks for 2 steps, records in a temporary folder), real
otherwise (GPT-2 small's shape on the 8 GPUs of a box, 10 steps, records under ``runs/``).

A notebook's ``parameters`` cell reads it once and everything after uses it::

    SMOKE = os.environ.get("ZEROKIT_SMOKE") == "1"  # or set True: the CPU-sized run
    RUN = profile("02", SMOKE)                        # from kit.lab.notebook import profile
    toy = RUN.toy_setup(zero={"precision": "bf16"})   # the toy GPT on RUN.nprocs ranks
    run_sweep(setups, sweep="02-stages", runs_dir=RUN.runs_dir, nprocs=RUN.nprocs, steps=RUN.steps)

Even the small profile teaches with real numbers: every byte the ranks hold is measured and compared
with the estimate, only the model, the ranks and the steps are few.

``readable()`` (``profile`` calls it) makes every table a notebook shows readable: floats formatted
(``kit.units.number``), snake_case headers in words (``header_text``: ``per_gpu_gib`` -> ``per GPU GiB``;
a setting's key stays as written), text in full (never cut with "..."), short labels on one line and long
text wrapped (``frame_html``). ``record()`` shows a few named values (what a pandas Series would print as
text, with its ``dtype:`` line) as such a table. ``measured_steps()`` gives a sweep's step records with their
steps numbered as every notebook, panel and ``zerokit monitor`` numbers them: the measured steps from 1,
after the warm-up (``kit.monitor.measured_step``).

``REOPEN_HINT`` is the one sentence every notebook that shows a panel or a progress bar carries in a
markdown cell before the first one (``tests/test_notebooks_clean.py`` checks it): widgets live in the
kernel, so a saved notebook reopened shows "Error displaying widget: model not found" until it runs again.
"""

from __future__ import annotations

import html
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kit.models import toy_spec
from kit.schema import Setup
from kit.toys import REAL_TOY, SMOKE_TOY, TOY_ZERO
from kit.units import number

#: a text cell up to this many characters stays on one line (a label); a longer one wraps (formulas,
#: messages, paths), so that a table stays as wide as the notebook
ONE_LINE_CHARS = 32
#: the rows a table shows before the rest are left out (and counted), as pandas' own display does
MAX_ROWS = 60

#: the environment variable ``make test`` sets
SMOKE_ENV = "ZEROKIT_SMOKE"

#: the markdown line, word for word, before the first panel or progress bar of every notebook that shows one
REOPEN_HINT = (
    '*A saved notebook reopened shows "Error displaying widget: model not found" where its panels and '
    "progress bars were: widgets live in the kernel, so Run > Run All Cells brings them back.*"
)


@dataclass(frozen=True)
class Profile:
    """How big a notebook's real runs are: ``nprocs`` ranks, ``steps`` measured steps (after the sweep's
    warm-up), ``micro_batch`` per rank, the toy GPT's ``toy`` shape (``kit.toys``' ``SMOKE_TOY`` or
    ``REAL_TOY``), and ``runs_dir`` for the records."""

    smoke: bool
    nprocs: int
    steps: int
    micro_batch: int
    toy: dict
    runs_dir: str

    def toy_setup(self, **sections) -> Setup:
        """The toy GPT on one node of ``nprocs`` ranks at ``micro_batch``, with ``TOY_ZERO``'s buckets;
        ``sections`` (``zero=``, ``batch=``) change its fields as ``Setup.replace`` does."""
        base = self.local(Setup(model=toy_spec(**self.toy), batch={"micro_batch": self.micro_batch}))
        return base.replace(**sections) if sections else base

    def local(self, setup: Setup) -> Setup:
        """``setup`` on this machine: one node of ``nprocs`` ranks, with ``TOY_ZERO``'s small buckets (a
        CPU rank has no room for DeepSpeed's default 500M-element ones); its batch per rank is kept."""
        return setup.replace(cluster={"nodes": 1, "gpus_per_node": self.nprocs}, zero=TOY_ZERO, batch={})


def profile(notebook: str, smoke: bool | None = None) -> Profile:
    """The profile of notebook ``notebook`` (its number, e.g. ``"02"``: it names the temporary folder);
    ``smoke`` None reads ``ZEROKIT_SMOKE`` ("1": the small one)."""
    if smoke is None:
        smoke = os.environ.get(SMOKE_ENV) == "1"
    readable()
    if smoke:
        runs = tempfile.mkdtemp(prefix=f"zerokit-{notebook}-")
        return Profile(True, nprocs=2, steps=2, micro_batch=2, toy=dict(SMOKE_TOY), runs_dir=runs)
    return Profile(False, nprocs=8, steps=10, micro_batch=8, toy=dict(REAL_TOY), runs_dir="runs")


def readable() -> None:
    """Tables as a reader needs them, for the rest of the session: pandas prints floats with
    ``kit.units.number`` and text in full, and a notebook shows a DataFrame as ``frame_html`` draws it."""
    import pandas as pd

    pd.set_option("display.float_format", number)
    pd.set_option("display.max_colwidth", None)
    pd.set_option("display.max_columns", None)
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["text/html"].for_type(pd.DataFrame, frame_html)


def record(values: Mapping[Any, object], column: str, index: str | None = None):
    """Named values as a one-column table (a DataFrame ``frame_html`` draws), never a Series printed as
    text: one row per name of ``values`` (in words, with its unit where the rows differ in unit), ``column``
    the header (with the unit where every row has the same), ``index`` the names' header."""
    import pandas as pd

    if not values:
        raise ValueError(f"values: nothing to show under {column!r}")
    return pd.DataFrame({column: list(values.values())}, index=pd.Index(list(values), name=index))


def measured_steps(results, rank: int | None = 0):
    """The ok step records of ``results`` (a sweep's ``kit.run.results.Results``) of rank ``rank`` (None:
    every rank), in configuration and step order, with ``step`` numbered as every view numbers it: the
    measured steps from 1, after their launch's warm-up (read from the launch spec beside the records,
    ``kit.monitor.launch_steps``; without one, a configuration's first measured step is its step 1)."""
    from pathlib import Path

    from kit.monitor import launch_steps

    frame = results.df
    if frame.empty:
        return frame
    ok = frame[frame["status"] == "ok"]
    if rank is not None:
        ok = ok[ok["rank"] == rank]
    ok = ok.sort_values(["order", "step", "rank"]).copy()
    folder = Path(results.path).parent if results.path is not None else None
    warmups: dict[str, float] = {}
    for run_id in ok["run_id"].unique():
        known = launch_steps(folder, run_id) if folder else None
        warmups[run_id] = known[0] if known else float("nan")
    first = ok.groupby(["config_id", "run_id"])["step"].transform("min")
    warmup = ok["run_id"].map(warmups)
    ok["step"] = (ok["step"] - warmup.astype(float).fillna(first) + 1).astype(int)
    return ok


def frame_html(frame) -> str:
    """``frame`` as an HTML table: its index as leading columns, numbers right-aligned in
    ``kit.units.number``, text in full: on one line up to ``ONE_LINE_CHARS`` characters (a label never
    breaks), wrapped beyond (a formula, a message); headers wrap between words and after ``_`` and ``.``;
    the first ``MAX_ROWS`` rows and a count of the rest."""
    import pandas as pd

    shown = frame.head(MAX_ROWS)
    if not isinstance(shown.index, pd.RangeIndex) or shown.index.name is not None:
        # an unnamed level gets a blank header, not pandas' "index" / "level_1"
        names = [name if name is not None else " " * (i + 1) for i, name in enumerate(shown.index.names)]
        shown = shown.rename_axis(names).reset_index()
    header = [
        " ".join(str(part) for part in c if str(part)) if isinstance(c, tuple) else str(c)
        for c in shown.columns
    ]
    numeric = [pd.api.types.is_numeric_dtype(t) and not pd.api.types.is_bool_dtype(t) for t in shown.dtypes]
    longest = [shown[c].astype(str).str.len().max() if len(shown) else 0 for c in shown.columns]
    cell = "padding:2px 5px;border-bottom:1px solid #e4e4e4;vertical-align:top;"
    head = "".join(
        f"<th style='{cell}text-align:{'right' if num else 'left'}'>{_breakable(h)}</th>"
        for h, num in zip(header, numeric, strict=True)
    )
    body = []
    for row in shown.itertuples(index=False):
        cells = []
        for value, num, width in zip(row, numeric, longest, strict=True):
            text = _cell_text(value)
            if num:
                style = "text-align:right;white-space:nowrap"
            elif width <= ONE_LINE_CHARS:
                style = "text-align:left;white-space:nowrap"
            else:
                style = "text-align:left;white-space:normal;overflow-wrap:anywhere;min-width:200px"
            cells.append(f"<td style='{cell}{style}'>{html.escape(text)}</td>")
        body.append(f"<tr>{''.join(cells)}</tr>")
    more = len(frame) - len(shown)
    note = f"<div style='color:#666;font-size:12px'>{more:,} more rows</div>" if more else ""
    return (
        "<table class='zk-frame' style='border-collapse:collapse;font-size:12px;"
        "font-variant-numeric:tabular-nums'>"
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>{note}"
    )


#: words of a snake_case column name as a header shows them (units and acronyms)
HEADER_WORDS = {"gib": "GiB", "mib": "MiB", "gpu": "GPU", "cpu": "CPU", "gbps": "GB/s", "usd": "USD"}


def header_text(name: str) -> str:
    """A snake_case column name in words (``per_gpu_gib`` -> ``per GPU GiB``, ``samples_per_s`` ->
    ``samples/s``, ``step_time_s`` -> ``step time (s)``); a setting's key (with ``.`` or ``=``:
    ``zero.reduce_bucket_size``) and a name without ``_`` stay as written."""
    if "_" not in name or "." in name or "=" in name:
        return name
    words = [HEADER_WORDS.get(w, w) for w in name.split("_")]
    text = " ".join(words).replace(" per s", "/s")
    return text[:-2] + " (s)" if text.endswith(" s") else text


def _breakable(header: str) -> str:
    """A column name in words (``header_text``) that may also wrap after ``.`` and ``_``."""
    return html.escape(header_text(header)).replace("_", "_<wbr>").replace(".", ".<wbr>")


def _cell_text(value) -> str:
    """A value as its cell shows it: floats by ``number``, missing ones as a dash."""
    import pandas as pd

    if value is None or (not isinstance(value, (list, tuple, dict)) and pd.isna(value)):
        return "\u2013"
    if isinstance(value, float):
        return number(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)
