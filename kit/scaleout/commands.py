"""Launch commands a user can paste for a Setup's cluster (network settings: ``kit.scaleout.network``).

Commands come as argument lists (``*_command``) and as shell strings (``shell_line``, quoted with
``shlex``). One node: ``deepspeed --num_gpus N``. Several: ``deepspeed --hostfile ... --master_addr
... --master_port ...`` (DeepSpeed's launcher reaches the nodes with pdsh, OpenMPI or SLURM), or
``torchrun`` once per node, or a SLURM ``sbatch`` script, with the network settings of
``kit.scaleout.network``.
"""

from __future__ import annotations

import re
import shlex

from kit.rules import DEFAULT_MASTER_PORT
from kit.run.local_nodes import RUNNER_BACKENDS
from kit.scaleout.network import network
from kit.schema import Setup

#: DeepSpeed's multi-node backends (``deepspeed --launcher``), as ``zerokit run --hostfile`` passes them
LAUNCHERS = RUNNER_BACKENDS


def deepspeed_command(
    setup: Setup,
    script: str,
    script_args: list[str] | tuple[str, ...] = (),
    *,
    ds_config: str = "ds_config.json",
    hostfile: str | None = None,
    master_addr: str | None = None,
    master_port: int = DEFAULT_MASTER_PORT,
    launcher: str = "pdsh",
    config_flag: str = "--deepspeed_config",
) -> list[str]:
    """``deepspeed --num_gpus N`` on one node; ``deepspeed --hostfile H --master_addr A ...`` on several.
    ``config_flag``: the script's flag for the config (the HF Trainer's is ``--deepspeed``)."""
    tail = [script, *script_args, config_flag, ds_config]
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
    master_port: int | str = DEFAULT_MASTER_PORT,
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
    master_port: int = DEFAULT_MASTER_PORT,
    interface: str | None = None,
    comments: tuple[str, ...] = (),
) -> str:
    """A SLURM batch script: ``srun`` starts one ``torchrun`` per node, each in its node's environment
    (``bash -c '...'``: ``$SLURM_NODEID`` expands on the node, not in the batch shell), the master on the
    job's first node."""
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
        *(f"# {line}" for line in comments),
        "set -euo pipefail",
        *(f"export {k}={shlex.quote(s.value)}  # {s.reason}" for k, s in net.env.items()),
        # sed reads to the end: head would leave scontrol a broken pipe, which pipefail makes fatal
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)',
        f"MASTER_PORT={master_port}",
        "export MASTER_ADDR MASTER_PORT",
        "# one task per node; the single quotes keep $SLURM_NODEID for each node's own shell",
        "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c " + shlex.quote(shell_line(command)),
    ]
    return "\n".join(lines) + "\n"


def launch_script(
    command: list[str], comments: tuple[str, ...] = (), setup_lines: tuple[str, ...] = ()
) -> str:
    """``launch.sh``: run one command from the script's own folder (where ds_config.json, hostfile and
    .deepspeed_env are; DeepSpeed reads .deepspeed_env from the current directory or ~), after
    ``comments`` (``# `` lines) and ``setup_lines`` (shell lines, e.g. exports)."""
    lines = ["#!/bin/bash", *(f"# {c}" for c in comments), "set -euo pipefail", 'cd "$(dirname "$0")"']
    return "\n".join([*lines, *setup_lines, shell_line(command)]) + "\n"


def docker_command(setup: Setup, image: str, command: list[str], interface: str | None = None) -> list[str]:
    """``docker run`` with the preset's flags around ``command``, the current folder mounted at the same path
    (as a shell line: ``$PWD`` is expanded by the shell)."""
    flags = [s.value for s in network(setup, interface).docker]
    return ["docker", "run", "--rm", *flags, "--volume=$PWD:$PWD", "--workdir=$PWD", image, *command]


_SHELL_VARIABLE = re.compile(r"^[\w.:=/-]*\$\{?\w+\}?[\w.:=/${}-]*$")


def shell_line(argv: list[str]) -> str:
    """The argument list as one shell line: shlex quoting, except ``$VAR`` tokens stay expandable."""
    return " ".join(f'"{a}"' if _SHELL_VARIABLE.match(a) else shlex.quote(a) for a in argv)
