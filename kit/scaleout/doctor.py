"""Preflight checks before a (multi-node) DeepSpeed run: ``zerokit doctor``.

Each check returns a ``Check`` with a status (``ok``, ``warn``, ``fail``, ``info``) and a one-line fix.
What a machine lacks (GPUs, InfiniBand, EFA) is ``info``, not an error: the kit runs on CPU too.
External tools (``nvidia-smi topo -m``, ``ibv_devinfo``, ``fi_info -p efa``, ``ssh``) are run with
argument lists and short timeouts; their output is parsed by the pure ``parse_*`` functions.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import resource
import shutil
import socket
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypedDict

from kit.rules import DEFAULT_MASTER_PORT
from kit.scaleout.hostfile import is_local
from kit.scaleout.network import SHM_SIZE
from kit.units import GIB, first_line

Status = Literal["ok", "warn", "fail", "info"]
STATUSES: tuple[Status, ...] = ("ok", "warn", "fail", "info")

#: Docker's default /dev/shm is 64 MiB; NCCL and DataLoader workers need far more (NCCL docs, "Docker").
MIN_SHM_BYTES = 1 * GIB
INFINIBAND_DIR = Path("/dev/infiniband")


@dataclass(frozen=True)
class Check:
    """One preflight result: what was checked, what was found, and what to do about it."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]

    @property
    def failed(self) -> bool:
        return any(c.status == "fail" for c in self.checks)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checks) for s in STATUSES}

    def to_dict(self) -> dict:
        return {"ok": not self.failed, "counts": self.counts(), "checks": [asdict(c) for c in self.checks]}

    def table(self):
        """The checks as a pandas DataFrame (columns status, check, detail, fix)."""
        import pandas as pd

        rows = [{"status": c.status, "check": c.name, "detail": c.detail, "fix": c.fix} for c in self.checks]
        return pd.DataFrame(rows, columns=["status", "check", "detail", "fix"])


def doctor(hostfile: str | os.PathLike | None = None, master_port: int = DEFAULT_MASTER_PORT) -> Report:
    """Run every check; with a ``hostfile``, also what the deepspeed launcher needs to reach its hosts."""
    checks = [check_python(), *check_torch(), check_deepspeed()]
    checks += [
        check_topology(),
        check_infiniband(),
        check_efa(),
        check_interface(),
        check_shm(),
        check_memlock(),
    ]
    checks.append(check_master_port(master_port))
    if hostfile is not None:
        checks += check_hostfile(hostfile)
    return Report(tuple(checks))


def run_tool(argv: list[str], timeout_s: float = 5.0) -> tuple[int, str] | None:
    """``(rc, stdout+stderr)`` of a short external command, or None when the tool is not installed."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {timeout_s:g} s"
    return done.returncode, done.stdout + done.stderr


def check_python(version: str | None = None) -> Check:
    """The interpreter the ranks will run (the launcher starts ``sys.executable``'s environment) against
    the installed zero-kit's ``Requires-Python`` (pyproject's ``requires-python``)."""
    from packaging.specifiers import SpecifierSet

    version = version or ".".join(map(str, sys.version_info[:3]))
    try:
        required = importlib.metadata.metadata("zero-kit")["Requires-Python"]
    except importlib.metadata.PackageNotFoundError:
        required = None
    if not required:
        return Check("python", "info", f"Python {version}; zero-kit is not installed, requirement unknown")
    if SpecifierSet(required).contains(version):
        return Check("python", "ok", f"Python {version} ({sys.executable}; zero-kit needs {required})")
    fix = f"use a Python {required} environment (make install creates one with python3)"
    return Check("python", "fail", f"Python {version}: zero-kit needs {required}", fix)


def check_torch() -> list[Check]:
    """torch, CUDA, NCCL and the GPUs torch sees."""
    try:
        import torch
    except ImportError:
        pin = tested_range("torch") or ""
        fix = f"pip install 'torch{pin}' (make install: the Makefile's TORCH), or a CUDA build"
        return [Check("torch", "fail", "not installed", fix)]
    checks = [Check("torch", "ok", f"torch {torch.__version__}")]
    if torch.cuda.is_available():
        checks.append(
            Check("cuda", "ok", f"CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s) visible")
        )
        version = torch.cuda.nccl.version()  # a tuple in torch >= 1.13, an int such as 2708 before
        nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        checks.append(Check("nccl", "ok", f"NCCL {nccl}"))
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
        names = sorted({f"{p.name} ({p.total_memory / GIB:.1f} GiB)" for p in props})
        checks.append(Check("gpus", "ok", f"{len(props)} x {', '.join(names)}"))
        return checks
    if torch.version.cuda:
        fix = "check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES"
        checks.append(Check("cuda", "warn", f"CUDA {torch.version.cuda} build, but no GPU is visible", fix))
    else:
        detail = "CPU build of torch: runs use DS_ACCELERATOR=cpu with gloo"
        checks.append(Check("cuda", "info", detail, "on a GPU box install the CUDA build of torch"))
    checks.append(Check("nccl", "info", "no NCCL without CUDA (gloo is used)"))
    checks.append(Check("gpus", "info", "no GPU visible"))
    return checks


def check_deepspeed() -> Check:
    """deepspeed, and whether it is in the range the kit's byte-exact claims were checked against (the
    ``deepspeed`` requirement of the installed zero-kit, the one place the range is written)."""
    tested = tested_range("deepspeed")
    try:
        version = importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return Check(
            "deepspeed", "fail", "not installed", f"pip install 'deepspeed{tested or ''}' (after torch)"
        )
    if tested is None:
        return Check(
            "deepspeed", "info", f"deepspeed {version}; zero-kit is not installed, tested range unknown"
        )
    if tested.contains(version, prereleases=True):
        return Check("deepspeed", "ok", f"deepspeed {version} (tested: {tested})")
    detail = f"deepspeed {version} is outside the tested range {tested}: model-state bytes may differ"
    return Check("deepspeed", "warn", detail, f"pip install 'deepspeed{tested}', or run make test against it")


def tested_range(package: str):
    """The version specifier the installed zero-kit requires for ``package`` (any extra), or None."""
    from packaging.requirements import Requirement

    try:
        requires = importlib.metadata.requires("zero-kit") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    found = [Requirement(r).specifier for r in requires if Requirement(r).name == package]
    return found[0] if found else None


class Topology(TypedDict):
    """``parse_topology``'s summary: the GPU count and the link type of each GPU pair."""

    gpus: int
    links: list[str]


def parse_topology(text: str) -> Topology:
    """Summarise ``nvidia-smi topo -m``: GPU count and the link type of each GPU pair (NV#, PIX, SYS...)."""
    lines = [line for line in text.splitlines() if line.strip()]
    header = next((line.split() for line in lines if line.split()[:1] == ["GPU0"]), [])
    gpus = sum(bool(re.fullmatch(r"GPU\d+", token)) for token in header)
    links = []
    for i, line in enumerate(row for row in lines if re.match(r"GPU\d+\s", row)):
        if i >= gpus:
            break
        cells = line.split()[1 : 1 + gpus]
        links += [cell for j, cell in enumerate(cells) if j > i]
    return {"gpus": gpus, "links": links}


def check_topology() -> Check:
    out = run_tool(["nvidia-smi", "topo", "-m"])
    if out is None:
        return Check("gpu topology", "info", "nvidia-smi not found (no NVIDIA GPU here)")
    rc, text = out
    if rc != 0:
        return Check(
            "gpu topology",
            "warn",
            f"nvidia-smi topo -m failed: {(first_line(text) or 'no output')}",
            "check the driver",
        )
    topo = parse_topology(text)
    links = topo["links"]
    if topo["gpus"] < 2:
        return Check("gpu topology", "info", f"{topo['gpus']} GPU: no GPU-to-GPU links")
    nvlink = [link for link in links if link.startswith("NV")]
    if len(nvlink) == len(links):
        return Check(
            "gpu topology", "ok", f"NVLink between all {topo['gpus']} GPUs ({', '.join(sorted(set(nvlink)))})"
        )
    kinds = ", ".join(sorted(set(links) - set(nvlink)))
    fix = "expect lower intra-node bandwidth; a machine with NVLink suits ZeRO-3 better"
    return Check(
        "gpu topology",
        "warn",
        f"{len(links) - len(nvlink)} of {len(links)} GPU pairs without NVLink ({kinds})",
        fix,
    )


def parse_ibv_devinfo(text: str) -> list[dict[str, str]]:
    """Ports from ``ibv_devinfo``: one dict per port with ``hca``, ``port``, ``state``, ``link_layer``."""
    ports: list[dict[str, str]] = []
    hca = ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        value = value.split()[0] if value else ""
        if key == "hca_id":
            hca = value
        elif key == "port":
            ports.append({"hca": hca, "port": value, "state": "", "link_layer": ""})
        elif key in ("state", "link_layer") and ports:
            ports[-1][key] = value
    return ports


def check_infiniband() -> Check:
    if not INFINIBAND_DIR.exists():
        return Check("infiniband", "info", f"no {INFINIBAND_DIR} (no InfiniBand/RoCE devices here)")
    out = run_tool(["ibv_devinfo"])
    if out is None:
        fix = "install rdma-core / ibverbs-utils; in Docker pass --device=/dev/infiniband"
        return Check("infiniband", "warn", f"{INFINIBAND_DIR} exists but ibv_devinfo is missing", fix)
    ports = parse_ibv_devinfo(out[1])
    active = [p for p in ports if p["state"] == "PORT_ACTIVE"]
    if not active:
        fix = "check cabling and the subnet manager (ibstat); NCCL would fall back to TCP sockets"
        return Check("infiniband", "warn", f"{len(ports)} port(s), none PORT_ACTIVE", fix)
    layers = ", ".join(sorted({p["link_layer"] or "?" for p in active}))
    hcas = ", ".join(sorted({p["hca"] for p in active}))
    return Check("infiniband", "ok", f"{len(active)} active port(s) on {hcas} ({layers})")


def parse_fi_info(text: str) -> list[str]:
    """EFA domains listed by ``fi_info -p efa`` (one per EFA device and endpoint type)."""
    domains, provider = [], ""
    for line in text.splitlines():
        key, _, value = (part.strip() for part in line.partition(":"))
        if key == "provider":
            provider = value
        elif key == "domain" and provider == "efa" and value not in domains:
            domains.append(value)
    return domains


def check_efa() -> Check:
    out = run_tool(["fi_info", "-p", "efa"])
    if out is None:
        return Check("efa", "info", "fi_info not found (no AWS EFA / libfabric here)")
    domains = parse_fi_info(out[1]) if out[0] == 0 else []
    if not domains:
        return Check("efa", "info", "libfabric present, no EFA provider")
    fix = "set FI_PROVIDER=efa, FI_EFA_USE_DEVICE_RDMA=1 (the kit's EFA network preset)"
    return Check("efa", "ok", f"EFA provider on {len(domains)} domain(s): {', '.join(domains)}", fix)


def check_interface() -> Check:
    """The interface NCCL should bootstrap on and this node's address (``kit.scaleout.interfaces``)."""
    from kit.scaleout import interfaces

    ip = run_tool(["ip", "-j", "addr"])
    if ip is None or ip[0] != 0:
        return Check(
            "nccl interface", "info", "ip -j addr unavailable", "install iproute2 to see the interfaces"
        )
    ibstat = run_tool(["ibstat"])
    ports = (
        interfaces.parse_ibstat(ibstat[1]) if ibstat and ibstat[0] == 0 else interfaces.read_sys_infiniband()
    )
    efa = run_tool(["fi_info", "-p", "efa"])
    choice = interfaces.choose(interfaces.parse_ip_addr(ip[1]), ports, parse_fi_info(efa[1]) if efa else [])
    values = f"NCCL_SOCKET_IFNAME={choice.socket_ifname}, MASTER_ADDR={choice.master_addr}"
    if choice.ib_hca:
        values += f", NCCL_IB_HCA={choice.ib_hca}"
    fix = (
        f"zerokit launch-cmd --interface {choice.socket_ifname}"
        if not choice.socket_ifname.startswith("^")
        else ""
    )
    return Check("nccl interface", "ok", f"{values}: {choice.reason}", fix)


def check_shm(path: str = "/dev/shm") -> Check:
    if not os.path.isdir(path):
        return Check("shared memory", "info", f"no {path} on this system")
    stat = os.statvfs(path)
    size = stat.f_blocks * stat.f_frsize
    if size < MIN_SHM_BYTES:
        fix = f"in Docker: --shm-size={SHM_SIZE} (or --ipc=host); NCCL and data loaders need large /dev/shm"
        return Check(
            "shared memory", "warn", f"{path} is {size / GIB:.2f} GiB (< {MIN_SHM_BYTES / GIB:g} GiB)", fix
        )
    return Check("shared memory", "ok", f"{path} is {size / GIB:.1f} GiB")


def check_memlock() -> Check:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check("ulimit -l", "ok", "locked memory unlimited")
    detail = f"locked memory limited to {soft // 1024} KiB"
    fix = "ulimit -l unlimited (/etc/security/limits.conf); in Docker --ulimit memlock=-1:-1"
    if INFINIBAND_DIR.exists() or shutil.which("fi_info"):
        return Check("ulimit -l", "warn", detail + ": RDMA (InfiniBand/EFA) needs pinned memory", fix)
    return Check("ulimit -l", "info", detail + " (matters only for RDMA)", fix)


def check_master_port(port: int = DEFAULT_MASTER_PORT) -> Check:
    if not 1 <= port <= 65535:
        raise ValueError(f"master_port: must be in 1..65535, got {port}")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            from kit.run.launcher import free_port

            fix = f"pass --master_port {free_port()} (a free port now) to the launcher"
            return Check("master port", "warn", f"port {port} is in use on this machine", fix)
    return Check("master port", "ok", f"port {port} is free")


def check_hostfile(path: str | os.PathLike) -> list[Check]:
    """The hostfile parses, and the launcher can reach every host (pdsh and ssh for multi-node runs)."""
    from kit.scaleout.hostfile import read_hostfile

    try:
        hosts = read_hostfile(path)
    except ValueError as error:
        return [Check("hostfile", "fail", str(error), "fix the line named above ([user@]host slots=N)")]
    slots = sum(h.slots for h in hosts)
    checks = [Check("hostfile", "ok", f"{len(hosts)} host(s), {slots} slot(s) in {path}")]
    if len(hosts) == 1:
        checks.append(Check("launcher", "ok", "single node: the deepspeed launcher runs it locally, no ssh"))
        return checks
    if shutil.which("pdsh") is None:
        fix = "install pdsh, or use --launcher openmpi|slurm, or start each node with --no_ssh --node_rank N"
        checks.append(
            Check("pdsh", "fail", "pdsh not found (the deepspeed launcher's default for multi-node)", fix)
        )
    else:
        checks.append(Check("pdsh", "ok", f"pdsh at {shutil.which('pdsh')}"))
    remote = [f"{h.user}@{h.host}" if h.user else h.host for h in hosts if not is_local(h.host)]
    with ThreadPoolExecutor(max_workers=16) as pool:  # each probe may wait out its timeout
        checks += list(pool.map(check_ssh, remote))
    return checks


def check_ssh(host: str, timeout_s: float = 5.0) -> Check:
    """Passwordless ssh to ``host`` (what pdsh needs): ``ssh -o BatchMode=yes host true``."""
    name = f"ssh {host}"
    fix = f"set up passwordless ssh (ssh-copy-id {host}) and accept its host key"
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout_s))}", host, "true"]
    out = run_tool(argv, timeout_s=timeout_s + 2)
    if out is None:
        return Check(name, "fail", "ssh not found", "install openssh-client")
    rc, text = out
    if rc != 0:
        return Check(name, "fail", f"unreachable: {(first_line(text) or 'no output')}", fix)
    return Check(name, "ok", "reachable without a password")
