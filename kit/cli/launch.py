"""``zerokit hostfile`` and ``zerokit launch-cmd``: parse, call ``kit.scaleout``, print.

zerokit hostfile --hosts node1,node2 --slots 8 --out hostfile
zerokit hostfile --check hostfile --master-addr node1
zerokit launch-cmd --model llama2-7b --nodes 2 --stage 3 --hosts node1,node2 --script train.py --out launch/
zerokit launch-cmd --for accelerate|hf-trainer|lightning|torchrun|slurm ... --out launch/
"""

from __future__ import annotations

import argparse
import shlex
import textwrap
from pathlib import Path

from kit import checkpointing, trainable
from kit import loss as losses
from kit.cli.args import UsageError, add_json, add_setup_args, print_json, setup_from_args
from kit.rules import DEFAULT_MASTER_PORT
from kit.scaleout import commands, image, launchers, network
from kit.scaleout import hostfile as hf


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("hostfile", help="write or check a DeepSpeed hostfile")
    p.add_argument("--hosts", help="comma-separated host names ([user@]host) to write a hostfile for")
    p.add_argument("--slots", type=int, default=8, help="GPUs per host (with --hosts)")
    p.add_argument("--user", help="ssh user for every host (with --hosts)")
    p.add_argument("--out", help="write the hostfile here (with --hosts)")
    p.add_argument("--check", metavar="FILE", help="validate an existing hostfile")
    p.add_argument("--master-addr", help="must be one of the hosts (default: the first)")
    add_json(p)
    p.set_defaults(func=hostfile_command)

    p = subparsers.add_parser(
        "launch-cmd", help="launch commands, ds_config.json, hostfile and network settings"
    )
    add_setup_args(p)
    g = p.add_argument_group("launch")
    g.add_argument(
        "--for",
        dest="target",
        default="deepspeed",
        help=f"whose files --out writes: {', '.join(launchers.LAUNCHER_FILES)} (default %(default)s)",
    )
    g.add_argument(
        "--script", default="train.py", help="the training script (relative to --out, or absolute)"
    )
    g.add_argument("--script-args", default="", help="arguments for the script, one quoted string")
    g.add_argument("--hostfile", help="an existing hostfile (multi-node)")
    g.add_argument("--hosts", help="comma-separated host names instead of --hostfile (multi-node)")
    g.add_argument("--master-addr", help="rank 0's host (default: the first host)")
    g.add_argument("--master-port", type=int, default=DEFAULT_MASTER_PORT)
    g.add_argument(
        "--launcher", default="pdsh", help="DeepSpeed's multi-node backend: pdsh, openmpi or slurm"
    )
    g.add_argument("--interconnect", help="infiniband, efa or ethernet (picks the network preset)")
    g.add_argument("--interface", help="NIC for NCCL_SOCKET_IFNAME, e.g. ib0 (default: all but docker0, lo)")
    g.add_argument("--hca", help="InfiniBand adapters for NCCL_IB_HCA, e.g. mlx5_0,mlx5_1 (InfiniBand only)")
    g.add_argument("--out", help="write the launcher's files here (ds_config.json, README.md, its scripts)")
    d = p.add_argument_group("one image for every node")
    d.add_argument("--docker", action="store_true", help="also write a Dockerfile and run_container.sh")
    d.add_argument("--image", help="image name (default zero-kit:latest with --docker)")
    d.add_argument("--registry", help="registry host to push to and pull from (ECR hosts log in with aws)")
    d.add_argument("--base-image", default=image.BASE_IMAGE, help="the CUDA base image (default %(default)s)")
    d.add_argument(
        "--efa-installer", help=f"AWS EFA installer version (EFA only; default {image.EFA_INSTALLER})"
    )
    p.set_defaults(func=launch_command)


def hostfile_command(args: argparse.Namespace) -> int:
    if bool(args.hosts) == bool(args.check):
        raise UsageError("hostfile: give --hosts NAMES (to write one) or --check FILE (to validate one)")
    if args.check:
        hosts = hf.read_hostfile(args.check)
    else:
        if args.slots < 1:
            raise UsageError(f"slots: must be >= 1 (GPUs per host), got {args.slots}")
        hosts = hf.make_hosts(_names(args.hosts), args.slots, args.user)
    master = args.master_addr or hosts[0].host
    hf.check_master(hosts, master)
    path = hf.write_hostfile(hosts, args.out) if args.hosts and args.out else None
    result = {
        "hostfile": str(path or args.check or ""),
        "hosts": [{"host": h.host, "slots": h.slots, "user": h.user} for h in hosts],
        "nodes": len(hosts),
        "world_size": sum(h.slots for h in hosts),
        "master_addr": master,
        "text": hf.format_hostfile(hosts),
    }
    if args.json:
        print_json(result)
    else:
        print(result["text"], end="")
        print(f"# {result['nodes']} nodes, {result['world_size']} ranks, master {master}")
        if path:
            print(f"# wrote {path}")
    return 0


def launch_command(args: argparse.Namespace) -> int:
    from kit.ds_config import to_ds_config

    setup = setup_from_args(args)
    if args.interconnect:
        setup = setup.replace(cluster={"interconnect": args.interconnect})
    if args.launcher not in commands.LAUNCHERS:
        raise UsageError(f"launcher: choose one of {', '.join(commands.LAUNCHERS)}, got {args.launcher!r}")
    if args.target not in launchers.LAUNCHER_FILES:
        raise UsageError(f"for: choose one of {', '.join(launchers.LAUNCHER_FILES)}, got {args.target!r}")
    out = Path(args.out) if args.out else None
    # SLURM names its nodes itself and Lightning starts per node: their files need no hosts
    need_hosts = args.target in launchers.NEED_HOSTS or args.docker or bool(args.image)
    hosts, hostfile_path = _hosts(args, setup, out, need_hosts)
    master = args.master_addr or (hosts[0].host if hosts else "127.0.0.1")
    if hosts:
        hf.check_master(hosts, master)
    script_args = shlex.split(args.script_args)
    net = network.network(setup, args.interface, args.hca)
    if args.efa_installer and net.name != "efa":
        raise UsageError(
            f"efa-installer: the AWS EFA installer is for --interconnect efa, but the cluster's is {net.name}"
        )
    if (args.registry or args.base_image != image.BASE_IMAGE) and not args.docker:
        raise UsageError("registry: --registry and --base-image describe the image of --docker; add --docker")
    name = args.image or ("zero-kit:latest" if args.docker else None)
    pulled = image.reference(name, args.registry) if name else None
    reachable = bool(hosts) or setup.cluster.nodes == 1
    deepspeed = (
        commands.deepspeed_command(
            setup,
            args.script,
            script_args,
            hostfile=hostfile_path,
            master_addr=master,
            master_port=args.master_port,
            launcher=args.launcher,
        )
        if reachable
        else None
    )
    torchrun = [
        commands.torchrun_command(
            setup, args.script, script_args, master_addr=master, master_port=args.master_port, node_rank=rank
        )
        for rank in range(setup.cluster.nodes if reachable else 0)
    ]
    sbatch = commands.sbatch_script(
        setup, args.script, script_args, master_port=args.master_port, interface=args.interface
    )
    env_file = network.deepspeed_env(setup, args.interface, args.hca)
    ds_config = to_ds_config(setup)
    launch = launchers.Launch(
        script=args.script,
        script_args=tuple(script_args),
        hosts=tuple(hosts),
        hostfile=hostfile_path or "hostfile",
        master_addr=master,
        master_port=args.master_port,
        launcher=args.launcher,
        interface=args.interface,
        hca=args.hca,
    )
    launcher_files = launchers.launcher_files(setup, args.target, launch)
    files = {}
    if out:
        out.mkdir(parents=True, exist_ok=True)
        for file_name, f in launcher_files.items():
            files[file_name] = _write(out / file_name, f.text, executable=f.executable)
    result = {
        "for": args.target,
        "label": setup.label,
        "setup": setup.model_dump(),
        "ds_config": ds_config,
        "commands": {
            "deepspeed": commands.shell_line(deepspeed) if deepspeed else None,
            "torchrun": [commands.shell_line(c) for c in torchrun],
        },
        "argv": {"deepspeed": deepspeed, "torchrun": torchrun},
        "master_addr": master,
        "hosts": [h.line for h in hosts],
        "network": {
            "name": net.name,
            "env": {k: {"value": s.value, "reason": s.reason} for k, s in net.env.items()},
            "docker": [{"flag": s.value, "reason": s.reason} for s in net.docker],
            "warning": net.warning,
        },
        "deepspeed_env": env_file,
        "sbatch": sbatch,
        "launcher_files": {file_name: f.text for file_name, f in launcher_files.items()},
        "files": files,
        "checkpointing": checkpointing.in_your_script(setup.zero),
        "trainable": trainable.in_your_script(setup.zero),
        "loss": losses.in_your_script(setup.zero),
    }
    if name:
        # an image needs the hosts (need_hosts), so the deepspeed command was made
        assert pulled is not None and deepspeed is not None
        docker = commands.docker_command(setup, pulled, deepspeed, args.interface)
        result["commands"]["docker"] = commands.shell_line(docker)
        result["argv"]["docker"] = docker
    if args.docker:
        assert name and pulled is not None  # --docker names an image (zero-kit:latest by default)
        options = {"interface": args.interface, "hca": args.hca}
        installer = args.efa_installer or image.EFA_INSTALLER
        result["dockerfile"] = image.dockerfile(
            setup, base_image=args.base_image, efa_installer=installer, **options
        )
        result["run_container"] = image.run_container_script(setup, pulled, **options)
        result["registry"] = image.registry_commands(name, args.registry)
        if out:
            files["Dockerfile"] = _write(out / "Dockerfile", result["dockerfile"])
            files["run_container.sh"] = _write(
                out / "run_container.sh", result["run_container"], executable=True
            )
    if args.json:
        print_json(result)
    else:
        _print_launch(result)
    return 0


def _hosts(
    args: argparse.Namespace, setup, out: Path | None, required: bool
) -> tuple[list[hf.Host], str | None]:
    """The validated hosts for a multi-node setup (``required``: the launcher needs them), and the
    hostfile path the command should name."""
    c = setup.cluster
    if args.hostfile and args.hosts:
        raise UsageError("hostfile: give --hostfile FILE or --hosts NAMES, not both")
    if (c.nodes == 1 or not required) and not (args.hostfile or args.hosts):
        return [], None
    if not (args.hostfile or args.hosts):
        raise UsageError(f"hostfile: a {c.nodes}-node launch needs --hostfile FILE or --hosts h1,h2,...")
    hosts = (
        hf.read_hostfile(args.hostfile)
        if args.hostfile
        else hf.make_hosts(_names(args.hosts), c.gpus_per_node)
    )
    hf.check_cluster(hosts, c.nodes, c.gpus_per_node)
    return hosts, "hostfile" if out or not args.hostfile else args.hostfile


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


def _write(path: Path, text: str, executable: bool = False) -> str:
    path.write_text(text)
    if executable:
        path.chmod(0o755)
    return str(path)


def _print_launch(r: dict) -> None:
    print(f"# {r['label']}")
    for key, what in (
        ("checkpointing", "activation checkpointing"),
        ("trainable", "what trains"),
        ("loss", "the loss"),
    ):
        if r[key]:
            print(f"# {what} is your script's (no ds_config key says it):")
            lines = textwrap.wrap(r[key], 100, initial_indent="#   ", subsequent_indent="#   ")
            print(*lines, sep="\n")
    if r["for"] == "deepspeed":
        print("# DeepSpeed launcher:")
        print(r["commands"]["deepspeed"])
        print("# or torchrun, one per node:")
        print(*r["commands"]["torchrun"], sep="\n")
    elif not r["files"]:
        for name, text in r["launcher_files"].items():
            if name not in ("README.md", "ds_config.json"):
                print(f"# {name} (--out writes it):\n{text}", end="")
    if "docker" in r["commands"]:
        print("# in docker:")
        print(r["commands"]["docker"])
    net = r["network"]
    print(f"# network preset: {net['name']}")
    for key, s in net["env"].items():
        print(f"{key}={s['value']}  # {s['reason']}")
    for d in net["docker"]:
        print(f"docker {d['flag']}  # {d['reason']}")
    if net["warning"]:
        print(f"# warning: {net['warning']}")
    if "registry" in r:
        print("# the image, built once and pulled on every node:")
        print(*r["registry"], sep="\n")
        if "Dockerfile" not in r["files"]:
            print(f"# Dockerfile (--out writes it):\n{r['dockerfile']}", end="")
            print(f"# run_container.sh:\n{r['run_container']}", end="")
    for name, path in r["files"].items():
        print(f"# wrote {name}: {path}")
