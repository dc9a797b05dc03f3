"""One image for every node: the training image's ``Dockerfile``, the ``run_container.sh`` each node runs,
and the registry commands that put the same image on every node.

Every line carries its reason (a comment above it), as the network presets do: the CUDA base image,
torch's CUDA build, the DeepSpeed range the kit is tested with, the kit itself, the interconnect's
userspace (InfiniBand verbs, or AWS's EFA installer with the aws-ofi-nccl plugin) and its NCCL /
libfabric settings as ``ENV`` lines; the ``docker run`` flags the interconnect needs
(``kit.scaleout.network``), the data mount and the command. ``zerokit launch-cmd --docker`` writes them.
"""

from __future__ import annotations

import importlib.metadata
import re
import shlex

from kit.scaleout.network import network
from kit.schema import Setup

#: CUDA 12.8 with cuDNN, the devel flavour (nvcc for DeepSpeed's JIT-built ops); Ubuntu 22.04's Python 3.10
BASE_IMAGE = "nvidia/cuda:12.8.1-cudnn-devel-ubuntu22.04"
#: PyTorch's index of CUDA 12.8 wheels (the public index's default build is CUDA too, but this pins it)
TORCH_INDEX = "https://download.pytorch.org/whl/cu128"
#: AWS's EFA installer (libfabric, the EFA provider, aws-ofi-nccl); pass another with --efa-installer
EFA_INSTALLER = "1.38.0"
#: an Amazon ECR registry host: <account>.dkr.ecr.<region>.amazonaws.com
ECR = re.compile(r"^(?P<account>\d{12})\.dkr\.ecr\.(?P<region>[a-z0-9-]+)\.amazonaws\.com$")


def pinned(package: str, fallback: str) -> str:
    """``torch==2.13.0`` (the installed version, local build tag dropped) or DeepSpeed's tested range."""
    if package == "deepspeed":
        from kit.scaleout.doctor import tested_range

        tested = tested_range("deepspeed")
        return f"deepspeed{tested}" if tested else fallback
    try:
        return f"{package}=={importlib.metadata.version(package).split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        return fallback


def dockerfile(
    setup: Setup,
    *,
    base_image: str = BASE_IMAGE,
    interface: str | None = None,
    hca: str | None = None,
    efa_installer: str = EFA_INSTALLER,
) -> str:
    """The training image for ``setup.cluster.interconnect``; build it from the kit's source folder."""
    net = network(setup, interface, hca)
    kind = net.name
    steps: list[tuple[str | None, str | None]] = [
        ("every node runs this one image: build once, push, pull on each node", None),
        ("the CUDA base image (driver libraries come from the host via the NVIDIA container toolkit)",
         f"FROM {base_image}"),
        ("Python, pip; pdsh and ssh for DeepSpeed's multi-node launcher; libaio for NVMe offload",
         "RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip "
         "openssh-client pdsh libaio-dev curl && rm -rf /var/lib/apt/lists/*"),
    ]  # fmt: skip
    if kind == "infiniband":
        steps.append(
            ("InfiniBand verbs userspace: NCCL's IB transport and ibstat / ibv_devinfo for zerokit doctor",
             "RUN apt-get update && apt-get install -y --no-install-recommends rdma-core ibverbs-providers "
             "libibverbs1 infiniband-diags && rm -rf /var/lib/apt/lists/*")
        )  # fmt: skip
    if kind == "efa":
        steps.append(
            (f"AWS EFA installer {efa_installer}: libfabric, the EFA provider and the aws-ofi-nccl plugin "
             "(no kernel module: the host has it)",
             f"RUN curl -fsSL https://efa-installer.amazonaws.com/aws-efa-installer-{efa_installer}.tar.gz "
             "| tar xz -C /tmp && cd /tmp/aws-efa-installer && ./efa_installer.sh -y --skip-kmod "
             "--skip-limit-conf --no-verify && rm -rf /tmp/aws-efa-installer")
        )  # fmt: skip
    torch, deepspeed = pinned("torch", "torch"), pinned("deepspeed", "deepspeed")
    steps += [
        (f"{torch}, CUDA build", f"RUN pip3 install --no-cache-dir {torch} --index-url {TORCH_INDEX}"),
        (f"{deepspeed}: the range zero-kit's estimates are checked against (its sdist wants torch first)",
         f"RUN pip3 install --no-cache-dir '{deepspeed}'"),
        ("zero-kit itself, with what runs need (transformers for HF models)", "COPY . /opt/zero-kit"),
        (None, "RUN pip3 install --no-cache-dir '/opt/zero-kit[run]'"),
    ]  # fmt: skip
    steps += [(f"{key}: {s.reason}", f"ENV {key}={shlex.quote(s.value)}") for key, s in net.env.items()]
    steps.append(("the job's folder (mounted by run_container.sh)", "WORKDIR /workspace"))
    lines = [f"# zero-kit training image for {setup.label} on {kind}"]
    for why, instruction in steps:
        if why:
            lines.append(f"# {why}")
        if instruction:
            lines.append(instruction)
    return "\n".join(lines) + "\n"


def run_container_script(
    setup: Setup, image: str, *, interface: str | None = None, hca: str | None = None
) -> str:
    """``run_container.sh``: ``docker run`` with the interconnect's flags, each with its reason, the job
    folder mounted at ``/workspace`` and ``$DATA`` at the same path; the arguments are the command."""
    net = network(setup, interface, hca)
    flags = [f"  {s.value}  # {s.reason}" for s in net.docker]
    lines = [
        "#!/bin/bash",
        f"# Run on every node of the {net.name} cluster, the same image everywhere:",
        "#   IMAGE=... DATA=/path/to/data ./run_container.sh deepspeed --hostfile hostfile train.py ...",
        "set -euo pipefail",
        f"IMAGE=${{IMAGE:-{image}}}",
        "DATA=${DATA:-$PWD}",
        "flags=(",
        *flags,
        '  --volume="$PWD:/workspace"  # the job folder: ds_config.json, hostfile, .deepspeed_env, scripts',
        '  --volume="$DATA:$DATA"  # the data set, at the same path on every node',
        "  --workdir=/workspace  # where launch.sh and the hostfile are",
        ")",
        'exec docker run --rm "${flags[@]}" "$IMAGE" "$@"',
    ]
    return "\n".join(lines) + "\n"


def reference(image: str, registry: str | None = None) -> str:
    """The name every node pulls and runs: ``registry/image``, or the bare image without a registry."""
    return f"{registry.rstrip('/')}/{image}" if registry else image


def registry_commands(image: str, registry: str | None = None) -> list[str]:
    """Shell lines to paste: build and push the image once, pull it on every node. An Amazon ECR host
    (``<account>.dkr.ecr.<region>.amazonaws.com``) logs in with ``aws ecr get-login-password`` first."""
    if not registry:
        return [
            f"docker build -t {image} .  # in the zero-kit source folder, next to the Dockerfile",
            f"docker save {image} | ssh NODE docker load  # without a registry: copy it to each node",
        ]
    target = reference(image, registry)
    lines = []
    ecr = ECR.match(registry.split("/")[0])
    if ecr:
        login = (
            f"aws ecr get-login-password --region {ecr['region']} | docker login --username AWS "
            f"--password-stdin {registry.split('/')[0]}"
        )
        lines += [f"{login}  # here, and on every node before the pull", f"aws ecr create-repository "
                  f"--region {ecr['region']} --repository-name {image.split(':')[0]}  # once"]  # fmt: skip
    lines += [
        f"docker build -t {target} .  # in the zero-kit source folder, next to the Dockerfile",
        f"docker push {target}",
        f"docker pull {target}  # on every node",
    ]
    return lines
