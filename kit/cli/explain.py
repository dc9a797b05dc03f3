"""``zerokit explain``: what an existing ds_config does for a model and cluster, setting by setting
(``kit.review``), as JSON or as the readable report (``report``)."""

from __future__ import annotations

import argparse

from kit.cli.args import (
    add_batch_args,
    add_cluster_args,
    add_json,
    add_model_args,
    cluster_from_args,
    model_from_args,
    print_json,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="validate an existing ds_config with DeepSpeed and explain each setting for a model and cluster",
        description="Read a ds_config (HF 'auto' values resolved), validate it with DeepSpeed's own config "
        "classes, and explain setting by setting what it does to memory and communication for this model "
        "and cluster, with a warning and what to change for each setting that does nothing or hurts. "
        "Exit 0 with the report (errors included), 2 on a file that is not a DeepSpeed config.",
    )
    p.add_argument("--ds-config", required=True, help="the ds_config.json to explain")
    add_model_args(p)
    add_cluster_args(p)
    add_batch_args(p)
    add_json(p)
    p.set_defaults(func=run_explain)


def run_explain(args: argparse.Namespace) -> int:
    from kit.review import explain_ds_config

    explanation = explain_ds_config(
        args.ds_config,
        model=model_from_args(args),
        cluster=cluster_from_args(args),
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        train_batch=args.train_batch,
    )
    if args.json:
        print_json(explanation.to_dict())
    else:
        print(report(explanation, title=f"{args.ds_config}:"))
    return 0


def report(explanation, title: str = "") -> str:
    """The readable report of an ``Explanation``: findings grouped by severity, errors first, then the
    notes."""
    from kit.ds_config.reader import UNMODELLED
    from kit.review import SEVERITIES

    counts = {s: sum(f.severity == s for f in explanation.findings) for s in SEVERITIES}
    lines = [title] if title else []
    s = explanation.setup
    if s is not None:
        z, b, c = s.zero, s.batch, s.cluster
        lines.append(
            f"{s.model.name} ({s.model.params:,} params) on {c.nodes} x {c.gpus_per_node} {c.gpu}: ZeRO "
            f"stage {z.stage}, {z.precision}, offload optimizer={z.offload_optimizer} "
            f"param={z.offload_param}, batch {b.train_batch} = {b.micro_batch} x {s.dp} x {b.grad_accum}"
        )
    unmodelled = {u.key for u in UNMODELLED}
    if explanation.valid:
        verdict = "DeepSpeed accepts this config"
    elif all(f.key in unmodelled for f in explanation.errors):
        verdict = "DeepSpeed accepts this config, but zero-kit does not model what it turns on"
    else:
        verdict = "DeepSpeed refuses this config"
    lines.append(
        f"{verdict}: {counts['error']} error(s), {counts['warning']} warning(s), {counts['info']} info"
    )
    for severity in SEVERITIES:
        group = [f for f in explanation.findings if f.severity == severity]
        if not group:
            continue
        lines += ["", f"{severity.upper()}S" if severity != "info" else "INFO"]
        for f in group:
            lines += [f"  {f.key}", f"    {f.message}", f"    -> {f.suggestion}"]
    if explanation.notes:
        lines += [""] + [f"note: {n}" for n in explanation.notes]
    return "\n".join(lines)
