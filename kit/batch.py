"""Batch decomposition: train_batch_size = micro_batch_per_gpu x data_parallel_size x grad_accum.

Any two of the three determine the third (as DeepSpeed's ``_set_batch_related_parameters`` does),
but where DeepSpeed silently floors a non-divisible split and then fails its assertion, we refuse
up front with the same equation and the valid alternatives nearest the request.
"""

from __future__ import annotations

from typing import NamedTuple

from kit.units import whole_number


class BatchError(ValueError):
    """An impossible batch: the message carries DeepSpeed's equation and valid alternatives."""


class Decomposition(NamedTuple):
    micro_batch: int
    grad_accum: int
    train_batch: int


def decompositions(train_batch: int, dp: int) -> list[Decomposition]:
    """Every (micro_batch, grad_accum) with micro x dp x gas == train_batch, smallest GAS first."""
    _positive("train_batch", train_batch)
    _positive("data_parallel_size", dp)
    if train_batch % dp:
        return []
    per_rank = train_batch // dp
    return [
        Decomposition(per_rank // gas, gas, train_batch)
        for gas in range(1, per_rank + 1)
        if per_rank % gas == 0
    ]


def resolve(
    dp: int,
    micro_batch: int | None = None,
    grad_accum: int | None = None,
    train_batch: int | None = None,
) -> Decomposition:
    """Fill in the missing value(s) like DeepSpeed does, or raise BatchError before anything runs."""
    _positive("data_parallel_size", dp)
    for name, value in (
        ("micro_batch", micro_batch),
        ("grad_accum", grad_accum),
        ("train_batch", train_batch),
    ):
        if value is not None:
            _positive(name, value)
    if train_batch is None:
        if micro_batch is None:
            raise BatchError("batch: give micro_batch or train_batch (or both, or with grad_accum)")
        gas = grad_accum or 1
        return Decomposition(micro_batch, gas, micro_batch * dp * gas)
    if micro_batch is None:
        gas = grad_accum or 1
        if train_batch % (dp * gas):
            raise _mismatch(train_batch, train_batch // dp // gas, gas, dp)
        return Decomposition(train_batch // (dp * gas), gas, train_batch)
    if grad_accum is None:
        if train_batch % (micro_batch * dp):
            raise _mismatch(train_batch, micro_batch, train_batch // micro_batch // dp, dp, micro_batch)
        return Decomposition(micro_batch, train_batch // (micro_batch * dp), train_batch)
    if micro_batch * grad_accum * dp != train_batch:
        raise _mismatch(train_batch, micro_batch, grad_accum, dp, micro_batch)
    return Decomposition(micro_batch, grad_accum, train_batch)


def nearest_valid(train_batch: int, dp: int, micro_batch: int | None = None, limit: int = 6) -> str:
    """A readable list of valid alternatives near the request, on the same number of GPUs.

    The global batch is what the user fixed, so when it divides by dp only its own decompositions are
    offered (nearest the requested micro batch first); otherwise no micro batch keeps it and the
    nearest global batches that work are: multiples of micro x dp when the micro batch is given,
    multiples of dp otherwise.
    """
    step = micro_batch * dp if micro_batch else dp
    below = max(step, train_batch - train_batch % step)
    targets = {train_batch} if train_batch % dp == 0 else {below, below + step}
    options = [d for t in sorted(targets) for d in decompositions(t, dp)]
    if micro_batch:
        options.sort(key=lambda d: (abs(d.micro_batch - micro_batch), abs(d.train_batch - train_batch)))
    lines = [f"{d.micro_batch} x {dp} x {d.grad_accum} = {d.train_batch}" for d in options[:limit]]
    return "valid (micro x dp x grad_accum = train): " + "; ".join(lines)


def _mismatch(
    train_batch: int, micro: int, gas: int, dp: int, requested_micro: int | None = None
) -> BatchError:
    """DeepSpeed's own assertion text (``DeepSpeedConfig._batch_assertion``) plus the alternatives; where
    DeepSpeed would floor gradient accumulation to 0 (a global batch below micro x dp), the minimum."""
    equation = f"{train_batch} != {micro} * {gas} * {dp}"
    if gas == 0:
        smallest = f"{micro * dp} (the smallest global batch for micro {micro})"
        equation = f"{train_batch} < {micro} * 1 * {dp} = {smallest}"
    return BatchError(
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size "
        f"{equation}; " + nearest_valid(train_batch, dp, requested_micro)
    )


def _positive(name: str, value: int) -> None:
    try:
        whole_number(name, value)
    except ValueError as error:
        raise BatchError(str(error)) from None


def schedule(dp: int, start: Decomposition, changes) -> list[tuple[int, Decomposition]]:
    """A batch schedule resolved against DeepSpeed's setters, or BatchError naming the first bad step.

    ``changes``: ``{step: train_batch}``, a ``"2=16,4=32"`` string, or a list of ``{"step": s, ...}``
    with ``train_batch``, ``grad_accum`` and/or ``micro_batch``. Each applies from its step on
    (steps >= 1, increasing; step 0 is ``start``). A new global batch keeps the micro batch and changes
    gradient accumulation (``engine.set_train_batch_size``, which raises unless the batch divides by
    micro x dp); a new micro batch keeps gradient accumulation (``set_train_micro_batch_size``).
    """
    out, now, last = [], start, 0
    for entry in schedule_entries(changes):
        step = entry.pop("step", None)
        if not isinstance(step, int) or isinstance(step, bool) or step <= last:
            raise BatchError(
                f"batch.schedule: steps must be whole numbers >= 1, increasing; got {step!r} after {last}"
            )
        unknown = set(entry) - {"micro_batch", "grad_accum", "train_batch"}
        if unknown or not entry:
            raise BatchError(
                f"batch.schedule: step {step}: give train_batch, grad_accum and/or micro_batch"
                + (f", not {sorted(unknown)[0]!r}" if unknown else "")
            )
        micro, gas, train = (entry.get(k) for k in ("micro_batch", "grad_accum", "train_batch"))
        if micro is None and (gas is None or train is None):
            micro = now.micro_batch  # a new global batch or grad accum keeps the micro batch
        if gas is None and train is None:
            gas = now.grad_accum  # a new micro batch keeps grad accum
        unit = micro * dp if micro else 0
        if gas is None and unit and isinstance(train, int) and train % unit:
            near = sorted({max(unit, train // unit * unit), train // unit * unit + unit})
            raise BatchError(
                f"batch.schedule: step {step}: train_batch {train} is not a multiple of micro_batch {micro} "
                f"x {dp} GPUs = {unit} (DeepSpeed's set_train_batch_size raises); nearest: "
                + ", ".join(map(str, near))
            )
        try:
            now = resolve(dp, micro, gas, train)
        except BatchError as error:
            raise BatchError(f"batch.schedule: step {step}: {error}") from None
        out.append((step, now))
        last = step
    return out


def ramp(start: int, end: int, steps: int, unit: int) -> dict[int, int]:
    """``{step: train_batch}`` growing linearly from ``start`` at step 0 to ``end`` at step ``steps``, each
    rounded down to a multiple of ``unit`` (micro batch x dp, so that only gradient accumulation changes),
    one entry per change."""
    for name, value in (("start", start), ("end", end), ("steps", steps), ("unit", unit)):
        _positive(f"ramp {name}", value)
    if start % unit or end % unit:
        raise BatchError(f"batch.ramp: start {start} and end {end} must be multiples of micro x dp = {unit}")
    out, last = {}, start
    for step in range(1, steps + 1):
        value = max(unit, (start + (end - start) * step // steps) // unit * unit)
        if value != last:
            out[step] = last = value
    return out


def schedule_entries(changes) -> list[dict]:
    """A schedule's entries as ``{"step": s, ...}`` dicts, from a dict, a ``"2=16,4=32"`` string or a list."""
    if isinstance(changes, str):
        pairs = [item.partition("=") for item in changes.split(",") if item.strip()]
        if not pairs or any(
            not sep or not a.strip().isdigit() or not b.strip().isdigit() for a, sep, b in pairs
        ):
            raise BatchError(
                f"batch.schedule: expected STEP=TRAIN_BATCH pairs like 2=16,4=32, got {changes!r}"
            )
        return [{"step": int(a), "train_batch": int(b)} for a, _, b in pairs]
    if isinstance(changes, dict):
        return [
            {"step": int(k), "train_batch": v} for k, v in sorted(changes.items(), key=lambda kv: int(kv[0]))
        ]
    return [
        dict(e) if isinstance(e, dict) else dict(e._asdict() if hasattr(e, "_asdict") else e) for e in changes
    ]
