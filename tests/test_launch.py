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
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)\n'
        "MASTER_PORT=29500\n"
        "export MASTER_ADDR MASTER_PORT\n"
        "# one task per node; the single quotes keep $SLURM_NODEID for each node's own shell\n"
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c 'torchrun --nnodes 2 --nproc_per_node 8 "
        '--node_rank "$SLURM_NODEID" --rdzv_backend c10d --rdzv_endpoint "$MASTER_ADDR:$MASTER_PORT" '
        """--rdzv_id "$SLURM_JOB_ID" train.py --deepspeed_config ds_config.json'\n"""
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


def test_expandable_segments_reach_every_ranks_environment(zerokit, tmp_path):
    """``zero.expandable_segments`` (``--expandable-segments``) sets PyTorch's allocator where every rank
    reads its environment: ``.deepspeed_env`` (read back as DeepSpeed's launcher does), the SLURM script's
    exports and the image's ENV; off, none of them names it."""
    from deepspeed.launcher.multinode_runner import MultiNodeRunner

    from kit.scaleout import image

    on = TWO_NODES.replace(zero={"expandable_segments": True})
    runner = SimpleNamespace(exports={})
    for line in network.deepspeed_env(on).splitlines(keepends=True):
        MultiNodeRunner.add_export(runner, *line.split("=", maxsplit=1))
    assert runner.exports["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert "\nexport PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # " in commands.sbatch_script(
        on, "t.py"
    )
    assert "ENV PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in image.dockerfile(on)
    off = (
        network.deepspeed_env(TWO_NODES),
        commands.sbatch_script(TWO_NODES, "t.py"),
        image.dockerfile(TWO_NODES),
    )
    assert not any("PYTORCH_CUDA_ALLOC_CONF" in text for text in off)
    out_dir = tmp_path / "launch"
    rc, _, err = zerokit(
        *("launch-cmd", "--params", "1e9", "--nodes", "2", "--stage", "3", "--expandable-segments"),
        *("--hosts", "n1,n2", "--script", "/w/train.py", "--out", str(out_dir)),
    )
    assert (rc, err) == (0, "")
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n" in (out_dir / ".deepspeed_env").read_text()


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
    monkeypatch.setattr(cli, "GROUPS", ("launch",))

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
        "README.md",
        "ds_config.json",
        "hostfile",
        "launch.sh",
    ]
    ds_config = json.loads((out_dir / "ds_config.json").read_text())
    assert ds_config == result["ds_config"]
    assert (ds_config["train_batch_size"], ds_config["zero_optimization"]["stage"]) == (16, 3)
    hostfile = (out_dir / "hostfile").read_text()
    assert hostfile.startswith(
        "# written by `zerokit launch-cmd --for deepspeed` (zero-kit) for z3 bf16 mb2 on"
    )
    assert (
        hostfile.endswith("\nn1 slots=4\nn2 slots=4\n")
        and read_hostfile(out_dir / "hostfile")[1].host == "n2"
    )
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
        "target_len": None,
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


# --- the files of the launchers people use (zerokit launch-cmd --for ...), read back by their own tools


@pytest.fixture
def launch_folder(zerokit, tmp_path):
    """``launch_folder(target, *flags)``: ``zerokit launch-cmd --for target ... --out DIR --json``,
    returning (DIR, the JSON result); every file but JSON says who wrote it and for which setup."""

    def make(target: str, *argv: str) -> tuple[Path, dict]:
        out_dir = tmp_path / target
        rc, out, err = zerokit("launch-cmd", "--for", target, *argv, "--out", str(out_dir), "--json")
        assert (rc, err) == (0, "")
        result = json.loads(out)
        assert result["for"] == target and set(result["files"]) == set(result["launcher_files"])
        note = f"written by `zerokit launch-cmd --for {target}` (zero-kit) for {result['label']} on "
        for name in result["files"]:
            text = (out_dir / name).read_text()
            assert text == result["launcher_files"][name]
            if name.endswith(".json") or name == ".deepspeed_env":
                assert note not in text  # no comment where the format has none
            else:
                assert note in text or note.capitalize() in text, name
        return out_dir, result

    return make


TWO_BY_TWO = ("--params", "1e9", "--nodes", "2", "--gpus-per-node", "2", "--stage", "3", "--micro-batch", "2")


@pytest.mark.parametrize("nodes", [1, 2])
def test_accelerate_config_loads_in_accelerates_own_loader_and_launcher(launch_folder, monkeypatch, nodes):
    """accelerate's ClusterConfig reads the YAML; ``accelerate launch``'s own argument handling turns it
    into DeepSpeed's command (parsed by DeepSpeed) and the environment whose DeepSpeedPlugin loads the
    setup's ds_config."""
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils import DeepSpeedPlugin
    from accelerate.utils.launch import prepare_deepspeed_cmd_env
    from deepspeed.launcher.runner import parse_args

    from kit.ds_config import to_ds_config
    from kit.run.launcher import free_port

    port = free_port()  # accelerate refuses a master port in use on machine rank 0
    hosts = ("--hosts", "n1,n2") if nodes == 2 else ()
    flags = (*TWO_BY_TWO[:2], "--nodes", str(nodes), *TWO_BY_TWO[4:], *hosts, "--master-port", str(port))
    out_dir, result = launch_folder("accelerate", *flags, "--script-args", "--steps 3")
    expected = {"README.md", "ds_config.json", "accelerate_config.yaml", "launch.sh"}
    assert set(result["files"]) == expected | ({"hostfile", ".deepspeed_env"} if nodes == 2 else set())
    config = ClusterConfig.from_yaml_file(out_dir / "accelerate_config.yaml")
    assert (config.distributed_type.value, config.num_machines, config.machine_rank) == (
        "DEEPSPEED",
        nodes,
        0,
    )
    assert (config.num_processes, config.main_process_port, config.mixed_precision) == (2 * nodes, port, None)
    assert config.deepspeed_config["deepspeed_config_file"] == "ds_config.json"
    assert config.deepspeed_config["zero3_init_flag"] is True
    if nodes == 2:
        assert config.main_process_ip == "n1"
        assert config.deepspeed_config["deepspeed_multinode_launcher"] == "pdsh"
        assert config.deepspeed_config["deepspeed_hostfile"] == "hostfile"

    line = (out_dir / "launch.sh").read_text().splitlines()[-1]
    assert line == "accelerate launch --config_file accelerate_config.yaml train.py --steps 3"
    monkeypatch.chdir(out_dir)  # launch.sh runs from its folder
    args = launch_command_parser().parse_args(shlex.split(line)[2:])
    args, defaults, precision_from_config = _validate_launch_command(args)
    assert args.use_deepspeed and not precision_from_config
    args.deepspeed_fields_from_accelerate_config = ",".join(defaults.deepspeed_config)  # as launch_command
    cmd, env = prepare_deepspeed_cmd_env(args)
    if nodes == 2:
        ds = parse_args(cmd[1:])
        assert (ds.hostfile, ds.launcher, ds.num_gpus, ds.master_addr, ds.master_port) == (
            "hostfile",
            "pdsh",
            2,
            "n1",
            port,
        )
        assert (ds.user_script, ds.user_args) == ("train.py", ["--steps", "3"])
    else:
        assert cmd is None and args.nproc_per_node == "2"
    for key, value in env.items():
        if key.startswith("ACCELERATE_"):
            monkeypatch.setenv(key, value)
    plugin = DeepSpeedPlugin()  # reads ACCELERATE_DEEPSPEED_CONFIG_FILE; refuses fields set twice
    loaded = dict(plugin.hf_ds_config.config)
    assert loaded.pop("steps_per_print") == float("inf")  # accelerate silences DeepSpeed's own printing
    written = to_ds_config(Setup.model_validate(result["setup"]))
    del written["steps_per_print"]
    assert loaded == written and plugin.zero_stage == 3


HF_MODEL = ModelSpec(params=10**9, largest_layer_params=10**8, hidden=1024, heads=8)


def test_hf_trainer_config_is_filled_by_transformers_to_the_setup(launch_folder, monkeypatch, tmp_path):
    """transformers parses launch.sh's flags into TrainingArguments (which builds HfTrainerDeepSpeedConfig
    from ds_config.json), and its trainer_config_process / _finalize fill every "auto" to the Setup's
    ds_config; a flag that disagreed with a written value would be refused."""
    from deepspeed.launcher.runner import parse_args
    from transformers import HfArgumentParser, TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig, unset_hf_deepspeed_config

    from kit.ds_config import read_ds_config, to_ds_config
    from kit.scaleout.launchers import hf_trainer_ds_config
    from kit.settings import hf_auto

    out_dir, result = launch_folder("hf-trainer", *TWO_BY_TWO, "--hosts", "n1,n2", "--grad-accum", "3")
    ds = parse_args(shlex.split((out_dir / "launch.sh").read_text().splitlines()[-1])[1:])
    assert (ds.hostfile, ds.master_addr) == ("hostfile", "n1")
    assert ds.user_args == [
        *("--per_device_train_batch_size", "2", "--gradient_accumulation_steps", "3"),
        *("--learning_rate", "0.0001", "--max_grad_norm", "1.0", "--bf16", "--deepspeed", "ds_config.json"),
    ]
    raw = json.loads((out_dir / "ds_config.json").read_text())
    assert {
        k: raw[k] for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_clipping")
    } == {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_clipping": "auto",
    }
    assert (raw["optimizer"]["params"]["lr"], raw["bf16"]["enabled"]) == ("auto", "auto")

    monkeypatch.chdir(out_dir)
    monkeypatch.setattr(TrainingArguments, "world_size", property(lambda self: 4))  # 2 nodes x 2 GPUs
    parser = HfArgumentParser(TrainingArguments)
    try:
        (args,) = parser.parse_args_into_dataclasses(
            args=[*ds.user_args, "--output_dir", str(tmp_path / "out"), "--use_cpu"]
        )
        hf = args.hf_deepspeed_config
        assert isinstance(hf, HfTrainerDeepSpeedConfig) and hf.is_zero3() and not hf.mismatches
        model = SimpleNamespace(config=SimpleNamespace(hidden_size=1024))
        hf.trainer_config_finalize(args, model, 10)
        filled = dict(hf.config)
    finally:
        unset_hf_deepspeed_config()
    setup = Setup.model_validate(result["setup"])
    written = to_ds_config(setup)
    assert filled.pop("steps_per_print") == float("inf") and written.pop("steps_per_print") == 100
    assert filled == written and written["train_batch_size"] == 2 * 2 * 2 * 3

    # the buckets go "auto" where the Setup's value is the Trainer's rule for the model's hidden size
    buckets = {"reduce_bucket_size": hf_auto("reduce_bucket_size", 1024)}
    buckets |= {"prefetch_bucket_size": hf_auto("stage3_prefetch_bucket_size", 1024)}
    buckets |= {"param_persistence_threshold": hf_auto("stage3_param_persistence_threshold", 1024)}
    sized = Setup(model=HF_MODEL, cluster={"gpus_per_node": 2}, zero={"stage": 3, **buckets})
    auto = hf_trainer_ds_config(sized)
    zero = auto["zero_optimization"]
    assert [zero[k] for k in ("reduce_bucket_size", "stage3_prefetch_bucket_size")] == ["auto", "auto"]
    assert zero["stage3_param_persistence_threshold"] == "auto"
    assert (
        zero["stage3_max_live_parameters"]
        == to_ds_config(sized)["zero_optimization"]["stage3_max_live_parameters"]
    )
    hf = HfTrainerDeepSpeedConfig(auto)
    try:
        hf.trainer_config_process(args)
        hf.trainer_config_finalize(args, model, 10)
        assert hf.config["zero_optimization"] == to_ds_config(sized)["zero_optimization"]
    finally:
        unset_hf_deepspeed_config()
    # the kit's own reader resolves the "auto" values back to the same Setup
    back, _ = read_ds_config(auto, model=HF_MODEL, cluster={"gpus_per_node": 2}, micro_batch=1)
    assert back.zero == sized.zero


def test_lightning_snippet_compiles_and_its_config_is_deepspeeds(launch_folder):
    """The snippet compiles; without Lightning (not a kit dependency) it still imports and its
    strategy() says how to install it; the config, completed as Lightning does, parses in DeepSpeed's
    config classes to the Setup's batch."""
    import importlib.util

    from kit.ds_config import to_ds_config, validate_ds_config

    out_dir, result = launch_folder("lightning", *TWO_BY_TWO, "--grad-accum", "2")
    assert set(result["files"]) == {"README.md", "ds_config.json", "lightning_strategy.py"}
    path = out_dir / "lightning_strategy.py"
    text = path.read_text()
    compile(text, str(path), "exec")
    assert "Lightning is not a dependency of zero-kit" in text
    assert "DeepSpeedStrategy(config=str(DS_CONFIG))" in text
    assert importlib.util.find_spec("lightning") is None  # what the guard is for, here
    spec = importlib.util.spec_from_file_location("lightning_strategy", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert out_dir / "ds_config.json" == module.DS_CONFIG
    assert module.TRAINER_OPTIONS == {
        "accelerator": "gpu",
        "devices": 2,
        "num_nodes": 2,
        "precision": "bf16-mixed",
        "accumulate_grad_batches": 2,
    }
    with pytest.raises(ImportError, match="zero-kit does not install: pip install lightning$"):
        module.strategy()
    config = json.loads(module.DS_CONFIG.read_text())
    assert "gradient_accumulation_steps" not in config  # Lightning refuses it there and sets it itself
    config["gradient_accumulation_steps"] = module.TRAINER_OPTIONS["accumulate_grad_batches"]
    parsed = validate_ds_config(config, world_size=4)
    setup = Setup.model_validate(result["setup"])
    assert (
        (parsed.train_batch_size, parsed.zero_optimization_stage) == (setup.batch.train_batch, 3) == (16, 3)
    )
    written = to_ds_config(setup)
    del written["train_batch_size"]
    assert config == written


def _fake_tools(folder: Path, **scripts: str) -> dict:
    """An environment whose PATH finds ``scripts`` (name -> bash body) first."""
    folder.mkdir()
    for name, body in scripts.items():
        (folder / name).write_text("#!/bin/bash\n" + body)
        (folder / name).chmod(0o755)
    return {"PATH": f"{folder}:/usr/bin:/bin", "HOME": str(folder)}


#: torchrun's stand-in: one line per call, its arguments as JSON
_ECHO_ARGS = """python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "$@"\n"""


def test_sbatch_runs_one_torchrun_per_node_with_that_nodes_rank(launch_folder, tmp_path):
    """sbatch.sh run by bash with SLURM's tools stood in for: srun starts the payload once per node with
    that node's SLURM_NODEID; each node's torchrun line parses in torchrun's parser with its own rank."""
    from torch.distributed.run import get_args_parser

    out_dir, result = launch_folder("slurm", *TWO_BY_TWO, "--script-args", "--tag 'a b'")
    assert set(result["files"]) == {"README.md", "ds_config.json", "sbatch.sh"}
    fake_srun = 'while [[ $1 == --* ]]; do shift; done\nfor n in 0 1; do SLURM_NODEID=$n "$@"; done\n'
    env = _fake_tools(
        tmp_path / "bin",
        srun=fake_srun,
        scontrol='printf "gpu-a\\ngpu-b\\n"\n',
        torchrun=_ECHO_ARGS,
    )
    env |= {"SLURM_JOB_NODELIST": "gpu-[a-b]", "SLURM_JOB_ID": "77"}
    done = subprocess.run(
        ["bash", "sbatch.sh"], cwd=out_dir, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    nodes = [get_args_parser().parse_args(json.loads(line)) for line in done.stdout.splitlines()]
    assert [(a.node_rank, a.rdzv_endpoint, a.rdzv_id, a.nproc_per_node) for a in nodes] == [
        (0, "gpu-a:29500", "77", "2"),
        (1, "gpu-a:29500", "77", "2"),
    ]
    assert nodes[1].training_script_args == ["--tag", "a b", "--deepspeed_config", "ds_config.json"]


def test_torchrun_script_runs_per_node_and_asks_for_its_rank(launch_folder, tmp_path):
    from torch.distributed.run import get_args_parser

    out_dir, result = launch_folder("torchrun", *TWO_BY_TWO, "--hosts", "n1,n2", "--interconnect", "efa")
    assert set(result["files"]) == {"README.md", "ds_config.json", "torchrun.sh"}
    env = _fake_tools(tmp_path / "bin", torchrun=_ECHO_ARGS + 'echo "FI_PROVIDER=$FI_PROVIDER"\n')
    done = subprocess.run(
        [str(out_dir / "torchrun.sh"), "1"], env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    argv, provider = done.stdout.splitlines()
    args = get_args_parser().parse_args(json.loads(argv))
    assert (args.nnodes, args.node_rank, args.rdzv_endpoint) == ("2", 1, "n1:29500")
    assert provider == "FI_PROVIDER=efa"  # the network preset exported on the node
    missing = subprocess.run(
        [str(out_dir / "torchrun.sh")], env=env, capture_output=True, text=True, timeout=30
    )
    assert missing.returncode != 0 and "give this node's rank: 0 on n1, 1 on n2" in missing.stderr


def test_launch_cmd_for_rejects_an_unknown_launcher(zerokit):
    rc, out, err = zerokit("launch-cmd", "--params", "1e9", "--for", "horovod")
    assert (rc, out) == (2, "")
    assert err == (
        "zerokit launch-cmd: for: choose one of deepspeed, torchrun, slurm, accelerate, hf-trainer, "
        "lightning, got 'horovod'\n"
    )


# --- the library call behind launch-cmd and the memory panel's command (kit.scaleout.bundle)


def test_bundle_is_what_launch_cmd_prints(zerokit, tmp_path):
    """``bundle(setup, LaunchRequest(...))`` for a 2-node setup: the commands as argument lists and shell
    lines, and ``to_dict`` the very object ``zerokit launch-cmd --json`` prints for the same request."""
    from kit.scaleout.bundle import LaunchRequest, bundle

    flags = ("--hosts", "n1,n2", "--interconnect", "efa", "--script-args", "--steps 10", "--docker")
    rc, out, err = zerokit("launch-cmd", *TWO_BY_TWO, *flags, "--json")
    assert (rc, err) == (0, "")
    printed = json.loads(out)
    setup = Setup.model_validate(printed["setup"])
    request = LaunchRequest(script_args=("--steps", "10"), hosts=("n1", "n2"), docker=True)
    made = bundle(setup, request)
    assert json.loads(json.dumps(made.to_dict(), default=str)) == printed
    assert made.deepspeed == [
        *("deepspeed", "--hostfile", "hostfile", "--master_addr", "n1", "--master_port", "29500"),
        *("train.py", "--steps", "10", "--deepspeed_config", "ds_config.json"),
    ]
    assert [argv[argv.index("--node_rank") + 1] for argv in made.torchrun] == ["0", "1"]
    assert made.shell_lines()["docker"].startswith("docker run --rm --gpus=all ")
    assert made.docker is not None and made.docker[-len(made.deepspeed) :] == made.deepspeed
    assert [h.line for h in made.hosts] == ["n1 slots=2", "n2 slots=2"] and made.master_addr == "n1"
    assert made.network.name == "efa" and "FI_PROVIDER=efa\n" in made.env_file
    assert made.registry == printed["registry"] and made.dockerfile == printed["dockerfile"]
    assert made.write() == {}  # no out: nothing written


def test_bundle_writes_its_folder_and_names_the_hostfile_copy(tmp_path):
    from kit.scaleout.bundle import LaunchRequest, bundle

    path = write_hostfile(make_hosts(["gpu-a", "gpu-b"], 8), tmp_path / "my hosts")
    here = bundle(TWO_NODES, LaunchRequest(hostfile=str(path)))
    assert here.deepspeed is not None and here.deepspeed[:3] == ["deepspeed", "--hostfile", str(path)]
    out = tmp_path / "launch"
    there = bundle(TWO_NODES, LaunchRequest(hostfile=str(path), out=str(out), docker=True))
    assert there.deepspeed is not None and there.deepspeed[:3] == ["deepspeed", "--hostfile", "hostfile"]
    written = there.write()
    assert list(written) == [*there.launcher_files, "Dockerfile", "run_container.sh"]
    assert sorted(p.name for p in out.iterdir()) == sorted(written)
    assert (out / "hostfile").read_text().endswith("\ngpu-a slots=8\ngpu-b slots=8\n")
    assert (out / "run_container.sh").stat().st_mode & 0o111 and not (
        out / "Dockerfile"
    ).stat().st_mode & 0o111
    assert there.to_dict(written)["files"] == {name: str(out / name) for name in written}


@pytest.mark.parametrize(
    "setup, request_fields, message",
    [
        (ONE_NODE, {"launcher": "ssh"}, "launcher: choose one of pdsh, openmpi, slurm, got 'ssh'"),
        (
            ONE_NODE,
            {"target": "horovod"},
            "for: choose one of deepspeed, torchrun, slurm, accelerate, hf-trainer, lightning, got 'horovod'",
        ),
        (TWO_NODES, {}, "hostfile: a 2-node launch needs --hostfile FILE or --hosts h1,h2,..."),
        (
            TWO_NODES,
            {"hosts": ("a", "b"), "hostfile": "h"},
            "hostfile: give --hostfile FILE or --hosts NAMES",
        ),
        (TWO_NODES, {"hosts": ("a", "b"), "master_addr": "c"}, "master_addr: 'c' is not a host"),
        (
            ONE_NODE,
            {"efa_installer": "1.0"},
            "efa-installer: the AWS EFA installer is for --interconnect efa",
        ),
        (
            ONE_NODE,
            {"registry": "r.io"},
            "registry: --registry and --base-image describe the image of --docker",
        ),
        (TWO_NODES, {"hosts_later": True, "out": "x"}, "out: a 2-node deepspeed folder names its hosts"),
    ],
)
def test_bundle_refuses_a_bad_request_in_one_line_naming_the_field(setup, request_fields, message):
    from kit.scaleout.bundle import LaunchRequest, bundle

    with pytest.raises(ValueError) as error:
        bundle(setup, LaunchRequest(**request_fields))
    assert str(error.value).startswith(message) and "\n" not in str(error.value)


def test_bundle_without_hosts_yet_is_the_memory_panels_command():
    """``hosts_later``: a multi-node command that names ``hostfile`` before it is written (the memory
    panel's), and no launch folder, whose files would name hosts nobody gave."""
    from kit.scaleout.bundle import LaunchRequest, bundle

    made = bundle(TWO_NODES, LaunchRequest(script="p.py", hosts_later=True, master_addr="$MASTER_ADDR"))
    assert made.shell_lines()["deepspeed"] == (
        'deepspeed --hostfile hostfile --master_addr "$MASTER_ADDR" --master_port 29500 p.py '
        "--deepspeed_config ds_config.json"
    )
    assert made.hosts == () and made.launcher_files == {} and len(made.torchrun) == 2
    slurm = bundle(TWO_NODES, LaunchRequest(target="slurm"))  # SLURM names its nodes: no hosts needed
    assert (slurm.deepspeed, slurm.torchrun) == (None, []) and "sbatch.sh" in slurm.launcher_files
    one = bundle(ONE_NODE, LaunchRequest(ds_config="/c/ds.json", hosts_later=True))
    assert one.deepspeed == ["deepspeed", "--num_gpus", "8", "train.py", "--deepspeed_config", "/c/ds.json"]
