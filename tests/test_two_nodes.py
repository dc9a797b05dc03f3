"""Two nodes on one machine, the CI stand-in for a cluster: two deepspeed launchers on the loopback
(``--hostfile H --no_ssh --node_rank 0|1 --master_addr 127.0.0.1``), 2 ranks each, world size 4."""

import json

import pytest

from kit.models import toy_spec
from kit.run.launcher import launch_argv, run_launch, worker_env
from kit.run.local_nodes import start_local_nodes
from kit.scaleout import commtest
from kit.scaleout.commtest import run_commtest
from kit.scaleout.hostfile import make_hosts, write_hostfile
from kit.schema import Setup

pytestmark = pytest.mark.distributed


def test_commtest_across_two_nodes_maps_ranks():
    result = run_commtest(2, (4096,), nnodes=2, iters=1, timeout_s=180)
    assert result.ok, result.error
    # deepspeed's launcher gives node i the global ranks 2i, 2i+1 and local ranks 0, 1
    mapping = [(r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in result.ranks]
    assert mapping == [(0, 0, 0, 4), (1, 0, 1, 4), (2, 1, 0, 4), (3, 1, 1, 4)]
    assert len({r["pid"] for r in result.ranks}) == 4
    details = {c["op"]: c["detail"] for c in result.checks}
    assert details["all_reduce"] == "got 10, expected 10 (SUM of rank+1 over 4 ranks)"
    assert details["all_gather"] == "gathered [1.0, 2.0, 3.0, 4.0], expected rank+1 in rank order"
    assert details["barrier"] == "all 4 ranks arrived"
    busbw = (
        result.bandwidth().set_index("op")["busbw_gbps"] / result.bandwidth().set_index("op")["algbw_gbps"]
    )
    assert busbw.round(12).to_dict() == {
        "all_reduce": 1.5,
        "all_gather": 0.75,
        "reduce_scatter": 0.75,
        "broadcast": 1.0,
    }


def test_zero2_run_across_two_nodes(tmp_path):
    spec = toy_spec()
    setup = Setup(
        model=spec, cluster={"nodes": 2, "gpus_per_node": 2}, zero={"stage": 2}, batch={"micro_batch": 1}
    )
    records = tmp_path / "records.jsonl"
    launch = {
        "sweep": "two-nodes",
        "run_id": "r0",
        "records": str(records),
        "steps": 2,
        "warmup": 1,
        "seed": 0,
    }
    launch["configs"] = [{"config_id": "z2", "label": setup.label, "setup": setup.model_dump()}]
    (tmp_path / "spec.json").write_text(json.dumps(launch))
    rcs, outputs = start_local_nodes(
        "kit.ranks.worker", ["--spec", str(tmp_path / "spec.json")], 2, 2, timeout_s=240
    )
    assert rcs == [0, 0], outputs[0][-3000:]
    rows = [json.loads(line) for line in records.read_text().splitlines()]
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


def test_zerokit_commtest_hostfile_reports_every_node(tmp_path):
    """``zerokit commtest --hostfile`` on two simulated nodes (both hosts are this machine)."""
    import subprocess
    import sys

    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 1), tmp_path / "hostfile")
    argv = [
        sys.executable,
        "-m",
        "kit",
        "commtest",
        "--hostfile",
        str(hostfile),
        "--sizes",
        "4K",
        "--iters",
        "1",
    ]
    done = subprocess.run([*argv, "--json"], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["ok"] is True and out["world_size"] == 2
    assert [(n["node_rank"], n["host"], n["status"], n["joined"]) for n in out["nodes"]] == [
        (0, "localhost", "ok", [0]),
        (1, "127.0.0.1", "ok", [1]),
    ]
    assert sorted(row["op"] for row in out["bandwidth"]) == sorted(commtest.TIMED)


def test_a_slow_node_is_named(tmp_path):
    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 1), tmp_path / "hostfile")
    result, nodes = commtest.run_on_hostfile(
        hostfile, (4096,), iters=1, arrive_s=1, late_rank=1, late_s=6, timeout_s=120
    )
    assert not result.ok
    assert [(n["host"], n["status"], n["late"]) for n in nodes] == [
        ("localhost", "ok", []),
        ("127.0.0.1", "slow", [1]),
    ]
