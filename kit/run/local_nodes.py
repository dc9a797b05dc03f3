"""Simulated nodes: several deepspeed launchers on this machine form one multi-node world.

Two layers:
- the starter, for any per-rank module: ``start_hosts_here`` starts one launcher per host of a hostfile
  on this machine at once (``--hostfile H --no_ssh --node_rank i``), as each node of a cluster starts
  its own; ``start_local_nodes`` does so for a hostfile of loopback names it writes (``localhost``,
  ``127.0.0.1``, ...). ``zerokit commtest --hostfile`` and ``--nnodes`` use them;
- ``run_setups_on_local_nodes``: Setups of several nodes (e.g. 2 nodes x 2 GPUs) run for real by
  ``kit.ranks.worker`` through the starter, the CI stand-in for a cluster. The ranks record as in any
  sweep, including the communication split by node (``comm_scope_bytes``), which a one-node sweep
  cannot show. By hand the same spec runs on a real cluster's hostfile.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kit.records import load_records
from kit.run.launcher import free_port, launch_argv, run_launch, worker_env
from kit.run.sweep import check, config_id
from kit.schema import Setup


def start_hosts_here(
    script: str, script_args: list[str], hostfile: str | Path, slots: Sequence[int], timeout_s: float
) -> tuple[list[int], list[str]]:
    """Every host of ``hostfile`` (``slots``: its hosts' slots, in order) started on this machine at once,
    one deepspeed launcher per host (``--no_ssh --node_rank i``, the master on this machine); returns each
    node's exit status and output, in hostfile order."""
    port, nodes = free_port(), len(slots)
    argvs = [
        launch_argv(script, script_args, n, nnodes=nodes, node_rank=r, master_port=port, hostfile=hostfile)
        for r, n in enumerate(slots)
    ]
    env = worker_env(max(slots))
    with ThreadPoolExecutor(nodes) as pool:
        done = list(pool.map(lambda argv: run_launch(argv, env, timeout_s), argvs))
    return [rc for rc, _ in done], [out for _, out in done]


def start_local_nodes(
    script: str, script_args: list[str], nprocs: int, nnodes: int, timeout_s: float
) -> tuple[list[int], list[str]]:
    """``script`` on ``nnodes`` simulated nodes of ``nprocs`` ranks: a hostfile of loopback names
    (``localhost``, ``127.0.0.1``, ``127.0.0.2``...; DeepSpeed's ``host slots=N`` lines) started by
    ``start_hosts_here``."""
    if not 2 <= nnodes <= 255:
        raise ValueError(f"nnodes: must be in 2..255 for a local multi-node rehearsal, got {nnodes}")
    names = ["localhost"] + [f"127.0.0.{i}" for i in range(1, nnodes)]
    with tempfile.TemporaryDirectory(prefix="zerokit-nodes-") as folder:
        hostfile = Path(folder) / "hostfile"
        hostfile.write_text("".join(f"{name} slots={nprocs}\n" for name in names))
        return start_hosts_here(script, script_args, hostfile, [nprocs] * nnodes, timeout_s)


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
    with the launch's tail when a node fails."""
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
    for i, setup in enumerate(setups):
        try:
            check(setup)
        except ValueError as error:
            raise ValueError(f"config {i} ({setup.label}): {error}") from None
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    records = folder / "records.jsonl"
    records.unlink(missing_ok=True)  # this launch's records only
    spec = {"sweep": folder.name, "run_id": "local-nodes", "records": str(records.resolve())}
    spec |= {"steps": steps, "warmup": warmup, "seed": seed}
    spec["configs"] = [
        {"config_id": config_id(s), "label": s.label, "setup": s.model_dump(mode="json")} for s in setups
    ]
    (folder / "spec.json").write_text(json.dumps(spec, indent=1))
    rcs, outputs = start_local_nodes(
        "kit.ranks.worker", ["--spec", str(folder / "spec.json")], per_node, nodes, timeout_s
    )
    if any(rcs):
        raise RuntimeError(f"local nodes exited with {rcs}; node 0's last output:\n{outputs[0][-3000:]}")
    rows = [r for r in load_records(records) if r.get("run_id") == "local-nodes"]
    failed = [r for r in rows if r.get("status") != "ok"]
    if failed:
        raise RuntimeError(f"{failed[0]['label']} on rank {failed[0]['rank']}: {failed[0]['error']}")
    return rows


def hpz_toy_setups() -> dict[str, Setup]:
    """The toy GPT on 2 simulated nodes x 2 ranks at stage 3, without and with hpZ over each node: its
    biases and norms kept whole (persistence threshold 1,000), its matrices released and so given
    secondary partitions, and no prefetch or reuse, so that backward gathers again (from the secondary
    partition with hpZ). What notebook 09 and ``tests/test_zeropp.py`` run."""
    from kit.models import toy_spec
    from kit.run.sweep import TOY_ZERO

    zero = {**TOY_ZERO, "stage": 3, "prefetch_bucket_size": 0, "max_live_parameters": 0}
    zero |= {"max_reuse_distance": 0, "param_persistence_threshold": 1000}
    base = Setup(
        model=toy_spec(), cluster={"nodes": 2, "gpus_per_node": 2}, zero=zero, batch={"micro_batch": 1}
    )
    return {"ZeRO-3": base, "hpZ": base.replace(zero={"hpz_partition_size": 2})}
