"""What the subcommands share: the flags that build a Setup, the Setup they describe, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from pydantic import BaseModel

from kit import checkpointing, settings
from kit.schema import Cluster, ZeroSettings
from kit.settings import BY_FIELD, SETTINGS, Setting
from kit.units import parse_count


class UsageError(ValueError):
    """Invalid input detected by a subcommand: printed as one line, exit 2."""


def default(section: type[BaseModel], name: str) -> Any:
    """A Setup field's default (``default(ZeroSettings, "stage")``): the flags restate no number."""
    return section.model_fields[name].default


def add_json(p, what: str = "one JSON object") -> None:
    """``--json``, which every subcommand takes: print ``what`` on stdout and nothing else there."""
    p.add_argument("--json", action="store_true", help=f"print {what} on stdout")


def add_precision(p) -> None:
    """``--precision``, a comma-separated list (``zerokit run``'s configurations), the schema's default."""
    choices = ", ".join(BY_FIELD["precision"].choices)
    p.add_argument(
        "--precision", default=default(ZeroSettings, "precision"), help=f"comma-separated: {choices}"
    )


def add_gpu(p, help: str = "a name in data/gpus.csv") -> None:
    """``--gpu NAME`` (a row of data/gpus.csv), the schema's default."""
    p.add_argument("--gpu", default=default(Cluster, "gpu"), help=help)


def add_zero_args(p, *, only: tuple[str, ...] = (), skip: tuple[str, ...] = ()) -> None:
    """A flag per ``kit.settings.SETTINGS`` entry (those in ``only`` when given, less ``skip``), a group per
    section. None has an argparse default: a flag not given reads back as absent (``zero_from_args``), so
    the schema's default applies and a flag beside a ds_config is told from none."""
    groups: dict[str, Any] = {}
    for s in SETTINGS:
        if (only and s.field not in only) or s.field in skip:
            continue
        if s.section not in groups:
            groups[s.section] = p.add_argument_group(s.section)
        groups[s.section].add_argument(s.option, *s.aliases, dest=s.dest, default=None, **_flag(s))


def _flag(s: Setting) -> dict[str, Any]:
    """argparse's keywords for one setting's flag, from its kind in the schema."""
    if s.field == "stage":  # ZeRO stages and PyTorch's engines, read by engine_stage
        return {"help": f"{s.help} (default {s.default})"}
    if s.field == "overlap_comm":
        return {"choices": ("on", "off"), "help": s.help}
    if isinstance(s.default, bool):
        return {
            "action": argparse.BooleanOptionalAction,
            "help": f"{s.help} (default {'on' if s.default else 'off'})",
        }
    if s.choices:
        return {"choices": s.choices, "help": f"{s.help} (default {s.default})"}
    if s.control == "elements":
        return {"type": count, "metavar": "N", "help": f"{s.help} ({s.default:,})"}
    if s.control in ("int", "float") or isinstance(s.default, int | float):
        kind = float if isinstance(s.default, float) else int
        return {"type": kind, "metavar": "N", "help": f"{s.help} (default {s.default:g})"}
    return {"metavar": "TEXT", "help": s.help}


def zero_from_args(args: argparse.Namespace, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """``{field: value}`` of the ZeRO flags given (``aio.x`` fields among them; ``kit.settings.fields``
    nests them), less ``skip`` (those a command reads its own way): ``--stage`` also sets the engine,
    ``--checkpoint-every`` or ``--checkpoint-policy`` away from its default turns checkpointing on."""
    given = {
        s.field: getattr(args, s.dest)
        for s in SETTINGS
        if s.field not in skip and getattr(args, s.dest, None) is not None
    }
    if "stage" in given:
        given["engine"], given["stage"] = engine_stage("stage", given["stage"])
    if "overlap_comm" in given:
        given["overlap_comm"] = given["overlap_comm"] == "on"
    if "lora_targets" in given:
        given["lora_targets"] = tuple(items(given["lora_targets"]))
    how = [
        f
        for f in ("checkpoint_every", "checkpoint_policy", *checkpointing.DEEPSPEED_FIELDS)
        if given.get(f, BY_FIELD[f].default) != BY_FIELD[f].default
    ]
    if how and "activation_checkpointing" not in given:
        given["activation_checkpointing"] = True
    return given


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """Flags that build a Setup (model, cluster, ZeRO settings, batch), shared by subcommands."""
    add_model_args(p)
    add_cluster_args(p)
    add_zero_args(p)
    p.add_argument("--ds-config", help="read ZeRO and batch settings from an existing ds_config.json")
    add_batch_args(p, target_len=True)
    add_json(p)


def add_offload_args(p) -> None:
    """``--offload-optimizer`` and ``--offload-param``, comma-separated lists (``zerokit run``'s
    configurations)."""
    for field in ("offload_optimizer", "offload_param"):
        s = BY_FIELD[field]
        p.add_argument(s.option, default=s.default, help=f"comma-separated: {', '.join(s.choices)}; {s.help}")


def add_model_args(p: argparse.ArgumentParser) -> None:
    """``--model`` / ``--params [--largest-layer]`` and the architecture overrides."""
    m = p.add_argument_group("model")
    m.add_argument(
        "--model", help="preset name (see `zerokit estimate --list-models`) or path to a config.json"
    )
    m.add_argument("--params", type=count, help="bare parameter count, e.g. 7e9 (instead of --model)")
    m.add_argument("--largest-layer", type=count, help="largest layer's parameter count (with --params)")
    add_model_overrides(m)


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    """``--nodes --gpus-per-node --gpu --cpu-ram-gb`` (read back by ``cluster_from_args``)."""
    c = p.add_argument_group("cluster")
    c.add_argument("--nodes", type=int, default=default(Cluster, "nodes"))
    c.add_argument("--gpus-per-node", type=int, default=default(Cluster, "gpus_per_node"))
    add_gpu(c)
    c.add_argument("--cpu-ram-gb", type=float, help="CPU RAM per node, GiB (for the offload fit check)")
    c.add_argument(
        "--define-gpu", action="append", default=[], metavar="NAME:KEY=VALUE,...",
        help="a GPU by its figures, usable as --gpu / --gpus NAME: memory_gib, memory_gbps, bf16_tflops "
        "(required), fp16_tflops, fp32_tflops, sms, nvlink_gbps, host_gbps (repeatable)",
    )  # fmt: skip
    c.add_argument(
        "--define-network", action="append", default=[], metavar="NAME:gbits_per_node=N",
        help="an inter-node fabric by its bandwidth per node, usable as --network NAME (repeatable)",
    )  # fmt: skip


def add_batch_args(p: argparse.ArgumentParser, target_len: bool = False) -> None:
    """``--micro-batch --grad-accum --train-batch --seq-len`` (and ``--target-len`` where it is read)."""
    b = p.add_argument_group("batch (any two of micro/grad-accum/train determine the third)")
    b.add_argument("--micro-batch", type=int)
    b.add_argument("--grad-accum", type=int)
    b.add_argument("--train-batch", type=int)
    add_seq_len(b)
    if target_len:
        b.add_argument(
            "--target-len",
            type=int,
            help="an encoder-decoder model's (t5, bart) decoder tokens per sample, its labels; the encoder "
            "reads --seq-len (default: --seq-len for both)",
        )


def add_seq_len(p) -> None:
    """``--seq-len`` (default: the model's maximum, else the schema's)."""
    p.add_argument("--seq-len", type=int, help="tokens per sample (default: the model's max_seq_len)")


def cluster_from_args(args: argparse.Namespace) -> dict:
    """The Cluster fields the cluster flags give, after defining the GPUs and fabrics they name by their
    figures (``kit.gpus.define_gpu``, ``define_network``)."""
    from kit.gpus import define_gpu, define_network

    for spec in getattr(args, "define_gpu", []):
        define_gpu(spec)
    for spec in getattr(args, "define_network", []):
        define_network(spec)
    cluster = {"nodes": args.nodes, "gpus_per_node": args.gpus_per_node, "gpu": args.gpu}
    if args.cpu_ram_gb:
        cluster["cpu_ram_per_node_bytes"] = int(args.cpu_ram_gb * 1024**3)
    return cluster


def add_model_overrides(group) -> None:
    """``--layers --hidden --heads --kv-heads --ffn --vocab --experts`` and ``--set KEY=VALUE``: change a
    preset's or config's architecture (``kit.models.override``), e.g. to shrink a 7B for CPU runs."""
    for name in ("layers", "hidden", "heads", "kv-heads", "ffn", "vocab", "experts"):
        group.add_argument(f"--{name}", type=int, help=f"override the config's {name.replace('-', ' ')}")
    group.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override any config key (repeatable)"
    )


def model_from_args(args: argparse.Namespace):
    """The ModelSpec of ``--model`` / ``--params``, with the architecture overrides applied."""
    from kit import models

    if getattr(args, "params", None):
        if args.model:
            raise UsageError("model: give --model or --params, not both")
        spec = models.from_count(args.params, args.largest_layer)
    elif args.model:
        spec = models.resolve(args.model)
    else:
        raise UsageError("model: give --model PRESET|config.json|my_model.py or --params N")
    changes = {
        name: getattr(args, name)
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "experts")
        if getattr(args, name) is not None
    }
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"set: expected KEY=VALUE, got {item!r}")
        try:
            changes[key] = json.loads(value)
        except json.JSONDecodeError:
            changes[key] = value
    return models.override(spec, changes)


def setup_from_args(args: argparse.Namespace):
    """The Setup the flags describe (a --ds-config file supplies ZeRO and batch settings)."""
    from kit.schema import Setup

    spec = model_from_args(args)
    cluster = cluster_from_args(args)
    batch = {"micro_batch": args.micro_batch, "grad_accum": args.grad_accum, "train_batch": args.train_batch}
    batch["seq_len"] = args.seq_len
    target = {"target_len": args.target_len} if getattr(args, "target_len", None) is not None else {}
    if args.ds_config:
        # A config DeepSpeed would refuse is refused here, in the words of `zerokit explain`'s first error
        # (this runs DeepSpeed's own parser, so it imports deepspeed).
        from kit.review import checked_setup

        setup, notes = checked_setup(args.ds_config, model=spec, cluster=cluster, **batch)
        for note in notes:  # how each "auto" was resolved: stderr, so --json stays one object
            print(f"note: {note}", file=sys.stderr)
        return beside_file(setup.replace(batch=target) if target else setup, args)
    batch |= target
    return Setup(model=spec, cluster=cluster, zero=settings.fields(zero_from_args(args)), batch=batch)


def beside_file(setup, args: argparse.Namespace):
    """The Setup of a ds_config with the flags given beside it, as the HF Trainer combines its arguments
    with the file: the training script's settings (``Setting.script``: checkpointing, what trains, the
    loss) apply; a flag for one of the file's keys that says otherwise than the file is a UsageError
    naming both."""
    z, given = setup.zero, zero_from_args(args)
    if "stage" in given and (given["engine"], given["stage"]) != (z.engine, z.stage):
        raise UsageError(
            f"--stage {args.stage}: the ds_config's zero_optimization.stage is {z.stage}; "
            "drop the flag or change the file"
        )
    script = {}
    for field, value in given.items():
        s = BY_FIELD.get(field)
        if s is None or s.field == "stage":
            continue
        if s.script:
            script[field] = value
        elif value != s.value(z):
            raise UsageError(
                f"{s.option} {settings.text(value)}: the ds_config's {s.ds_key} is "
                f"{settings.text(s.value(z))}; drop the flag or change the file"
            )
    return setup.replace(zero=settings.fields(script))


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, default=str)
    sys.stdout.write("\n")


def count(text: str) -> int:
    """argparse type for counts: 7e9, 7B, 350M."""
    try:
        return parse_count(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def items(text: str | None) -> list[str]:
    """The items of a comma-separated flag (``--stages 0,1,2``), blanks dropped; [] for no flag."""
    return [t.strip() for t in text.split(",") if t.strip()] if text else []


def engine_stage(flag: str, item: str) -> tuple[str, int]:
    """``(engine, stage)`` of a ZeRO stage or a PyTorch baseline's name (``kit.rules.BASELINES``)."""
    from kit.rules import BASELINES

    if item in BASELINES:
        return BASELINES[item]
    stage = whole(flag, item, allowed="0-3 or " + ", ".join(BASELINES))
    if not 0 <= stage <= 3:
        raise UsageError(f"{flag}: ZeRO stages are 0-3 (or {', '.join(BASELINES)}), got {item!r}")
    return "deepspeed", stage


def whole(flag: str, text: str, allowed: str = "0-3") -> int:
    """One integer item of a comma-separated flag, or UsageError naming the flag and what is allowed."""
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag}: comma-separated integers {allowed}, got {text!r}") from None


@contextlib.contextmanager
def stdout_to_stderr():
    """Send everything written to stdout meanwhile (DeepSpeed logs there) to stderr, so that
    ``--json`` prints one JSON object and nothing else on stdout."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def add_hostfile_args(p: argparse.ArgumentParser) -> None:
    """The flags that run a command's ranks across a hostfile's nodes (``zerokit run`` and ``tune``),
    read back by ``nodes_from_args``."""
    from kit.rules import DEFAULT_MASTER_PORT

    h = p.add_argument_group("several nodes (a DeepSpeed hostfile)")
    h.add_argument(
        "--hostfile",
        help="run on this hostfile's nodes, --nprocs ranks on each, through DeepSpeed's multi-node runner "
        "(--runs-dir and this Python must be on storage every node sees)",
    )
    h.add_argument(
        "--local", action="store_true", help="start every host's ranks on this machine (a rehearsal)"
    )
    h.add_argument(
        "--nodes", type=int, help="use the first N hosts (default: all, after --include/--exclude)"
    )
    h.add_argument("--include", default="", help="DeepSpeed's --include, e.g. 'node1@node2:0,1'")
    h.add_argument("--exclude", default="", help="DeepSpeed's --exclude, e.g. 'node3'")
    h.add_argument("--master-addr", help="rank 0's host (default: the first host)")
    h.add_argument(
        "--master-port", type=int, help=f"rank 0's port (default: a free one; {DEFAULT_MASTER_PORT} common)"
    )


def nodes_from_args(args: argparse.Namespace):
    """The ``kit.run.local_nodes.Nodes`` of ``--hostfile`` (None without it), its hosts and the cluster
    size checked before anything starts: the hostfile line by line, ``--include`` / ``--exclude`` as
    DeepSpeed applies them, hosts against ``--nodes`` and slots against ``--nprocs``, one line each."""
    from kit.run.launcher import check_launcher
    from kit.run.local_nodes import RUNNER_BACKENDS as HOSTFILE_LAUNCHERS  # beside deepspeed, torchrun
    from kit.scaleout.hostfile import nodes_from_hostfile

    launcher = args.launcher
    if not args.hostfile:
        for flag in ("local", "nodes", "include", "exclude", "master_addr", "master_port"):
            if getattr(args, flag):
                raise UsageError(
                    f"{flag.replace('_', '-')}: runs across a --hostfile's nodes; give --hostfile"
                )
        if launcher in HOSTFILE_LAUNCHERS:
            raise UsageError(f"launcher: {launcher} reaches a --hostfile's nodes; give --hostfile")
        try:
            check_launcher(launcher)
        except ValueError as error:
            raise UsageError(str(error)) from None
        return None
    if launcher not in (None, "deepspeed", *HOSTFILE_LAUNCHERS):
        raise UsageError(
            f"launcher: with --hostfile choose one of {', '.join(HOSTFILE_LAUNCHERS)} (DeepSpeed's runner), "
            f"got {launcher!r}"
        )
    return nodes_from_hostfile(
        args.hostfile,
        args.nprocs,
        nodes=args.nodes,
        local=args.local,
        backend="pdsh" if launcher in (None, "deepspeed") else launcher,
        include=args.include,
        exclude=args.exclude,
        master_addr=args.master_addr,
        master_port=args.master_port,
    )
