"""DeepSpeed hostfiles: one ``[user@]host slots=N`` line per node; ``#`` comments and blank lines allowed.

The format is what ``deepspeed/launcher/runner.py`` ``_parse_hostfile`` reads (the node's GPU count
in ``slots``); this module is stricter where DeepSpeed would fail later or silently: it rejects
``slots=0``, text after the slots, and a master address that is not one of the hosts, naming the line.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

_LINE = re.compile(r"^(?:(?P<user>[\w.-]+)@)?(?P<host>[\w.-]+)\s+slots=(?P<slots>\d+)\s*(?:#.*)?$")


class HostfileError(ValueError):
    """A hostfile problem; the message names the file and line."""


@dataclass(frozen=True)
class Host:
    """One node: its address (as pdsh/ssh reach it), optional ssh user, and GPU slots."""

    host: str
    slots: int
    user: str | None = None

    @property
    def line(self) -> str:
        return (
            f"{self.user}@{self.host} slots={self.slots}" if self.user else f"{self.host} slots={self.slots}"
        )


def parse_hostfile(text: str, source: str = "hostfile") -> list[Host]:
    """The hosts a hostfile lists, in order; HostfileError names ``source:line`` on any bad line."""
    hosts: list[Host] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        if not match:
            raise HostfileError(f"{source}:{number}: expected '[user@]host slots=N', got {line!r}")
        host, slots = match["host"], int(match["slots"])
        if slots < 1:
            raise HostfileError(f"{source}:{number}: slots must be >= 1 (the node's GPU count), got {slots}")
        if host in seen:
            raise HostfileError(f"{source}:{number}: duplicate host {host!r} (first on line {seen[host]})")
        seen[host] = number
        hosts.append(Host(host, slots, match["user"]))
    if not hosts:
        raise HostfileError(f"{source}: no hosts (expected lines like 'node1 slots=8')")
    return hosts


def read_hostfile(path: str | os.PathLike[str]) -> list[Host]:
    path = Path(path)
    return parse_hostfile(path.read_text(), source=str(path))


def make_hosts(names: list[str], slots: int, user: str | None = None) -> list[Host]:
    """Hosts from names (each ``host`` or ``user@host``) with the same slot count; validated."""
    lines = [name if "@" in name or not user else f"{user}@{name}" for name in names]
    return parse_hostfile("\n".join(f"{name} slots={slots}" for name in lines), source="hosts")


def format_hostfile(hosts: list[Host]) -> str:
    return "".join(h.line + "\n" for h in hosts)


def write_hostfile(hosts: list[Host], path: str | Path) -> Path:
    path = Path(path)
    path.write_text(format_hostfile(hosts))
    return path


def is_local(host: str) -> bool:
    """Whether ``host`` is this machine (loopback names, or its own hostname)."""
    return host in ("localhost", "::1") or host.startswith("127.") or host == socket.gethostname()


def check_master(hosts: list[Host], master_addr: str) -> None:
    """The master address must be one of the hosts (DeepSpeed defaults to the first)."""
    names = [h.host for h in hosts]
    if master_addr not in names:
        raise HostfileError(
            f"master_addr: {master_addr!r} is not a host in the hostfile ({', '.join(names)}); "
            f"use the first host, {names[0]!r}, where rank 0 runs"
        )


def check_cluster(hosts: list[Host], nodes: int, gpus_per_node: int) -> None:
    """The hostfile must describe the cluster the Setup was sized for (nodes x GPUs per node)."""
    if len(hosts) != nodes:
        raise HostfileError(f"hostfile: lists {len(hosts)} hosts but the setup has nodes={nodes}")
    for h in hosts:
        if h.slots != gpus_per_node:
            raise HostfileError(
                f"hostfile: {h.host} has slots={h.slots} but the setup has gpus_per_node={gpus_per_node}"
            )


def nodes_from_hostfile(
    hostfile: str | Path,
    nprocs: int,
    *,
    nodes: int | None = None,
    local: bool = False,
    backend: str = "pdsh",
    include: str = "",
    exclude: str = "",
    master_addr: str | None = None,
    master_port: int | None = None,
):
    """The ``Nodes`` of ``hostfile``, checked before anything starts (ValueError, one line each): the
    hostfile line by line, ``include`` / ``exclude`` as DeepSpeed's runner applies them, hosts against
    ``nodes`` (default: every host left) and slots against ``nprocs``, the master address and port."""
    from kit.run.local_nodes import Nodes

    if include and exclude:
        raise ValueError("include: give --include or --exclude, not both (DeepSpeed refuses both)")
    hosts = read_hostfile(hostfile)
    keys = {h.host: f"{h.user}@{h.host}" if h.user else h.host for h in hosts}  # DeepSpeed's pool keys
    active = _deepspeed_filter({keys[h.host]: h.slots for h in hosts}, include, exclude)
    names = [h.host for h in hosts if keys[h.host] in active]
    slots = {name: len(active[keys[name]]) for name in names}
    filtered = include or exclude
    after = " after --include/--exclude" if filtered else ""
    if not names:
        raise ValueError(f"hostfile: no host left{after} ({hostfile})")
    count = len(names) if nodes is None else nodes
    if count < 1 or count > len(names):
        raise ValueError(f"nodes: the hostfile has {len(names)} hosts{after}, got --nodes {count}")
    if filtered and count != len(names):
        raise ValueError(
            f"nodes: --include/--exclude leave {len(names)} hosts, all of which run (DeepSpeed refuses "
            f"--num_nodes beside them); drop --nodes or change the filter"
        )
    names = names[:count]
    for name in names:
        if slots[name] < nprocs or (filtered and slots[name] != nprocs):
            need = "exactly" if filtered else "at least"
            raise ValueError(
                f"nprocs: {nprocs} ranks per node need {need} {nprocs} slots on every host, but "
                f"{name} has {slots[name]}{after} ({hostfile})"
            )
    if master_addr:
        check_master(hosts, master_addr)
    if master_port is not None and not 1 <= master_port <= 65535:
        raise ValueError(f"master-port: must be in 1..65535, got {master_port}")
    return Nodes(
        Path(hostfile), tuple(names), nprocs, local=local, backend=backend, include=include,
        exclude=exclude, master_addr=master_addr, master_port=master_port,
    )  # fmt: skip


def _deepspeed_filter(pool: dict[str, int], include: str, exclude: str) -> dict[str, list[int]]:
    """The hosts and slots DeepSpeed's runner keeps of ``pool`` (its own ``parse_inclusion_exclusion``)."""
    if not (include or exclude):
        return {host: list(range(n)) for host, n in pool.items()}
    import os

    from kit.run.launcher import ranks_accelerator

    # the ranks' accelerator, as worker_env gives them: unset, DeepSpeed's import says it fell back to the
    # CPU on stdout (a line in front of `--json`'s document)
    os.environ.setdefault("DS_ACCELERATOR", ranks_accelerator())
    from deepspeed.launcher.runner import parse_inclusion_exclusion

    try:
        return dict(parse_inclusion_exclusion(pool, include, exclude))
    except ValueError as error:
        raise ValueError(f"{'include' if include else 'exclude'}: {error}") from None
