"""The caching-allocator replay (kit.estimate.allocator) against bytes worked out by hand from the rules of
PyTorch's ``c10/cuda/CUDACachingAllocator.cpp``; each test names the rule it rests on."""

from __future__ import annotations

import random
import subprocess
import sys

import pytest

from kit.estimate.allocator import (
    Alloc,
    Allocator,
    Free,
    Mark,
    Oom,
    allocation_size,
    replay,
    round_size,
)
from kit.units import MIB

KIB = 1024


def valid(a: Allocator) -> None:
    """The allocator's bookkeeping, white-box: each segment's blocks tile it exactly, linked both ways; no
    two neighbours are both free and alike (mapped or not), i.e. merged; the free sets hold exactly the
    free blocks, sorted by (size, address); the stats are the sums of the blocks; reserved >= allocated >=
    requested."""
    blocks = {b.addr: b for b in a._all_blocks()}
    seen = 0
    for base, nbytes in a._segments.items():
        block, at, prev = blocks.get(base), base, None
        while block is not None:
            assert block.addr == at and block.prev is prev and block.size > 0, f"blocks at {at:#x} gap"
            merged = prev is None or prev.allocated or block.allocated or prev.mapped != block.mapped
            assert merged, f"free neighbours at {at:#x} not merged"
            at, prev, block, seen = at + block.size, block, block.next, seen + 1
        assert at == base + nbytes, f"segment at {base:#x} tiled to {at - base} B of {nbytes}"
    assert seen == len(blocks), "blocks outside their segments"
    free = [b for b in blocks.values() if not b.allocated and b.mapped]
    assert all(a._free_at.get(b.addr) is b for b in free), "a free block missing from its set"
    assert len(a._free_at) == len(free) == sum(map(len, a._free.values())), "free sets stale"
    for (small, stream), keys in a._free.items():
        assert keys == sorted(keys), "a free set out of order"
        for key in keys:
            b = a._free_at[key & (2**64 - 1)]
            assert key == (b.size << 64) | b.addr and (b.small, b.stream) == (small, stream), (
                "a free key stale"
            )
    unmapped = [b for b in blocks.values() if not b.mapped]
    assert len(a._unmapped_at) == len(unmapped) == sum(map(len, a._unmapped.values())), "unmapped"
    assert all(b.allocated == (b in a._active) for b in blocks.values()), "active set stale"
    assert a.allocated == sum(b.size for b in a._active), "allocated != its blocks"
    assert a.requested == sum(b.requested for b in a._active), "requested != its blocks"
    assert a.reserved == sum(b.size for b in blocks.values() if b.mapped), "reserved != its blocks"
    assert a.reserved >= a.allocated >= a.requested >= 0, "reserved >= allocated >= requested"


def test_round_size_and_allocation_size():
    # round_size: below kMinBlockSize (512 B) -> 512, else up to a multiple of 512
    assert [round_size(n) for n in (1, 511, 512, 513, MIB + 1)] == [512, 512, 512, 1024, MIB + 512]
    # get_allocation_size: <= 1 MiB -> 2 MiB; < 10 MiB -> 20 MiB; else up to a multiple of 2 MiB
    sizes = (MIB, MIB + 512, 10 * MIB - 512, 10 * MIB, 11 * MIB)
    assert [allocation_size(n) for n in sizes] == [2 * MIB, 20 * MIB, 20 * MIB, 10 * MIB, 12 * MIB]


def test_a_one_byte_request_takes_512_bytes_of_a_2mib_segment():
    done = replay([Alloc("a", 1)])
    assert (done.allocated, done.max_requested, done.reserved, done.segments) == (512, 1, 2 * MIB, 1)


def test_small_requests_pack_into_one_2mib_segment():
    # 1 MiB is small (<= kSmallSize): a 2 MiB segment, split (remaining >= 512 B); the next two fit the rest
    events = [Alloc("a", MIB), Alloc("b", 512 * KIB), Alloc("c", 512 * KIB)]
    done = replay(events)
    assert (done.allocated, done.reserved, done.segments) == (2 * MIB, 2 * MIB, 1)
    # the segment is full: one more byte gets a second one
    done = replay([*events, Alloc("d", 1)])
    assert (done.allocated, done.reserved, done.segments) == (2 * MIB + 512, 4 * MIB, 2)


def test_a_5mib_request_makes_a_20mib_segment_a_second_one_splits_it():
    # 1 MiB < 5 MiB < kMinLargeAlloc: a kLargeBuffer (20 MiB) segment, split (15 MiB left > kSmallSize)
    done = replay([Alloc("a", 5 * MIB)])
    assert (done.allocated, done.reserved) == (5 * MIB, 20 * MIB)
    done = replay([Alloc("a", 5 * MIB), Alloc("b", 5 * MIB)])
    assert (done.allocated, done.reserved, done.segments) == (10 * MIB, 20 * MIB, 1)


def test_an_11mib_request_gets_a_12mib_segment_whole():
    # >= 10 MiB: rounded up to 2 MiB; the 1 MiB left is not > kSmallSize, so no split: allocated counts 12
    done = replay([Alloc("a", 11 * MIB)])
    assert (done.allocated, done.max_requested, done.reserved) == (12 * MIB, 11 * MIB, 12 * MIB)
    # 12 MiB + 512 B: a 14 MiB segment, 2 MiB - 512 B left > 1 MiB: split
    done = replay([Alloc("a", 12 * MIB + 512)])
    assert (done.allocated, done.reserved) == (12 * MIB + 512, 14 * MIB)


def test_best_fit_takes_the_smallest_free_block():
    # two cached segments, 30 and 40 MiB: 25 MiB takes the 30 (get_free_block: lower_bound by size), so 38
    # MiB still finds the 40 and no segment is added
    events = [Alloc("a", 30 * MIB), Alloc("b", 40 * MIB), Free("a"), Free("b")]
    done = replay([*events, Alloc("c", 25 * MIB), Alloc("d", 38 * MIB)])
    assert (done.allocated, done.reserved, done.segments) == (63 * MIB, 70 * MIB, 2)


def test_best_fit_breaks_ties_by_address():
    # BlockComparatorSize: equal sizes order by address; the first segment lies lower
    allocator = Allocator()
    a, b = allocator.malloc(30 * MIB), allocator.malloc(30 * MIB)
    assert a is not None and b is not None and a.addr < b.addr
    low = a.addr
    allocator.free(b)
    allocator.free(a)
    c = allocator.malloc(30 * MIB)
    assert c is not None and c.addr == low


def test_freeing_merges_neighbours_so_a_larger_request_fits():
    # three 5 MiB blocks and a free 5 MiB tail in one 20 MiB segment; free_block merges each freed block
    # with its free neighbours, so after the three frees the segment is one free 20 MiB block
    events = [Alloc(k, 5 * MIB) for k in "abc"] + [Free("a"), Free("c"), Free("b")]
    done = replay([*events, Alloc("d", 18 * MIB)])
    # 18 MiB takes it (2 MiB left > 1 MiB: split): no new segment
    assert (done.allocated, done.reserved, done.segments) == (18 * MIB, 20 * MIB, 1)


def test_streams_do_not_share_blocks():
    # blocks are cached per stream: a block freed on stream 0 is not reused on stream 1
    done = replay([Alloc("a", 5 * MIB), Free("a"), Alloc("b", 5 * MIB, stream=1)])
    assert (done.allocated, done.reserved, done.segments) == (5 * MIB, 40 * MIB, 2)
    done = replay([Alloc("a", 5 * MIB), Free("a"), Alloc("b", 5 * MIB)])
    assert (done.reserved, done.segments) == (20 * MIB, 1)


FRAGMENTING = [Alloc("a", 100 * MIB), Free("a"), Alloc("b", 30 * MIB), Alloc("c", 100 * MIB)]


def test_fragmentation_makes_a_new_segment():
    # b (30 MiB) splits a's cached 100 MiB segment; 70 MiB is left there, too little for c: a new segment
    done = replay(FRAGMENTING)
    assert (done.allocated, done.reserved, done.max_reserved, done.segments) == (
        130 * MIB, 200 * MIB, 200 * MIB, 2,
    )  # fmt: skip


def test_expandable_segments_extend_the_free_block_at_the_end():
    # one segment per stream and pool, mapped in 20 MiB pages (large pool): a maps 100 MiB; b splits it;
    # c finds no free block of 100 MiB, so find_expandable_block starts at the free 70 MiB before the
    # unmapped rest and map_block adds 30 MiB rounded up to two pages (40 MiB); c splits off 10 MiB
    done = replay(FRAGMENTING, expandable_segments=True)
    assert (done.allocated, done.reserved, done.max_reserved, done.segments) == (
        130 * MIB, 140 * MIB, 140 * MIB, 1,
    )  # fmt: skip


def test_expandable_segments_map_2mib_pages_in_the_small_pool():
    # kSmallBuffer pages for the small pool, kLargeBuffer pages for the large; one segment each
    done = replay([Alloc("a", MIB), Alloc("b", 5 * MIB)], expandable_segments=True)
    assert (done.allocated, done.reserved, done.segments) == (6 * MIB, 22 * MIB, 2)


def test_capacity_frees_cached_segments_before_failing():
    # b does not fit next to a's cached 30 MiB: release_cached_blocks cudaFrees it and the retry succeeds
    events = [Alloc("a", 30 * MIB), Free("a"), Alloc("b", 80 * MIB)]
    done = replay(events, capacity=100 * MIB)
    assert (done.oom, done.reserved, done.max_reserved, done.segments) == (None, 80 * MIB, 80 * MIB, 1)
    # allocated 80 MiB + 20 MiB needed = the capacity: fits
    assert replay([*events, Alloc("c", 20 * MIB)], capacity=100 * MIB).oom is None
    # 80 + 30 > 100: the OOM, and the replay stops there (the Free of an unknown key is never read)
    done = replay([*events, Alloc("c", 30 * MIB), Free("nothing")], capacity=100 * MIB)
    assert done.oom == Oom(index=3, size=30 * MIB, alloc_size=30 * MIB, allocated=80 * MIB, reserved=80 * MIB)
    assert (done.allocated, done.reserved) == (80 * MIB, 80 * MIB)


def test_capacity_fragmentation_oom_that_expandable_segments_avoid():
    # a (5 MiB) holds its 20 MiB segment; b needs an 82 MiB segment and 20 + 82 > 100 MiB: nothing is
    # cached whole, so the OOM comes though 5 + 82 MiB allocated would fit; "Tried to allocate" 82 MiB
    events = [Alloc("a", 5 * MIB), Alloc("b", 82 * MIB)]
    done = replay(events, capacity=100 * MIB)
    assert done.oom == Oom(index=1, size=82 * MIB, alloc_size=82 * MIB, allocated=5 * MIB, reserved=20 * MIB)
    # expandable: b extends the free 15 MiB at the segment's end by 67 MiB, four 20 MiB pages: 100 MiB
    done = replay(events, capacity=100 * MIB, expandable_segments=True)
    assert (done.oom, done.allocated, done.reserved) == (None, 87 * MIB, 100 * MIB)


def test_expandable_segments_unmap_free_pages_under_pressure():
    # a's 40 MiB stay mapped after its free; c (stream 1) needs two more pages, 42 + 40 > 60 MiB, so
    # release_cached_blocks unmaps a's pages (unmap_block) and drops its emptied segment; the retry maps
    done = replay(
        [Alloc("a", 40 * MIB), Alloc("b", MIB), Free("a"), Alloc("c", 30 * MIB, stream=1)],
        expandable_segments=True,
        capacity=60 * MIB,
    )
    assert (done.oom, done.allocated, done.reserved, done.max_reserved, done.segments) == (
        None, 31 * MIB, 42 * MIB, 42 * MIB, 2,
    )  # fmt: skip


def test_max_split_size_rules():
    # max_split_size_mb:40. a (100 MiB >= 40) is not split; cached, it is refused to b (30 < 40 MiB),
    # which gets its own segment, but given whole to c (90 MiB: 100 < 90 + kLargeBuffer); d (70 MiB: 100
    # >= 70 + 20) is refused it too
    events = [Alloc("a", 100 * MIB), Free("a"), Alloc("b", 30 * MIB), Alloc("c", 90 * MIB)]
    done = replay(events, max_split_size=40 * MIB)
    assert (done.allocated, done.reserved) == (130 * MIB, 130 * MIB)
    events += [Free("c"), Alloc("d", 70 * MIB)]
    done = replay(events, max_split_size=40 * MIB)
    assert (done.allocated, done.reserved, done.segments) == (100 * MIB, 200 * MIB, 3)
    # e (60 MiB) is refused the cached 100 MiB and 200 + 60 > 250 MiB: release_available_cached_blocks
    # frees the smallest oversize block >= max(60, 40) MiB, that 100 MiB, and the retry succeeds
    done = replay([*events, Alloc("e", 60 * MIB)], max_split_size=40 * MIB, capacity=250 * MIB)
    assert (done.oom, done.allocated, done.reserved, done.max_reserved, done.segments) == (
        None, 160 * MIB, 160 * MIB, 200 * MIB, 3,
    )  # fmt: skip


def test_phases_take_the_peaks_from_each_mark_to_the_next():
    events = [
        Mark("forward"),
        Alloc("a", 5 * MIB),  # 5 MiB of a 20 MiB segment
        Alloc("b", MIB),  # 1 MiB of a 2 MiB small segment: 6 and 22 MiB
        Free("b"),
        Mark("backward"),  # starts at 5 and 22 MiB
        Free("a"),
        Alloc("c", 30 * MIB),  # the cached 20 MiB is too small: a 30 MiB segment, 30 and 52 MiB
        Free("c"),
        Mark("forward"),  # again: 0 and 52 MiB; d reuses the cached small segment
        Alloc("d", 1),
    ]
    done = replay(events)
    assert done.phases == {"forward": (6 * MIB, 52 * MIB), "backward": (30 * MIB, 52 * MIB)}
    assert (done.max_allocated, done.max_reserved, done.allocated) == (30 * MIB, 52 * MIB, 512)


def test_bad_keys_and_settings_are_errors():
    with pytest.raises(ValueError, match="ghost"):
        replay([Free("ghost")])
    with pytest.raises(ValueError, match="'a'"):
        replay([Alloc("a", 10), Alloc("a", 10)])
    with pytest.raises(ValueError, match="'a'"):
        replay([Alloc("a", 10), Free("a"), Free("a")])
    # a zero-byte storage takes no block (allocate(0) returns none) but is still a key
    done = replay([Alloc("empty", 0), Free("empty")])
    assert (done.max_allocated, done.max_reserved) == (0, 0)
    with pytest.raises(ValueError, match="max_split_size"):
        replay([], max_split_size=10 * MIB)  # parseMaxSplitSize: at least 20 MiB


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"expandable_segments": True},
        {"max_split_size": 64 * MIB, "capacity": 1024 * MIB},
        {"expandable_segments": True, "capacity": 600 * MIB},
    ],
    ids=["plain", "expandable", "max-split-capacity", "expandable-capacity"],
)
def test_random_sequences_keep_the_invariants(settings):
    """After every malloc and free: segments tiled exactly by their blocks, free neighbours merged, the
    free sets exact, reserved >= allocated >= requested (Allocator.validate), peaks never below."""
    rng = random.Random(20240601)
    allocator = Allocator(**settings)
    live = []
    ooms = 0
    for _ in range(1500):
        if live and (len(live) > 40 or rng.random() < 0.45):
            allocator.free(live.pop(rng.randrange(len(live))))
        else:
            kind = rng.random()
            if kind < 0.5:
                size = rng.randint(1, MIB)
            elif kind < 0.8:
                size = rng.randint(MIB, 12 * MIB)
            else:
                size = rng.randint(12 * MIB, 120 * MIB)
            block = allocator.malloc(size, stream=rng.choice((0, 0, 1)))
            if block is None:
                ooms += 1
            else:
                live.append(block)
        valid(allocator)
        assert allocator.max_reserved >= allocator.reserved
        assert allocator.max_allocated >= allocator.allocated
        assert allocator.max_requested >= allocator.requested
    if "capacity" in settings:
        assert allocator.max_reserved <= settings["capacity"]
    else:
        assert ooms == 0
    for block in live:
        allocator.free(block)
    valid(allocator)
    assert (allocator.allocated, allocator.requested) == (0, 0)


def test_a_100000_event_step_replays():
    # the size of a real step's trace; kept fast by bisect over sorted free sets (no timing asserted)
    rng = random.Random(7)
    events, live = [], []
    for i in range(50_000):
        if len(live) > 300 or (live and rng.random() < 0.5):
            events.append(Free(live.pop(rng.randrange(len(live)))))
        size = rng.choice((4 * KIB, 300 * KIB, 3 * MIB, 16 * MIB, 64 * MIB)) + rng.randrange(512)
        events.append(Alloc(i, size))
        live.append(i)
    events += [Free(k) for k in live]
    for expandable in (False, True):
        done = replay(events, expandable_segments=expandable)
        assert done.oom is None and (done.allocated, done.max_reserved > 0) == (0, True)
        assert done.max_reserved >= done.max_allocated >= done.max_requested


def test_the_replay_does_not_import_torch():
    code = "import sys, kit.estimate.allocator; print('torch' in sys.modules)"
    assert subprocess.check_output([sys.executable, "-c", code], text=True).strip() == "False"
