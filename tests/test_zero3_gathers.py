"""Stage 3's gathers as DeepSpeed 0.19's coordinator makes them (kit.estimate.zero3_gathers), on a model
small enough to follow by hand, and the kit's step of the kit's GPT with A18's shape beside the H100's
allocator trace of the same (data/reference/allocator-traces)."""

from kit.accuracy import traces
from kit.components import Component
from kit.estimate import deepspeed_events, memory, partition
from kit.estimate.allocator import Alloc, EmptyCache, Free, replay
from kit.estimate.zero3_gathers import Gathers
from kit.schema import ZeroSettings
from kit.toys import toy_setup
from tests.fixtures.cpu_rank import last_json


def _walk(zero: ZeroSettings, steps: int = 2, ranks: int = 2) -> list[str]:
    """Two steps of three modules (a weight and its bias each), forward then backward, as the engine's
    hooks call the coordinator: ``+B`` an allocation of B bytes on the gather stream (``@D`` the default
    one), ``-B`` its free, ``|`` where a phase begins."""
    log: list[str] = []
    sizes: dict[int, int] = {}

    def alloc(size: int, stream: int) -> int:
        sizes[len(sizes)] = size
        log.append(f"+{size}" + ("@D" if stream == 0 else ""))
        return len(sizes) - 1

    def free(*keys):
        log.extend(f"-{sizes[k]}" for k in keys if k is not None)

    gathers = Gathers([1000, 10, 400, 10, 300, 10], 2, ranks, zero, alloc, free, (0, 1), in_place=ranks == 1)
    modules = gathers.modules(list(range(6)))
    assert modules == [(0, 1), (2, 3), (4, 5)]  # each weight with its bias (10 <= the threshold: persistent)
    for _ in range(steps):
        gathers.reset()
        log.append("|fwd")
        for m in modules:
            gathers.fetch(m)
            gathers.release(m)
        log.append("|bwd")
        for m in reversed(modules):
            gathers.fetch(m)
            gathers.release(m)
        gathers.end()
        log.append("|step")
        gathers.regather_persistent()
    return log


def test_the_first_step_records_the_second_prefetches():
    """Step 1 records the trace: each module's weight and (not yet gathered) bias in one coalesced call,
    a flat buffer of their padded partitions (2 ranks: 2 B x 1,010) and a copy of each at the wait, the
    flat freed once both were waited for; every tensor released after its module. At the update every
    tensor is released and the persistent ones gathered again, one buffer each, on the default stream.

    Step 2 prefetches from the trace: after the first module's weight (alone: its own buffer), the next
    tensors not gathered while fewer than ``stage3_prefetch_bucket_size`` (500) elements are on their
    way, 400 + 300, in one call; their copies come at the first wait, the flat buffer goes at the last.
    The next prefetch finds the queue's next tensor not gathered is the first weight's backward use: it
    is gathered then and held to it; the second weight, whose backward use that prefetch passed over,
    is not released after its forward (``__params_to_release``)."""
    zero = ZeroSettings(
        stage=3, param_persistence_threshold=100, prefetch_bucket_size=500, max_reuse_distance=0
    )
    first, second = (part.strip() for part in " ".join(_walk(zero)).split("|fwd")[1:])
    assert first == (
        "+2020 +2000 +20 -2020 -2000 +820 +800 +20 -820 -800 +620 +600 +20 -620 -600 "
        "|bwd +600 -600 +800 -800 +2000 -2000 -20 -20 -20 |step +20@D +20@D +20@D"
    )
    assert second == (
        "+2000 +1400 -2000 +800 +600 +2000 -1400 -600 |bwd +600 -600 -800 -2000 -20 -20 -20 |step "
        "+20@D +20@D +20@D"
    )


def test_the_reuse_distance_keeps_what_is_used_again_soon():
    """With ``stage3_max_reuse_distance`` over the whole trace nothing a module fetches is released
    before the update (its next use is always within reach); each tensor is gathered once a step."""
    zero = ZeroSettings(stage=3, param_persistence_threshold=100, prefetch_bucket_size=500)
    second = " ".join(_walk(zero)).split("|fwd")[2]
    gathers = [t for t in second.split() if t.startswith("+") and "@D" not in t]
    frees_before_update = [t for t in second.split("|step")[0].split() if t.startswith("-")]
    assert gathers == ["+2000", "+1400", "+800", "+600"]
    assert frees_before_update[0] == "-1400"  # the prefetch's flat buffer, at its last wait
    assert sorted(frees_before_update[1:]) == sorted(["-2000", "-800", "-600", "-20", "-20", "-20"])


def test_one_rank_gathers_in_place():
    """With one rank the same calls allocate nothing (``_no_gather_coalesced``: a parameter is a view of
    its partition), nor does the estimate's step count a gathered byte; checked on a CPU rank below."""
    zero = ZeroSettings(stage=3, param_persistence_threshold=100, prefetch_bucket_size=500)
    assert "".join(_walk(zero, ranks=1)).replace(" ", "") == "|fwd|bwd|step" * 2
    one = toy_setup(1).replace(zero={"stage": 3, "max_live_parameters": 10**9})
    assert partition.gathers_in_place(one) and not partition.gathers_in_place(toy_setup(2))
    assert not partition.gathers_in_place(one.replace(zero={"offload_param": "cpu"}))  # copied to the device
    events = deepspeed_events.Step(one, memory.states(one).device, memory.batch_activations(one)).events()
    assert not [e for e in events if isinstance(e, Alloc) and e.stream == deepspeed_events.GATHER]
    assert "no gathered params" in memory.estimate(one).terms[Component.BUFFERS].formula


#: run on a CPU rank of one: DeepSpeed at stage 3 over a process group of one, a forward hook on each
#: block comparing every parameter's storage with its partition's
ONE_RANK = """
import json, os, torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
from kit.ranks import engine
from kit.toys import toy_setup
setup = toy_setup(1).replace(zero={"stage": 3})
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_SIZE="1")
dist.init_process_group("fake", rank=0, world_size=1, store=FakeStore())
built = engine.build_engine(setup)
seen = []
def check(module, args):
    for p in module.parameters(recurse=False):
        seen.append(p.data.untyped_storage().data_ptr() == p.ds_tensor.untyped_storage().data_ptr())
for m in built.engine.module.modules():
    if any(True for _ in m.parameters(recurse=False)):
        m.register_forward_pre_hook(check)
engine.train_step(built.engine, built.workload, setup, 0, 0, 1)
print(json.dumps(seen))
"""


def test_a_cpu_rank_of_one_sees_each_parameter_as_its_partition():
    """What ``gathers_in_place`` stands for, measured: at stage 3 on one rank every parameter a module
    uses shares its partition's storage (no gathered copy)."""
    seen = last_json(["-c", ONE_RANK])
    assert len(seen) > 10 and all(seen)


def _streams(events) -> dict[int, int]:
    """Max reserved per stream: each stream's allocations (and every EmptyCache) replayed alone."""
    out = {}
    for stream in sorted({e.stream for e in events if isinstance(e, Alloc)}):
        keys = {e.key for e in events if isinstance(e, Alloc) and e.stream == stream}
        mine = [
            e
            for e in events
            if (isinstance(e, Alloc) and e.stream == stream)
            or (isinstance(e, Free) and e.key in keys)
            or isinstance(e, EmptyCache)
        ]
        out[stream] = replay(mine).max_reserved
    return out


def test_the_step_of_a18s_shape_beside_an_h100s_trace():
    """The kit's GPT with A18's shape at ZeRO-3, rank 0 of 64 ranks on an H100 (fp16, torch's foreach
    AdamW): each stream's pool reserves what the device's did, to within 1 %: the gathers' (9 segments:
    3 x 590, 596, 3 x 360, 2 x 288 MiB, from the embeddings gathered for the forward, the tied head and the
    backward, and the coalesced prefetches), the reduction stream's (``has_overflow``'s 16-bit magnitudes
    and bool masks of the flat gradient partition) and the default stream's (the cuBLAS workspaces of the
    forward's and the backward's threads split the cache as the device's did: without them it reserved
    6.4 % less)."""
    run = next(r for r in traces.runs() if r.name == "a18-fp16")
    held = memory.states(run.setup)
    step = deepspeed_events.Step(run.setup, held.device, memory.batch_activations(run.setup), "foreach")
    kit, device = _streams(step.events()), _streams(run.events())
    assert abs(kit[deepspeed_events.DEFAULT] / device[0] - 1) < 0.01, (kit, device)
    kit_others = sorted(v for k, v in kit.items() if k != deepspeed_events.DEFAULT)
    device_others = sorted(v for k, v in device.items() if k != 0)
    for ours, theirs in zip(kit_others, device_others, strict=True):
        assert abs(ours / theirs - 1) < 0.01, (kit, device)
