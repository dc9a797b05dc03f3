"""The interface NCCL should use, from real command outputs kept as fixtures (tests/fixtures/net/):
an InfiniBand node, an AWS EFA instance, this kind of machine (plain Ethernet) and a Docker host."""

from pathlib import Path

import pytest

from kit.scaleout import doctor, interfaces

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "net"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


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
    for ca, state, gid in (("mlx5_0", "4: ACTIVE", "fe80:0000:0000:0000:0c42:a103:00c0:ffee"),):
        port = tmp_path / ca / "ports" / "1"
        (port / "gids").mkdir(parents=True)
        (port / "state").write_text(state + "\n")
        (port / "link_layer").write_text("InfiniBand\n")
        (port / "gids" / "0").write_text(gid + "\n")
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


def test_doctor_names_the_interface_on_this_machine():
    check = doctor.check_interface()
    assert check.name == "nccl interface" and check.status == "ok"
    assert check.detail.startswith("NCCL_SOCKET_IFNAME=")
