"""Launch commands a user can paste for a Setup's cluster, and the network settings that go with them.

Commands come as argument lists (``*_command``) and as shell strings (``shell_line``, quoted with
``shlex``). One node: ``deepspeed --num_gpus N``. Several: ``deepspeed --hostfile ... --master_addr
... --master_port ...`` (DeepSpeed's launcher reaches the nodes with pdsh, OpenMPI or SLURM), or
``torchrun`` once per node, or a SLURM ``sbatch`` script. ``cluster.interconnect`` picks the network
preset: the NCCL / libfabric variables for ``.deepspeed_env`` (which DeepSpeed's launcher exports to
every node) and the ``docker run`` flags, each with its reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from kit.setup import Setup

LAUNCHERS = ("pdsh", "openmpi", "slurm")
DEFAULT_PORT = 29500
#: Excludes the docker bridge and loopback, so NCCL's bootstrap picks a real NIC (NCCL docs).
NOT_DOCKER_OR_LOOPBACK = "^docker0,lo"


@dataclass(frozen=True)
class Setting:
    """One environment variable or docker flag, and why it is there (one line)."""

    value: str
    reason: str


@dataclass(frozen=True)
class Network:
    """A network preset: environment for every rank, docker flags, and a warning where it is slow."""

    name: str
    env: dict[str, Setting]
    docker: tuple[Setting, ...]
    warning: str | None = None


def network(setup: Setup, interface: str | None = None) -> Network:
    """The preset for ``setup.cluster.interconnect``; ``interface`` pins NCCL to one NIC (e.g. ib0)."""
    kind = setup.cluster.interconnect
    ifname = Setting(
        interface or NOT_DOCKER_OR_LOOPBACK,
        f"NCCL's socket bootstrap uses {interface}"
        if interface
        else "NCCL skips the docker bridge and loopback",
    )
    docker = [
        Setting("--gpus=all", "give the container every GPU of the node"),
        Setting("--network=host", "ranks reach other nodes directly, without docker's NAT"),
        Setting(
            "--shm-size=64g", "NCCL and DataLoader workers share memory via /dev/shm (docker default 64 MB)"
        ),
        Setting("--ulimit=memlock=-1:-1", "pinned host memory (offload, RDMA) must not be limited"),
    ]
    rdma = [
        Setting("--cap-add=IPC_LOCK", "RDMA registers (locks) memory pages"),
        Setting("--device=/dev/infiniband", "the RDMA verbs devices NCCL uses"),
    ]
    if kind == "infiniband":
        env = {"NCCL_SOCKET_IFNAME": ifname, "NCCL_IB_DISABLE": Setting("0", "use InfiniBand verbs for NCCL")}
        return Network("infiniband", env, tuple(docker + rdma))
    if kind == "efa":
        env = {
            "NCCL_SOCKET_IFNAME": ifname,
            "FI_PROVIDER": Setting("efa", "libfabric (aws-ofi-nccl plugin) uses the EFA provider"),
            "FI_EFA_USE_DEVICE_RDMA": Setting("1", "GPUDirect RDMA over EFA (p4d/p5 instances)"),
            "NCCL_PROTO": Setting("simple", "AWS's recommendation for NCCL over EFA"),
        }
        return Network("efa", env, tuple(docker + rdma))
    env = {
        "NCCL_SOCKET_IFNAME": ifname,
        "NCCL_IB_DISABLE": Setting("1", "no InfiniBand: NCCL uses TCP sockets"),
    }
    warning = (
        "plain Ethernet: NCCL over TCP typically reaches a few GB/s between nodes, an order of magnitude "
        "below InfiniBand or EFA; each step moves about 2 model sizes of 16-bit data (3 at stage 3, ZeRO "
        "paper), so expect communication-bound steps across nodes"
    )
    return Network("ethernet", env, tuple(docker), warning)


def deepspeed_env(setup: Setup, interface: str | None = None) -> str:
    """Content of ``.deepspeed_env``: ``KEY=VALUE`` lines, unquoted (DeepSpeed's launcher splits each line
    at the first ``=`` and quotes values itself; it cannot read comments or blank lines)."""
    return "".join(f"{k}={s.value}\n" for k, s in network(setup, interface).env.items())


def deepspeed_command(
    setup: Setup,
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    ds_config: str = "ds_config.json",
    hostfile: str | None = None,
    master_addr: str | None = None,
    master_port: int = DEFAULT_PORT,
    launcher: str = "pdsh",
) -> list[str]:
    """``deepspeed --num_gpus N`` on one node; ``deepspeed --hostfile H --master_addr A ...`` on several."""
    tail = [script, *script_args, "--deepspeed_config", ds_config]
    if setup.cluster.nodes == 1:
        return ["deepspeed", "--num_gpus", str(setup.cluster.gpus_per_node), *tail]
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher: choose one of {', '.join(LAUNCHERS)}, got {launcher!r}")
    if not hostfile or not master_addr:
        raise ValueError(
            f"hostfile: a {setup.cluster.nodes}-node launch needs a hostfile and a master address"
        )
    argv = [
        "deepspeed",
        "--hostfile",
        hostfile,
        "--master_addr",
        master_addr,
        "--master_port",
        str(master_port),
    ]
    if launcher != "pdsh":
        argv += ["--launcher", launcher]
    return argv + tail


def torchrun_command(
    setup: Setup,
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    ds_config: str = "ds_config.json",
    master_addr: str = "127.0.0.1",
    master_port: int | str = DEFAULT_PORT,
    node_rank: int | str = 0,
    rdzv_id: str | None = None,
) -> list[str]:
    """``torchrun`` for one node (run on each node with its ``node_rank``); c10d rendezvous at the master."""
    c = setup.cluster
    argv = ["torchrun", "--nnodes", str(c.nodes), "--nproc_per_node", str(c.gpus_per_node)]
    argv += [
        "--node_rank",
        str(node_rank),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"{master_addr}:{master_port}",
    ]
    if rdzv_id:
        argv += ["--rdzv_id", rdzv_id]
    return argv + [script, *script_args, "--deepspeed_config", ds_config]


def sbatch_script(
    setup: Setup,
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    ds_config: str = "ds_config.json",
    job_name: str = "zerokit",
    time_limit: str = "01:00:00",
    master_port: int = DEFAULT_PORT,
    interface: str | None = None,
) -> str:
    """A SLURM batch script: one ``torchrun`` per node via ``srun``, the master on the job's first node."""
    c = setup.cluster
    net = network(setup, interface)
    command = torchrun_command(
        setup,
        script,
        script_args,
        ds_config=ds_config,
        master_addr="$MASTER_ADDR",
        master_port="$MASTER_PORT",
        node_rank="$SLURM_NODEID",
        rdzv_id="$SLURM_JOB_ID",
    )
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={c.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={c.gpus_per_node}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"# {setup.label} on {c.nodes} x {c.gpus_per_node} {c.gpu}, {net.name}",
        "# submit from the folder with ds_config.json: sbatch sbatch.sh",
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(s.value)}  # {s.reason}" for k, s in net.env.items()),
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        f"MASTER_PORT={master_port}",
        "srun " + shell_line(command),
    ]
    return "\n".join(lines) + "\n"


def launch_script(command: list[str]) -> str:
    """``launch.sh``: run one command from the script's own folder (where ds_config.json, hostfile and
    .deepspeed_env are; DeepSpeed reads .deepspeed_env from the current directory or ~)."""
    return "\n".join(["#!/bin/bash", "set -euo pipefail", 'cd "$(dirname "$0")"', shell_line(command)]) + "\n"


def docker_command(setup: Setup, image: str, command: list[str], interface: str | None = None) -> list[str]:
    """``docker run`` with the preset's flags around ``command``, the current folder mounted at the same path
    (as a shell line: ``$PWD`` is expanded by the shell)."""
    flags = [s.value for s in network(setup, interface).docker]
    return ["docker", "run", "--rm", *flags, "--volume=$PWD:$PWD", "--workdir=$PWD", image, *command]


_SHELL_VARIABLE = re.compile(r"^[\w.:=/-]*\$\{?\w+\}?[\w.:=/${}-]*$")


def shell_line(argv: list[str]) -> str:
    """The argument list as one shell line: shlex quoting, except ``$VAR`` tokens stay expandable."""
    return " ".join(f'"{a}"' if _SHELL_VARIABLE.match(a) else shlex.quote(a) for a in argv)
