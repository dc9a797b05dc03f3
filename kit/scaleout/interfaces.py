"""Which network interface NCCL should use on this node, and the address to give as ``MASTER_ADDR``.

NCCL bootstraps over TCP on an interface it picks itself, and a wrong pick (a docker bridge, a
wireless NIC, a management port) hangs the first collective or slows every one. This module reads
``ip -j addr`` (interfaces, state, IPv4 addresses), InfiniBand ports (``ibstat``, or
``/sys/class/infiniband``) and EFA domains (``fi_info -p efa``, from ``kit.scaleout.doctor``), and says:
- InfiniBand: the IP-over-IB interface whose hardware address ends in an *Active* port's GUID
  (the last 8 of its 20 bytes), so bootstrap and data take the fabric; ``NCCL_IB_HCA`` lists the
  active adapters;
- EFA: the instance's IP interface (EFA devices carry no IP; libfabric moves the data);
- Ethernet: the one real interface with IPv4, or the exclusion form (``^docker0,lo``, plus the
  bridges present) when several are up.
The parsers are pure functions over the commands' text (tests keep real outputs as fixtures).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

#: interface names that are never the one to use: loopback and container / VM bridges and tunnels
VIRTUAL = re.compile(r"^(lo|docker\d*|br-.*|veth.*|virbr.*|cni.*|flannel.*|cali.*|tun.*|tap.*|vxlan.*)$")
SYS_INFINIBAND = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class Interface:
    """One network interface: name, whether it is up, link type (``ether``, ``infiniband``...), hardware
    address and IPv4 addresses."""

    name: str
    up: bool
    link_type: str
    address: str
    ipv4: tuple[str, ...]


@dataclass(frozen=True)
class IbPort:
    """One InfiniBand (or RoCE) port: adapter, port number, state, link layer and port GUID (16 hex)."""

    ca: str
    port: int
    state: str
    link_layer: str
    guid: str


@dataclass(frozen=True)
class Choice:
    """What to set: ``NCCL_SOCKET_IFNAME``, the node's ``MASTER_ADDR`` candidate, ``NCCL_IB_HCA`` (None
    off InfiniBand), and why."""

    socket_ifname: str
    master_addr: str | None
    ib_hca: str | None
    reason: str


def parse_ip_addr(text: str) -> list[Interface]:
    """The interfaces of ``ip -j addr`` output."""
    out = []
    for item in json.loads(text):
        ipv4 = tuple(a["local"] for a in item.get("addr_info", []) if a.get("family") == "inet")
        up = "UP" in item.get("flags", []) and item.get("operstate") in ("UP", "UNKNOWN")
        out.append(Interface(item["ifname"], up, item.get("link_type", ""), item.get("address", ""), ipv4))
    return out


def parse_ibstat(text: str) -> list[IbPort]:
    """The ports of ``ibstat`` output (``CA 'mlx5_0'`` blocks with ``Port N:`` sections)."""
    ports: list[IbPort] = []
    ca: str | None = None
    port: int | None = None
    fields: dict[str, str] = {}

    def close():
        if ca is not None and port is not None:
            guid = fields.get("Port GUID", "").removeprefix("0x").lower().rjust(16, "0")
            ports.append(IbPort(ca, port, fields.get("State", ""), fields.get("Link layer", ""), guid))

    for raw in text.splitlines():
        line = raw.strip()
        if match := re.match(r"^CA '(.+)'$", line):
            close()
            ca, port, fields = match.group(1), None, {}
        elif match := re.match(r"^Port (\d+):$", line):
            close()
            port, fields = int(match.group(1)), {}
        elif ":" in line and port is not None:
            key, _, value = line.partition(":")
            fields[key.strip()] = value.strip()
    close()
    return ports


def read_sys_infiniband(root: Path = SYS_INFINIBAND) -> list[IbPort]:
    """The same from sysfs (``<ca>/ports/<n>/{state,link_layer,gids/0}``) where ``ibstat`` is missing."""
    ports = []
    for port_dir in sorted(root.glob("*/ports/*")):
        try:
            state = port_dir.joinpath("state").read_text().split(":")[-1].strip()
            layer = port_dir.joinpath("link_layer").read_text().strip()
            gid = port_dir.joinpath("gids", "0").read_text().strip()
        except OSError:
            continue
        guid = gid.replace(":", "")[-16:].lower()
        ports.append(IbPort(port_dir.parent.parent.name, int(port_dir.name), state.capitalize(), layer, guid))
    return ports


def ipoib_guid(interface: Interface) -> str | None:
    """The port GUID in an IP-over-IB interface's 20-byte hardware address (its last 8 bytes)."""
    parts = interface.address.split(":")
    return "".join(parts[-8:]).lower() if interface.link_type == "infiniband" and len(parts) == 20 else None


def choose(interfaces: list[Interface], ib_ports: list[IbPort], efa_domains: Sequence[str] = ()) -> Choice:
    """The interface for NCCL's bootstrap (``NCCL_SOCKET_IFNAME``) and this node's address (see the
    module docstring for the rules)."""
    real = [i for i in interfaces if i.up and i.ipv4 and not VIRTUAL.match(i.name)]
    active = {p.guid: p for p in ib_ports if p.state == "Active" and p.link_layer == "InfiniBand"}
    ipoib = [(i, active[g]) for i in real if (g := ipoib_guid(i)) in active]
    if ipoib:
        iface, port = ipoib[0]
        hca = ",".join(f"{p.ca}:{p.port}" for p in active.values())
        reason = (
            f"IP over InfiniBand on {port.ca} port {port.port} (Active, GUID 0x{port.guid}): bootstrap "
            f"and data on the fabric; NCCL_IB_HCA={hca} lists the active adapters"
        )
        return Choice(iface.name, iface.ipv4[0], hca, reason)
    if len(real) == 1:
        why = "EFA carries the data (libfabric); this is the instance's IP interface" if efa_domains else (
            "the only interface that is up with IPv4, besides loopback and container bridges"
        )  # fmt: skip
        return Choice(real[0].name, real[0].ipv4[0], None, why)
    if real:
        skip = ["docker0", "lo"] + sorted(
            {i.name for i in interfaces if VIRTUAL.match(i.name)} - {"docker0", "lo"}
        )
        reason = (
            f"{len(real)} interfaces are up with IPv4 ({', '.join(i.name for i in real)}): NCCL may pick any "
            f"but the excluded ones; pin the one your nodes share with --interface (MASTER_ADDR shown is "
            f"{real[0].name}'s)"
        )
        return Choice("^" + ",".join(skip), real[0].ipv4[0], None, reason)
    return Choice("lo", "127.0.0.1", None, "no interface besides loopback is up with IPv4: one node only")
