"""Communication per collective, split by where its ranks live: inside one node (``intra``) or across nodes.

The records' ``comm_bytes`` are these two scopes added up (``kit.ranks.measure.comm_bytes``). DeepSpeed's
comms logger records each collective's size too, but not its process group, so it cannot tell ZeRO++
hpZ's in-node all-gather from the world's, and it synchronizes the device after every collective to time
it (``measure.logged_comm_bytes``, the optional ``comm_logger`` probe, is checked equal). ``CommScopes``
wraps the collectives of DeepSpeed's communication backend (``deepspeed.comm.comm.cdb``, through which
every ``deepspeed.comm`` collective goes) while installed, and adds each call's size to ``intra`` when
all ranks of its group are on one node (node = global rank // GPUs per node, the launcher's contiguous
placement), else to ``inter``. Sizes follow the comms logger's convention (whole input for all-reduce,
reduce-scatter and all-to-all, the shard for all-gather), so per collective the two scopes add up to
what the logger records; wire bytes use the group's own size.

Blind spots: collectives called on ``torch.distributed`` directly (not through ``deepspeed.comm``) are
not seen; nor are point-to-point sends.
"""

from __future__ import annotations

from kit.rules import wire_factor

#: backend method -> (collective family, argument whose size counts, its position, the group's position),
#: as ``deepspeed/comm/torch.py`` ``TorchBackend`` declares them (its decorators hide the signatures)
WATCHED = {
    "all_gather_into_tensor": ("all_gather", "input_tensor", 1, 2),
    "all_gather_base": ("all_gather", "input_tensor", 1, 2),
    "all_gather": ("all_gather", "tensor", 1, 2),
    "all_gather_coalesced": ("all_gather", "input_tensors", 1, 2),
    "reduce_scatter_tensor": ("reduce_scatter", "input_tensor", 1, 3),
    "reduce_scatter": ("reduce_scatter", "input_list", 1, 3),
    "all_reduce": ("all_reduce", "tensor", 0, 2),
    "all_reduce_coalesced": ("all_reduce", "tensors", 0, 2),
    "all_to_all_single": ("all_to_all", "input", 1, 4),
    "broadcast": ("broadcast", "tensor", 0, 2),
    "reduce": ("reduce", "tensor", 0, 3),
}
SCOPES = ("intra", "inter")


class CommScopes:
    """``install()`` (returns self; ``uninstall()`` removes it), ``reset()`` before a step, then
    ``bytes()`` ({scope: {collective: logged bytes}}) and ``wire_bytes()`` ({scope: bytes sent})."""

    def __init__(self, gpus_per_node: int):
        self.gpus_per_node = gpus_per_node
        self._logged: dict[str, dict[str, int]] = {s: {} for s in SCOPES}
        self._wire: dict[str, float] = dict.fromkeys(SCOPES, 0.0)
        self._groups: dict[int, tuple[object, str, int]] = {}

    def install(self) -> CommScopes:
        """Wrap the backend's collectives (replacing any CommScopes installed before)."""
        from deepspeed.comm import comm

        uninstall()
        for name, watched in WATCHED.items():
            method = getattr(comm.cdb, name, None)
            if method is not None:
                setattr(comm.cdb, name, self._wrap(method, *watched))
        return self

    def reset(self) -> None:
        self._logged = {s: {} for s in SCOPES}
        self._wire = dict.fromkeys(SCOPES, 0.0)

    def bytes(self) -> dict[str, dict[str, int]]:
        return {s: dict(ops) for s, ops in self._logged.items()}

    def wire_bytes(self) -> dict[str, int]:
        return {s: round(v) for s, v in self._wire.items()}

    def _wrap(self, method, family: str, argument: str, position: int, group_position: int):
        def watched(*args, **kwargs):
            size = _nbytes(kwargs[argument] if argument in kwargs else _at(args, position))
            if size:
                scope, members = self._scope(
                    kwargs["group"] if "group" in kwargs else _at(args, group_position)
                )
                ops = self._logged[scope]
                ops[family] = ops.get(family, 0) + size
                self._wire[scope] += size * wire_factor(family, members) if members > 1 else 0.0
            return method(*args, **kwargs)

        return watched

    def _scope(self, group) -> tuple[str, int]:
        """("intra" | "inter", ranks in the group), cached per group object (kept alive with its entry,
        so that its id is not reused)."""
        key = id(group)
        if key not in self._groups:
            import torch.distributed as dist

            ranks = dist.get_process_group_ranks(group) if group is not None else range(dist.get_world_size())
            nodes = {r // self.gpus_per_node for r in ranks}
            self._groups[key] = (group, "intra" if len(nodes) == 1 else "inter", len(ranks))
        return self._groups[key][1:]


def uninstall() -> None:
    """Remove the wrappers: the backend class's own methods show through again."""
    from deepspeed.comm import comm

    if comm.cdb is not None:
        for name in WATCHED:
            vars(comm.cdb).pop(name, None)


def _at(args: tuple, position: int):
    return args[position] if position < len(args) else None


def _nbytes(value) -> int:
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    if hasattr(value, "element_size"):
        return value.element_size() * value.nelement()
    return 0
