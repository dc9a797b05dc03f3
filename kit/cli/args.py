"""What the subcommands share: the flags that build a Setup, the Setup they describe, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from kit.checkpointing import POLICIES
from kit.ds_keys import ZERO_KEYS
from kit.loss import LOSSES
from kit.schema import AioSettings, Cluster, ZeroSettings
from kit.units import parse_count


class UsageError(ValueError):
    """Invalid input detected by a subcommand: printed as one line, exit 2."""


def default(section: type, name: str) -> Any:
    """A Setup field's default (``default(ZeroSettings, "stage")``): the flags restate no number."""
    return section.model_fields[name].default


def add_json(p, what: str = "one JSON object") -> None:
    """``--json``, which every subcommand takes: print ``what`` on stdout and nothing else there."""
    p.add_argument("--json", action="store_true", help=f"print {what} on stdout")


def add_precision(p, *, many: bool = False) -> None:
    """``--precision`` (``many``: a comma-separated list), the schema's default."""
    choices = "fp32, fp16, bf16"
    help = f"comma-separated: {choices}" if many else choices
    p.add_argument("--precision", default=default(ZeroSettings, "precision"), help=help)


def add_gpu(p, help: str = "a name in data/gpus.csv") -> None:
    """``--gpu NAME`` (a row of data/gpus.csv), the schema's default."""
    p.add_argument("--gpu", default=default(Cluster, "gpu"), help=help)


def add_checkpointing(p) -> None:
    """``--activation-checkpointing`` and how (``kit.checkpointing``): ``--checkpoint-every K``,
    ``--checkpoint-policy {full,selective-op}``; either of the two turns checkpointing on."""
    p.add_argument("--activation-checkpointing", action="store_true", help="recompute activations per block")
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=default(ZeroSettings, "checkpoint_every"),
        metavar="K",
        help="checkpoint one block in K, the others keep everything (torchtitan's selective 'layer' K)",
    )
    p.add_argument(
        "--checkpoint-policy",
        choices=POLICIES,
        default=default(ZeroSettings, "checkpoint_policy"),
        help="full: a block keeps its input; selective-op: also its matmul and attention outputs "
        "(torchtitan's 'op')",
    )


def checkpointing_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ZeroSettings checkpointing fields of the flags (``add_checkpointing``)."""
    every = getattr(args, "checkpoint_every", default(ZeroSettings, "checkpoint_every"))
    policy = getattr(args, "checkpoint_policy", default(ZeroSettings, "checkpoint_policy"))
    on = getattr(args, "activation_checkpointing", False) or every != 1 or policy != "full"
    return {"activation_checkpointing": on, "checkpoint_every": every, "checkpoint_policy": policy}


def add_trainable(p) -> None:
    """What trains (``kit.trainable``): ``--lora-rank R``, ``--lora-targets q_proj,v_proj`` (or
    ``all-linear``), ``--freeze-embeddings``, ``--frozen-blocks K``; the loss (``kit.loss``): ``--loss``."""
    g = p.add_argument_group("what trains (default: every parameter) and its loss")
    g.add_argument("--lora-rank", type=int, default=0, metavar="R", help="LoRA rank through peft; 0: no LoRA")
    g.add_argument(
        "--lora-targets",
        metavar="MODULES",
        help="comma-separated peft target_modules, or all-linear (default: peft's for the model type)",
    )
    g.add_argument("--freeze-embeddings", action="store_true", help="the input embeddings do not train")
    g.add_argument(
        "--frozen-blocks", type=int, default=0, metavar="K", help="the first K blocks do not train"
    )

    g.add_argument(
        "--loss",
        choices=LOSSES,
        default=default(ZeroSettings, "loss"),
        help="plain cross-entropy, or chunked: a fused linear cross-entropy (Liger's algorithm)",
    )


def trainable_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ZeroSettings fields of what trains and how its loss is computed (``add_trainable``)."""
    return {
        "lora_rank": getattr(args, "lora_rank", 0),
        "lora_targets": tuple(items(getattr(args, "lora_targets", None))),
        "freeze_embeddings": getattr(args, "freeze_embeddings", False),
        "frozen_blocks": getattr(args, "frozen_blocks", 0),
        "loss": getattr(args, "loss", default(ZeroSettings, "loss")),
    }


#: the zero_optimization knobs counted in elements (buckets, stage 3's fetching), a flag each named after
#: its ZeroSettings field (``--reduce-bucket-size``): ``kit.ds_keys.ZERO_KEYS`` declares them once
BUCKET_KEYS = tuple(
    k for k in ZERO_KEYS if type(k.default) is int and k.field not in ("stage", "hpz_partition_size")
)


def flag(field: str) -> str:
    """The CLI flag of a ZeroSettings field: ``--reduce-bucket-size``."""
    return "--" + field.replace("_", "-")


def add_bucket_args(p) -> None:
    """A flag per ``BUCKET_KEYS`` knob (elements, ``7e8`` or ``500M``), DeepSpeed's default when not given
    (read back by ``buckets_from_args``)."""
    b = p.add_argument_group("buckets and stage 3's fetching (elements)")
    for k in BUCKET_KEYS:
        stages = "stage 3" if k.stages == (3,) else f"stages {k.stages[0]}-{k.stages[-1]}"
        what = f"zero_optimization.{k.key}, {stages} ({k.default:,})"
        b.add_argument(flag(k.field), type=count, metavar="N", help=what)


def buckets_from_args(args: argparse.Namespace) -> dict[str, int]:
    """The ZeroSettings fields the bucket flags give (only those given)."""
    given = {k.field: getattr(args, k.field, None) for k in BUCKET_KEYS}
    return {field: value for field, value in given.items() if value is not None}


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """Flags that build a Setup (model, cluster, ZeRO settings, batch), shared by subcommands."""
    add_model_args(p)
    add_cluster_args(p)
    z = p.add_argument_group("ZeRO")
    z.add_argument(  # no argparse default: a --stage given beside a --ds-config is told from none
        "--stage",
        help="ZeRO stage 0-3, or a PyTorch baseline: ddp, fsdp, fsdp-grad-op "
        f"(default {default(ZeroSettings, 'stage')})",
    )
    add_offload_args(z)
    add_precision(z)
    z.add_argument("--optimizer", default=default(ZeroSettings, "optimizer"), help="adamw, adam or sgd")
    z.add_argument("--momentum", type=float, default=default(ZeroSettings, "momentum"), help="SGD momentum")
    add_checkpointing(z)
    add_zeropp_args(z)
    z.add_argument("--ds-config", help="read ZeRO and batch settings from an existing ds_config.json")
    add_trainable(p)
    add_bucket_args(p)
    add_nvme_args(p)
    add_batch_args(p)
    add_json(p)


def add_offload_args(p, *, many: bool = False) -> None:
    """``--offload-optimizer`` and ``--offload-param`` (``many``: comma-separated lists)."""
    lists = "comma-separated: " if many else ""
    for flag, where in (("optimizer", "nvme: stage 3"), ("param", "stage 3 only")):
        p.add_argument(
            f"--offload-{flag}",
            default=default(ZeroSettings, f"offload_{flag}"),
            help=f"{lists}none, cpu or nvme ({where})",
        )


#: NVMe offload flag -> ZeroSettings field (``add_nvme_args``); aio fields go under ``aio``
NVME_FLAGS = {
    "nvme_buffer_count": "buffer_count",
    "nvme_buffer_size": "buffer_size",
    "nvme_max_in_cpu": "max_in_cpu",
    "nvme_optimizer_buffer_count": "optimizer_buffer_count",
}
AIO_FLAGS = {
    "aio_block_size": "block_size",
    "aio_queue_depth": "queue_depth",
    "aio_intra_op_parallelism": "intra_op_parallelism",
}


def add_nvme_args(p: argparse.ArgumentParser) -> None:
    """ZeRO-Infinity flags (``--offload-* nvme``): ``--nvme-path`` and the swapper / aio knobs, each
    DeepSpeed's default when not given (read back by ``nvme_from_args``)."""
    n = p.add_argument_group("NVMe offload (ZeRO-Infinity)")
    n.add_argument("--nvme-path", help="folder on the NVMe drive for the swap files")
    knobs = {
        "--nvme-buffer-count": (int, "offload_param.buffer_count"),
        "--nvme-buffer-size": (count, "offload_param.buffer_size, elements"),
        "--nvme-max-in-cpu": (count, "offload_param.max_in_cpu, elements"),
        "--nvme-optimizer-buffer-count": (int, "offload_optimizer.buffer_count"),
    }
    for (flag, (kind, what)), name in zip(knobs.items(), NVME_FLAGS.values(), strict=True):
        n.add_argument(flag, type=kind, help=f"{what} ({default(ZeroSettings, name):,})")
    n.add_argument("--no-pin-memory", action="store_true", help="offload into pageable RAM")
    aio = {
        "--aio-block-size": ("aio.block_size, bytes", count),
        "--aio-queue-depth": ("aio.queue_depth", int),
    }
    aio["--aio-intra-op-parallelism"] = ("aio.intra_op_parallelism", int)
    for (flag, (what, kind)), name in zip(aio.items(), AIO_FLAGS.values(), strict=True):
        aliases = ["--aio-thread-count"] if name == "intra_op_parallelism" else []
        n.add_argument(flag, *aliases, type=kind, help=f"{what} ({default(AioSettings, name):,})")


def nvme_from_args(args: argparse.Namespace) -> dict:
    """The ZeroSettings fields the NVMe flags give (only those given)."""
    zero: dict[str, Any] = {}
    if getattr(args, "nvme_path", None):
        zero["nvme_path"] = args.nvme_path
    zero.update({f: getattr(args, a) for a, f in NVME_FLAGS.items() if getattr(args, a, None) is not None})
    if getattr(args, "no_pin_memory", False):
        zero["pin_memory"] = False
    aio = {f: getattr(args, a) for a, f in AIO_FLAGS.items() if getattr(args, a, None) is not None}
    if aio:
        zero["aio"] = aio
    return zero


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


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """``--micro-batch --grad-accum --train-batch --seq-len``."""
    b = p.add_argument_group("batch (any two of micro/grad-accum/train determine the third)")
    b.add_argument("--micro-batch", type=int)
    b.add_argument("--grad-accum", type=int)
    b.add_argument("--train-batch", type=int)
    add_seq_len(b)


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
    if args.ds_config:
        # A config DeepSpeed would refuse is refused here, in the words of `zerokit explain`'s first error
        # (this runs DeepSpeed's own parser, so it imports deepspeed).
        from kit.review import checked_setup

        setup, notes = checked_setup(args.ds_config, model=spec, cluster=cluster, **batch)
        for note in notes:  # how each "auto" was resolved: stderr, so --json stays one object
            print(f"note: {note}", file=sys.stderr)
        return beside_file(setup, args)
    engine, stage = engine_stage("stage", args.stage or str(default(ZeroSettings, "stage")))
    zero = {
        "engine": engine,
        "stage": stage,
        "offload_optimizer": args.offload_optimizer,
        "offload_param": args.offload_param,
        "precision": args.precision,
        "optimizer": args.optimizer,
        "momentum": args.momentum,
        **checkpointing_from_args(args),
        **trainable_from_args(args),
        **buckets_from_args(args),
        **nvme_from_args(args),
        **zeropp_from_args(args),
    }
    return Setup(model=spec, cluster=cluster, zero=zero, batch=batch)


#: the ZeRO flags a ds_config also sets: (flag, argparse name, ZeroSettings field, the file's key)
FILE_FLAGS = (
    ("--offload-optimizer", "offload_optimizer", "offload_optimizer", "zero_optimization.offload_optimizer"),
    ("--offload-param", "offload_param", "offload_param", "zero_optimization.offload_param"),
    ("--hpz", "hpz", "hpz_partition_size", "zero_optimization.zero_hpz_partition_size"),
    (
        "--quantized-weights", "quantized_weights", "quantized_weights",
        "zero_optimization.zero_quantized_weights",
    ),
    (
        "--quantized-gradients", "quantized_gradients", "quantized_gradients",
        "zero_optimization.zero_quantized_gradients",
    ),
    *((flag(k.field), k.field, k.field, f"zero_optimization.{k.key}") for k in BUCKET_KEYS),
)  # fmt: skip


def beside_file(setup, args: argparse.Namespace):
    """The Setup of a ds_config with the flags given beside it, as the HF Trainer combines its arguments
    with the file: ``--activation-checkpointing`` (the Trainer's gradient checkpointing, which no ds_config
    key turns on) and what trains (LoRA, frozen parts: the script's, not the file's) apply; a ZeRO flag
    given that says otherwise than the file is a UsageError naming
    both (``--stage`` whenever given; the others when not at their default, which is taken as not given)."""
    z = setup.zero
    if args.stage is not None and engine_stage("--stage", args.stage) != (z.engine, z.stage):
        raise UsageError(
            f"--stage {args.stage}: the ds_config's zero_optimization.stage is {z.stage}; "
            "drop the flag or change the file"
        )
    for flag, name, field, key in FILE_FLAGS:
        value = getattr(args, name, None)
        if value is not None and value != default(ZeroSettings, field) and value != getattr(z, field):
            raise UsageError(
                f"{flag} {value}: the ds_config's {key} is {getattr(z, field)}; "
                "drop the flag or change the file"
            )
    flags = checkpointing_from_args(args)
    if not flags["activation_checkpointing"] or z.activation_checkpointing:
        flags = {}
    return setup.replace(zero={**flags, **trainable_from_args(args)})


def add_zeropp_args(p) -> None:
    """The ZeRO++ flags (stage 3): ``--hpz N``, ``--quantized-weights``, ``--quantized-gradients``."""
    p.add_argument(
        "--hpz",
        type=int,
        default=default(ZeroSettings, "hpz_partition_size"),
        help="ZeRO++ hpZ: zero_hpz_partition_size (stage 3; divides GPUs per node)",
    )
    p.add_argument(
        "--quantized-weights", action="store_true", help="ZeRO++ qwZ: int8 weight all-gathers (stage 3)"
    )
    p.add_argument("--quantized-gradients", action="store_true", help="ZeRO++ qgZ: int4 gradients (stage 3)")


def zeropp_from_args(args: argparse.Namespace) -> dict:
    """ZeroSettings fields of the ZeRO++ flags (--hpz, --quantized-weights, --quantized-gradients)."""
    return {
        "hpz_partition_size": getattr(args, "hpz", 1),
        "quantized_weights": getattr(args, "quantized_weights", False),
        "quantized_gradients": getattr(args, "quantized_gradients", False),
    }


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
