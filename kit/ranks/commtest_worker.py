"""The per-rank script of ``zerokit commtest``: check collectives, then time them over message sizes.

Launch it by hand on one node (``DS_ACCELERATOR=cpu`` is not needed: it uses NCCL with CUDA, gloo without)::

    python -m torch.distributed.run --nproc_per_node 2 -m kit.ranks.commtest_worker --sizes 1048576
    deepspeed --num_gpus 8 --module kit.ranks.commtest_worker
    deepspeed --hostfile hostfile --module kit.ranks.commtest_worker --sizes 1073741824   # across nodes

Every rank prints one ``ZEROKIT_COMMTEST_RANK {json}`` line (who it is and what it checked); rank 0 also
prints one ``ZEROKIT_COMMTEST_BW {json}`` line per (collective, size). ``kit.scaleout.commtest`` parses them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

from kit.records import BW_TAG, RANK_TAG
from kit.specs import TIMED


def identity(backend: str, device: torch.device) -> dict:
    """Where this rank sits, from the launcher's environment (known before the ranks have met):
    rank, local rank, node rank (deepspeed sets CROSS_RANK, torchrun GROUP_RANK)."""
    env = os.environ
    return {
        "rank": int(env.get("RANK", "0")),
        "world_size": int(env.get("WORLD_SIZE", "1")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "node_rank": int(env.get("CROSS_RANK", env.get("GROUP_RANK", "0"))),
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "backend": backend,
        "device": str(device),
    }


def check_collectives(device: torch.device, numel: int, wrong_rank: int) -> list[dict]:
    """all_reduce SUM, all_gather, reduce_scatter and broadcast against values every rank can predict.

    Rank r contributes r + 1 (``wrong_rank`` adds 1 more: a deliberately broken contribution, to show
    what a failure looks like).
    """
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = float(rank + 1 + (rank == wrong_rank))
    total = world * (world + 1) / 2
    checks = []

    x = torch.full((numel,), mine, device=device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    checks.append(_expect("all_reduce", x, total, f"SUM of rank+1 over {world} ranks"))

    parts = [torch.empty(numel, device=device) for _ in range(world)]
    dist.all_gather(parts, torch.full((numel,), mine, device=device))
    got = [p[0].item() for p in parts]
    ok = all(torch.equal(p, torch.full_like(p, r + 1.0)) for r, p in enumerate(parts))
    checks.append({"op": "all_gather", "ok": ok, "detail": f"gathered {got}, expected rank+1 in rank order"})

    chunks = [torch.full((numel,), mine * (j + 1), device=device) for j in range(world)]
    out = torch.empty(numel, device=device)
    dist.reduce_scatter(out, chunks, op=dist.ReduceOp.SUM)
    checks.append(
        _expect("reduce_scatter", out, total * (rank + 1), f"chunk {rank} = (rank+1) x SUM of rank+1")
    )

    b = torch.full((numel,), 42.0 if rank == 0 else mine, device=device)
    dist.broadcast(b, src=0)
    checks.append(_expect("broadcast", b, 42.0, "rank 0's value 42"))
    return checks


def _expect(op: str, x: torch.Tensor, value: float, what: str) -> dict:
    ok = bool(torch.all(x == value))
    return {"op": op, "ok": ok, "detail": f"got {x[0].item():g}, expected {value:g} ({what})"}


def buffer_numel(size_bytes: int, world: int) -> int:
    """fp32 elements of the full buffer: ``size_bytes`` rounded down to a multiple of 4 x world bytes."""
    return max(world, size_bytes // 4 // world * world)


def time_collective(op: str, numel: int, device: torch.device, iters: int, warmup: int) -> float:
    """Seconds per call, the slowest rank's mean (nccl-tests' sizes: the full buffer for every op)."""
    world = dist.get_world_size()
    buf = torch.ones(numel, device=device)
    chunks = list(buf.chunk(world))
    shard = torch.empty(numel // world, device=device)

    def call():
        if op == "all_reduce":
            dist.all_reduce(buf)
        elif op == "all_gather":
            dist.all_gather(chunks, shard)
        elif op == "reduce_scatter":
            dist.reduce_scatter(shard, chunks)
        else:
            dist.broadcast(buf, src=0)

    for _ in range(warmup):
        call()
    _sync(device)
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    _sync(device)
    elapsed = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _last_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines() or [type(error).__name__]
    return lines[-1][:500] if len(lines) > 1 else lines[0][:1000]


def emit(tag: str, obj: dict) -> None:
    """One line in one write() (atomic on a pipe up to PIPE_BUF bytes), so ranks' lines never interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"{tag} {json.dumps(obj)}\n".encode())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="*", default=[1 << 20], help="message sizes, bytes")
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--arrive-s", type=float, default=60.0, help="how long to wait for every rank")
    p.add_argument("--late-rank", type=int, default=-1, help="this rank arrives --late-s seconds late")
    p.add_argument("--late-s", type=float, default=0.0)
    p.add_argument("--wrong-rank", type=int, default=-1, help="this rank contributes a wrong value")
    p.add_argument("--local_rank", type=int, default=0, help=argparse.SUPPRESS)  # the deepspeed launcher's
    args = p.parse_args(argv)

    cuda = torch.cuda.is_available()
    backend = "nccl" if cuda else "gloo"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.arrive_s)
    report = identity(backend, device)
    try:
        try:
            dist.init_process_group(backend, timeout=timeout)
        except (RuntimeError, ValueError) as error:  # torch raises DistStoreError, a RuntimeError
            raise RuntimeError(
                f"the {report['world_size']} ranks did not all meet within {args.arrive_s:g} s "
                f"(is every node started, with the same MASTER_ADDR:MASTER_PORT, and reachable?): "
                f"{_last_line(error)}"
            ) from error
        # a gloo side group: monitored_barrier names the ranks that did not arrive (NCCL cannot)
        monitor = dist.new_group(backend="gloo") if cuda else None
        if report["rank"] == args.late_rank:
            time.sleep(args.late_s)
        dist.monitored_barrier(group=monitor, timeout=timeout, wait_all_ranks=True)
        report["checks"] = check_collectives(device, 1024, args.wrong_rank)
        report["checks"].append(
            {"op": "barrier", "ok": True, "detail": f"all {dist.get_world_size()} ranks arrived"}
        )
        if all(c["ok"] for c in report["checks"]):
            for op in TIMED:
                for size in args.sizes:
                    numel = buffer_numel(size, dist.get_world_size())
                    seconds = time_collective(op, numel, device, args.iters, args.warmup)
                    if report["rank"] == 0:
                        emit(BW_TAG, {"op": op, "size_bytes": 4 * numel, "time_s": seconds})
        report["error"] = None
    except RuntimeError as error:
        report["error"] = _last_line(error)
    emit(RANK_TAG, report)
    if report["error"] is None:
        dist.destroy_process_group()
    return 0 if report["error"] is None and all(c["ok"] for c in report.get("checks", [])) else 1


if __name__ == "__main__":
    sys.exit(main())
