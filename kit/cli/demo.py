"""``zerokit demo`` (``make demo``): the kit's main job, headless, on an embedded default.

1. Before booking: for a preset model on a cluster (default Llama-2-7B on one node of 8 H100s),
   the memory per GPU of every common ZeRO stage / offload setting, as a table and a PNG.
2. Compare for real: a short 2-rank sweep of stages 0-3 on a tiny GPT (CPU processes without a GPU),
   measured beside the estimate, with the plots as PNGs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kit.cli.args import add_setup_args, print_json, setup_from_args
from kit.units import GIB


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="memory table per ZeRO stage + a short real 2-rank sweep, with plots")
    add_setup_args(p)
    p.set_defaults(model="llama-2-7b", micro_batch=1, seq_len=4096)
    p.add_argument("--out", default="runs/demo", help="folder for the table, plots and records")
    p.add_argument("--nprocs", type=int, default=2, help="ranks of the real sweep")
    p.add_argument("--steps", type=int, default=3, help="measured steps per configuration")
    p.add_argument("--no-run", action="store_true", help="only the estimate part (no DeepSpeed launch)")
    p.set_defaults(func=run)


def memory_table(setup):
    """Bytes per GPU (GiB) by component for each common ZeRO variant of ``setup``, their sum, the predicted
    peak per GPU (what ``fits`` is decided on) and CPU RAM per node."""
    import pandas as pd

    from kit.components import COMPONENTS
    from kit.estimate import estimate
    from kit.fit import estimate_fit, shown_bytes
    from kit.planning.plan import DEFAULT_VARIANTS

    rows, estimates = [], []
    for variant in DEFAULT_VARIANTS:
        e = estimate(setup.replace(zero=variant))
        estimates.append(e)
        row = {"variant": e.setup.label, **{c: e.components[c] / GIB for c in COMPONENTS}}
        verdict = estimate_fit(e)  # its bytes: past the GPU's memory, what the flushed allocator holds there
        row.update(components_sum=e.components_bytes / GIB, peak_per_gpu=shown_bytes(e, verdict) / GIB)
        row["cpu_per_node"] = e.cpu_bytes_per_node / GIB
        row["fits"] = verdict.ok
        rows.append(row)
    return pd.DataFrame(rows).set_index("variant").round(2), estimates


def run(args: argparse.Namespace) -> int:
    from kit.lab import plots

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    setup = setup_from_args(args)
    table, estimates = memory_table(setup)
    table.to_csv(out / "memory_table.csv")
    c = setup.cluster
    title = (
        f"{setup.model.name} on {c.nodes} x {c.gpus_per_node} {c.gpu}, micro batch {setup.batch.micro_batch}"
    )
    plots.estimated_memory(estimates, title=title).savefig(out / "memory_per_gpu.png", dpi=120)
    files = [out / "memory_table.csv", out / "memory_per_gpu.png"]
    report = {"memory_table": table.reset_index().to_dict(orient="records")}
    if not args.json:
        print(f"Memory per GPU (GiB), {title}:\n{table.to_string()}\n")
    if not args.no_run:
        results = _sweep(args, out)
        for name in ("throughput", "memory", "comm_volume", "loss_curves"):
            path = out / f"sweep_{name}.png"
            getattr(plots, name)(results).savefig(path, dpi=120)
            files.append(path)
        report["sweep"] = {"records": str(results.path), "configs": results.configs()}
        if not args.json:
            from kit.cli.run import render

            print(render(results))
    report["files"] = [str(f) for f in files]
    if args.json:
        print_json(report)
    else:
        print("\nwrote " + ", ".join(str(f) for f in files))
    return 0


def _sweep(args: argparse.Namespace, out: Path):
    from kit.run.sweep import run_sweep
    from kit.toys import toy_setup

    base = toy_setup(args.nprocs)
    setups = [base.replace(zero={"stage": stage}) for stage in (0, 1, 2, 3)]
    return run_sweep(
        setups, sweep="stages", runs_dir=out, nprocs=args.nprocs, steps=args.steps, progress=True
    )
