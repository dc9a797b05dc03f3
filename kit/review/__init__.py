"""The review of an existing ds_config for one model and cluster, setting by setting (``zerokit explain``).

``explain_ds_config(config, model=..., cluster=...)`` reads a user's DeepSpeed config (HF Trainer
``"auto"`` values resolved as ``kit.ds_config.read_ds_config`` does), has DeepSpeed's own config classes
parse it (``kit.ds_config.deepspeed_refusals``: every refusal, not only the first, plus the checks
DeepSpeed makes only when the engine starts), and then reviews each setting with the bytes the kit's
estimate (``kit.estimate.memory``) gives it for this model and cluster:

- ``error``: DeepSpeed refuses the config (an unknown key in a section, a value its parser or engine
  rejects); the suggestion names the fix (the nearest known key, an aligned size, a valid batch):
  ``refusals``;
- ``warning``: a setting that does nothing although it looks like it should (an unknown top-level key,
  which DeepSpeed ignores silently; ``offload_param`` below stage 3), or that costs memory or
  communication for nothing (GB-sized buckets, a prefetch bucket many layers deep, stage 3 where
  stage 2 fits with room to spare);
- ``info``: what every other present setting does, with its number and formula.

The checks, by topic: ``stage``, ``buckets``, ``offload``, ``precision``, ``batch``, ``zeropp``; what they
share: ``context``. The text report is the CLI's (``kit.cli.explain``). Importing this package imports
neither torch nor deepspeed; reviewing imports deepspeed (its parser).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kit.ds_config import load_ds_config
from kit.ds_config.reader import read_or_repair
from kit.review import batch, buckets, offload, precision, stage, zeropp
from kit.review.context import SEVERITIES, Context, Finding
from kit.review.refusals import refusal_findings
from kit.schema import Cluster, ModelSpec, Setup

#: every check of the settings, in the order the findings of one severity are listed
CHECKS = (
    stage.stage, buckets.reduce_bucket, buckets.overlap, buckets.contiguous, buckets.allgather,
    stage.stage3_keys, offload.offload_param, offload.offload_optimizer, offload.pin_memory,
    buckets.prefetch, buckets.max_live, buckets.persistence, precision.precision, batch.batch,
    batch.checkpointing, precision.optimizer, zeropp.zeropp, offload.nvme_offload,
)  # fmt: skip

__all__ = ["CHECKS", "SEVERITIES", "Explanation", "Finding", "checked_setup", "explain_ds_config"]


@dataclass
class Explanation:
    """The findings for a ds_config (errors first), the notes (how "auto" was resolved, what the
    estimate assumes) and the Setup it describes (None where the kit cannot build one)."""

    setup: Setup | None
    findings: list[Finding]
    notes: list[str]
    #: why the kit could not read the config as written (its Setup is then of a repaired copy, or None)
    unread: str | None = None

    @property
    def valid(self) -> bool:
        """Whether DeepSpeed accepts the config and zero-kit models what it turns on (no ``error``
        finding)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> dict:
        """The ``zerokit explain --json`` object."""
        return {
            "findings": [f.to_dict() for f in self.findings],
            "notes": list(self.notes),
            "setup": self.setup.model_dump(mode="json") if self.setup else None,
            "valid": self.valid,
        }

    def frame(self):
        """The findings as a pandas DataFrame (key, severity, message, suggestion)."""
        import pandas as pd

        columns = ["key", "severity", "message", "suggestion"]
        return pd.DataFrame([f.to_dict() for f in self.findings], columns=columns)


def explain_ds_config(
    config: dict | str | Path,
    *,
    model: ModelSpec,
    cluster: Cluster | dict | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
) -> Explanation:
    """Every problem of ``config`` for ``model`` on ``cluster``, then what each setting does.

    ValueError (one line naming the file) when ``config`` is not JSON, not a JSON object or not a
    DeepSpeed config at all; and when a batch value given here contradicts a number in the file.
    """
    flags = {
        "seq_len": seq_len,
        "micro_batch": micro_batch,
        "grad_accum": grad_accum,
        "train_batch": train_batch,
    }
    _, raw = load_ds_config(config)
    cluster = cluster if isinstance(cluster, Cluster) else Cluster.model_validate(cluster or {})
    setup, notes, unread = read_or_repair(raw, model=model, cluster=cluster, **flags)
    findings = refusal_findings(raw, setup, cluster, flags, notes)
    if setup is not None:
        x = Context(raw, setup)
        taken = {f.key for f in findings}
        findings += [f for check in CHECKS for f in check(x) if f.key not in taken]
    order = {s: i for i, s in enumerate(SEVERITIES)}
    return Explanation(setup, sorted(findings, key=lambda f: order[f.severity]), notes, unread)


def checked_setup(
    config: dict | str | Path,
    *,
    model: ModelSpec,
    cluster: Cluster | dict | None = None,
    seq_len: int | None = None,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
) -> tuple[Setup, list[str]]:
    """``read_ds_config``'s Setup and notes, refusing (ValueError) a config DeepSpeed would refuse with
    the message of ``explain_ds_config``'s first error finding (``zerokit estimate --ds-config``)."""
    explanation = explain_ds_config(
        config, model=model, cluster=cluster, seq_len=seq_len, micro_batch=micro_batch,
        grad_accum=grad_accum, train_batch=train_batch,
    )  # fmt: skip
    if explanation.errors:
        raise ValueError(explanation.errors[0].message)
    if explanation.unread or explanation.setup is None:
        raise ValueError(explanation.unread)
    return explanation.setup, explanation.notes
