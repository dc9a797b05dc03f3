"""Two nodes on one machine, the CI stand-in for a cluster: two deepspeed launchers on the loopback
(``--hostfile H --no_ssh --node_rank 0|1 --master_addr 127.0.0.1``), 2 ranks each, world size 4.

The correct commtest and the sweep runs (ZeRO-2, and the stages 0 and 3 of ``zerokit run --hostfile H
--local --stages 0,3 --nprocs 2``) are tests/conftest.py's shared launches (``commtest_two_nodes``,
``local_nodes_run``); a node that never starts and a slow node launch their own. The sweep's watchdog
over several nodes, a failing node and the DeepSpeed runner's command line are checked without ranks."""

import json
import sys
import time
from types import SimpleNamespace

import pytest

from kit import cli
from kit.cli import build_parser
from kit.cli.run import setups_from_args
from kit.estimate import rank_states
from kit.models import toy_spec
from kit.run.launcher import CANCEL_RC, TIMEOUT_RC, launch_argv, run_launch, worker_env
from kit.run.local_nodes import Nodes, run_together
from kit.run.sweep import run_sweep
from kit.scaleout import commtest
from kit.scaleout.commtest import run_commtest
from kit.scaleout.hostfile import make_hosts, write_hostfile
from kit.schema import Setup
from kit.specs import TIMED
from kit.units import number

pytestmark = pytest.mark.distributed

ZERO2 = Setup(
    model=toy_spec(), cluster={"nodes": 2, "gpus_per_node": 2}, zero={"stage": 2}, batch={"micro_batch": 1}
)
#: what ``zerokit run --hostfile H --local --stages 0,3 --nprocs 2`` runs on a hostfile of two hosts
RUN_FLAGS = ["run", "--stages", "0,3", "--nprocs", "2", "--steps", "2", "--warmup", "1"]
CLI_SETUPS = setups_from_args(build_parser().parse_args(RUN_FLAGS), SimpleNamespace(count=2))
LOCAL_NODE_SETUPS = [ZERO2, *CLI_SETUPS]


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
    assert sorted({row["op"] for row in out["bandwidth"]}) == sorted(TIMED)


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


def test_stages_0_and_3_across_two_nodes_name_each_ranks_node(local_nodes_run):
    """The four ranks of stages 0 and 3 (as ``zerokit run --hostfile H --local`` builds them): each
    record's node and local rank are where DeepSpeed's launchers put it (node = rank // 2), and every
    rank's measured model states equal ``rank_states``, the estimate for that rank, exactly."""
    assert [s.zero.stage for s in CLI_SETUPS] == [0, 3]
    assert {(s.cluster.nodes, s.cluster.gpus_per_node) for s in CLI_SETUPS} == {(2, 2)}
    for setup in CLI_SETUPS:
        rows = local_nodes_run.of([setup], steps=(2,))
        assert {r["status"] for r in rows} == {"ok"}
        placed = sorted((r["rank"], r["node_rank"], r["local_rank"], r["world_size"]) for r in rows)
        assert placed == [(0, 0, 0, 4), (1, 0, 1, 4), (2, 1, 0, 4), (3, 1, 1, 4)]
        for r in rows:
            predicted = rank_states(setup, r["rank"])["device"]
            assert {k: r["measured"][k] for k in predicted} == predicted, (setup.label, r["rank"])
            for k in ("parameters", "gradients", "optimizer_states"):
                assert r["measured"][k] == r["estimate"][k], (setup.label, r["rank"], k)
    # stage 3 partitions the states over the 4 ranks: each holds less than at stage 0
    z0, z3 = (local_nodes_run.of([s], steps=(2,))[0]["measured"] for s in CLI_SETUPS)
    assert z3["optimizer_states"] * 4 == z0["optimizer_states"]


def test_zerokit_run_hostfile_local_runs_four_ranks_as_two_nodes(
    replay_local_nodes, tmp_path, monkeypatch, capsys
):
    """``zerokit run --hostfile H --local --stages 0,3 --nprocs 2`` (two hosts): the sweep goes to two
    simulated nodes of 2 ranks (the launch replayed from the shared one), the JSON has a row per
    configuration and node with its ranks, model states beside the estimate and bytes sent inside and
    across nodes; the text summary prints the same per node."""
    monkeypatch.setattr(cli, "GROUPS", (cli.run,))
    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), tmp_path / "hostfile")
    argv = [*RUN_FLAGS, "--hostfile", str(hostfile), "--local", "--runs-dir", str(tmp_path / "runs")]
    assert cli.main([*argv, "--no-progress", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ((nodes, labels),) = replay_local_nodes
    assert (nodes.names, nodes.local, labels) == (
        ("localhost", "127.0.0.1"),
        True,
        ["z0 bf16 mb2", "z3 bf16 mb2"],
    )
    assert [c["status"] for c in out["configs"]] == ["ok", "ok"]
    rows = [(n["label"], n["node_rank"], n["host"], n["ranks"], n["local_ranks"]) for n in out["nodes"]]
    assert rows == [
        ("z0 bf16 mb2", 0, "localhost", [0, 1], [0, 1]),
        ("z0 bf16 mb2", 1, "127.0.0.1", [2, 3], [0, 1]),
        ("z3 bf16 mb2", 0, "localhost", [0, 1], [0, 1]),
        ("z3 bf16 mb2", 1, "127.0.0.1", [2, 3], [0, 1]),
    ]
    for n in out["nodes"]:
        assert n["model_states_bytes"] == n["estimate_model_states_bytes"] > 0
        # no group of stages 0 or 3 stays inside a node here: every collective crosses them
        assert n["intra_wire_bytes"] == n["estimate_intra_wire_bytes"] == 0 and n["inter_wire_bytes"] > 0
        # measured beside modelled: the bytes each rank sent across nodes are comm_by_scope's within 1 %
        # (stage 0 exactly; stage 3 sent 0.3 % more here)
        assert abs(n["inter_wire_bytes"] / n["estimate_inter_wire_bytes"] - 1) < 0.01, n
    # the second run resumes: nothing launches again
    assert cli.main([*argv, "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert len(replay_local_nodes) == 1
    assert "per node: its ranks' model states" in text
    line = next(t for t in text.splitlines() if t.startswith("z3 bf16 mb2") and "127.0.0.1" in t)
    assert line.split()[3:6] == ["1", "127.0.0.1", "2,3"]


def _sleeper(seconds: float) -> list[str]:
    return [sys.executable, "-c", f"import time; print('up', flush=True); time.sleep({seconds})"]


def test_a_failing_node_stops_the_others_and_is_named():
    """Node 1's launcher fails at once (as one whose host cannot be reached): node 0, which would wait
    for it, is stopped within a second or two, and node 1 is the one named."""
    failing = [sys.executable, "-c", "import sys; print('ssh: connect to host: refused'); sys.exit(255)"]
    start = time.monotonic()
    done = run_together([_sleeper(60), failing], worker_env(1), 120, on_line=lambda line: None)
    assert time.monotonic() - start < 15
    assert (done.rc, done.rcs, done.failed_node) == (255, (CANCEL_RC, 255), 1)
    assert "--- node 1:\nssh: connect to host: refused" in done.output
    # the watchdog: nothing hangs past the deadline, and no node is blamed for a hang
    start = time.monotonic()
    done = run_together([_sleeper(60), _sleeper(60)], worker_env(1), 120, deadline=lambda: start + 2)
    assert time.monotonic() - start < 15
    assert (done.rc, done.failed_node) == (TIMEOUT_RC, None)
    assert TIMEOUT_RC in done.rcs and set(done.rcs) <= {
        TIMEOUT_RC,
        CANCEL_RC,
    }  # the first one stops the other


class _NodeOneNeverStarts(Nodes):
    """Two simulated nodes whose second launcher exits at once: a node that never starts."""

    def launch(self, script, script_args, timeout_s, on_line=None, *, deadline=None, cancel=None):
        failing = [sys.executable, "-c", "import sys; print('node 1: no route to host'); sys.exit(255)"]
        return run_together(
            [_sleeper(60), failing], worker_env(1), timeout_s, on_line, deadline=deadline, cancel=cancel
        )


def test_a_node_that_never_starts_ends_as_records_naming_it(tmp_path):
    """``run_sweep`` over nodes whose node 1 never starts: the configuration under way gets an error
    record naming node 1 and its host, the others one saying they did not run; nothing is left running."""
    nodes = _NodeOneNeverStarts(tmp_path / "hostfile", ("localhost", "127.0.0.1"), 2, local=True)
    start = time.monotonic()
    results = run_sweep(
        CLI_SETUPS, sweep="s", runs_dir=tmp_path, nprocs=2, nodes=nodes, progress=False, timeout_s=30
    )
    assert time.monotonic() - start < 30
    errors = [(r["label"], r["status"], r["error"].splitlines()[0]) for r in results.records]
    assert errors == [
        ("z0 bf16 mb2", "error", "node 1 (127.0.0.1): launch exited with status 255; last output:"),
        (
            "z3 bf16 mb2",
            "error",
            "not run: the launch failed before it (node 1 (127.0.0.1): launch exited with status 255)",
        ),
    ]
    assert "node 1: no route to host" in results.records[0]["error"]


def test_the_multi_node_runner_command_is_deepspeeds(tmp_path, monkeypatch):
    """Without --local the hostfile's nodes are reached by DeepSpeed's runner from this node; its command
    line parses in DeepSpeed's own parser, and --include selects the hosts DeepSpeed would."""
    from deepspeed.launcher.runner import parse_args

    from kit.cli.args import nodes_from_args

    hostfile = write_hostfile(make_hosts(["gpu-a", "gpu-b", "gpu-c"], 4), tmp_path / "hostfile")
    parser = build_parser()

    def nodes(*flags: str) -> Nodes:
        return nodes_from_args(parser.parse_args(["run", "--hostfile", str(hostfile), *flags]))

    plain = nodes("--nprocs", "4", "--nodes", "2", "--master-port", "29600")
    assert (plain.names, plain.local, plain.backend) == (("gpu-a", "gpu-b"), False, "pdsh")
    args = parse_args(plain.runner_argv("kit.ranks.worker", ["--spec", "s.json"])[1:])
    assert (args.hostfile, args.master_addr, args.master_port, args.launcher) == (
        str(hostfile),
        "gpu-a",
        29600,
        "pdsh",
    )
    assert (args.num_nodes, args.num_gpus, args.module, args.user_script, args.user_args) == (
        2,
        4,
        True,
        "kit.ranks.worker",
        ["--spec", "s.json"],
    )
    picked = nodes(
        "--nprocs", "4", "--include", "gpu-b@gpu-c", "--launcher", "openmpi", "--master-addr", "gpu-b"
    )
    assert picked.names == ("gpu-b", "gpu-c")
    args = parse_args(picked.runner_argv("kit.ranks.worker", [])[1:])
    assert (args.include, args.launcher, args.master_addr, args.num_nodes, args.num_gpus) == (
        "gpu-b@gpu-c",
        "openmpi",
        "gpu-b",
        -1,
        -1,
    )  # DeepSpeed refuses --num_nodes / --num_gpus beside --include


@pytest.mark.parametrize(
    "flags, message",
    [
        (
            ["--nprocs", "4"],
            "nprocs: 4 ranks per node need at least 4 slots on every host, but localhost has 2",
        ),
        (["--nodes", "3"], "nodes: the hostfile has 2 hosts, got --nodes 3"),
        (
            ["--include", "localhost:0"],
            "nprocs: 2 ranks per node need exactly 2 slots on every host, but "
            "localhost has 1 after --include/--exclude",
        ),
        (["--include", "gpu-z"], "include: Hostname 'gpu-z' not found in hostfile"),
        (
            ["--include", "localhost", "--exclude", "127.0.0.1"],
            "include: give --include or --exclude, not both",
        ),
        (["--exclude", "localhost@127.0.0.1"], "hostfile: no host left after --include/--exclude"),
        (["--launcher", "torchrun"], "launcher: with --hostfile choose one of pdsh, openmpi, slurm"),
        (["--master-addr", "10.0.0.9"], "master_addr: '10.0.0.9' is not a host in the hostfile"),
        (["--no-hostfile", "--local"], "local: runs across a --hostfile's nodes; give --hostfile"),
        (
            ["--no-hostfile", "--launcher", "slurm"],
            "launcher: slurm reaches a --hostfile's nodes; give --hostfile",
        ),
        (
            ["--no-hostfile", "--launcher", "mpirun"],
            "launcher: choose torchrun or deepspeed on this machine, got 'mpirun'",
        ),
    ],
)
def test_hostfile_and_cluster_size_are_checked_before_launch(tmp_path, monkeypatch, capsys, flags, message):
    monkeypatch.setattr(cli, "GROUPS", (cli.run, cli.tune))
    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), tmp_path / "hostfile")
    given = [] if "--no-hostfile" in flags else ["--hostfile", str(hostfile)]
    flags = [f for f in flags if f != "--no-hostfile"]
    for command in ("run", "tune"):
        rc = cli.main([command, *given, *flags, "--runs-dir", str(tmp_path / "runs"), "--json"])
        out, err = capsys.readouterr()
        assert (rc, out) == (2, "")
        assert err.startswith(f"zerokit {command}: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "runs").exists()  # nothing launched


def test_zerokit_tune_hostfile_local_ranks_candidates_run_as_two_nodes(
    replay_local_nodes, tmp_path, monkeypatch, capsys
):
    """``zerokit tune --hostfile H --local``: the candidates are sized for 2 nodes x 2 ranks, run there
    (the launch replayed from the shared one: the same configurations as ``zerokit run``'s) and ranked."""
    monkeypatch.setattr(cli, "GROUPS", (cli.tune,))
    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), tmp_path / "hostfile")
    argv = ["tune", "--stages", "0,3", "--offload", "none", "--micro-batches", "2", "--nprocs", "2"]
    argv += ["--steps", "2", "--warmup", "1", "--hostfile", str(hostfile), "--local"]
    rc = cli.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--no-progress", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    ((nodes, labels),) = replay_local_nodes
    assert nodes.names == ("localhost", "127.0.0.1") and labels == ["z0 bf16 mb2", "z3 bf16 mb2"]
    ranked = sorted((row["rank"], row["label"], row["status"]) for row in out["candidates"])
    assert [(status, label) for _, label, status in ranked] == [("ok", "z0 bf16 mb2"), ("ok", "z3 bf16 mb2")]
    assert {r for r, _, _ in ranked} == {1, 2}
    best = Setup.model_validate(out["best"]["setup"])
    assert (best.cluster.nodes, best.cluster.gpus_per_node, out["best"]["label"]) == (2, 2, ranked[0][1])


def test_an_unreachable_node_through_deepspeeds_runner_is_named(tmp_path, monkeypatch, capsys):
    """``zerokit run --hostfile H`` without --local: DeepSpeed's runner tries the hosts (``.invalid``
    names never resolve), fails before any rank starts, and the records name the node; no rank ran."""
    monkeypatch.setattr(cli, "GROUPS", (cli.run,))
    hostfile = write_hostfile(make_hosts(["gpu-a.invalid", "gpu-b.invalid"], 2), tmp_path / "hostfile")
    argv = ["run", "--stages", "0,3", "--nprocs", "2", "--hostfile", str(hostfile), "--timeout", "60"]
    start = time.monotonic()
    assert cli.main([*argv, "--runs-dir", str(tmp_path / "runs"), "--no-progress", "--json"]) == 0
    assert time.monotonic() - start < 60
    out = json.loads(capsys.readouterr().out)
    errors = [(c["label"], c["status"], c["error"].splitlines()[0]) for c in out["configs"]]
    assert errors == [
        ("z0 bf16 mb2", "error", "node 0 (gpu-a.invalid): launch exited with status 1; last output:"),
        (
            "z3 bf16 mb2",
            "error",
            "not run: the launch failed before it (node 0 (gpu-a.invalid): launch exited with status 1)",
        ),
    ]
    assert "host=gpu-a.invalid was not reachable via ssh" in out["configs"][0]["error"]
    assert out["nodes"] == []  # no rank recorded a step


def test_a_rank_killed_on_node_1_ends_as_a_record_naming_node_1(tmp_path):
    """Rank 3, on the second of 2 simulated nodes, exits at the start of its configuration (the
    ``die-last`` test fault): its node's launcher ends first, the other node is stopped, the record
    names node 1 and its host, and no rank of the launch is left running."""
    from pathlib import Path

    from kit.run.local_nodes import local_nodes

    setup = ZERO2.replace(zero={"stage": 0})
    start = time.monotonic()
    results = run_sweep(
        [setup], sweep="die", runs_dir=tmp_path, nprocs=2, nodes=local_nodes(2, 2, tmp_path / "nodes"),
        steps=1, warmup=1, faults={0: "die-last"}, progress=False, timeout_s=60,
    )  # fmt: skip
    assert time.monotonic() - start < 120
    parent = [r for r in results.records if r["rank"] is None]
    assert [(r["status"], r["error"].splitlines()[0]) for r in parent] == [
        ("error", "node 1 (127.0.0.1): launch exited with status 3; last output:")
    ]
    assert not [r for r in results.records if r["status"] == "ok"]
    spec = str(tmp_path / "die")
    left = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if spec in cmdline.read_bytes().decode(errors="replace"):
                left.append(cmdline.parent.name)
        except OSError:
            continue
    assert left == []


def test_the_comparison_panel_runs_across_a_hostfiles_nodes(replay_local_nodes, tmp_path):
    """The comparison panel given a hostfile (two simulated nodes of 2 ranks): its configurations span
    both nodes, the sweep launches on them (replayed from the shared local-node launch), and the per-node
    table puts each node's ranks, model states and bytes sent across nodes beside the estimate."""
    from kit.lab.comparison_panel import ComparisonPanel, nodes_html
    from kit.run.local_nodes import per_node
    from tests.conftest import NODE_STEPS, NODE_WARMUP

    hostfile = write_hostfile(make_hosts(["localhost", "127.0.0.1"], 2), tmp_path / "hostfile")
    panel = ComparisonPanel(
        CLI_SETUPS[0], stages=(0, 3), nprocs=2, steps=NODE_STEPS, warmup=NODE_WARMUP, hostfile=hostfile,
        runs_dir=tmp_path / "runs", sweep="panel",
    )  # fmt: skip
    assert [s.cluster.nodes for s in panel.setups] == [2, 2] and panel.setups == CLI_SETUPS
    assert panel.message.value.startswith("2 configurations, 2 nodes x 2 ranks")
    results = panel.run()
    ((nodes, labels),) = replay_local_nodes
    assert (nodes.names, nodes.local, labels) == (
        ("localhost", "127.0.0.1"),
        True,
        ["z0 bf16 mb2", "z3 bf16 mb2"],
    )
    assert {r["status"] for r in results.records} == {"ok"}
    rows = per_node(results.records, nodes.names)
    assert [(r["label"], r["host"], r["ranks"]) for r in rows] == [
        ("z0 bf16 mb2", "localhost", [0, 1]), ("z0 bf16 mb2", "127.0.0.1", [2, 3]),
        ("z3 bf16 mb2", "localhost", [0, 1]), ("z3 bf16 mb2", "127.0.0.1", [2, 3]),
    ]  # fmt: skip
    assert panel.table.value.endswith(nodes_html(rows))
    # each row adds up to the configuration's total per rank, measured and estimated: no group of these
    # stays inside a node, so the world's ring factor prices every collective (with hpZ's in-node
    # all-gather the row prices it on its 2 ranks: tests/test_zeropp.py)
    last = {
        (r["label"], r["rank"]): r
        for r in sorted(results.records, key=lambda r: r["step"])
        if r["rank"] is not None
    }
    for r in rows:
        mine = [last[(r["label"], rank)] for rank in r["ranks"]]
        assert r["wire_bytes"] == r["intra_wire_bytes"] + r["inter_wire_bytes"]
        assert {m["comm_wire_bytes"] for m in mine} == {r["wire_bytes"]}, r
        assert {m["estimate_comm_wire_bytes"] for m in mine} == {r["estimate_wire_bytes"]}
        assert r["estimate_wire_bytes"] == r["estimate_intra_wire_bytes"] + r["estimate_inter_wire_bytes"]
    for r in rows:
        html = nodes_html([r])
        assert f">{r['host']}<" in html and f">{', '.join(map(str, r['ranks']))}<" in html
        assert f">{number(r['model_states_bytes'] / 2**20)}<" in html  # memory in MiB, traffic in MB
        for key in ("inter_wire_bytes", "estimate_inter_wire_bytes"):
            assert f">{number(r[key] / 1e6)}<" in html, key
    with pytest.raises(ValueError, match="^nprocs: 3 ranks per node need at least 3 slots on every host"):
        ComparisonPanel(CLI_SETUPS[0], nprocs=3, hostfile=hostfile)
