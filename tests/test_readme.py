"""The README says what the kit does: every ``zerokit`` example in a ``console`` block prints, today,
exactly the output shown under it (regenerate the block when a formula changes)."""

import re
import shlex
from pathlib import Path

import pytest

from kit.cli import main
from kit.estimate.comm import comm_by_scope

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
#: (command line, the output shown) for every ``$ .venv/bin/zerokit ...`` in a console block
EXAMPLES = [
    (command, output)
    for block in re.findall(r"```console\n(.*?)```", README, flags=re.S)
    for command, output in re.findall(r"^\$ \.venv/bin/zerokit (.+)\n((?:(?!\$ ).*\n)*)", block, flags=re.M)
]


def test_the_readme_has_examples():
    assert [command.split()[0] for command, _ in EXAMPLES] == ["estimate", "explain"]


@pytest.mark.parametrize(("command", "shown"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_prints_what_the_readme_shows(command, shown, capsys):
    assert main(shlex.split(command)) == 0
    assert capsys.readouterr().out == shown


def test_the_zeropp_figures_in_the_prose_are_the_estimates():
    """README's ZeRO++ paragraph (Llama-2-7B on 2 x 8 H100s, micro batch 1, seq 4096): bytes per GPU per
    step across and inside nodes (``kit.estimate.comm.comm_by_scope``) and the memory hpZ adds
    (``kit.estimate``)."""
    from kit import models
    from kit.estimate import estimate
    from kit.schema import Setup
    from kit.units import GIB

    prose = " ".join(README.split())
    found = re.search(
        r"for Llama-2-7B on 2 x 8 H100s, ([\d.]+) GiB per GPU per step cross nodes with ZeRO-3, ([\d.]+) GiB "
        r"with all three \(plus ([\d.]+) GiB inside the node\), for ([\d.]+) GiB more parameter memory per "
        r"GPU \(the secondary partition; ([\d.]+) GiB more at the peak per GPU\)",
        prose,
    )
    assert found, "the README's ZeRO++ sentence changed: update this test with it"
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
