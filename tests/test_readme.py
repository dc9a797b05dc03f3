"""The README and the pages of docs/ say what the kit does: every ``zerokit`` example in a ``console`` block
prints, today, exactly the output shown under it (regenerate the block when a formula changes), the figures
in the prose are the estimates, and every relative link points at a file (and heading) that exists."""

import re
import shlex
from pathlib import Path

import pytest

from kit.cli import main
from kit.steptime.comm import comm_by_scope

REPO = Path(__file__).resolve().parent.parent
#: the front page and every page of docs/, by their path from the repository's root
PAGES = {
    path.relative_to(REPO).as_posix(): path.read_text()
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
}
#: (page, command line, the output shown) for every ``$ .venv/bin/zerokit ...`` in a console block
EXAMPLES = [
    (page, command, output)
    for page, text in PAGES.items()
    for block in re.findall(r"```console\n(.*?)```", text, flags=re.S)
    for command, output in re.findall(r"^\$ \.venv/bin/zerokit (.+)\n((?:(?!\$ ).*\n)*)", block, flags=re.M)
]


def test_the_examples_are_where_the_readme_sends_readers():
    """One estimate on the front page, the explain example with the estimate's other pages."""
    found = {}
    for page, command, _ in EXAMPLES:
        found.setdefault(page, []).append(command.split()[0])
    assert found == {"README.md": ["estimate"], "docs/estimate.md": ["explain"]}


@pytest.mark.parametrize(("page", "command", "shown"), EXAMPLES, ids=[f"{p}: {c}" for p, c, _ in EXAMPLES])
def test_example_prints_what_its_page_shows(page, command, shown, capsys):
    assert main(shlex.split(command)) == 0
    assert capsys.readouterr().out == shown


def anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading: lower case, punctuation but ``-`` and ``_`` dropped, spaces
    to ``-``."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    without_code = re.sub(r"```.*?```", "", text, flags=re.S)
    return {anchor(h) for h in re.findall(r"^#{1,6} (.+)$", without_code, flags=re.M)}


def test_relative_links_point_at_files_and_headings_that_exist():
    links = [
        (page, target)
        for page, text in PAGES.items()
        for target in re.findall(r"\]\(([^)\s]+)\)", text)
        if not re.match(r"[a-z]+:", target)
    ]
    assert {page for page, _ in links} >= {"README.md", "docs/estimate.md", "docs/architecture.md"}
    broken = []
    for page, target in links:
        path, _, fragment = target.partition("#")
        file = (REPO / page).parent / path if path else REPO / page
        if not file.exists():
            broken.append(f"{page}: {target} (no such file)")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text()):
            broken.append(f"{page}: {target} (no such heading)")
    assert broken == []


def test_every_docs_page_links_back_to_the_readme():
    pages = [page for page in PAGES if page.startswith("docs/")]
    assert len(pages) >= 8
    assert [page for page in pages if "](../README.md)" not in PAGES[page]] == []


def test_the_zeropp_figures_in_the_prose_are_the_estimates():
    """The ZeRO++ paragraph of docs/zeropp-and-infinity.md (Llama-2-7B on 2 x 8 H100s, micro batch 1,
    seq 4096): bytes per GPU per step across and inside nodes (``kit.steptime.comm.comm_by_scope``) and
    the memory hpZ adds (``kit.estimate``)."""
    from kit import models
    from kit.estimate import estimate
    from kit.schema import Setup
    from kit.units import GIB

    prose = " ".join(PAGES["docs/zeropp-and-infinity.md"].split())
    found = re.search(
        r"for Llama-2-7B on 2 x 8 H100s, ([\d.]+) GiB per GPU per step cross nodes with ZeRO-3, ([\d.]+) GiB "
        r"with all three \(plus ([\d.]+) GiB inside the node\), for ([\d.]+) GiB more parameter memory per "
        r"GPU \(the secondary partition; ([\d.]+) GiB more at the peak per GPU\)",
        prose,
    )
    assert found, "the ZeRO++ sentence of docs/zeropp-and-infinity.md changed: update this test with it"
    z3 = Setup(
        model=models.preset("llama-2-7b"),
        cluster={"nodes": 2, "gpus_per_node": 8},
        zero={"stage": 3},
        batch={"micro_batch": 1, "seq_len": 4096},
    )
    zpp = z3.replace(zero={"hpz_partition_size": 8, "quantized_weights": True, "quantized_gradients": True})
    before, after = estimate(z3), estimate(zpp)
    computed = (
        comm_by_scope(z3)["inter"],
        comm_by_scope(zpp)["inter"],
        comm_by_scope(zpp)["intra"],
        after.components["parameters"] - before.components["parameters"],
        after.per_gpu_bytes - before.per_gpu_bytes,
    )
    assert [f"{b / GIB:.1f}" for b in computed] == list(found.groups())
