"""One image for every node: the generated Dockerfile (read back by dockerfile-parse) and run_container.sh
(read back by shlex, and by bash itself) carry exactly the settings each interconnect needs."""

import json
import shlex
import subprocess

import pytest
from dockerfile_parse import DockerfileParser

from kit import models
from kit.cli import main
from kit.scaleout import doctor, image, network
from kit.schema import Setup

KINDS = ("infiniband", "efa", "ethernet")


def cluster(kind: str) -> Setup:
    nodes = {"nodes": 2, "gpus_per_node": 8, "interconnect": kind}
    return Setup(model=models.preset("llama-2-13b"), cluster=nodes, zero={"stage": 3}, batch={})


def parsed(text: str, tmp_path) -> DockerfileParser:
    parser = DockerfileParser(path=str(tmp_path / "Dockerfile"))
    parser.content = text
    return parser


def flags_of(script: str) -> list[str]:
    """The entries of the script's ``flags=( ... )`` array, comments dropped."""
    tokens = shlex.split(script, comments=True)
    return tokens[tokens.index("flags=(") + 1 : tokens.index(")")]


@pytest.mark.parametrize("kind", KINDS)
def test_dockerfile_has_the_base_image_pins_kit_and_network_env(kind, tmp_path):
    setup = cluster(kind)
    hca = "mlx5_0,mlx5_1" if kind == "infiniband" else None
    df = parsed(image.dockerfile(setup, hca=hca), tmp_path)
    assert df.baseimage == image.BASE_IMAGE
    runs = [i["value"] for i in df.structure if i["instruction"] == "RUN"]
    assert any(
        f"pip3 install --no-cache-dir torch==2.13.0 --index-url {image.TORCH_INDEX}" in r for r in runs
    )
    assert f"pip3 install --no-cache-dir 'deepspeed{doctor.tested_range('deepspeed')}'" in runs
    assert "pip3 install --no-cache-dir '/opt/zero-kit[run]'" in runs
    expected = {k: s.value for k, s in network.network(setup, hca=hca).env.items()}
    assert df.envs == expected  # every NCCL / libfabric setting of the preset, and nothing else
    verbs = any("rdma-core ibverbs-providers" in r for r in runs)
    efa = any(f"aws-efa-installer-{image.EFA_INSTALLER}.tar.gz" in r and "--skip-kmod" in r for r in runs)
    assert (verbs, efa) == (kind == "infiniband", kind == "efa")
    if kind == "infiniband":
        assert df.envs["NCCL_IB_HCA"] == "mlx5_0,mlx5_1" and df.envs["NCCL_IB_DISABLE"] == "0"
    if kind == "efa":
        assert (df.envs["FI_PROVIDER"], df.envs["FI_EFA_USE_DEVICE_RDMA"], df.envs["NCCL_PROTO"]) == (
            "efa", "1", "simple"
        )  # fmt: skip
    # every FROM and ENV has its reason on the line above
    lines = image.dockerfile(setup, hca=hca).splitlines()
    bare = [
        n
        for n, line in enumerate(lines)
        if line.startswith(("FROM", "ENV")) and not lines[n - 1].startswith("#")
    ]
    assert bare == []


@pytest.mark.parametrize("kind", KINDS)
def test_run_container_flags_follow_the_interconnect(kind):
    setup = cluster(kind)
    script = image.run_container_script(setup, "registry.example.com/zero-kit:1")
    flags = flags_of(script)
    rdma = {"--cap-add=IPC_LOCK", "--device=/dev/infiniband"}
    assert set(flags) >= {
        "--gpus=all",
        "--network=host",
        f"--shm-size={network.SHM_SIZE}",
        "--ulimit=memlock=-1:-1",
    }
    assert (rdma <= set(flags)) == (kind != "ethernet")
    assert flags[-3:] == ["--volume=$PWD:/workspace", "--volume=$DATA:$DATA", "--workdir=/workspace"]
    assert flags[:-3] == [s.value for s in network.network(setup).docker]
    reasons = [line for line in script.splitlines() if line.startswith("  --")]
    assert all("  # " in line for line in reasons)  # each flag says why
    assert "IMAGE=${IMAGE:-registry.example.com/zero-kit:1}" in script.splitlines()
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0  # bash parses it


def test_registry_commands_for_a_private_registry_and_ecr():
    assert image.registry_commands("zk:1", "registry.example.com/team") == [
        "docker build -t registry.example.com/team/zk:1 .  # in the zero-kit source folder, next to the "
        "Dockerfile",
        "docker push registry.example.com/team/zk:1",
        "docker pull registry.example.com/team/zk:1  # on every node",
    ]
    ecr = image.registry_commands("zk:1", "123456789012.dkr.ecr.eu-west-1.amazonaws.com")
    assert shlex.split(ecr[0], comments=True) == [
        "aws", "ecr", "get-login-password", "--region", "eu-west-1", "|", "docker", "login", "--username",
        "AWS", "--password-stdin", "123456789012.dkr.ecr.eu-west-1.amazonaws.com",
    ]  # fmt: skip
    assert ecr[-2] == "docker push 123456789012.dkr.ecr.eu-west-1.amazonaws.com/zk:1"


def test_launch_cmd_docker_writes_both_files(tmp_path, capsys):
    argv = ["launch-cmd", "--model", "llama-2-13b", "--nodes", "2", "--stage", "3", "--hosts", "n1,n2"]
    argv += [
        "--interconnect",
        "efa",
        "--docker",
        "--registry",
        "registry.example.com",
        "--out",
        str(tmp_path),
    ]
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (tmp_path / "Dockerfile").read_text() == out["dockerfile"]
    assert (tmp_path / "run_container.sh").stat().st_mode & 0o111
    assert "IMAGE=${IMAGE:-registry.example.com/zero-kit:latest}" in out["run_container"]
    assert out["registry"][-1] == "docker pull registry.example.com/zero-kit:latest  # on every node"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ["--interconnect", "efa", "--hca", "mlx5_0"],
            "hca: NCCL_IB_HCA names InfiniBand adapters, but the cluster's interconnect is efa",
        ),  # noqa: E501
        (
            ["--interconnect", "infiniband", "--docker", "--efa-installer", "1.38.0"],
            "efa-installer: the AWS EFA installer is for --interconnect efa",
        ),  # noqa: E501
        (
            ["--registry", "registry.example.com"],
            "registry: --registry and --base-image describe the image of --docker",
        ),  # noqa: E501
    ],
)
def test_impossible_combinations_are_refused_in_one_line(flags, message, capsys):
    argv = ["launch-cmd", "--model", "llama-2-13b", "--nodes", "2", "--hosts", "n1,n2", *flags]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and message in err
