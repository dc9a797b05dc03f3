"""The README says what the kit does: every ``zerokit`` example in a ``console`` block prints, today,
exactly the output shown under it (regenerate the block when a formula changes)."""

import re
import shlex
from pathlib import Path

import pytest

from kit.cli import main

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
