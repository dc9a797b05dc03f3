"""``zerokit commtest``: are the collectives right, and how fast are they, on N ranks?

Starts ``kit.ranks.commtest_worker`` on N ranks (gloo on CPU, NCCL on GPUs), which checks ``all_reduce``
SUM, ``all_gather``, ``reduce_scatter``, ``broadcast`` and a barrier that names late ranks, then times
each collective over message sizes. Bandwidths follow nccl-tests (doc/PERFORMANCE.md):
algbw = size / time; busbw = algbw x 2(n-1)/n for all_reduce, x (n-1)/n for all_gather and
reduce_scatter, x 1 for broadcast, where size is the full buffer (all_gather's output, reduce_scatter's
input). GB/s are 1e9 bytes per second.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from kit.records import BW_TAG, RANK_TAG
from kit.rules import bus_factor

#: the per-rank script, run as a module (``-m``) so that kit/ itself is not put on sys.path
WORKER = "kit.ranks.commtest_worker"
#: 8 KiB to 32 MiB in steps of 4x: small enough for CPU ranks, large enough to show the bandwidth knee.
DEFAULT_SIZES = tuple(1 << k for k in range(13, 26, 2))


@dataclass(frozen=True)
class CommtestResult:
    """What the ranks reported: identities, collective checks, timings, and the first error."""

    world_size: int
    ranks: list[dict] = field(default_factory=list)
    checks: list[dict] = field(default_factory=list)
    timings: list[dict] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.checks) and all(c["ok"] for c in self.checks)

    def bandwidth(self):
        """DataFrame: op, size_bytes, time_s, algbw_gbps, busbw_gbps (one row per collective and size)."""
        import pandas as pd

        rows = []
        for t in self.timings:
            algbw = t["size_bytes"] / t["time_s"] / 1e9
            rows.append(
                {**t, "algbw_gbps": algbw, "busbw_gbps": algbw * bus_factor(t["op"], self.world_size)}
            )
        return pd.DataFrame(rows, columns=["op", "size_bytes", "time_s", "algbw_gbps", "busbw_gbps"])

    def to_dict(self) -> dict:
        return {
            "ok": self.ok,
            "world_size": self.world_size,
            "error": self.error,
            "ranks": self.ranks,
            "checks": self.checks,
            "bandwidth": self.bandwidth().to_dict(orient="records"),
        }

    def plot(self, ax=None):
        """Bus bandwidth vs message size, one line per collective (log-log); returns the Figure (a new
        one, outside pyplot's state, unless ``ax`` is given)."""
        from matplotlib.figure import Figure

        if ax is None:
            ax = Figure(figsize=(6, 3.5)).subplots()
        fig = ax.figure
        df = self.bandwidth()
        for op, rows in df.groupby("op", sort=False):
            ax.plot(rows["size_bytes"], rows["busbw_gbps"], marker="o", label=op)
        ax.set(xscale="log", yscale="log", xlabel="message size (bytes)", ylabel="bus bandwidth (GB/s)")
        backend = self.ranks[0]["backend"] if self.ranks else "?"
        ax.set_title(f"commtest: {self.world_size} ranks, {backend}")
        ax.legend()
        ax.grid(True, which="both", alpha=0.3)
        fig.tight_layout()
        return fig


def worker_args(
    sizes=DEFAULT_SIZES,
    iters: int = 5,
    arrive_s: float = 60.0,
    late_rank: int = -1,
    late_s: float = 0.0,
    wrong_rank: int = -1,
) -> list[str]:
    """The worker's arguments; ``late_rank`` / ``wrong_rank`` inject a late or wrong rank (a failure demo)."""
    if not sizes or any(s < 4 for s in sizes):
        raise ValueError(f"sizes: give message sizes of at least 4 bytes, got {list(sizes)}")
    if iters < 1:
        raise ValueError(f"iters: must be >= 1, got {iters}")
    args = ["--sizes", *map(str, sizes), "--iters", str(iters), "--arrive-s", str(arrive_s)]
    return args + ["--late-rank", str(late_rank), "--late-s", str(late_s), "--wrong-rank", str(wrong_rank)]


def parse_output(text: str, world_size: int, rc: int = 0) -> CommtestResult:
    """The result from the launch output (of one node, or several nodes' outputs joined; a prefix
    such as pdsh's ``node1: `` before a tag is fine)."""
    from kit.run.launcher import TIMEOUT_RC

    ranks: list[dict] = []
    timings: list[dict] = []
    for line in text.splitlines():
        for tag, found in ((RANK_TAG, ranks), (BW_TAG, timings)):
            at = line.find(tag + " ")
            if at >= 0:
                found.append(json.loads(line[at + len(tag) + 1 :]))
    ranks.sort(key=lambda r: r["rank"])
    checks = _merge_checks(ranks)
    errors = [f"rank {r['rank']}: {r['error']}" for r in ranks if r.get("error")]
    wrong = [c for c in checks if not c["ok"]]
    missing = sorted(set(range(world_size)) - {r["rank"] for r in ranks})
    if errors:
        error = errors[0]
    elif wrong:
        error = "; ".join(f"{c['op']} is wrong: {c['detail']}" for c in wrong)
    elif missing:
        why = "timed out" if rc == TIMEOUT_RC else f"exit status {rc}"
        error = f"ranks {missing} of {world_size} did not report ({why}); last output: {_tail(text)}"
    elif rc != 0:
        error = f"launch failed with exit status {rc}: {_tail(text)}"
    else:
        error = None
    identities = [{k: v for k, v in r.items() if k != "checks"} for r in ranks]
    return CommtestResult(world_size, identities, checks, timings, error)


def _merge_checks(ranks: list[dict]) -> list[dict]:
    """One row per collective: ok only if every rank saw the expected value; detail of the first bad rank."""
    merged: dict[str, dict] = {}
    for r in ranks:
        for c in r.get("checks", []):
            if c["op"] not in merged or (merged[c["op"]]["ok"] and not c["ok"]):
                merged[c["op"]] = {**c, "rank": r["rank"]}
            merged[c["op"]]["ok"] = merged[c["op"]]["ok"] and c["ok"]
    return list(merged.values())


def _tail(text: str, lines: int = 3) -> str:
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(kept[-lines:]) or "no output"


def run_commtest(
    nprocs: int = 2,
    sizes=DEFAULT_SIZES,
    *,
    nnodes: int = 1,
    iters: int = 5,
    timeout_s: float = 180.0,
    arrive_s: float = 60.0,
    launcher: str = "torchrun",
    late_rank: int = -1,
    late_s: float = 0.0,
    wrong_rank: int = -1,
) -> CommtestResult:
    """Launch the communication test on ``nprocs`` ranks per node and return what they measured.

    ``nnodes > 1`` rehearses a multi-node job on this machine (``kit.run.local_nodes.start_local_nodes``).
    ``arrive_s``: how long the ranks wait for each other (a barrier that names missing ranks);
    ``timeout_s``: when the launch is killed. ``torchrun`` starts faster than ``deepspeed``.
    """
    from kit.run.launcher import launch_argv, run_launch, worker_env
    from kit.run.local_nodes import start_local_nodes

    if nprocs * nnodes < 2:
        raise ValueError(f"nprocs: a communication test needs at least 2 ranks, got {nprocs * nnodes}")
    script = worker_args(sizes, iters, arrive_s, late_rank, late_s, wrong_rank)
    if nnodes > 1:
        rcs, outputs = start_local_nodes(WORKER, script, nprocs, nnodes, timeout_s)
        return parse_output("\n".join(outputs), nprocs * nnodes, max(rcs, key=abs))
    argv = launch_argv(WORKER, script, nprocs, launcher=launcher)
    rc, output = run_launch(argv, worker_env(nprocs), timeout_s)
    return parse_output(output, nprocs, rc)


def allreduce_bus_gbps(nprocs: int = 2) -> float:
    """The all-reduce bus bandwidth between ``nprocs`` ranks of this machine at the largest message size
    (one commtest launch), as ``kit.run.calibrate.cpu_machine`` needs it; RuntimeError if the test fails."""
    test = run_commtest(nprocs)
    if not test.ok:
        raise RuntimeError(f"calibrate: the communication test failed: {test.error}")
    bw = test.bandwidth()
    return float(bw[bw.op == "all_reduce"].sort_values("size_bytes").busbw_gbps.iloc[-1])


def run_on_hostfile(
    hostfile,
    sizes=DEFAULT_SIZES,
    *,
    iters: int = 5,
    timeout_s: float = 180.0,
    arrive_s: float = 60.0,
    local: bool | None = None,
    late_rank: int = -1,
    late_s: float = 0.0,
) -> tuple[CommtestResult, list[dict]]:
    """The communication test across the hosts of a DeepSpeed hostfile, and a report per node.

    DeepSpeed's launcher reaches the hosts itself (pdsh, from this node). When every host is this
    machine (``localhost``, ``127.0.0.x``), or ``local=True``, each host's launcher is started here
    instead (``--no_ssh --node_rank i``): the two-node rehearsal CI runs. Returns the result and
    ``node_report``'s rows.
    """
    from kit.run.launcher import free_port, launch_argv, run_launch, worker_env
    from kit.run.local_nodes import start_hosts_here
    from kit.scaleout.hostfile import is_local, read_hostfile

    hosts = read_hostfile(hostfile)
    world = sum(h.slots for h in hosts)
    if world < 2:
        raise ValueError(f"hostfile: a communication test needs at least 2 slots in all, got {world}")
    script = worker_args(sizes, iters, arrive_s, late_rank, late_s)
    simulate = local if local is not None else all(is_local(h.host) for h in hosts)
    if simulate:
        rcs, outputs = start_hosts_here(WORKER, script, hostfile, [h.slots for h in hosts], timeout_s)
        rc, output = max(rcs, key=abs), "\n".join(outputs)
    else:
        argv = launch_argv(WORKER, script, hosts[0].slots, master_addr=hosts[0].host, master_port=free_port())
        argv = [argv[0], "--hostfile", str(hostfile), *argv[3:]]  # every host of the file, reached by pdsh
        rc, output = run_launch(argv, worker_env(hosts[0].slots), timeout_s)
    result = parse_output(output, world, rc)
    return result, node_report(result, hosts)


def node_report(result: CommtestResult, hosts) -> list[dict]:
    """Per host of the hostfile: its ranks (node by node, in hostfile order, as DeepSpeed numbers them),
    those that joined, those missing, those late at the barrier, and a verdict: ``ok``, ``missing`` (no
    rank reported), ``slow`` (a rank arrived late), ``wrong`` (a collective's result) or ``partial``
    (some of its ranks did not report)."""
    joined = {r["rank"] for r in result.ranks}
    late = {int(n) for n in re.findall(r"\d+", _late_ranks(result.error or ""))}
    wrong = {c["rank"] for c in result.checks if not c["ok"]}
    rows, first = [], 0
    for node, host in enumerate(hosts):
        ranks = list(range(first, first + host.slots))
        first += host.slots
        mine = {"joined": [r for r in ranks if r in joined], "late": [r for r in ranks if r in late]}
        missing = [r for r in ranks if r not in joined]
        if not mine["joined"]:
            status = "missing"
        elif mine["late"]:
            status = "slow"
        elif wrong & set(ranks):
            status = "wrong"
        else:
            status = "partial" if missing else "ok"
        rows.append({"node_rank": node, "host": host.host, "ranks": ranks, **mine, "missing": missing})
        rows[-1]["status"] = status
    return rows


def _late_ranks(error: str) -> str:
    """The rank list of a monitored barrier's message (``Ranks 1, 3 failed to pass monitoredBarrier``)."""
    match = re.search(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier", error)
    return match.group(1) if match else ""
