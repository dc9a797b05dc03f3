"""Issue 43, one unit per quantity in what a person reads of a sweep: memory in MiB (2**20, as the
estimates show it), bytes sent in MB (1e6, as network traffic is counted): the comparison panel's per-node
table and the engine report (no launch: hand-written records)."""

from __future__ import annotations

import re

import pytest

from kit.components import HELD
from kit.lab.comparison_panel import BRIEF_FORMATS, nodes_html
from kit.lab.engine_report import advice, engines_table
from kit.run.results import Results
from kit.run.sweep import config_id
from kit.toys import toy_setup
from kit.units import MB

STATES = 3 * 2**20  # model states a node's ranks hold: 3 MiB, 3.146 MB
SENT = 2 * 10**6  # bytes each rank sent inside the node: 2 MB, 1.907 MiB


def test_the_per_node_table_shows_memory_in_mib_and_bytes_sent_in_mb():
    row = {"label": "z3 bf16 mb2", "node_rank": 0, "host": "localhost", "ranks": [0, 1]}
    row |= {"model_states_bytes": STATES, "estimate_model_states_bytes": STATES}
    row |= {"intra_wire_bytes": SENT, "estimate_intra_wire_bytes": SENT}
    row |= {"inter_wire_bytes": 0, "estimate_inter_wire_bytes": 0}
    shown = nodes_html([row])
    header = re.findall(r"<th[^>]*>([^<]*)</th>", shown)
    assert header[4:] == [
        "model states MiB", "estimate MiB", "intra-node MB", "estimate MB", "inter-node MB", "estimate MB",
    ]  # fmt: skip
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", shown)
    assert cells[4:8] == ["3", "3", "2", "2"]  # 3 MiB of states, 2 MB sent: each in its own unit
    assert "model states in MiB; MB each rank sent" in shown


def test_the_results_table_formats_memory_in_mib_and_traffic_in_mb():
    memory = [c for c in BRIEF_FORMATS if "RSS" in c or "states" in c or c == "estimate MiB"]
    assert memory == ["model states MiB", "estimate MiB", "peak RSS MiB"]
    assert [c for c in BRIEF_FORMATS if " MB" in c] == ["wire MB/step", "estimate wire MB"]


def _records() -> list[dict]:
    rows = []
    for stage, held in ((0, 4 * 2**20), (3, 2 * 2**20)):
        setup = toy_setup(2).replace(zero={"stage": stage})
        states = {c: held // len(HELD) for c in HELD} | {"activations": 0}
        base = {"sweep": "s", "run_id": "r1", "config_id": config_id(setup), "label": setup.label}
        base |= {"setup": setup.model_dump(mode="json"), "rank": 0, "world_size": 2, "device": "cpu"}
        base |= {"time": 1e9, "status": "ok", "error": None, "loss": 5.0, "step_time_s": 0.1}
        base |= {
            "samples_per_s": 100.0 - 10 * stage,
            "comm_wire_bytes": SENT,
            "estimate_comm_wire_bytes": SENT,
        }
        rows += [base | {"step": step, "measured": states, "estimate": states} for step in (1, 2)]
    return rows


def test_the_engine_report_holds_mib_and_sends_mb():
    table = engines_table(Results(_records()))
    assert list(table.columns[2:6]) == ["held MiB", "estimate MiB", "wire MB/step", "estimate wire MB"]
    assert table["held MiB"].tolist() == pytest.approx([4.0, 2.0])  # 4 MiB and 2 MiB: bytes / 2**20
    assert table["wire MB/step"].tolist() == pytest.approx([SENT / MB] * 2)
    text = advice(Results(_records()))
    assert "(2.00 MiB)" in text and "4.00 MiB or more" in text and " MB " not in text


@pytest.mark.parametrize(("device", "where"), [("cpu", "in a CPU rank"), ("NVIDIA H200", "on the GPU")])
def test_a_records_peak_timeline_says_where_its_tensors_lived(device, where):
    """Issue 43: a CPU rank's measured timeline is not drawn as "live on the GPU"."""
    from kit.estimate.memory import peak_timeline
    from kit.lab.comparison_panel import peak_plot

    setup = toy_setup(2)
    line = peak_timeline(setup, 0, implementation="single", backend="gloo")
    record = {"label": setup.label, "device": device, "rank": 0, "setup": setup.model_dump(mode="json")}
    record["measured"] = {"phases": dict(line.totals)}
    assert peak_plot(record).axes[0].get_ylabel() == f"MiB live {where}"
