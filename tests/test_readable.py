"""What a reader sees in a table (issue 43): no e-notation, no 0.0002 GiB, no snake_case byte counts;
the machine-readable frames scripts read (``Results.summary()``, a plan's tables) keep their columns."""

import math

import pandas as pd
import pytest

from kit import Setup
from kit.estimate import estimate
from kit.models import from_hf_config
from kit.run.results import Results
from kit.units import GIB, MIB, number


def _toy() -> Setup:
    spec = from_hf_config(
        {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 512, "n_positions": 64}
    )
    return Setup(model=spec, cluster={"gpus_per_node": 2}, zero={"stage": 2}, batch={"micro_batch": 2})


def test_a_number_is_never_in_e_notation():
    """Below 1e-4 ``.4g`` writes "9.461e-05": a table says "<0.0001" (">-0.0001" below zero) instead,
    and a table whose values are that small is one whose caller should pick a smaller unit."""
    assert [number(v) for v in (9.461e-05, -9.461e-05, 5e-300, 1e-4, 0.000123, -0.000123, 0.0)] == [
        "<0.0001", ">-0.0001", "<0.0001", "0.0001", "0.000123", "-0.000123", "0"
    ]  # fmt: skip
    tiny = 0.000099995  # .4g would round it up to 0.0001: it is still below
    assert number(tiny) == "<0.0001"
    for value in (1e-12, 3.2e-7, 1.5e20, 123456789.123, 0.5, 2.5e-4, -7e-9):
        assert "e" not in number(value), value
    assert [number(v) for v in (float("nan"), float("inf"))] == ["nan", "inf"]


def test_the_estimate_table_shows_mib_below_a_gib():
    """07's ``booked.table()`` showed a small model's parameters as 0.0002127 GiB (its CPU RAM per node, 16
    GiB, set the column's unit): each row's size is now in GiB from 1 GiB, else MiB (``kit.units.size``),
    beside the exact bytes."""
    e = estimate(_toy().replace(cluster={"gpus_per_node": 8}))
    table = e.table()
    assert list(table.columns) == ["bytes", "size", "formula"]
    assert table.loc["parameters", "bytes"] == e.components["parameters"] < MIB
    assert table.loc["parameters", "size"] == f"{e.components['parameters'] / MIB:.2f} MiB"
    assert table.loc["CPU RAM per node", "size"] == f"{e.cpu_bytes_per_node / GIB:.2f} GiB"
    assert all(s.endswith((" MiB", " GiB")) for s in table["size"])


def _record(setup: Setup, config_id: str, rank: int, step: int, **fields) -> dict:
    record = {"sweep": "t", "run_id": "r1", "config_id": config_id, "label": f"{setup.label} {config_id}"}
    record.update(rank=rank, setup=setup.model_dump(mode="json"), world_size=2, step=step, status="ok")
    return {**record, "error": None, **fields}


def _results() -> Results:
    from kit.estimate import rank_states

    setup = _toy()
    held = rank_states(setup, 0)["device"]
    measured = {**held, "activations": 950272}
    common = {"step_time_s": 0.0125, "samples_per_s": 320.0, "loss": 6.25, "comm_wire_bytes": 123456}
    common |= {"peak_rss_bytes": 600 * 10**6, "estimate_peak_bytes": estimate(setup).per_gpu_bytes}
    rows = []
    for cid, device in (("cpu", "cpu"), ("gpu", "NVIDIA H200")):
        for step in (1, 2):
            rows.append(
                _record(setup, cid, 0, step, device=device, measured=measured, estimate=measured, **common)
            )
    rows.append(_record(setup, "bad", 0, 1, device="cpu", status="error", error="RuntimeError: boom\nmore"))
    return Results(rows)


def test_results_readable_is_the_summary_in_words_and_units():
    """``summary()`` keeps its machine-readable columns (bytes, seconds: users' scripts read them);
    ``readable()`` shows chosen columns, named as ``summary()`` names them, with headers in words and
    units, memory in MiB (as the estimates show it), bytes sent in MB (1e6, as traffic is counted), a step
    in ms, an error's first line; on CPU ranks the whole-GPU estimate (a GPU's CUDA context and NCCL
    buffers) is blank, not 771 MiB beside a CPU process."""
    results = _results()
    summary = results.summary()
    assert "measured_optimizer_states" in summary and summary["estimate_peak_bytes"].notna().sum() == 2
    chosen = ["label", "status", "samples_per_s", "measured_optimizer_states", "estimate_optimizer_states"]
    shown = results.readable(chosen)
    states = ["measured optimizer states MiB", "estimated optimizer states MiB"]
    assert list(shown.columns) == ["configuration", "status", "samples/s", *states]
    measured = summary["measured_optimizer_states"]
    assert shown["measured optimizer states MiB"].tolist()[:2] == (measured / 2**20).tolist()[:2]
    assert pd.api.types.is_float_dtype(shown["measured optimizer states MiB"])  # numbers for the formatter
    every = results.readable()
    assert "config id" not in every and "config_id" not in every
    assert all("_" not in header for header in every.columns)
    assert every["step ms"].tolist()[:2] == [12.5, 12.5]
    assert every["MB sent per step"].tolist()[:2] == [0.123456, 0.123456]  # traffic: MB, 1e6
    assert every["peak RSS MiB"].tolist()[:2] == [600 * 10**6 / 2**20] * 2  # memory: MiB, 2**20
    assert not [h for h in every.columns if h.endswith(" MB") and "sent" not in h]  # MB is traffic only
    assert every["error"].tolist()[2] == "RuntimeError: boom"  # its first line
    peaks = every["estimated peak per GPU MiB"].tolist()
    assert math.isnan(peaks[0]) and peaks[1] == estimate(_toy()).per_gpu_bytes / 2**20  # cpu blank, GPU kept
    assert math.isnan(results.readable(["measured_peak_tensor_bytes"])["measured peak tensors MiB"][0])
    with pytest.raises(
        ValueError, match=r"^columns: 'samples' is not a column of Results.summary\(\), one of"
    ):
        results.readable(["samples"])


def test_plan_tables_in_a_notebook_have_units_in_their_headers():
    """``plan.readable`` keeps the CLI's form (its column names, the units in the cells: ``zerokit plan``
    prints it); ``units_in_headers=True`` (notebook 08) names the units in the headers and leaves the
    numbers numbers, dollars and tokens/s whole."""
    from kit.planning import plan

    row = {"label": "a", "per_gpu_gib": 3171.97, "hours": 49814.9, "cost_usd": 243595.4, "tokens_per_s": 9.6}
    row |= {"step_s": 0.41088, "gpus_per_node": 8, "micro_batch": 1}
    frame = pd.DataFrame([row])
    assert list(plan.readable(frame).columns) == list(frame.columns)
    shown = plan.readable(frame, units_in_headers=True)
    assert list(shown.columns) == [
        "label", "GiB per GPU", "hours", "USD", "tokens/s", "step s", "GPUs per node", "micro batch"
    ]  # fmt: skip
    assert shown.iloc[0].tolist()[1:6] == [3171.97, 49814.9, 243595.0, 10.0, 0.41088]
    assert [number(v) for v in shown.iloc[0].tolist()[1:6]] == [
        "3,172.0",
        "49,814.9",
        "243,595",
        "10",
        "0.4109",
    ]
    assert frame["cost_usd"].iloc[0] == 243595.4  # the plan's own frame is not changed
