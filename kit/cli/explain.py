"""``zerokit explain``: what an existing ds_config does for a model and cluster, setting by setting."""

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
    from kit.estimate.explain import explain_ds_config, report

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
