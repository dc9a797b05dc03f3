"""zerokit commtest: nccl-tests bandwidth definitions, output parsing, a correct gloo run (tests/conftest.py's
shared ``zerokit commtest --hostfile`` on 2 simulated nodes x 2 ranks) and a 2-rank run with a wrong
contribution, plus the CLI. A late rank: tests/test_two_nodes.py."""

import json

import matplotlib.image
import numpy as np
import pytest

from kit.records import RANK_TAG
from kit.rules import bus_factor
from kit.run.launcher import TIMEOUT_RC
from kit.scaleout import commtest
from kit.scaleout.commtest import CommtestResult, parse_output, run_commtest
from kit.specs import TIMED
from tests.conftest import COMMTEST_SIZES


def test_bus_factors_are_nccl_tests_definitions():
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_reduce", 8) == 1.75  # 2 x 7 / 8
    assert bus_factor("all_gather", 4) == 0.75
    assert bus_factor("reduce_scatter", 8) == 0.875
    assert bus_factor("broadcast", 8) == 1.0
    with pytest.raises(ValueError, match="op: choose one of all_reduce"):
        bus_factor("alltoall", 4)


def test_bandwidth_from_timings():
    timings = [
        {"op": "all_reduce", "size_bytes": 1_000_000_000, "time_s": 0.5},
        {"op": "all_gather", "size_bytes": 4_000_000, "time_s": 0.002},
    ]
    df = CommtestResult(world_size=4, timings=timings).bandwidth()
    assert df["algbw_gbps"].tolist() == [2.0, 2.0]
    assert df["busbw_gbps"].tolist() == [3.0, 1.5]  # x 2(n-1)/n = 1.5 and x (n-1)/n = 0.75


def test_worker_args_validation():
    with pytest.raises(ValueError, match="sizes: give message sizes of at least 4 bytes"):
        commtest.worker_args(sizes=(2,))
    with pytest.raises(ValueError, match="iters: must be >= 1"):
        commtest.worker_args(iters=0)
    with pytest.raises(ValueError, match="nprocs: a communication test needs at least 2 ranks, got 1"):
        run_commtest(1)


def test_missing_ranks_after_a_timeout_are_named():
    line = json.dumps({"rank": 0, "backend": "gloo", "checks": [{"op": "barrier", "ok": True, "detail": ""}]})
    result = parse_output(f"node1: {RANK_TAG} {line}\nsome launcher noise", 3, TIMEOUT_RC)
    assert not result.ok
    assert result.error.startswith("ranks [1, 2] of 3 did not report (timed out)")
    assert result.ranks == [{"rank": 0, "backend": "gloo"}]  # pdsh's host prefix is skipped


def shared_result(run: dict) -> CommtestResult:
    """The shared run's result, rebuilt from its JSON (the timings are its bandwidth rows' first columns)."""
    assert run["returncode"] == 0, run["output"]
    out = run["json"]
    timings = [{k: row[k] for k in ("op", "size_bytes", "time_s")} for row in out["bandwidth"]]
    return CommtestResult(out["world_size"], out["ranks"], out["checks"], timings, out["error"])


@pytest.mark.distributed
def test_collectives_are_right_on_four_ranks(commtest_two_nodes):
    good = shared_result(commtest_two_nodes)
    assert good.ok, good.error
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in good.ranks] == [
        (0, 0, 0, 4),
        (1, 1, 0, 4),
        (2, 0, 1, 4),
        (3, 1, 1, 4),
    ]
    assert {r["backend"] for r in good.ranks} == {"nccl" if good.ranks[0]["device"] != "cpu" else "gloo"}
    details = {c["op"]: c["detail"] for c in good.checks}
    assert details == {
        "all_reduce": "got 10, expected 10 (SUM of rank+1 over 4 ranks)",
        "all_gather": "gathered [1.0, 2.0, 3.0, 4.0], expected rank+1 in rank order",
        "reduce_scatter": "got 10, expected 10 (chunk 0 = (rank+1) x SUM of rank+1)",
        "broadcast": "got 42, expected 42 (rank 0's value 42)",
        "barrier": "all 4 ranks arrived",
    }


@pytest.mark.distributed
def test_bandwidth_rows_and_plot(commtest_two_nodes):
    good = shared_result(commtest_two_nodes)
    df = good.bandwidth()
    assert sorted(zip(df["op"], df["size_bytes"], strict=True)) == sorted(
        (op, s) for op in TIMED for s in COMMTEST_SIZES
    )
    assert (df["algbw_gbps"] == df["size_bytes"] / df["time_s"] / 1e9).all()  # nccl-tests' algbw
    assert (df["time_s"] < 300).all()  # each timed call finished within the launch's limit
    ratio = (df["busbw_gbps"] / df["algbw_gbps"]).round(12).tolist()
    assert ratio == [
        {"all_reduce": 1.5, "all_gather": 0.75, "reduce_scatter": 0.75, "broadcast": 1.0}[op]
        for op in df["op"]
    ]
    fig = good.plot()
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == list(TIMED)
    assert all(list(line.get_xdata()) == list(COMMTEST_SIZES) for line in lines)
    # the CLI's JSON is the result's to_dict (and the per-node report), value for value
    assert json.loads(json.dumps(good.to_dict())) == {
        k: v for k, v in commtest_two_nodes["json"].items() if k != "nodes"
    }


@pytest.mark.distributed
def test_a_wrong_contribution_is_reported_per_collective():
    result = run_commtest(2, (4096,), iters=1, wrong_rank=1, timeout_s=120)
    assert not result.ok and result.timings == []  # no timing once a collective is wrong
    wrong = {c["op"]: c["detail"] for c in result.checks if not c["ok"]}
    assert wrong == {
        "all_reduce": "got 4, expected 3 (SUM of rank+1 over 2 ranks)",
        "all_gather": "gathered [1.0, 3.0], expected rank+1 in rank order",
        "reduce_scatter": "got 4, expected 3 (chunk 0 = (rank+1) x SUM of rank+1)",
    }
    assert result.error.startswith("all_reduce is wrong: got 4, expected 3")
    # on one node, torchrun's identities: every rank on node 0
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in result.ranks] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]


@pytest.mark.distributed
def test_cli_json_and_plot(commtest_two_nodes):
    shared_result(commtest_two_nodes)  # exit status 0
    out = commtest_two_nodes["json"]
    assert out["ok"] is True and out["world_size"] == 4 and len(out["bandwidth"]) == 8
    assert {row["size_bytes"] for row in out["bandwidth"]} == set(COMMTEST_SIZES)
    image = matplotlib.image.imread(commtest_two_nodes["plot"])
    assert image.shape[:2] == (3.5 * 120, 6 * 120)  # the 6 x 3.5 inch figure at the CLI's 120 dpi
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # lines, labels: not blank


def test_cli_nprocs_hands_its_flags_to_run_commtest_and_exits_1_on_failure(monkeypatch, capsys):
    """``--nprocs`` (no hostfile): what the CLI passes on and prints (the launch itself: the tests above)."""
    from kit.cli import main

    calls = []
    passed = CommtestResult(3, ranks=[{"rank": r} for r in range(3)], checks=[{"op": "barrier", "ok": True}])

    def fake(nprocs, sizes, **kw):
        calls.append((nprocs, sizes, kw))
        return passed if len(calls) == 1 else CommtestResult(3, error="boom")

    monkeypatch.setattr(commtest, "run_commtest", fake)
    argv = ["commtest", "--nprocs", "3", "--sizes", "4K", "--iters", "1", "--launcher", "deepspeed"]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {**passed.to_dict(), "nodes": None}
    assert main(argv) == 1 and capsys.readouterr().out.strip().endswith("commtest: FAILED: boom")
    assert calls[0] == (
        3,
        (4096,),
        {"launcher": "deepspeed", "iters": 1, "timeout_s": 300.0, "arrive_s": 60.0},
    )


def test_node_report_says_which_node_is_missing_slow_or_wrong():
    from kit.scaleout.hostfile import make_hosts

    hosts = make_hosts(["a", "b", "c"], 2)
    late = CommtestResult(
        6,
        ranks=[{"rank": r} for r in range(4)],
        error="rank 0: Ranks 3 failed to pass monitoredBarrier in 1000 ms",
    )
    assert [(n["host"], n["status"], n["late"], n["missing"]) for n in commtest.node_report(late, hosts)] == [
        ("a", "ok", [], []),
        ("b", "slow", [3], []),
        ("c", "missing", [], [4, 5]),
    ]
    checks = [{"op": "all_reduce", "ok": False, "rank": 5, "detail": "got 4"}]
    wrong = CommtestResult(6, ranks=[{"rank": r} for r in range(6)], checks=checks)
    assert [n["status"] for n in commtest.node_report(wrong, hosts)] == ["ok", "ok", "wrong"]
