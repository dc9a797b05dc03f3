"""One launch of a Setup, made once: what ``zerokit launch-cmd`` prints and writes and the memory panel's
command shows (``bundle(setup, LaunchRequest(...))`` -> ``Bundle``): the hosts and master, the commands
(DeepSpeed's launcher, torchrun per node, docker), the network preset, ``.deepspeed_env``, the SLURM
script, the ds_config, the ``--for`` launcher's folder and the image for every node.

The front ends only show it: the CLI as text and JSON (``kit.cli.launch``), the memory panel as its
deepspeed line (``kit.lab.memory_panel``). What it cannot see: whether the hosts answer, the script
exists or the nodes' network is the preset's (``zerokit doctor`` and ``commtest`` check those).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kit import checkpointing, trainable
from kit import loss as losses
from kit import sequence_parallel as ulysses
from kit.ds_config import to_ds_config
from kit.rules import DEFAULT_MASTER_PORT
from kit.scaleout import commands, image, launchers, network
from kit.scaleout.hostfile import Host, check_cluster, check_master, make_hosts, read_hostfile
from kit.scaleout.image import BASE_IMAGE
from kit.scaleout.launchers import LaunchFile
from kit.scaleout.network import Network
from kit.schema import Setup

#: the image ``docker`` names without ``image``
DEFAULT_IMAGE = "zero-kit:latest"


@dataclass(frozen=True)
class LaunchRequest:
    """How to launch: the ``script`` and its arguments; ``target``, the launcher whose folder it is
    (``launchers.LAUNCHER_FILES``, the CLI's ``--for``); DeepSpeed's multi-node ``launcher`` (pdsh, openmpi,
    slurm); the ``hosts`` by name or an existing ``hostfile`` (read, checked against the cluster), or,
    with neither, ``hosts_later``: a multi-node launch names ``hostfile`` all the same (the hosts are not
    known yet); rank 0's address and port; the network choices; the config file the commands name
    (``launcher_files`` name their folder's own ds_config.json); ``out``, the folder ``Bundle.write`` fills
    (the commands then name its copy of the hostfile); the image for every node (``docker``: its files,
    ``image``: its name, alone only for the docker command)."""

    script: str = "train.py"
    script_args: tuple[str, ...] = ()
    target: str = "deepspeed"
    launcher: str = "pdsh"
    hosts: tuple[str, ...] = ()
    hostfile: str | None = None
    hosts_later: bool = False
    master_addr: str | None = None
    master_port: int = DEFAULT_MASTER_PORT
    interface: str | None = None
    hca: str | None = None
    ds_config: str = "ds_config.json"
    out: str | None = None
    docker: bool = False
    image: str | None = None
    registry: str | None = None
    base_image: str = BASE_IMAGE
    efa_installer: str | None = None


@dataclass(frozen=True)
class Bundle:
    """One launch of ``setup`` as ``request`` asks: the checked ``hosts`` (none on one node, or where none
    were given and none are needed) and ``master_addr``; the commands as argument lists: ``deepspeed`` and
    ``torchrun`` (one per node; None and empty for a multi-node launch without hosts) and, with an image,
    ``docker`` (the deepspeed command inside it); the ``network`` preset, ``env_file`` (``.deepspeed_env``),
    ``sbatch``, ``ds_config``; ``launcher_files``, ``request.target``'s folder by file name (empty while
    ``hosts_later`` leaves the hosts it names unknown); with ``request.docker`` the ``dockerfile``,
    ``run_container`` script and ``registry`` lines."""

    setup: Setup
    request: LaunchRequest
    hosts: tuple[Host, ...]
    master_addr: str
    deepspeed: list[str] | None
    torchrun: list[list[str]]
    network: Network
    env_file: str
    sbatch: str
    ds_config: dict[str, Any]
    launcher_files: dict[str, LaunchFile]
    docker: list[str] | None = None
    dockerfile: str | None = None
    run_container: str | None = None
    registry: list[str] | None = None

    def shell_lines(self) -> dict[str, Any]:
        """The commands as shell lines: ``deepspeed`` (None without it), ``torchrun`` and, with an image,
        ``docker``."""
        lines: dict[str, Any] = {
            "deepspeed": commands.shell_line(self.deepspeed) if self.deepspeed else None,
            "torchrun": [commands.shell_line(c) for c in self.torchrun],
        }
        if self.docker is not None:
            lines["docker"] = commands.shell_line(self.docker)
        return lines

    def write(self) -> dict[str, str]:
        """Write the launch folder into ``request.out`` (nothing without it): the launcher's files, and the
        image's ``Dockerfile`` and ``run_container.sh``; name -> path written."""
        if self.request.out is None:
            return {}
        out = Path(self.request.out)
        out.mkdir(parents=True, exist_ok=True)
        files = {name: _write(out / name, f.text, f.executable) for name, f in self.launcher_files.items()}
        if self.dockerfile is not None and self.run_container is not None:
            files["Dockerfile"] = _write(out / "Dockerfile", self.dockerfile)
            files["run_container.sh"] = _write(out / "run_container.sh", self.run_container, True)
        return files

    def to_dict(self, files: dict[str, str] | None = None) -> dict[str, Any]:
        """``zerokit launch-cmd --json``'s object (docs/contracts.md); ``files``: what ``write`` wrote."""
        net, zero = self.network, self.setup.zero
        argv: dict[str, Any] = {"deepspeed": self.deepspeed, "torchrun": self.torchrun}
        if self.docker is not None:
            argv["docker"] = self.docker
        result: dict[str, Any] = {
            "for": self.request.target,
            "label": self.setup.label,
            "setup": self.setup.model_dump(),
            "ds_config": self.ds_config,
            "commands": self.shell_lines(),
            "argv": argv,
            "master_addr": self.master_addr,
            "hosts": [h.line for h in self.hosts],
            "network": {
                "name": net.name,
                "env": {k: {"value": s.value, "reason": s.reason} for k, s in net.env.items()},
                "docker": [{"flag": s.value, "reason": s.reason} for s in net.docker],
                "warning": net.warning,
            },
            "deepspeed_env": self.env_file,
            "sbatch": self.sbatch,
            "launcher_files": {name: f.text for name, f in self.launcher_files.items()},
            "files": files or {},
            "checkpointing": checkpointing.in_your_script(zero),
            "trainable": trainable.in_your_script(zero),
            "loss": losses.in_your_script(zero, self.setup.model),
            "sequence_parallel": ulysses.in_your_script(zero, self.setup.model),
        }
        if self.request.docker:
            result |= {
                "dockerfile": self.dockerfile,
                "run_container": self.run_container,
                "registry": self.registry,
            }
        return result


def bundle(setup: Setup, request: LaunchRequest) -> Bundle:
    """The launch of ``setup`` that ``request`` describes, checked before anything is made: ValueError
    naming the field (launcher, for, hostfile, master_addr, hca, efa-installer, registry, out)."""
    r, nodes = request, setup.cluster.nodes
    if r.launcher not in commands.LAUNCHERS:
        raise ValueError(f"launcher: choose one of {', '.join(commands.LAUNCHERS)}, got {r.launcher!r}")
    if r.target not in launchers.LAUNCHER_FILES:
        raise ValueError(f"for: choose one of {', '.join(launchers.LAUNCHER_FILES)}, got {r.target!r}")
    # SLURM names its nodes itself and Lightning starts per node: their files need no hosts
    hosts, hostfile = _hosts(setup, r, r.target in launchers.NEED_HOSTS or r.docker or bool(r.image))
    master = r.master_addr or (hosts[0].host if hosts else "127.0.0.1")
    if hosts:
        check_master(hosts, master)
    net = network.network(setup, r.interface, r.hca)
    if r.efa_installer and net.name != "efa":
        raise ValueError(
            f"efa-installer: the AWS EFA installer is for --interconnect efa, but the cluster's is {net.name}"
        )
    if (r.registry or r.base_image != BASE_IMAGE) and not r.docker:
        raise ValueError("registry: --registry and --base-image describe the image of --docker; add --docker")
    # hosts_later: the folder's files would name hosts nobody gave
    unnamed = hostfile is not None and not hosts and r.target in launchers.NEED_HOSTS
    if unnamed and r.out:
        raise ValueError(f"out: a {nodes}-node {r.target} folder names its hosts; give hosts or a hostfile")
    reachable = nodes == 1 or hostfile is not None
    args, port, config = list(r.script_args), r.master_port, r.ds_config
    deepspeed = (
        commands.deepspeed_command(
            setup,
            r.script,
            args,
            ds_config=config,
            hostfile=hostfile,
            master_addr=master,
            master_port=port,
            launcher=r.launcher,
        )
        if reachable
        else None
    )
    torchrun = [
        commands.torchrun_command(
            setup, r.script, args, ds_config=config, master_addr=master, master_port=port, node_rank=rank
        )
        for rank in range(nodes if reachable else 0)
    ]
    launch = launchers.Launch(
        script=r.script,
        script_args=r.script_args,
        hosts=tuple(hosts),
        hostfile=hostfile or "hostfile",
        master_addr=master,
        master_port=port,
        launcher=r.launcher,
        interface=r.interface,
        hca=r.hca,
    )
    name = r.image or (DEFAULT_IMAGE if r.docker else None)
    in_image: dict[str, Any] = {}
    if name:
        pulled = image.reference(name, r.registry)
        # an image needs the hosts (``_hosts``' needed), so the deepspeed command was made
        assert deepspeed is not None
        in_image["docker"] = commands.docker_command(setup, pulled, deepspeed, r.interface)
        if r.docker:
            options = {"interface": r.interface, "hca": r.hca}
            installer = r.efa_installer or image.EFA_INSTALLER
            in_image["dockerfile"] = image.dockerfile(
                setup, base_image=r.base_image, efa_installer=installer, **options
            )
            in_image["run_container"] = image.run_container_script(setup, pulled, **options)
            in_image["registry"] = image.registry_commands(name, r.registry)
    return Bundle(
        setup=setup,
        request=r,
        hosts=tuple(hosts),
        master_addr=master,
        deepspeed=deepspeed,
        torchrun=torchrun,
        network=net,
        env_file=network.deepspeed_env(setup, r.interface, r.hca),
        sbatch=commands.sbatch_script(
            setup, r.script, args, ds_config=config, master_port=port, interface=r.interface
        ),
        ds_config=to_ds_config(setup),
        launcher_files={} if unnamed else launchers.launcher_files(setup, r.target, launch),
        **in_image,
    )


def _hosts(setup: Setup, r: LaunchRequest, needed: bool) -> tuple[list[Host], str | None]:
    """The checked hosts (``needed``: the target's files or the image name them) and the hostfile path the
    commands name (None: no hostfile)."""
    c = setup.cluster
    if r.hostfile and r.hosts:
        raise ValueError("hostfile: give --hostfile FILE or --hosts NAMES, not both")
    if not (r.hostfile or r.hosts):
        if c.nodes > 1 and r.hosts_later:
            return [], "hostfile"
        if c.nodes > 1 and needed:
            raise ValueError(f"hostfile: a {c.nodes}-node launch needs --hostfile FILE or --hosts h1,h2,...")
        return [], None
    hosts = read_hostfile(r.hostfile) if r.hostfile else make_hosts(list(r.hosts), c.gpus_per_node)
    check_cluster(hosts, c.nodes, c.gpus_per_node)
    return hosts, "hostfile" if r.out or not r.hostfile else r.hostfile


def _write(path: Path, text: str, executable: bool = False) -> str:
    path.write_text(text)
    if executable:
        path.chmod(0o755)
    return str(path)
