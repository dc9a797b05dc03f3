"""The interface NCCL should use, from real command outputs kept as fixtures (tests/fixtures/net/):
an InfiniBand node, an AWS EFA instance, this kind of machine (plain Ethernet) and a Docker host."""

from pathlib import Path

import pytest

from kit.scaleout import doctor, interfaces

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "net"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def _sysfs(root: Path, ca: str, state: str, gid: str) -> Path:
    port = root / ca / "ports" / "1"
    (port / "gids").mkdir(parents=True)
    (port / "state").write_text(state + "\n")
    (port / "link_layer").write_text("InfiniBand\n")
    (port / "gids" / "0").write_text(gid + "\n")
    return root


def test_parse_ip_addr_reads_state_link_type_and_ipv4():
    found = {
        i.name: (i.up, i.link_type, i.ipv4)
        for i in interfaces.parse_ip_addr(fixture("infiniband_ip_addr.json"))
    }
    assert found == {
        "lo": (True, "loopback", ("127.0.0.1",)),
        "eno1": (True, "ether", ("198.51.100.21",)),
        "ib0": (True, "infiniband", ("203.0.113.21",)),
        "ib1": (False, "infiniband", ()),
        "docker0": (False, "ether", ("172.17.0.1",)),
    }


def test_parse_ibstat_ports():
    ports = interfaces.parse_ibstat(fixture("infiniband_ibstat.txt"))
    assert ports == [
        interfaces.IbPort("mlx5_0", 1, "Active", "InfiniBand", "0c42a10300c0ffee"),
        interfaces.IbPort("mlx5_1", 1, "Down", "InfiniBand", "0c42a10300c0ffef"),
    ]


def test_sysfs_ports_match_ibstat(tmp_path):
    _sysfs(tmp_path, "mlx5_0", "4: ACTIVE", "fe80:0000:0000:0000:0c42:a103:00c0:ffee")
    assert interfaces.read_sys_infiniband(tmp_path) == [
        interfaces.IbPort("mlx5_0", 1, "Active", "InfiniBand", "0c42a10300c0ffee")
    ]


def test_infiniband_picks_the_ipoib_interface_of_the_active_port():
    ifaces = interfaces.parse_ip_addr(fixture("infiniband_ip_addr.json"))
    choice = interfaces.choose(ifaces, interfaces.parse_ibstat(fixture("infiniband_ibstat.txt")))
    assert (choice.socket_ifname, choice.master_addr, choice.ib_hca) == ("ib0", "203.0.113.21", "mlx5_0:1")
    assert "mlx5_0 port 1 (Active, GUID 0x0c42a10300c0ffee)" in choice.reason


def test_efa_uses_the_instances_ip_interface():
    domains = doctor.parse_fi_info(fixture("efa_fi_info.txt"))
    choice = interfaces.choose(interfaces.parse_ip_addr(fixture("efa_ip_addr.json")), [], domains)
    assert (choice.socket_ifname, choice.master_addr, choice.ib_hca) == ("ens32", "203.0.113.11", None)
    assert choice.reason.startswith("EFA carries the data")


def test_plain_ethernet_picks_the_one_real_interface():
    choice = interfaces.choose(interfaces.parse_ip_addr(fixture("ethernet_ip_addr.json")), [])
    assert (choice.socket_ifname, choice.master_addr) == ("eth0", "192.0.2.10")


def test_docker_host_with_two_nics_gets_the_exclusion_form():
    choice = interfaces.choose(interfaces.parse_ip_addr(fixture("docker_ip_addr.json")), [])
    assert choice.socket_ifname == "^docker0,lo,br-5e8d1c2a7f10,veth3f2a1b0"
    assert choice.master_addr == "198.51.100.40"
    assert "2 interfaces are up with IPv4 (enp5s0, wlp4s0)" in choice.reason


@pytest.mark.parametrize(
    "name", ["lo", "docker0", "br-5e8d1c2a7f10", "veth3f2a1b0", "virbr0", "cni0", "flannel.1"]
)
def test_bridges_and_loopback_are_never_chosen(name):
    assert interfaces.VIRTUAL.match(name)


def _tools(monkeypatch, outputs: dict[str, str]):
    """The doctor's external tools print the fixture ``outputs[argv[0]]`` (absent: not installed)."""
    found = {tool: (0, fixture(name)) for tool, name in outputs.items()}
    monkeypatch.setattr(doctor, "run_tool", lambda argv, timeout_s=5.0: found.get(argv[0]))


IB_DETAIL = (
    "NCCL_SOCKET_IFNAME=ib0, MASTER_ADDR=203.0.113.21, NCCL_IB_HCA=mlx5_0:1: IP over InfiniBand on mlx5_0 "
    "port 1 (Active, GUID 0x0c42a10300c0ffee): bootstrap and data on the fabric; NCCL_IB_HCA=mlx5_0:1 lists "
    "the active adapters"
)


def test_doctor_on_an_infiniband_node_from_ibstat_or_sysfs(monkeypatch, tmp_path):
    _tools(monkeypatch, {"ip": "infiniband_ip_addr.json", "ibstat": "infiniband_ibstat.txt"})
    expected = doctor.Check("nccl interface", "ok", IB_DETAIL, "zerokit launch-cmd --interface ib0")
    assert doctor.check_interface() == expected
    # without ibstat, the ports come from sysfs: the same verdict
    root = _sysfs(tmp_path, "mlx5_0", "4: ACTIVE", "fe80:0000:0000:0000:0c42:a103:00c0:ffee")
    _sysfs(root, "mlx5_1", "1: DOWN", "fe80:0000:0000:0000:0c42:a103:00c0:ffef")
    read = interfaces.read_sys_infiniband
    monkeypatch.setattr(interfaces, "read_sys_infiniband", lambda: read(root))
    _tools(monkeypatch, {"ip": "infiniband_ip_addr.json"})
    assert doctor.check_interface() == expected
    # no active port: the IPoIB interface is not preferred; two real interfaces up: the exclusion form
    monkeypatch.setattr(interfaces, "read_sys_infiniband", lambda: [])
    check = doctor.check_interface()
    assert check.status == "ok" and check.fix == ""
    assert check.detail.startswith("NCCL_SOCKET_IFNAME=^docker0,lo, MASTER_ADDR=198.51.100.21: 2 interfaces")


def test_doctor_on_efa_ethernet_docker_and_without_ip(monkeypatch):
    _tools(monkeypatch, {"ip": "efa_ip_addr.json", "fi_info": "efa_fi_info.txt"})
    assert doctor.check_interface() == doctor.Check(
        "nccl interface",
        "ok",
        "NCCL_SOCKET_IFNAME=ens32, MASTER_ADDR=203.0.113.11: EFA carries the data (libfabric); this is the "
        "instance's IP interface",
        "zerokit launch-cmd --interface ens32",
    )
    _tools(monkeypatch, {"ip": "ethernet_ip_addr.json"})
    assert doctor.check_interface() == doctor.Check(
        "nccl interface",
        "ok",
        "NCCL_SOCKET_IFNAME=eth0, MASTER_ADDR=192.0.2.10: the only interface that is up with IPv4, besides "
        "loopback and container bridges",
        "zerokit launch-cmd --interface eth0",
    )
    _tools(monkeypatch, {"ip": "docker_ip_addr.json"})
    check = doctor.check_interface()
    assert check.detail.startswith("NCCL_SOCKET_IFNAME=^docker0,lo,br-5e8d1c2a7f10,veth3f2a1b0, MASTER_ADDR=")
    assert check.fix == ""  # an exclusion list is no --interface value
    _tools(monkeypatch, {})
    assert doctor.check_interface() == doctor.Check(
        "nccl interface", "info", "ip -j addr unavailable", "install iproute2 to see the interfaces"
    )


def test_doctor_on_this_machine_names_one_of_its_own_addresses():
    """Whatever this machine is: the address named is one of its interfaces' (psutil, not ``ip``)."""
    import socket

    import psutil

    check = doctor.check_interface()
    if check.status == "info":  # no iproute2 here
        assert check.detail == "ip -j addr unavailable"
        return
    values = dict(part.split("=", 1) for part in check.detail.split(": ", 1)[0].split(", "))
    addresses = {
        name: {a.address for a in found if a.family == socket.AF_INET}
        for name, found in psutil.net_if_addrs().items()
    }
    ifname = values["NCCL_SOCKET_IFNAME"]
    if ifname.startswith("^"):
        excluded = set(ifname[1:].split(","))
        assert any(values["MASTER_ADDR"] in a for n, a in addresses.items() if n not in excluded)
    else:
        assert values["MASTER_ADDR"] in addresses[ifname]
