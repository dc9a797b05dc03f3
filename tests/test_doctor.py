"""zerokit doctor: parsers of nvidia-smi / ibv_devinfo / fi_info output, each check's verdict, the CLI."""

import importlib.metadata
import json
import os
import platform
import re
import shutil
import socket
import sys
import tomllib
from pathlib import Path

from kit.cli import main
from kit.scaleout import doctor

REPO = Path(__file__).resolve().parent.parent
PYPROJECT = (REPO / "pyproject.toml").read_text()

# nvidia-smi topo -m on an 4-GPU NVLink box (trimmed DGX layout: NIC and affinity columns follow the GPUs)
TOPO_NVLINK = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\tPXB\t0-55,112-167\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tPXB\t0-55,112-167\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tSYS\t0-55,112-167\t0\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tSYS\t0-55,112-167\t0\t\tN/A
NIC0\tPXB\tPXB\tSYS\tSYS\t X

Legend:

  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity\tNUMA Affinity
GPU0\t X \tPIX\tSYS\t0-15\t0
GPU1\tPIX\t X \tSYS\t0-15\t0
GPU2\tSYS\tSYS\t X \t16-31\t1
"""
IBV_DEVINFO = """\
hca_id:\tmlx5_0
\ttransport:\t\t\tInfiniBand (0)
\tfw_ver:\t\t\t\t28.39.1002
\tphys_port_cnt:\t\t\t1
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_ACTIVE (4)
\t\t\tmax_mtu:\t\t4096 (5)
\t\t\tlink_layer:\t\tInfiniBand

hca_id:\tmlx5_1
\ttransport:\t\t\tInfiniBand (0)
\t\tport:\t1
\t\t\tstate:\t\t\tPORT_DOWN (1)
\t\t\tlink_layer:\t\tInfiniBand
"""
FI_INFO_EFA = """\
provider: efa
    fabric: efa
    domain: rdmap16s27-rdm
    version: 120.10
    type: FI_EP_RDM
    protocol: FI_PROTO_EFA
provider: efa
    fabric: efa
    domain: rdmap16s27-dgrm
    version: 120.10
    type: FI_EP_DGRAM
provider: efa
    fabric: efa
    domain: rdmap32s27-rdm
    type: FI_EP_RDM
"""


def test_parse_topology_nvlink_pairs_ignore_nic_columns():
    topo = doctor.parse_topology(TOPO_NVLINK)
    assert topo == {"gpus": 4, "links": ["NV18"] * 6}


def test_parse_topology_pcie_pairs():
    assert doctor.parse_topology(TOPO_PCIE) == {"gpus": 3, "links": ["PIX", "SYS", "SYS"]}


def test_parse_ibv_devinfo_ports():
    assert doctor.parse_ibv_devinfo(IBV_DEVINFO) == [
        {"hca": "mlx5_0", "port": "1", "state": "PORT_ACTIVE", "link_layer": "InfiniBand"},
        {"hca": "mlx5_1", "port": "1", "state": "PORT_DOWN", "link_layer": "InfiniBand"},
    ]


def test_parse_fi_info_unique_efa_domains():
    assert doctor.parse_fi_info(FI_INFO_EFA) == ["rdmap16s27-rdm", "rdmap16s27-dgrm", "rdmap32s27-rdm"]
    assert doctor.parse_fi_info("fi_getinfo: -61 (No data available)") == []


def _tools(monkeypatch, outputs):
    """Pretend the external tools print ``outputs[argv[0]]`` (absent from the dict = not installed)."""
    monkeypatch.setattr(doctor, "run_tool", lambda argv, timeout_s=5.0: outputs.get(argv[0]))


def test_topology_verdicts(monkeypatch):
    _tools(monkeypatch, {"nvidia-smi": (0, TOPO_NVLINK)})
    check = doctor.check_topology()
    assert (check.status, check.detail) == ("ok", "NVLink between all 4 GPUs (NV18)")
    _tools(monkeypatch, {"nvidia-smi": (0, TOPO_PCIE)})
    check = doctor.check_topology()
    assert (check.status, check.detail) == ("warn", "3 of 3 GPU pairs without NVLink (PIX, SYS)")
    _tools(monkeypatch, {})
    assert doctor.check_topology().status == "info"


def test_infiniband_and_efa_verdicts(monkeypatch, tmp_path):
    monkeypatch.setattr(doctor, "INFINIBAND_DIR", tmp_path)  # a /dev/infiniband that exists
    _tools(monkeypatch, {"ibv_devinfo": (0, IBV_DEVINFO), "fi_info": (0, FI_INFO_EFA)})
    ib = doctor.check_infiniband()
    assert (ib.status, ib.detail) == ("ok", "1 active port(s) on mlx5_0 (InfiniBand)")
    efa = doctor.check_efa()
    assert efa.status == "ok" and "3 domain(s)" in efa.detail and "FI_PROVIDER=efa" in efa.fix
    _tools(monkeypatch, {"ibv_devinfo": (0, IBV_DEVINFO.replace("PORT_ACTIVE", "PORT_DOWN"))})
    assert doctor.check_infiniband().status == "warn"
    _tools(monkeypatch, {})
    assert doctor.check_infiniband().status == "warn"  # devices but no ibv_devinfo: install rdma-core
    assert doctor.check_efa().status == "info"
    monkeypatch.setattr(doctor, "INFINIBAND_DIR", tmp_path / "absent")
    assert doctor.check_infiniband().status == "info"


def test_shm_below_a_gib_warns_with_docker_fix(monkeypatch):
    small = os.statvfs_result((4096, 4096, 16384, 0, 0, 0, 0, 0, 0, 255))  # 16384 x 4 KiB = 64 MiB
    monkeypatch.setattr(doctor.os, "statvfs", lambda path: small)
    check = doctor.check_shm()
    assert check.status == "warn" and "0.06 GiB" in check.detail and "--shm-size" in check.fix


def test_master_port_in_use_warns_and_suggests_a_free_one():
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        busy = doctor.check_master_port(port)
    assert busy.status == "warn" and f"port {port} is in use" in busy.detail
    suggested = int(busy.fix.split("--master_port ")[1].split()[0])
    assert 1 <= suggested <= 65535 and suggested != port
    assert doctor.check_master_port(port).status == "ok"  # released


def test_hostfile_single_node_needs_no_ssh(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("# one box\nlocalhost slots=8\n")
    checks = doctor.check_hostfile(path)
    assert [(c.name, c.status) for c in checks] == [("hostfile", "ok"), ("launcher", "ok")]
    assert checks[0].detail == f"1 host(s), 8 slot(s) in {path}"


def test_hostfile_bad_line_fails_naming_it(tmp_path):
    path = tmp_path / "hostfile"
    path.write_text("node1 slots=8\nnode2 slots=0\n")
    (check,) = doctor.check_hostfile(path)
    assert check.status == "fail" and f"{path}:2" in check.detail and "slots" in check.detail


def test_multi_node_without_pdsh_and_unreachable_host_fail(tmp_path, monkeypatch):
    path = tmp_path / "hostfile"
    path.write_text("localhost slots=2\nno-such-host.invalid slots=2\n")
    real_which = shutil.which
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "pdsh" else real_which(name))
    checks = {c.name: c for c in doctor.check_hostfile(path)}
    assert set(checks) == {"hostfile", "pdsh", "ssh no-such-host.invalid"}  # localhost needs no ssh
    assert checks["pdsh"].status == "fail" and "--no_ssh" in checks["pdsh"].fix
    assert checks["ssh no-such-host.invalid"].status == "fail"


def test_report_on_this_machine_says_what_it_found():
    import deepspeed
    import torch
    from packaging.requirements import Requirement
    from packaging.version import Version

    report = doctor.doctor()
    checks = {c.name: c for c in report.checks}
    assert list(checks)[:3] == ["python", "torch", "cuda"]
    # the versions as the interpreter and the installed distributions report them, the requirements as
    # pyproject.toml writes them (the doctor reads the installed zero-kit's metadata)
    python = platform.python_version()
    required = re.search(r'^requires-python = "(.+)"$', PYPROJECT, flags=re.M).group(1)
    assert Version(python) >= Version("3.11") and required == ">=3.11"
    assert checks["python"] == doctor.Check(
        "python", "ok", f"Python {python} ({sys.executable}; zero-kit needs >=3.11)"
    )
    assert checks["torch"] == doctor.Check("torch", "ok", f"torch {importlib.metadata.version('torch')}")
    assert torch.__version__ == importlib.metadata.version("torch")
    extras = tomllib.loads(PYPROJECT)["project"]["optional-dependencies"]
    (pin,) = [
        Requirement(r) for group in extras.values() for r in group if Requirement(r).name == "deepspeed"
    ]
    assert str(pin.specifier) == "<0.20,>=0.19.8" and pin.specifier.contains(deepspeed.__version__)
    assert checks["deepspeed"] == doctor.Check(
        "deepspeed", "ok", f"deepspeed {deepspeed.__version__} (tested: <0.20,>=0.19.8)"
    )
    if not torch.cuda.is_available():  # this kind of machine and CI: hardware it lacks is info, not fail
        assert [checks[n].status for n in ("cuda", "nccl", "gpus")] == ["info", "info", "info"]
    assert not report.failed and report.counts()["fail"] == 0
    assert report.table()[["status", "check"]].values.tolist() == [[c.status, c.name] for c in report.checks]


def test_deepspeed_outside_the_tested_range_warns(monkeypatch):
    monkeypatch.setattr(doctor.importlib.metadata, "version", lambda name: "0.18.0")
    check = doctor.check_deepspeed()
    assert check.status == "warn" and "outside the tested range <0.20,>=0.19.8" in check.detail
    assert check.fix.startswith("pip install 'deepspeed<0.20,>=0.19.8'")


def test_cli_json_is_one_object_and_exit_status_follows_failures(capsys, tmp_path):
    assert main(["doctor", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and out["counts"]["fail"] == 0
    bad = tmp_path / "hostfile"
    bad.write_text("node1 slots=eight\n")
    assert main(["doctor", "--hostfile", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["checks"][-1]["name"] == "hostfile"


def test_python_is_checked_against_requires_python():
    check_python = doctor.check_python

    required = re.search(r'^requires-python = "(.+)"$', PYPROJECT, flags=re.M).group(1)
    assert required == ">=3.11"
    assert check_python("3.11.0").status == "ok" and check_python().status == "ok"
    old = check_python("3.10.14")
    assert (old.status, old.detail) == ("fail", f"Python 3.10.14: zero-kit needs {required}")


def test_one_torch_pin_in_the_makefile_and_environment_within_pyprojects_range():
    from packaging.requirements import Requirement

    pin = re.search(r"^TORCH\s+\?= torch==(\S+)$", (REPO / "Makefile").read_text(), flags=re.M).group(1)
    env = re.findall(r"torch==(\S+)", (REPO / "environment.yml").read_text())
    assert env == [pin]
    ranges = [Requirement(r).specifier for r in re.findall(r'"(torch[^"]*)"', PYPROJECT)]
    assert ranges and all(r.contains(pin) for r in ranges)
    assert "torch==" not in Path(doctor.__file__).read_text()  # the doctor names pyproject's range
