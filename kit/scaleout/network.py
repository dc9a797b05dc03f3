"""Network presets per interconnect: the NCCL / libfabric variables every rank needs and the ``docker run``
flags, each with its reason.

``cluster.interconnect`` picks the preset (InfiniBand, EFA or Ethernet); the setup's allocator setting
(``zero.expandable_segments``: ``PYTORCH_CUDA_ALLOC_CONF``) joins its variables. They go to
``.deepspeed_env``, which DeepSpeed's launcher exports to every node, and to every launch file's exports.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kit.schema import Setup

#: Excludes the docker bridge and loopback, so NCCL's bootstrap picks a real NIC (NCCL docs).
NOT_DOCKER_OR_LOOPBACK = "^docker0,lo"
#: /dev/shm for a training container: NCCL and DataLoader workers share memory there (docker's default
#: is 64 MB); ``zerokit doctor`` advises the same.
SHM_SIZE = "64g"


@dataclass(frozen=True)
class Setting:
    """One environment variable or docker flag, and why it is there (one line)."""

    value: str
    reason: str


@dataclass(frozen=True)
class Network:
    """A network preset: environment for every rank, docker flags, and a warning where it is slow."""

    name: str
    env: dict[str, Setting]
    docker: tuple[Setting, ...]
    warning: str | None = None


def network(setup: Setup, interface: str | None = None, hca: str | None = None) -> Network:
    """The preset for ``setup.cluster.interconnect``; ``interface`` pins NCCL's bootstrap to one NIC
    (e.g. ib0), ``hca`` names the InfiniBand adapters NCCL uses (``NCCL_IB_HCA``, InfiniBand only); with
    ``zero.expandable_segments`` its environment sets PyTorch's allocator too."""
    net = _preset(setup, interface, hca)
    if not setup.zero.expandable_segments:
        return net
    allocator = Setting(
        "expandable_segments:True",
        "PyTorch's caching allocator grows its segments (zero.expandable_segments, as the estimate replays)",
    )
    return replace(net, env={**net.env, "PYTORCH_CUDA_ALLOC_CONF": allocator})


def _preset(setup: Setup, interface: str | None, hca: str | None) -> Network:
    kind = setup.cluster.interconnect
    if hca and kind != "infiniband":
        raise ValueError(
            f"hca: NCCL_IB_HCA names InfiniBand adapters, but the cluster's interconnect is {kind}; "
            "drop --hca or use --interconnect infiniband"
        )
    ifname = Setting(
        interface or NOT_DOCKER_OR_LOOPBACK,
        f"NCCL's socket bootstrap uses {interface}"
        if interface
        else "NCCL skips the docker bridge and loopback",
    )
    docker = [
        Setting("--gpus=all", "give the container every GPU of the node"),
        Setting("--network=host", "ranks reach other nodes directly, without docker's NAT"),
        Setting(
            f"--shm-size={SHM_SIZE}",
            "NCCL and DataLoader workers share memory via /dev/shm (docker default 64 MB)",
        ),
        Setting("--ulimit=memlock=-1:-1", "pinned host memory (offload, RDMA) must not be limited"),
    ]
    rdma = [
        Setting("--cap-add=IPC_LOCK", "RDMA registers (locks) memory pages"),
        Setting("--device=/dev/infiniband", "the RDMA verbs devices NCCL uses"),
    ]
    if kind == "infiniband":
        env = {"NCCL_SOCKET_IFNAME": ifname, "NCCL_IB_DISABLE": Setting("0", "use InfiniBand verbs for NCCL")}
        if hca:
            env["NCCL_IB_HCA"] = Setting(hca, "NCCL's InfiniBand traffic uses these adapters (ports)")
        return Network("infiniband", env, tuple(docker + rdma))
    if kind == "efa":
        env = {
            "NCCL_SOCKET_IFNAME": ifname,
            "FI_PROVIDER": Setting("efa", "libfabric (aws-ofi-nccl plugin) uses the EFA provider"),
            "FI_EFA_USE_DEVICE_RDMA": Setting("1", "GPUDirect RDMA over EFA (p4d/p5 instances)"),
            "NCCL_PROTO": Setting("simple", "AWS's recommendation for NCCL over EFA"),
        }
        return Network("efa", env, tuple(docker + rdma))
    env = {
        "NCCL_SOCKET_IFNAME": ifname,
        "NCCL_IB_DISABLE": Setting("1", "no InfiniBand: NCCL uses TCP sockets"),
    }
    warning = (
        "plain Ethernet: NCCL over TCP typically reaches a few GB/s between nodes, an order of magnitude "
        "below InfiniBand or EFA; each step moves about 2 model sizes of 16-bit data (3 at stage 3, ZeRO "
        "paper), so expect communication-bound steps across nodes"
    )
    return Network("ethernet", env, tuple(docker), warning)


def deepspeed_env(setup: Setup, interface: str | None = None, hca: str | None = None) -> str:
    """Content of ``.deepspeed_env``: ``KEY=VALUE`` lines, unquoted (DeepSpeed's launcher splits each line
    at the first ``=`` and quotes values itself; it cannot read comments or blank lines)."""
    return "".join(f"{k}={s.value}\n" for k, s in network(setup, interface, hca).env.items())
