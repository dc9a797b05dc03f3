"""Two nodes on one machine, the CI stand-in for a cluster: two deepspeed launchers on the loopback
(``--hostfile H --no_ssh --node_rank 0|1 --master_addr 127.0.0.1``), 2 ranks each, world size 4.

The correct commtest and the ZeRO-2 run are tests/conftest.py's shared launches (``commtest_two_nodes``,
``local_nodes_run``); a node that never starts and a slow node launch their own."""

import pytest

from kit.models import toy_spec
from kit.run.launcher import launch_argv, run_launch, worker_env
from kit.scaleout import commtest
from kit.scaleout.commtest import run_commtest
from kit.scaleout.hostfile import make_hosts, write_hostfile
from kit.schema import Setup

pytestmark = pytest.mark.distributed

ZERO2 = Setup(
    model=toy_spec(), cluster={"nodes": 2, "gpus_per_node": 2}, zero={"stage": 2}, batch={"micro_batch": 1}
)
LOCAL_NODE_SETUPS = [ZERO2]


def test_commtest_across_two_nodes_maps_ranks(commtest_two_nodes):
    assert commtest_two_nodes["returncode"] == 0, commtest_two_nodes["output"]
    out = commtest_two_nodes["json"]
    assert out["ok"] is True and out["error"] is None
    # deepspeed's launcher gives node i the global ranks 2i, 2i+1 and local ranks 0, 1
    mapping = [(r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in out["ranks"]]
    assert mapping == [(0, 0, 0, 4), (1, 0, 1, 4), (2, 1, 0, 4), (3, 1, 1, 4)]
    assert len({r["pid"] for r in out["ranks"]}) == 4
    details = {c["op"]: c["detail"] for c in out["checks"]}
    assert details["all_reduce"] == "got 10, expected 10 (SUM of rank+1 over 4 ranks)"
    assert details["all_gather"] == "gathered [1.0, 2.0, 3.0, 4.0], expected rank+1 in rank order"
    assert details["barrier"] == "all 4 ranks arrived"
    ratio = {(row["op"], round(row["busbw_gbps"] / row["algbw_gbps"], 12)) for row in out["bandwidth"]}
    assert ratio == {("all_reduce", 1.5), ("all_gather", 0.75), ("reduce_scatter", 0.75), ("broadcast", 1.0)}


def test_zero2_run_across_two_nodes(local_nodes_run):
    spec = ZERO2.model
    rows = local_nodes_run.of([ZERO2])
    assert sorted((r["rank"], r["step"]) for r in rows) == [(rank, s) for rank in range(4) for s in (1, 2)]
    assert {(r["world_size"], r["status"]) for r in rows} == {(4, "ok")}
    # ZeRO-2 over 4 ranks: each holds 1/4 of the fp32 master weights and both Adam moments, 12 x psi / 4
    assert {r["measured"]["optimizer_states"] for r in rows} == {12 * spec.params // 4}
    assert {r["measured"]["parameters"] for r in rows} == {2 * spec.params}  # bf16 weights, whole
    # every rank sees different samples, so the 4 ranks' losses of a step differ
    assert len({r["loss"] for r in rows if r["step"] == 1}) == 4


def test_a_node_that_never_starts_is_reported(tmp_path):
    """Only node 0 of a 2-node hostfile starts: its ranks give up after ``arrive_s`` and say why."""
    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), tmp_path / "hostfile")
    script = commtest.worker_args(sizes=(4096,), iters=1, arrive_s=3)
    argv = launch_argv(commtest.WORKER, script, 2, nnodes=2, node_rank=0, hostfile=hostfile)
    rc, output = run_launch(argv, worker_env(2), timeout_s=120)
    result = commtest.parse_output(output, 4, rc)
    assert rc != 0 and not result.ok
    assert "the 4 ranks did not all meet within 3 s (is every node started" in result.error
    first, second = commtest.node_report(result, make_hosts(["localhost", "127.0.0.1"], 2))
    assert (second["status"], second["joined"], second["missing"]) == ("missing", [], [2, 3])
    # node 0 is there: a rank's last line may be cut when the launch ends, so at least one of its two
    assert first["status"] in ("ok", "partial") and first["joined"] and set(first["joined"]) <= {0, 1}


def test_zerokit_commtest_hostfile_reports_every_node(commtest_two_nodes):
    """``zerokit commtest --hostfile`` on two simulated nodes (both hosts are this machine)."""
    assert commtest_two_nodes["returncode"] == 0, commtest_two_nodes["output"]
    out = commtest_two_nodes["json"]
    assert out["ok"] is True and out["world_size"] == 4
    assert [(n["node_rank"], n["host"], n["status"], n["joined"], n["missing"]) for n in out["nodes"]] == [
        (0, "localhost", "ok", [0, 1], []),
        (1, "127.0.0.1", "ok", [2, 3], []),
    ]
    assert sorted({row["op"] for row in out["bandwidth"]}) == sorted(commtest.TIMED)


def test_a_slow_node_is_named():
    """Rank 1, alone on the second of 2 simulated nodes (``run_commtest(nnodes=2)``), arrives 3 s late."""
    result = run_commtest(1, (4096,), nnodes=2, iters=1, arrive_s=1, late_rank=1, late_s=3, timeout_s=120)
    assert not result.ok
    assert result.error == "rank 0: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 1000 ms"
    nodes = commtest.node_report(result, make_hosts(["localhost", "127.0.0.1"], 1))
    assert [(n["host"], n["status"], n["late"]) for n in nodes] == [
        ("localhost", "ok", []),
        ("127.0.0.1", "slow", [1]),
    ]
