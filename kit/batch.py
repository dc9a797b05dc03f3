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

    The global batch itself when it divides by dp (its decompositions nearest the requested micro
    batch first), otherwise the nearest global batches that do: multiples of micro x dp when the
    micro batch is fixed, multiples of dp otherwise.
    """
    step = micro_batch * dp if micro_batch else dp
    below = max(step, train_batch - train_batch % step)
    targets = {below, below + step} if train_batch % step else set()
    if train_batch % dp == 0:
        targets.add(train_batch)
    options = [d for t in sorted(targets) for d in decompositions(t, dp)]
    if micro_batch:
        options.sort(key=lambda d: (abs(d.micro_batch - micro_batch), abs(d.train_batch - train_batch)))
    lines = [f"{d.micro_batch} x {dp} x {d.grad_accum} = {d.train_batch}" for d in options[:limit]]
    return "valid (micro x dp x grad_accum = train): " + "; ".join(lines)


def _mismatch(
    train_batch: int, micro: int, gas: int, dp: int, requested_micro: int | None = None
) -> BatchError:
    """DeepSpeed's own assertion text (``DeepSpeedConfig._batch_assertion``) plus the alternatives."""
    return BatchError(
        "train_batch_size is not equal to micro_batch_per_gpu * gradient_acc_step * world_size "
        f"{train_batch} != {micro} * {gas} * {dp}; " + nearest_valid(train_batch, dp, requested_micro)
    )


def _positive(name: str, value: int) -> None:
    try:
        whole_number(name, value)
    except ValueError as error:
        raise BatchError(str(error)) from None
