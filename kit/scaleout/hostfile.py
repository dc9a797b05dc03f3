"""DeepSpeed hostfiles: one ``[user@]host slots=N`` line per node; ``#`` comments and blank lines allowed.

The format is what ``deepspeed/launcher/runner.py`` ``_parse_hostfile`` reads (the node's GPU count
in ``slots``); this module is stricter where DeepSpeed would fail later or silently: it rejects
``slots=0``, text after the slots, and a master address that is not one of the hosts, naming the line.
"""

from __future__ import annotations

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


def read_hostfile(path: str | Path) -> list[Host]:
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
