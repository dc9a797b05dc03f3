"""zerokit commtest: nccl-tests bandwidth definitions, output parsing, and real 2-rank gloo runs
(a correct one, one with a wrong contribution, one with a late rank), plus the CLI."""

import json
import subprocess
import sys

import matplotlib.image
import numpy as np
import pytest

from kit.rules import bus_factor
from kit.run.launcher import TIMEOUT_RC
from kit.scaleout import commtest
from kit.scaleout.commtest import CommtestResult, parse_output, run_commtest

SIZES = (8192, 1 << 20)


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
    result = parse_output(f"node1: {commtest.RANK_TAG} {line}\nsome launcher noise", 3, TIMEOUT_RC)
    assert not result.ok
    assert result.error.startswith("ranks [1, 2] of 3 did not report (timed out)")
    assert result.ranks == [{"rank": 0, "backend": "gloo"}]  # pdsh's host prefix is skipped


@pytest.fixture(scope="module")
def good():
    return run_commtest(2, SIZES, iters=2, timeout_s=120)


@pytest.mark.distributed
def test_collectives_are_right_on_two_ranks(good):
    assert good.ok, good.error
    assert [(r["rank"], r["local_rank"], r["node_rank"], r["world_size"]) for r in good.ranks] == [
        (0, 0, 0, 2),
        (1, 1, 0, 2),
    ]
    assert {r["backend"] for r in good.ranks} == {"nccl" if good.ranks[0]["device"] != "cpu" else "gloo"}
    details = {c["op"]: c["detail"] for c in good.checks}
    assert details["all_reduce"] == "got 3, expected 3 (SUM of rank+1 over 2 ranks)"
    assert details["all_gather"] == "gathered [1.0, 2.0], expected rank+1 in rank order"
    assert details["broadcast"] == "got 42, expected 42 (rank 0's value 42)"
    assert details["barrier"] == "all 2 ranks arrived"


@pytest.mark.distributed
def test_bandwidth_rows_and_plot(good):
    df = good.bandwidth()
    assert sorted(zip(df["op"], df["size_bytes"], strict=True)) == sorted(
        (op, s) for op in commtest.TIMED for s in SIZES
    )
    assert (df["algbw_gbps"] == df["size_bytes"] / df["time_s"] / 1e9).all()  # nccl-tests' algbw
    assert (df["time_s"] < 120).all()  # each timed call finished within the launch's limit
    ratio = (df["busbw_gbps"] / df["algbw_gbps"]).round(12).tolist()
    assert ratio == [
        {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}[op] for op in df["op"]
    ]
    fig = good.plot()
    lines = fig.axes[0].get_lines()
    assert [line.get_label() for line in lines] == list(commtest.TIMED)
    assert all(list(line.get_xdata()) == list(SIZES) for line in lines)
    assert json.loads(json.dumps(good.to_dict()))["bandwidth"][0]["op"] == "all_reduce"


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


@pytest.mark.distributed
def test_a_late_rank_is_named():
    result = run_commtest(2, (4096,), iters=1, late_rank=1, late_s=6, arrive_s=1, timeout_s=120)
    assert not result.ok
    assert result.error == "rank 0: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 1000 ms"


@pytest.mark.distributed
def test_cli_json(tmp_path):
    plot = tmp_path / "bw.png"
    argv = [sys.executable, "-m", "kit", "commtest", "--nprocs", "2", "--sizes", "4K", "--iters", "1"]
    done = subprocess.run([*argv, "--plot", str(plot), "--json"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["ok"] is True and out["world_size"] == 2 and len(out["bandwidth"]) == 4
    assert {row["size_bytes"] for row in out["bandwidth"]} == {4096}
    image = matplotlib.image.imread(plot)
    assert image.shape[:2] == (3.5 * 120, 6 * 120)  # the 6 x 3.5 inch figure at the CLI's 120 dpi
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 10  # lines, labels: not blank


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
