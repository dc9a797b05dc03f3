"""What the subcommands share: the flags that build a Setup, the Setup they describe, JSON output."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from typing import Any

from kit.units import parse_count


class UsageError(ValueError):
    """Invalid input detected by a subcommand: printed as one line, exit 2."""


def add_setup_args(p: argparse.ArgumentParser) -> None:
    """Flags that build a Setup (model, cluster, ZeRO settings, batch), shared by subcommands."""
    add_model_args(p)
    add_cluster_args(p)
    z = p.add_argument_group("ZeRO")
    z.add_argument(
        "--stage", default="2", help="ZeRO stage 0-3, or a PyTorch baseline: ddp, fsdp, fsdp-grad-op"
    )
    z.add_argument("--offload-optimizer", default="none", help="none, cpu or nvme (nvme: stage 3)")
    z.add_argument("--offload-param", default="none", help="none, cpu or nvme (stage 3 only)")
    z.add_argument("--precision", default="bf16", help="fp32, fp16 or bf16")
    z.add_argument("--optimizer", default="adamw", help="adamw, adam or sgd")
    z.add_argument("--momentum", type=float, default=0.0, help="SGD momentum")
    z.add_argument("--activation-checkpointing", action="store_true")
    add_zeropp_args(z)
    z.add_argument("--ds-config", help="read ZeRO and batch settings from an existing ds_config.json")
    add_nvme_args(p)
    add_batch_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object on stdout")


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
    n.add_argument("--nvme-buffer-count", type=int, help="offload_param.buffer_count (5)")
    n.add_argument("--nvme-buffer-size", type=count, help="offload_param.buffer_size, elements (1e8)")
    n.add_argument("--nvme-max-in-cpu", type=count, help="offload_param.max_in_cpu, elements (1e9)")
    n.add_argument("--nvme-optimizer-buffer-count", type=int, help="offload_optimizer.buffer_count (4)")
    n.add_argument("--no-pin-memory", action="store_true", help="offload into pageable RAM")
    n.add_argument("--aio-block-size", type=count, help="aio.block_size, bytes (1048576)")
    n.add_argument("--aio-queue-depth", type=int, help="aio.queue_depth (8)")
    n.add_argument(
        "--aio-intra-op-parallelism", "--aio-thread-count", type=int, help="aio.intra_op_parallelism (1)"
    )


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
    c.add_argument("--nodes", type=int, default=1)
    c.add_argument("--gpus-per-node", type=int, default=8)
    c.add_argument("--gpu", default="H100-SXM-80GB", help="a name in data/gpus.csv")
    c.add_argument("--cpu-ram-gb", type=float, help="CPU RAM per node, GiB (for the offload fit check)")


def add_batch_args(p: argparse.ArgumentParser) -> None:
    """``--micro-batch --grad-accum --train-batch --seq-len``."""
    b = p.add_argument_group("batch (any two of micro/grad-accum/train determine the third)")
    b.add_argument("--micro-batch", type=int)
    b.add_argument("--grad-accum", type=int)
    b.add_argument("--train-batch", type=int)
    b.add_argument("--seq-len", type=int)


def cluster_from_args(args: argparse.Namespace) -> dict:
    """The Cluster fields the cluster flags give."""
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
        from kit.estimate.review import checked_setup

        setup, notes = checked_setup(args.ds_config, model=spec, cluster=cluster, **batch)
        for note in notes:  # how each "auto" was resolved: stderr, so --json stays one object
            print(f"note: {note}", file=sys.stderr)
        return setup
    engine, stage = engine_stage("stage", args.stage)
    zero = {
        "engine": engine,
        "stage": stage,
        "offload_optimizer": args.offload_optimizer,
        "offload_param": args.offload_param,
        "precision": args.precision,
        "optimizer": args.optimizer,
        "momentum": args.momentum,
        "activation_checkpointing": args.activation_checkpointing,
        **nvme_from_args(args),
        **zeropp_from_args(args),
    }
    return Setup(model=spec, cluster=cluster, zero=zero, batch=batch)


def add_zeropp_args(p) -> None:
    """The ZeRO++ flags (stage 3): ``--hpz N``, ``--quantized-weights``, ``--quantized-gradients``."""
    p.add_argument(
        "--hpz",
        type=int,
        default=1,
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
