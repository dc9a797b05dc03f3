"""Hostfiles, launch commands, network presets and the hostfile / launch-cmd CLI (no launches).

Commands are checked as exact strings and by parsing them with DeepSpeed's and torchrun's own
argument parsers; hostfiles and .deepspeed_env against DeepSpeed's launcher code that reads them.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from kit import cli
from kit.scaleout import commands, network
from kit.scaleout.hostfile import (
    Host,
    HostfileError,
    check_cluster,
    check_master,
    format_hostfile,
    make_hosts,
    parse_hostfile,
    read_hostfile,
    write_hostfile,
)
from kit.schema import ModelSpec, Setup

REPO = Path(__file__).resolve().parent.parent

MODEL = ModelSpec(params=10**9, largest_layer_params=10**8)
ONE_NODE = Setup(model=MODEL, cluster={"nodes": 1, "gpus_per_node": 8}, batch={"micro_batch": 2})
TWO_NODES = Setup(
    model=MODEL, cluster={"nodes": 2, "gpus_per_node": 8}, zero={"stage": 3}, batch={"micro_batch": 2}
)

GOOD = """\
# two nodes
alice@node-1 slots=8

node-2   slots=8   # spare
"""


def test_parse_hostfile_matches_deepspeeds_parser():
    from deepspeed.launcher.runner import _parse_hostfile

    hosts = parse_hostfile(GOOD)
    assert hosts == [Host("node-1", 8, "alice"), Host("node-2", 8)]
    # DeepSpeed keys its resource pool by the host as written (user@host for pdsh).
    assert dict(_parse_hostfile(GOOD.splitlines())) == {"alice@node-1": 8, "node-2": 8}
    assert format_hostfile(hosts) == "alice@node-1 slots=8\nnode-2 slots=8\n"
    assert dict(_parse_hostfile(format_hostfile(hosts).splitlines())) == {"alice@node-1": 8, "node-2": 8}


@pytest.mark.parametrize(
    "text, message",
    [
        ("node1 slots=8\nnode2\n", "hostfile:2: expected '[user@]host slots=N', got 'node2'"),
        ("# c\n\nnode1 slots=0\n", "hostfile:3: slots must be >= 1 (the node's GPU count), got 0"),
        (
            "node1 slots=8\nnode2 slots=8\nnode1 slots=4\n",
            "hostfile:3: duplicate host 'node1' (first on line 1)",
        ),
        ("node1 slots=8 gpus=8\n", "hostfile:1: expected '[user@]host slots=N', got 'node1 slots=8 gpus=8'"),
        ("node1 slots=-1\n", "hostfile:1: expected '[user@]host slots=N', got 'node1 slots=-1'"),
        ("# nothing\n\n", "hostfile: no hosts (expected lines like 'node1 slots=8')"),
    ],
)
def test_hostfile_errors_name_the_line(text, message):
    with pytest.raises(HostfileError) as error:
        parse_hostfile(text)
    assert str(error.value) == message


def test_hostfile_checks_and_files(tmp_path):
    hosts = make_hosts(["node-1", "bob@node-2"], 4, user="alice")
    assert hosts == [Host("node-1", 4, "alice"), Host("node-2", 4, "bob")]
    path = write_hostfile(hosts, tmp_path / "hostfile")
    assert read_hostfile(path) == hosts
    check_master(hosts, "node-1")
    with pytest.raises(
        HostfileError, match=r"master_addr: '10.0.0.1' is not a host in the hostfile \(node-1, node-2\)"
    ):
        check_master(hosts, "10.0.0.1")
    check_cluster(hosts, 2, 4)
    with pytest.raises(HostfileError, match="hostfile: lists 2 hosts but the setup has nodes=3"):
        check_cluster(hosts, 3, 4)
    with pytest.raises(HostfileError, match="hostfile: node-1 has slots=4 but the setup has gpus_per_node=8"):
        check_cluster(hosts, 2, 8)
    (tmp_path / "bad").write_text("node-1 slots=4\nnode 2 slots=4\n")
    with pytest.raises(HostfileError, match=f"{tmp_path / 'bad'}:2: expected"):
        read_hostfile(tmp_path / "bad")


def test_single_node_deepspeed_command_exact_and_parsed():
    from deepspeed.launcher.runner import parse_args

    argv = commands.deepspeed_command(ONE_NODE, "train.py", ["--tag", "a b"])
    assert (
        commands.shell_line(argv)
        == "deepspeed --num_gpus 8 train.py --tag 'a b' --deepspeed_config ds_config.json"
    )
    args = parse_args(argv[1:])
    assert (args.num_gpus, args.user_script, args.user_args) == (8, "train.py", argv[4:])


@pytest.mark.parametrize("launcher", ["pdsh", "openmpi", "slurm"])
def test_multi_node_deepspeed_command(launcher):
    from deepspeed.launcher.runner import parse_args

    argv = commands.deepspeed_command(
        TWO_NODES, "train.py", hostfile="hostfile", master_addr="node-1", master_port=29600, launcher=launcher
    )
    expected = "deepspeed --hostfile hostfile --master_addr node-1 --master_port 29600"
    expected += "" if launcher == "pdsh" else f" --launcher {launcher}"
    assert commands.shell_line(argv) == expected + " train.py --deepspeed_config ds_config.json"
    args = parse_args(argv[1:])
    assert (args.hostfile, args.master_addr, args.master_port, args.launcher) == (
        "hostfile",
        "node-1",
        29600,
        launcher,
    )
    assert (args.user_script, args.user_args) == ("train.py", ["--deepspeed_config", "ds_config.json"])


def test_multi_node_command_errors():
    with pytest.raises(ValueError, match="launcher: choose one of pdsh, openmpi, slurm, got 'mpich'"):
        commands.deepspeed_command(TWO_NODES, "t.py", hostfile="h", master_addr="a", launcher="mpich")
    with pytest.raises(ValueError, match="hostfile: a 2-node launch needs a hostfile and a master address"):
        commands.deepspeed_command(TWO_NODES, "t.py")


def test_torchrun_command_exact_and_parsed():
    from torch.distributed.run import get_args_parser

    argv = commands.torchrun_command(TWO_NODES, "train.py", ["--x", "1"], master_addr="node-1", node_rank=1)
    assert commands.shell_line(argv) == (
        "torchrun --nnodes 2 --nproc_per_node 8 --node_rank 1 --rdzv_backend c10d "
        "--rdzv_endpoint node-1:29500 train.py --x 1 --deepspeed_config ds_config.json"
    )
    args = get_args_parser().parse_args(argv[1:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("2", "8", 1)
    assert (args.rdzv_backend, args.rdzv_endpoint, args.training_script) == (
        "c10d",
        "node-1:29500",
        "train.py",
    )
    assert args.training_script_args == ["--x", "1", "--deepspeed_config", "ds_config.json"]


def test_sbatch_script_exact():
    assert commands.sbatch_script(TWO_NODES, "train.py", interface="ib0") == (
        "#!/bin/bash\n"
        "#SBATCH --job-name=zerokit\n"
        "#SBATCH --nodes=2\n"
        "#SBATCH --ntasks-per-node=1\n"
        "#SBATCH --gpus-per-node=8\n"
        "#SBATCH --exclusive\n"
        "#SBATCH --time=01:00:00\n"
        "# z3 bf16 mb2 on 2 x 8 H100-SXM-80GB, infiniband\n"
        "# submit from the folder with ds_config.json: sbatch sbatch.sh\n"
        "set -euo pipefail\n"
        "export NCCL_SOCKET_IFNAME=ib0  # NCCL's socket bootstrap uses ib0\n"
        "export NCCL_IB_DISABLE=0  # use InfiniBand verbs for NCCL\n"
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)\n'
        "MASTER_PORT=29500\n"
        'srun torchrun --nnodes 2 --nproc_per_node 8 --node_rank "$SLURM_NODEID" --rdzv_backend c10d '
        '--rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv_id "$SLURM_JOB_ID" train.py '
        "--deepspeed_config ds_config.json\n"
    )


def test_shell_line_quotes_but_keeps_variables():
    argv = ["echo", "a b", "it's", "$HOME", "--volume=$PWD:$PWD", "$(rm -rf x)", "x;y"]
    line = commands.shell_line(argv)
    assert line == """echo 'a b' 'it'"'"'s' "$HOME" "--volume=$PWD:$PWD" '$(rm -rf x)' 'x;y'"""
    assert shlex.split(line) == argv


def test_network_presets():
    ib = network.network(TWO_NODES)
    assert {k: s.value for k, s in ib.env.items()} == {
        "NCCL_SOCKET_IFNAME": "^docker0,lo",
        "NCCL_IB_DISABLE": "0",
    }
    assert [s.value for s in ib.docker] == [
        "--gpus=all",
        "--network=host",
        "--shm-size=64g",
        "--ulimit=memlock=-1:-1",
        "--cap-add=IPC_LOCK",
        "--device=/dev/infiniband",
    ]
    assert ib.warning is None and all(s.reason for s in ib.docker)
    efa = network.network(TWO_NODES.replace(cluster={"interconnect": "efa"}), interface="ens5")
    assert {k: s.value for k, s in efa.env.items()} == {
        "NCCL_SOCKET_IFNAME": "ens5",
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_PROTO": "simple",
    }
    eth = network.network(TWO_NODES.replace(cluster={"interconnect": "ethernet"}))
    assert eth.env["NCCL_IB_DISABLE"].value == "1"
    assert eth.warning.startswith("plain Ethernet: NCCL over TCP")
    assert "--cap-add=IPC_LOCK" not in [s.value for s in eth.docker]


def test_deepspeed_env_reads_back_through_deepspeeds_launcher():
    from deepspeed.launcher.multinode_runner import MultiNodeRunner

    text = network.deepspeed_env(TWO_NODES.replace(cluster={"interconnect": "efa"}))
    assert (
        text
        == "NCCL_SOCKET_IFNAME=^docker0,lo\nFI_PROVIDER=efa\nFI_EFA_USE_DEVICE_RDMA=1\nNCCL_PROTO=simple\n"
    )
    runner = SimpleNamespace(exports={})
    for line in text.splitlines(keepends=True):  # as deepspeed/launcher/runner.py reads the file
        key, value = line.split("=", maxsplit=1)
        MultiNodeRunner.add_export(runner, key, value)
    assert runner.exports == {
        "NCCL_SOCKET_IFNAME": '"^docker0,lo"',
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_PROTO": "simple",
    }


def test_docker_command_and_launch_script():
    cmd = commands.docker_command(ONE_NODE, "img:1", ["deepspeed", "--num_gpus", "8", "t.py"])
    assert commands.shell_line(cmd) == (
        "docker run --rm --gpus=all --network=host --shm-size=64g --ulimit=memlock=-1:-1 --cap-add=IPC_LOCK "
        '--device=/dev/infiniband "--volume=$PWD:$PWD" "--workdir=$PWD" img:1 deepspeed --num_gpus 8 t.py'
    )
    assert commands.launch_script(["deepspeed", "t.py"]) == (
        '#!/bin/bash\nset -euo pipefail\ncd "$(dirname "$0")"\ndeepspeed t.py\n'
    )


@pytest.fixture
def zerokit(monkeypatch, capsys):
    """Run ``zerokit`` in-process with only this module's command group; returns (rc, stdout, stderr)."""
    monkeypatch.setattr(cli, "GROUPS", (cli.launch,))

    def run(*argv: str) -> tuple[int, str, str]:
        rc = cli.main(list(argv))
        out, err = capsys.readouterr()
        return rc, out, err

    return run


def test_cli_hostfile_write_and_check(zerokit, tmp_path):
    path = tmp_path / "hostfile"
    rc, out, err = zerokit("hostfile", "--hosts", "n1,n2,n3", "--slots", "4", "--out", str(path), "--json")
    assert (rc, err) == (0, "")
    result = json.loads(out)
    assert (result["nodes"], result["world_size"], result["master_addr"]) == (3, 12, "n1")
    assert path.read_text() == "n1 slots=4\nn2 slots=4\nn3 slots=4\n"
    rc, out, _ = zerokit("hostfile", "--check", str(path), "--master-addr", "n2", "--json")
    assert rc == 0 and json.loads(out)["hosts"][1] == {"host": "n2", "slots": 4, "user": None}


@pytest.mark.parametrize(
    "argv, message",
    [
        (
            ["hostfile", "--check", "{bad}"],
            "zerokit hostfile: {bad}:2: slots must be >= 1 (the node's GPU count), got 0",
        ),
        (["hostfile", "--check", "{bad}", "--hosts", "a"], "zerokit hostfile: hostfile: give --hosts NAMES"),
        (
            ["hostfile", "--hosts", "a,b", "--master-addr", "c"],
            "zerokit hostfile: master_addr: 'c' is not a host",
        ),
        (
            ["hostfile", "--hosts", "a", "--slots", "0"],
            "zerokit hostfile: slots: must be >= 1 (GPUs per host), got 0",
        ),
        (["hostfile", "--check", "{missing}"], "zerokit hostfile: {missing}: file not found"),
        (
            ["launch-cmd", "--params", "1e9", "--nodes", "2"],
            "zerokit launch-cmd: hostfile: a 2-node launch needs --hostfile FILE or --hosts h1,h2,...",
        ),
        (
            ["launch-cmd", "--params", "1e9", "--nodes", "2", "--hosts", "a,b,c"],
            "zerokit launch-cmd: hostfile: lists 3 hosts but the setup has nodes=2",
        ),
        (
            ["launch-cmd", "--params", "1e9", "--nodes", "2", "--hosts", "a,b", "--launcher", "ssh"],
            "zerokit launch-cmd: launcher: choose one of pdsh, openmpi, slurm, got 'ssh'",
        ),
        (
            ["launch-cmd", "--params", "1e9", "--interconnect", "carrier-pigeon"],
            "zerokit launch-cmd: cluster.interconnect: Input should be 'infiniband', 'efa' or 'ethernet'",
        ),
        (
            ["launch-cmd", "--params", "1e9", "--stage", "5"],
            "zerokit launch-cmd: stage: ZeRO stages are 0-3 (or ddp, fsdp, fsdp-grad-op), got '5'",
        ),
    ],
)
def test_cli_bad_input_exits_2_with_one_line(zerokit, tmp_path, argv, message):
    (tmp_path / "bad").write_text("n1 slots=8\nn2 slots=0\n")
    paths = {"bad": str(tmp_path / "bad"), "missing": str(tmp_path / "missing")}
    rc, out, err = zerokit(*[a.format(**paths) for a in argv])
    assert (rc, out) == (2, "")
    assert err.startswith(message.format(**paths)) and err.count("\n") == 1


def test_cli_launch_cmd_writes_the_launch_folder(zerokit, tmp_path):
    out_dir = tmp_path / "launch"
    rc, out, err = zerokit(
        *("launch-cmd", "--params", "1e9", "--nodes", "2", "--gpus-per-node", "4", "--stage", "3"),
        *("--micro-batch", "2", "--hosts", "n1,n2", "--interconnect", "efa", "--script", "/w/train.py"),
        *("--script-args", "--steps 10", "--out", str(out_dir), "--json"),
    )
    assert (rc, err) == (0, "")
    result = json.loads(out)
    assert result["commands"]["deepspeed"] == (
        "deepspeed --hostfile hostfile --master_addr n1 --master_port 29500 /w/train.py --steps 10 "
        "--deepspeed_config ds_config.json"
    )
    assert result["commands"]["torchrun"][1].startswith(
        "torchrun --nnodes 2 --nproc_per_node 4 --node_rank 1 "
    )
    assert sorted(p.name for p in out_dir.iterdir()) == [
        ".deepspeed_env",
        "ds_config.json",
        "hostfile",
        "launch.sh",
        "sbatch.sh",
    ]
    ds_config = json.loads((out_dir / "ds_config.json").read_text())
    assert ds_config == result["ds_config"]
    assert (ds_config["train_batch_size"], ds_config["zero_optimization"]["stage"]) == (16, 3)
    assert (out_dir / "hostfile").read_text() == "n1 slots=4\nn2 slots=4\n"
    assert (out_dir / ".deepspeed_env").read_text().splitlines()[1] == "FI_PROVIDER=efa"
    assert (out_dir / "launch.sh").read_text().endswith(result["commands"]["deepspeed"] + "\n")
    assert (out_dir / "launch.sh").stat().st_mode & 0o111


def test_cli_launch_cmd_subprocess_prints_one_json_object():
    proc = subprocess.run(
        [sys.executable, "-m", "kit", "launch-cmd", "--params", "7e9", "--gpus-per-node", "2", "--json"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert (
        result["commands"]["deepspeed"] == "deepspeed --num_gpus 2 train.py --deepspeed_config ds_config.json"
    )
    assert result["setup"]["batch"] == {
        "micro_batch": 1,
        "grad_accum": 1,
        "train_batch": 2,
        "seq_len": 2048,
        "schedule": [],
        "max_tokens": None,
    }
    assert result["files"] == {}


def test_cli_launch_cmd_with_an_existing_hostfile(zerokit, tmp_path):
    path = write_hostfile(make_hosts(["gpu-a", "gpu-b"], 2), tmp_path / "my hosts")
    base = ("launch-cmd", "--params", "1e9", "--nodes", "2", "--gpus-per-node", "2", "--hostfile", str(path))
    rc, out, err = zerokit(*base, "--launcher", "slurm", "--json")
    assert (rc, err) == (0, "")
    result = json.loads(out)
    assert result["commands"]["deepspeed"] == (
        f"deepspeed --hostfile {shlex.quote(str(path))} --master_addr gpu-a --master_port 29500 "
        "--launcher slurm train.py --deepspeed_config ds_config.json"
    )
    assert result["hosts"] == ["gpu-a slots=2", "gpu-b slots=2"]
    rc, out, err = zerokit(*base, "--gpus-per-node", "4")
    assert (
        rc == 2
        and err == "zerokit launch-cmd: hostfile: gpu-a has slots=2 but the setup has gpus_per_node=4\n"
    )
