"""Several nodes, simulated on this machine or reached through DeepSpeed's multi-node runner.

Three layers:
- the starter, for any per-rank module: ``start_hosts_here`` starts one launcher per host of a hostfile
  on this machine at once (``--hostfile H --no_ssh --node_rank i``), as each node of a cluster starts
  its own; ``run_together`` starts such launchers and stops them all when one fails, the watchdog fires
  or ``cancel()`` says so; ``start_local_nodes`` does so for a hostfile of loopback names it writes
  (``localhost``, ``127.0.0.1``, ...). ``zerokit commtest --hostfile`` and ``--nnodes`` use them;
- ``Nodes``: the nodes of a sweep (``run_sweep(nodes=...)``, ``zerokit run / tune --hostfile H``): started
  here (``local``, the rehearsal the tests and notebooks run) or by DeepSpeed's runner from this node
  (``runner_argv``: ``--hostfile --launcher --include/--exclude --master_addr/--master_port``), the
  outcome naming the node that failed (``NodesDone``);
- ``run_setups_on_local_nodes``: Setups of several nodes (e.g. 2 nodes x 2 GPUs) run for real by
  ``kit.ranks.worker`` through ``run_sweep`` on simulated nodes, the CI stand-in for a cluster. The ranks
  record as in any sweep, including their node and the communication split by node
  (``comm_scope_bytes``), which a one-node sweep cannot show. ``per_node`` sums records by node.
"""

from __future__ import annotations

import re
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from kit.components import MODEL_STATES
from kit.run.launcher import CANCEL_RC, TIMEOUT_RC, free_port, launch_argv, run_launch, worker_env
from kit.schema import Setup

#: DeepSpeed's multi-node runner backends ``Nodes`` passes on (``deepspeed --launcher``)
RUNNER_BACKENDS = ("pdsh", "openmpi", "slurm")


@dataclass(frozen=True)
class NodesDone:
    """How a launch over several nodes ended: the exit status (``TIMEOUT_RC`` for the watchdog,
    ``CANCEL_RC`` for ``cancel()``), each node's status and output (one of each through DeepSpeed's
    runner, which reports for all) and the node that failed first, if one did."""

    rc: int
    rcs: tuple[int, ...]
    outputs: tuple[str, ...]
    failed_node: int | None = None

    @property
    def output(self) -> str:
        """Node 0's output; every node's, each under a ``--- node i`` line, when a node failed."""
        if self.failed_node is None or len(self.outputs) == 1:
            return self.outputs[0]
        return "\n".join(f"--- node {i}:\n{out}" for i, out in enumerate(self.outputs))


def run_together(
    argvs: Sequence[list[str]],
    env: dict[str, str],
    timeout_s: float,
    on_line: Callable[[str], None] | None = None,
    *,
    deadline: Callable[[], float | None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> NodesDone:
    """One launcher per node, at once (node 0's lines to ``on_line``), each under ``run_launch``'s
    timeout, watchdog and cancel. The first node that exits with an error stops the others (a node that
    never starts cannot leave the rest waiting for it): that node is ``failed_node``."""
    stop, lock, failures = threading.Event(), threading.Lock(), []

    def stopped() -> bool:
        return stop.is_set() or (cancel is not None and cancel())

    def one(node: int) -> tuple[int, str]:
        rc, output = run_launch(
            argvs[node], env, timeout_s, on_line if node == 0 else None, deadline=deadline, cancel=stopped
        )
        with lock:
            if rc not in (0, TIMEOUT_RC, CANCEL_RC) and not stop.is_set():
                failures.append(node)
            if rc != 0:
                stop.set()
        return rc, output

    with ThreadPoolExecutor(len(argvs)) as pool:
        done = list(pool.map(one, range(len(argvs))))
    rcs, outputs = tuple(rc for rc, _ in done), tuple(out for _, out in done)
    if failures:
        return NodesDone(rcs[failures[0]], rcs, outputs, failures[0])
    if TIMEOUT_RC in rcs:
        return NodesDone(TIMEOUT_RC, rcs, outputs)
    return NodesDone(CANCEL_RC if any(rcs) else 0, rcs, outputs)


def _host_argvs(script: str, script_args: list[str], hostfile: str | Path, slots: Sequence[int]) -> list:
    """One deepspeed launcher per host of ``hostfile``, each for this machine (``--no_ssh --node_rank i``)."""
    port, nodes = free_port(), len(slots)
    return [
        launch_argv(script, script_args, n, nnodes=nodes, node_rank=r, master_port=port, hostfile=hostfile)
        for r, n in enumerate(slots)
    ]


def start_hosts_here(
    script: str, script_args: list[str], hostfile: str | Path, slots: Sequence[int], timeout_s: float
) -> tuple[list[int], list[str]]:
    """Every host of ``hostfile`` (``slots``: its hosts' slots, in order) started on this machine at once,
    one deepspeed launcher per host (the master on this machine), each left to end on its own (commtest
    reads what every rank printed); returns each node's exit status and output, in hostfile order."""
    argvs, env = _host_argvs(script, script_args, hostfile, slots), worker_env(max(slots))
    with ThreadPoolExecutor(len(argvs)) as pool:
        done = list(pool.map(lambda argv: run_launch(argv, env, timeout_s), argvs))
    return [rc for rc, _ in done], [out for _, out in done]


def start_local_nodes(
    script: str, script_args: list[str], nprocs: int, nnodes: int, timeout_s: float
) -> tuple[list[int], list[str]]:
    """``script`` on ``nnodes`` simulated nodes of ``nprocs`` ranks: a hostfile of ``loopback_names``
    (DeepSpeed's ``host slots=N`` lines) started by ``start_hosts_here``."""
    with tempfile.TemporaryDirectory(prefix="zerokit-nodes-") as folder:
        hostfile = Path(folder) / "hostfile"
        hostfile.write_text("".join(f"{name} slots={nprocs}\n" for name in loopback_names(nnodes)))
        return start_hosts_here(script, script_args, hostfile, [nprocs] * nnodes, timeout_s)


def loopback_names(nnodes: int) -> list[str]:
    """``localhost``, ``127.0.0.1``, ``127.0.0.2``...: ``nnodes`` names of this machine, one per node."""
    if not 2 <= nnodes <= 255:
        raise ValueError(f"nnodes: must be in 2..255 for a local multi-node rehearsal, got {nnodes}")
    return ["localhost"] + [f"127.0.0.{i}" for i in range(1, nnodes)]


@dataclass(frozen=True)
class Nodes:
    """The nodes a sweep runs on: the hostfile, the hosts used (``names``, node rank = index, after
    ``include`` / ``exclude``) and ``nprocs`` ranks on each. ``local``: every host's launcher started here
    (a rehearsal of the cluster on this machine); else DeepSpeed's runner reaches them from this node
    (``backend`` pdsh, openmpi or slurm), exporting ``.deepspeed_env`` as it does. Validated by the caller
    (``kit.cli.args.nodes_from_args`` checks the hostfile and the cluster size)."""

    hostfile: Path
    names: tuple[str, ...]
    nprocs: int
    local: bool = False
    backend: str = "pdsh"
    include: str = ""
    exclude: str = ""
    master_addr: str | None = None
    master_port: int | None = None

    @property
    def count(self) -> int:
        return len(self.names)

    def where(self, node: int) -> str:
        return f"node {node} ({self.names[node]})"

    def runner_argv(self, script: str, script_args: list[str]) -> list[str]:
        """DeepSpeed's multi-node runner over the hostfile, from this node: ``--include`` / ``--exclude``
        as given (DeepSpeed refuses them beside ``--num_nodes`` / ``--num_gpus``), else the first
        ``count`` hosts and ``nprocs`` slots of each."""
        if self.backend not in RUNNER_BACKENDS:
            raise ValueError(f"launcher: choose one of {', '.join(RUNNER_BACKENDS)}, got {self.backend!r}")
        port = self.master_port or free_port()
        master = self.master_addr or self.names[0]
        # the deepspeed command next to this Python
        exe = launch_argv(script, [], self.nprocs, launcher="deepspeed", master_port=port)[0]
        argv = [exe, "--hostfile", str(self.hostfile), "--master_addr", master, "--master_port", str(port)]
        if self.backend != "pdsh":
            argv += ["--launcher", self.backend]
        if self.include or self.exclude:
            argv += ["--include", self.include] if self.include else ["--exclude", self.exclude]
        else:
            argv += ["--num_nodes", str(self.count), "--num_gpus", str(self.nprocs)]
        return [*argv, "--module", script, *script_args]

    def launch(
        self,
        script: str,
        script_args: list[str],
        timeout_s: float,
        on_line: Callable[[str], None] | None = None,
        *,
        deadline: Callable[[], float | None] | None = None,
        cancel: Callable[[], bool] | None = None,
    ) -> NodesDone:
        """Run ``script`` on every node; with ``local`` through ``start_hosts_here`` on a hostfile of the
        used hosts with ``nprocs`` slots each."""
        if not self.local:
            rc, output = run_launch(
                self.runner_argv(script, script_args),
                worker_env(self.nprocs),
                timeout_s,
                on_line,
                deadline=deadline,
                cancel=cancel,
            )
            failed = _failed_host(output) if rc else None
            return NodesDone(rc, (rc,), (output,), self.names.index(failed) if failed in self.names else None)
        with tempfile.TemporaryDirectory(prefix="zerokit-nodes-") as folder:
            hostfile = Path(folder) / "hostfile"
            hostfile.write_text("".join(f"{name} slots={self.nprocs}\n" for name in self.names))
            argvs = _host_argvs(script, script_args, hostfile, [self.nprocs] * self.count)
            env = worker_env(self.nprocs)
            return run_together(argvs, env, timeout_s, on_line, deadline=deadline, cancel=cancel)


#: the lines naming a host that failed: DeepSpeed's runner's ssh check of the first host (``host=gpu-a
#: was not reachable via ssh``), and pdsh's own lines about a host (``pdsh@this-node: gpu-b: ssh exited
#: with exit code 255``; the ranks' lines come as ``gpu-b: ...``)
_FAILED_HOST = re.compile(r"host=(\S+) was not reachable via ssh|^pdsh@[^:\s]+: ([^:\s]+): ", re.MULTILINE)


def _failed_host(output: str) -> str | None:
    """The first host DeepSpeed's runner or pdsh reported a problem with."""
    match = _FAILED_HOST.search(output)
    return (match.group(1) or match.group(2)) if match else None


def local_nodes(nnodes: int, nprocs: int, folder: str | Path) -> Nodes:
    """``nnodes`` simulated nodes of ``nprocs`` ranks (``loopback_names``), their hostfile in ``folder``."""
    names = loopback_names(nnodes)
    hostfile = Path(folder) / "hostfile"
    hostfile.parent.mkdir(parents=True, exist_ok=True)
    hostfile.write_text("".join(f"{name} slots={nprocs}\n" for name in names))
    return Nodes(hostfile, tuple(names), nprocs, local=True)


def run_setups_on_local_nodes(
    setups: list[Setup],
    folder: str | Path,
    *,
    steps: int = 1,
    warmup: int = 1,
    seed: int = 0,
    timeout_s: float = 400,
) -> list[dict]:
    """Run every Setup (all on the same cluster shape) in one launch across ``nodes`` local launchers;
    returns the ok step records. ValueError (one line) before launch for what cannot run; RuntimeError
    naming the configuration and the rank or node when one fails (``run_sweep``'s records)."""
    if not setups:
        raise ValueError("setups: give at least one Setup to run")
    shapes = {(s.cluster.nodes, s.cluster.gpus_per_node) for s in setups}
    if len(shapes) != 1:
        raise ValueError(
            f"setups: all must share one cluster shape (nodes x GPUs per node), got {sorted(shapes)}"
        )
    (nodes, per_node) = shapes.pop()
    if nodes < 2:
        raise ValueError(f"cluster.nodes: must be >= 2 for a multi-node rehearsal, got {nodes}")
    from kit.run.sweep import run_sweep

    folder = Path(folder)
    (folder / "records.jsonl").unlink(missing_ok=True)  # this launch's records only
    results = run_sweep(
        setups,
        sweep=folder.name,
        runs_dir=folder.parent,
        nprocs=per_node,
        nodes=local_nodes(nodes, per_node, folder),
        steps=steps,
        warmup=warmup,
        seed=seed,
        timeout_s=timeout_s,
        progress=False,
    )
    rows = results.records
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        where = f"rank {failed[0]['rank']}" if failed[0]["rank"] is not None else "the launch"
        raise RuntimeError(f"{failed[0]['label']} on {where}: {failed[0]['error']}")
    return rows


def per_node(records: list[dict], names: Sequence[str] = ()) -> list[dict]:
    """Per configuration and node (``node_rank``, as each rank's launcher placed it), from the ok
    records of each rank's last measured step: its ranks, their model-state bytes measured and
    estimated (``MODEL_STATES``, summed over the node's ranks) and the bytes each rank sent inside
    and across nodes (``comm_scope_wire_bytes``, averaged over the node's ranks) beside the prediction
    (``kit.steptime.comm.comm_by_scope``), and both together (``wire_bytes``, ``estimate_wire_bytes``:
    ``comm_bytes``). Each collective's bytes on the wire follow its own group's size (an hpZ gather
    inside a node of h ranks sends (h-1) x its shard, not the world's N-1). ``names``: the hosts, by
    node rank."""
    from kit.schema import Setup
    from kit.steptime.comm import comm_by_scope

    last: dict[tuple[str, int], dict] = {}
    for r in records:
        if r.get("status") == "ok" and r.get("rank") is not None and r.get("measured"):
            key = (r["config_id"], r["rank"])
            if key not in last or r["step"] >= last[key]["step"]:
                last[key] = r
    order = {cid: i for i, cid in enumerate(dict.fromkeys(r["config_id"] for r in records))}
    groups: dict[tuple[str, int], list[dict]] = {}
    for (cid, _), r in sorted(
        last.items(), key=lambda item: (order[item[0][0]], item[1]["node_rank"], item[0][1])
    ):
        groups.setdefault((cid, r["node_rank"]), []).append(r)
    rows = []
    for (cid, node), mine in groups.items():
        predicted = comm_by_scope(Setup.model_validate(mine[0]["setup"]))
        wire = {s: sum(r["comm_scope_wire_bytes"][s] for r in mine) / len(mine) for s in ("intra", "inter")}
        row = {"config_id": cid, "label": mine[0]["label"], "node_rank": node}
        row |= {"host": names[node] if node < len(names) else "", "ranks": [r["rank"] for r in mine]}
        row["local_ranks"] = [r["local_rank"] for r in mine]
        row["model_states_bytes"] = sum(r["measured"][k] for r in mine for k in MODEL_STATES)
        row["estimate_model_states_bytes"] = sum(r["estimate"][k] for r in mine for k in MODEL_STATES)
        row |= {"intra_wire_bytes": round(wire["intra"]), "inter_wire_bytes": round(wire["inter"])}
        row["estimate_intra_wire_bytes"] = predicted["intra"]
        row["estimate_inter_wire_bytes"] = predicted["inter"]
        row["wire_bytes"] = row["intra_wire_bytes"] + row["inter_wire_bytes"]
        row["estimate_wire_bytes"] = predicted["intra"] + predicted["inter"]
        rows.append(row)
    return rows
