"""``zerokit hostfile`` and ``zerokit launch-cmd``: parse, call ``kit.scaleout`` (``launch-cmd``: its
``bundle``), print.

zerokit hostfile --hosts node1,node2 --slots 8 --out hostfile
zerokit hostfile --check hostfile --master-addr node1
zerokit launch-cmd --model llama2-7b --nodes 2 --stage 3 --hosts node1,node2 --script train.py --out launch/
zerokit launch-cmd --for accelerate|hf-trainer|lightning|torchrun|slurm ... --out launch/
"""

from __future__ import annotations

import argparse
import shlex
import textwrap

from kit.cli.args import UsageError, add_json, add_setup_args, print_json, setup_from_args
from kit.rules import DEFAULT_MASTER_PORT
from kit.scaleout import hostfile as hf
from kit.scaleout import image, launchers
from kit.scaleout.bundle import DEFAULT_IMAGE, LaunchRequest, bundle


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
    d.add_argument("--image", help=f"image name (default {DEFAULT_IMAGE} with --docker)")
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
    setup = setup_from_args(args)
    if args.interconnect:
        setup = setup.replace(cluster={"interconnect": args.interconnect})
    request = LaunchRequest(
        script=args.script,
        script_args=tuple(shlex.split(args.script_args)),
        target=args.target,
        launcher=args.launcher,
        hosts=tuple(_names(args.hosts or "")),
        hostfile=args.hostfile,
        master_addr=args.master_addr,
        master_port=args.master_port,
        interface=args.interface,
        hca=args.hca,
        out=args.out,
        docker=args.docker,
        image=args.image,
        registry=args.registry,
        base_image=args.base_image,
        efa_installer=args.efa_installer,
    )
    made = bundle(setup, request)
    result = made.to_dict(made.write())
    if args.json:
        print_json(result)
    else:
        _print_launch(result)
    return 0


def _names(text: str) -> list[str]:
    return [n.strip() for n in text.split(",") if n.strip()]


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
    if r["sequence_parallel"]:  # the ds_config says sequence_parallel_size; the script wires Ulysses in
        print("# sequence parallelism: sequence_parallel_size is in the ds_config; your script also does:")
        lines = textwrap.wrap(r["sequence_parallel"], 100, initial_indent="#   ", subsequent_indent="#   ")
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
