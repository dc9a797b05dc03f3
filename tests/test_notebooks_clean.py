"""Every notebook is committed clean: no outputs, a `parameters` first code cell, data resolved by the kit;
one that shows a widget says how to bring it back after reopening."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import nbformat
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from kit.lab.notebook import REOPEN_HINT

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK_FILES = sorted((REPO / "notebooks").glob("*.ipynb"))
DATA = (REPO / "data").resolve()
#: a code cell that shows a widget: a panel (or its ``.widget``, its ``.monitor()``) ...
PANEL_CALL = re.compile(
    r"\b(memory_panel|comparison_panel|plan_panel|monitor_panel)\(|\.widget\b|\.monitor\("
)
#: ... or a sweep that draws its progress bar (tqdm's, a widget in a notebook) unless told not to
SWEEP_CALL = re.compile(r"\b(run_sweep|run_together|tune)\(")


def data_paths(source: str) -> list[str]:
    """The string literals of a code cell (IPython's own translation of its magics, parsed by ``ast``)
    that reach into the repository's data/ when opened from notebooks/ or from the repository root (the
    kit resolves data/ from the package instead)."""
    tree = ast.parse(TransformerManager().transform_cell(source))
    bases = (REPO / "notebooks", REPO)
    texts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [t for t in texts if "\0" not in t and any((b / t).resolve().is_relative_to(DATA) for b in bases)]


def test_data_paths_finds_relative_paths_into_data():
    for bad in ('open("../data/gpus.csv")', "Path('data') / 'gpus.csv'", 'pd.read_csv("data/gpus.csv")'):
        assert data_paths(bad), bad
    good = (
        "from kit.paths import DATA",
        'DATA / "gpus.csv"',
        'models.resolve("llama-2-7b")',
        "%matplotlib inline",
    )
    for source in good:
        assert data_paths(source) == [], source


def test_notebooks_are_numbered_without_gaps_and_each_is_in_the_readme():
    numbers = [int(p.name[:2]) for p in NOTEBOOK_FILES]
    assert len(numbers) >= 7 and numbers == list(range(len(numbers))), [p.name for p in NOTEBOOK_FILES]
    readme = (REPO / "README.md").read_text()
    assert [p.stem for p in NOTEBOOK_FILES if f"`{p.stem}`" not in readme] == []


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_no_outputs(path):
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and (c.outputs or c.execution_count)]
    assert dirty == [], f"{path.name}: cells {dirty} have outputs or execution counts; clear them"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_first_code_cell_is_parameters(path):
    nb = nbformat.read(path, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{path.name}: no code cells"
    assert "parameters" in code[0].metadata.get("tags", []), f"{path.name}: first code cell lacks the tag"
    assert 'os.environ.get("ZEROKIT_SMOKE") == "1"' in code[0].source, f"{path.name}: no smoke defaults"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_goal_stated_at_top(path):
    nb = nbformat.read(path, as_version=4)
    first = nb.cells[0]
    assert first.cell_type == "markdown" and first.source.startswith("# "), f"{path.name}: no title"
    assert "goal" in first.source.lower(), f"{path.name}: the first cell does not state the goal"


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_data_resolved_from_the_package(path):
    nb = nbformat.read(path, as_version=4)
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            assert data_paths(cell.source) == [], f"{path.name}: cell {i} opens data/ by a relative path"


def test_onboarding_points_to_every_other_notebook():
    nb = nbformat.read(NOTEBOOK_FILES[0], as_version=4)
    (what_next,) = [c.source for c in nb.cells if c.source.startswith("## What next")]
    for path in NOTEBOOK_FILES[1:]:
        assert f"**{path.name[:2]} · " in what_next, f"00's 'What next' does not list {path.name}"


def shows_widget(source: str) -> bool:
    """Whether a code cell shows a widget (``PANEL_CALL``, or ``SWEEP_CALL`` with its progress bar on)."""
    return bool(PANEL_CALL.search(source) or (SWEEP_CALL.search(source) and "progress=False" not in source))


def test_shows_widget_finds_panels_and_progress_bars():
    for cell in (
        "panel = memory_panel(setup)\npanel.widget",
        "watch = job.monitor(interval_s=1)",
        "results = run_sweep([ddp], steps=2)",
        "runs = sweeps.run_together({}, sweep='x')",
    ):
        assert shows_widget(cell), cell
    for cell in (
        "run_sweep(setups, steps=2,\n          progress=False)",
        "from kit import run_sweep",
        "plots.pareto(found)",
        "panel.stage.value = 3",
    ):
        assert not shows_widget(cell), cell


def test_the_reopen_hint_is_one_sentence():
    text = REOPEN_HINT.strip("*")
    assert text.endswith(".") and text.count(". ") == 0 and "Run > Run All Cells" in text
    assert "Error displaying widget: model not found" in text  # what the reader sees, to find this line


@pytest.mark.parametrize("path", NOTEBOOK_FILES, ids=lambda p: p.name)
def test_a_notebook_with_widgets_says_how_to_bring_them_back(path):
    """Widgets live in the kernel: a saved notebook reopened shows "Error displaying widget: model not
    found" where they were. Every notebook that shows one carries ``REOPEN_HINT``, word for word, once,
    in the markdown just before its first widget; the others do not."""
    nb = nbformat.read(path, as_version=4)
    first = next(
        (i for i, c in enumerate(nb.cells) if c.cell_type == "code" and shows_widget(c.source)), None
    )
    carrying = [i for i, c in enumerate(nb.cells) if REOPEN_HINT in " ".join(c.source.split())]
    if first is None:
        assert carrying == [], f"{path.name}: shows no widget, yet cells {carrying} carry the reopen hint"
        return
    before = max((i for i in range(first) if nb.cells[i].cell_type == "code"), default=-1)
    assert len(carrying) == 1 and before < carrying[0] < first, (
        f"{path.name}: its first widget is in cell {first}; the markdown between cells {before} and {first} "
        f"should carry, once, kit.lab.notebook.REOPEN_HINT (carried by cells {carrying})"
    )
    assert nb.cells[carrying[0]].cell_type == "markdown"
