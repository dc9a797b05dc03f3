"""A replay of PyTorch's CUDA caching allocator over a sequence of allocations and frees, without a GPU.

Given the storages a step allocates and frees (``Alloc``/``Free`` in order; ``Mark`` names a phase;
``EmptyCache`` is ``torch.cuda.empty_cache()``), ``replay`` follows ``DeviceCachingAllocator``'s rules
(``c10/cuda/CUDACachingAllocator.cpp``) and answers what ``torch.cuda.max_memory_reserved()`` and
``max_memory_allocated()`` report: the ``reserved_bytes`` / ``allocated_bytes`` stats, current and peak.

Read from pytorch/pytorch at commit 001074d2 (mid-2024 main, between torch 2.4 and 2.5) and checked against
copies of the 2.8+ code (``AcceleratorAllocatorConfig``, ``max_non_split_rounding_size``): the same rules.

- ``malloc``: ``round_size`` (512 B multiples, at least 512 B; ``roundup_power2_divisions`` is not
  replayed: its default is off), ``get_pool`` (small <= 1 MiB, else large; one free set per pool and stream),
  ``get_free_block`` (best fit: the smallest free block of the stream >= the size, ties by address; the
  ``max_split_size`` rules on that one block), else ``alloc_block`` (a new segment of
  ``get_allocation_size``: 2 MiB for small, 20 MiB below 10 MiB, else rounded up to 2 MiB), on failure
  ``release_available_cached_blocks`` then ``release_cached_blocks`` and a retry each, else the OOM;
  ``should_split`` and ``alloc_found_block`` split the block (allocated bytes count the block's size).
- ``free`` / ``free_block`` / ``try_merge_blocks``: a freed block merges with free neighbours.
- ``expandable_segments``: ``find_expandable_block``, ``map_block`` and ``try_allocate_expandable_block``
  grow one segment per stream and pool at its lowest free address (a free block at its end is extended),
  mapping whole pages, 2 MiB in the small pool and 20 MiB in the large (``kSmallBuffer``/``kLargeBuffer``);
  ``release_cached_blocks`` unmaps free whole pages (``unmap_block``) and drops a segment left empty.

Not seen, or simplified: memory outside the allocator (the CUDA context, NCCL's and cuBLAS's own
``cudaMalloc``, other processes: subtract them from ``capacity``); ``cudaMallocAsync``;
``garbage_collection_threshold``, ``set_per_process_memory_fraction`` (``capacity`` is what ``cudaMalloc``
can get); one device; no CUDA-graph or ``MemPool`` pools; ``record_stream`` (a Free frees at once);
``max_non_split_rounding_mb`` at its default (20 MiB). Addresses are modelled (segments in order, never
reused): ties among equal free blocks may break otherwise than on a device. An expandable segment reserves
5 TiB of addresses (PyTorch: 1 1/8 of the device's memory). With ``expandable_segments`` and
``max_split_size`` both set, ``release_available_cached_blocks`` frees nothing (as newer PyTorch does).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Hashable, Iterable, Iterator
from dataclasses import dataclass
from itertools import chain

from kit.units import MIB

MIN_BLOCK_SIZE = 512  # kMinBlockSize: every size is rounded to a multiple, at least this
SMALL_SIZE = MIB  # kSmallSize: the largest request of the small pool
SMALL_BUFFER = 2 * MIB  # kSmallBuffer: a small pool's segment; an expandable small segment's page
MIN_LARGE_ALLOC = 10 * MIB  # kMinLargeAlloc: requests below it (and above 1 MiB) get a 20 MiB segment
LARGE_BUFFER = 20 * MIB  # kLargeBuffer: that segment; an expandable large segment's page
ROUND_LARGE = 2 * MIB  # kRoundLarge: larger segments are rounded up to it
SIZE_MAX = 2**64 - 1  # max_split_size when unset: std::numeric_limits<size_t>::max()

_EXPANDABLE_SPACE = LARGE_BUFFER * 2**18  # address space an expandable segment reserves (5 TiB)
_ADDRESS = 2**64 - 1  # the address bits of a free-set key, (size << 64) | address


@dataclass(slots=True)
class Alloc:
    """A tensor's storage is allocated: ``size`` bytes on ``stream``; ``key`` names it for its Free."""

    key: Hashable
    size: int
    stream: int = 0


@dataclass(slots=True)
class Free:
    """The storage ``key`` is freed."""

    key: Hashable


@dataclass(slots=True)
class Mark:
    """A named point of the sequence: a phase of the training step begins."""

    name: str


@dataclass(slots=True)
class EmptyCache:
    """``torch.cuda.empty_cache()``: every cached segment that is all free goes back to the device."""


#: never changed once made (not frozen: a replay's events number ~10^4, and a frozen init is 3x slower)
Event = Alloc | Free | Mark | EmptyCache


@dataclass(frozen=True)
class Oom:
    """The allocation PyTorch would fail with ``torch.OutOfMemoryError``, and what its message prints.

    ``alloc_size`` is its "Tried to allocate" (``get_allocation_size`` of the rounded size, not the
    request); ``allocated`` its "allocated by PyTorch"; ``reserved - allocated`` its "reserved by PyTorch but
    unallocated", after the cached segments were released."""

    index: int  # the Alloc's position in the events
    size: int  # bytes requested
    alloc_size: int
    allocated: int
    reserved: int


@dataclass(frozen=True)
class Replay:
    """What a replay ends with: the peaks over the whole sequence, the state at its end (at the OOM, where
    one stopped it), per ``Mark`` name (max allocated, max reserved) from that mark to the next (a name
    marked more than once: the largest), the first OOM and the segments live at the end (as
    ``torch.cuda.memory_snapshot()`` lists them: a mapped run of an expandable segment is one)."""

    max_allocated: int
    max_reserved: int
    max_requested: int
    allocated: int
    reserved: int
    phases: dict[str, tuple[int, int]]
    oom: Oom | None
    segments: int


def round_size(size: int) -> int:
    """``round_size``: at least ``kMinBlockSize``, a multiple of it."""
    if size < MIN_BLOCK_SIZE:
        return MIN_BLOCK_SIZE
    return -(-size // MIN_BLOCK_SIZE) * MIN_BLOCK_SIZE


def allocation_size(size: int) -> int:
    """``get_allocation_size``: the segment ``cudaMalloc`` gets for a rounded request no free block fits."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


class Block:
    """A ``Block``: bytes of one segment, linked to the segment's neighbours by address (``prev``/``next``).
    ``mapped`` is False for the unmapped address space of an expandable segment."""

    __slots__ = (
        "addr", "size", "stream", "small", "expandable", "mapped", "allocated", "requested", "prev", "next",
    )  # fmt: skip

    def __init__(self, addr: int, size: int, stream: int, small: bool, expandable: bool, mapped: bool = True):
        self.addr, self.size, self.stream, self.small = addr, size, stream, small
        self.expandable, self.mapped = expandable, mapped
        self.allocated = False
        self.requested = 0
        self.prev: Block | None = None
        self.next: Block | None = None


def _key(block: Block) -> int:
    """A free block's place in its free set: by size, then address (``BlockComparatorSize``)."""
    return (block.size << 64) | block.addr


class Allocator:
    """``DeviceCachingAllocator`` of one device, one ``malloc``/``free`` at a time, with its stats.

    ``allocated``, ``reserved``, ``requested`` and their ``max_`` peaks are ``allocated_bytes``,
    ``reserved_bytes`` and ``requested_bytes`` (``all``); ``window_allocated``/``window_reserved`` are the
    peaks since ``reset_window`` (as after ``torch.cuda.reset_peak_memory_stats``)."""

    def __init__(
        self,
        *,
        expandable_segments: bool = False,
        capacity: int | None = None,
        max_split_size: int | None = None,
    ):
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0 bytes, got {capacity}")
        if max_split_size is not None and max_split_size < LARGE_BUFFER:
            # parseMaxSplitSize: max_split_size_mb must be >= 20 (> 20 before torch 2.8)
            raise ValueError(f"max_split_size must be >= {LARGE_BUFFER} B (20 MiB), got {max_split_size}")
        self.expandable_segments = expandable_segments
        self.capacity = capacity
        self.max_split_size = SIZE_MAX if max_split_size is None else max_split_size
        self.allocated = self.reserved = self.requested = 0
        self.max_allocated = self.max_reserved = self.max_requested = 0
        self.window_allocated = self.window_reserved = 0
        # per (small pool?, stream): the free mapped blocks' keys, sorted; and the unmapped blocks' addresses
        self._free: dict[tuple[bool, int], list[int]] = {}
        self._free_at: dict[int, Block] = {}
        self._unmapped: dict[tuple[bool, int], list[int]] = {}
        self._unmapped_at: dict[int, Block] = {}
        self._active: set[Block] = set()
        self._segments: dict[int, int] = {}  # base address: bytes (a cudaMalloc, or an expandable's space)
        self._next_address = LARGE_BUFFER

    # the public face: malloc, free, the stats

    def malloc(self, orig_size: int, stream: int = 0) -> Block | None:
        """``malloc``: a block of ``orig_size`` bytes for ``stream``, or None where PyTorch raises its OOM."""
        size = round_size(orig_size)
        small = size <= SMALL_SIZE
        block = self._get_free_block(size, small, stream)
        if block is None:
            alloc_size = allocation_size(size)
            block = self._alloc_block(size, alloc_size, small, stream)
            if block is None and self._release_available_cached_blocks(size, small, stream):
                block = self._alloc_block(size, alloc_size, small, stream)
            if block is None:
                self._release_cached_blocks()
                block = self._alloc_block(size, alloc_size, small, stream)
            if block is None:
                return None
        return self._alloc_found_block(block, size, orig_size)

    def free(self, block: Block) -> None:
        """``free`` then ``free_block``: the block joins its free neighbours and its pool's free set."""
        if block not in self._active:
            raise ValueError("free of a block that is not allocated")
        self._active.remove(block)
        block.allocated = False
        self.allocated -= block.size
        self.requested -= block.requested
        block.requested = 0
        if block.prev is not None and not block.prev.allocated:
            self._try_merge_blocks(block, block.prev)
        if block.next is not None and not block.next.allocated:
            self._try_merge_blocks(block, block.next)
        self._insert_free(block)

    def reset_window(self) -> None:
        """Start the window peaks at the current values."""
        self.window_allocated, self.window_reserved = self.allocated, self.reserved

    def segment_count(self) -> int:
        """Segments as ``torch.cuda.memory_snapshot()`` lists them: each ``cudaMalloc``, each mapped run of
        an expandable segment."""
        return sum(1 for b in self._all_blocks() if b.mapped and (b.prev is None or not b.prev.mapped))

    # DeviceCachingAllocator's private functions

    def _get_free_block(self, size: int, small: bool, stream: int) -> Block | None:
        """``get_free_block``: the smallest free block of the pool and stream with room (expandable: one whose
        room to grow is smaller first), unless the ``max_split_size`` rules refuse it."""
        keys = self._free.get((small, stream))
        if not keys:
            return None
        i = bisect_left(keys, size << 64)
        if i == len(keys):
            return None
        block = self._free_at[keys[i] & _ADDRESS]
        if block.expandable:
            # a block followed by unmapped space counts as the size it can grow to
            while i + 1 < len(keys):
                after = self._free_at[keys[i + 1] & _ADDRESS]
                if _expandable_size(after) >= _expandable_size(block):
                    break
                i, block = i + 1, after
        # an oversize block is not handed to a request below max_split_size, nor to a larger one it
        # exceeds by max_non_split_rounding_size (kLargeBuffer) or more
        if size < self.max_split_size <= block.size:
            return None
        if size >= self.max_split_size and block.size >= size + LARGE_BUFFER:
            return None
        del keys[i]
        del self._free_at[block.addr]
        return block

    def _alloc_found_block(self, block: Block, size: int, orig_size: int) -> Block:
        """``should_split`` and ``alloc_found_block``: the request takes the block's front, the rest stays
        free; then the stats count the block's whole size (requested: ``orig_size``)."""
        remaining = block.size - size
        if block.small or self.expandable_segments:
            split = remaining >= MIN_BLOCK_SIZE
        else:
            split = size < self.max_split_size and remaining > SMALL_SIZE
        if split:
            front = Block(block.addr, size, block.stream, block.small, block.expandable)
            front.prev, front.next = block.prev, block
            if block.prev is not None:
                block.prev.next = front
            block.prev = front
            block.addr += size
            block.size = remaining
            self._insert_free(block)
            block = front
        block.allocated = True
        block.requested = orig_size
        self._active.add(block)
        self.allocated += block.size
        self.requested += orig_size
        if self.allocated > self.window_allocated:  # the window starts at or below the whole run's peak
            self.window_allocated = self.allocated
            self.max_allocated = max(self.max_allocated, self.allocated)
        if self.requested > self.max_requested:
            self.max_requested = self.requested
        return block

    def _try_merge_blocks(self, dst: Block, src: Block | None) -> None:
        """``try_merge_blocks``: ``dst`` (out of every set) takes in its neighbour ``src`` if that is free and
        alike (mapped or not)."""
        if src is None or src.allocated or src.mapped != dst.mapped:
            return
        if src.mapped:
            self._remove_free(src)
        else:
            self._remove_unmapped(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size

    def _alloc_block(self, size: int, alloc_size: int, small: bool, stream: int) -> Block | None:
        """``alloc_block``: a new ``cudaMalloc`` segment of ``alloc_size`` bytes (expandable: grow one), or
        None if the device has no room for it."""
        if self.expandable_segments:
            return self._try_allocate_expandable_block(size, small, stream)
        if self.capacity is not None and self.reserved + alloc_size > self.capacity:
            return None
        block = Block(self._take_address(alloc_size), alloc_size, stream, small, expandable=False)
        self._segments[block.addr] = alloc_size
        self._grow_reserved(alloc_size)
        return block

    def _release_available_cached_blocks(self, size: int, small: bool, stream: int) -> bool:
        """``release_available_cached_blocks`` (only with ``max_split_size``): free the smallest oversize
        cached segment of the stream that covers max(size, max_split_size), else the largest ones down to
        max_split_size until that much is freed; True if it was."""
        if self.max_split_size == SIZE_MAX or self.expandable_segments:
            return False
        keys = self._free.get((small, stream))
        if not keys:
            return False
        target = max(size, self.max_split_size)
        i = bisect_left(keys, target << 64)
        if i < len(keys):
            self._release_block(self._free_at[keys[i] & _ADDRESS])
            return True
        released = 0
        while released < target and keys:
            block = self._free_at[keys[-1] & _ADDRESS]
            if block.size < self.max_split_size:
                break
            released += block.size
            self._release_block(block)
        return released >= target

    def _release_cached_blocks(self) -> None:
        """``release_cached_blocks`` / ``release_blocks``: ``cudaFree`` every segment that is all free; in
        expandable segments unmap every free whole page and drop a segment left with none mapped."""
        to_unmap = []
        for keys in list(self._free.values()):
            for key in list(keys):
                block = self._free_at[key & _ADDRESS]
                if block.expandable:
                    to_unmap.append(block)
                elif block.prev is None and block.next is None:
                    self._release_block(block)
        for block in to_unmap:
            self._unmap_block(block)
            if not block.mapped and block.prev is None and block.next is None:
                self._remove_unmapped(block)  # release_expandable_segment
                del self._segments[block.addr]

    def _release_block(self, block: Block) -> None:
        """``release_block``: ``cudaFree`` a cached segment that is one free block."""
        _check(block.prev is None and block.next is None, "release_block of a split block")
        self._remove_free(block)
        del self._segments[block.addr]
        self.reserved -= block.size

    # expandable segments

    def _try_allocate_expandable_block(self, size: int, small: bool, stream: int) -> Block | None:
        """``try_allocate_expandable_block``: map pages after (or into) the lowest free run with room until a
        free block of ``size`` bytes is there; None if the device has no room for a mapping."""
        block = self._find_expandable_block(size, small, stream)
        if not block.mapped and not self._map_block(block, min(block.size, size)):
            return None
        while block.size < size:
            after = block.next
            assert after is not None and not after.mapped  # free -> unmapped, as find_expandable_block saw
            if not self._map_block(after, min(size - block.size, after.size)):
                return None
            block = after  # it took in the free block before it
        self._remove_free(block)
        return block

    def _find_expandable_block(self, size: int, small: bool, stream: int) -> Block:
        """``find_expandable_block``: the lowest-addressed unmapped block of the pool and stream (or the free
        block before it) from which free and unmapped neighbours reach ``size`` bytes; else a new segment."""
        for addr in self._unmapped.get((small, stream), ()):
            block = self._unmapped_at[addr]
            if block.prev is not None and not block.prev.allocated:
                block = block.prev
            reach = 0
            run: Block | None = block
            while reach < size and run is not None and not run.allocated:
                reach, run = reach + run.size, run.next
            if reach >= size:
                return block
        block = Block(self._take_address(_EXPANDABLE_SPACE), _EXPANDABLE_SPACE, stream, small, True, False)
        self._segments[block.addr] = _EXPANDABLE_SPACE
        self._insert_unmapped(block)
        return block

    def _map_block(self, block: Block, size: int) -> bool:
        """``map_block`` / ``ExpandableSegment::map``: back the unmapped ``block``'s first ``size`` bytes,
        rounded up to whole pages, with memory (all or nothing); the rest stays unmapped; the mapped part
        joins free neighbours."""
        page = SMALL_BUFFER if block.small else LARGE_BUFFER
        nbytes = -(-size // page) * page
        if self.capacity is not None and self.reserved + nbytes > self.capacity:
            return False
        self._remove_unmapped(block)
        block.mapped = True
        if nbytes < block.size:
            rest = Block(block.addr + nbytes, block.size - nbytes, block.stream, block.small, True, False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            block.size = nbytes
            self._insert_unmapped(rest)
        self._try_merge_blocks(block, block.prev)
        self._try_merge_blocks(block, block.next)
        self._insert_free(block)
        self._grow_reserved(nbytes)
        return True

    def _unmap_block(self, block: Block) -> None:
        """``unmap_block`` / ``ExpandableSegment::unmap``: give back the whole pages inside a free block; the
        bytes before and after them stay free blocks; the unmapped part joins unmapped neighbours."""
        page = SMALL_BUFFER if block.small else LARGE_BUFFER
        end = block.addr + block.size
        low, high = -(-block.addr // page) * page, end // page * page
        if low >= high:
            return
        self._remove_free(block)
        if low > block.addr:
            before = Block(block.addr, low - block.addr, block.stream, block.small, True)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            block.prev = before
            self._insert_free(before)
        if high < end:
            after = Block(high, end - high, block.stream, block.small, True)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            self._insert_free(after)
        block.addr, block.size, block.mapped = low, high - low, False
        self._try_merge_blocks(block, block.prev)
        self._try_merge_blocks(block, block.next)
        self._insert_unmapped(block)
        self.reserved -= high - low

    # bookkeeping

    def _insert_free(self, block: Block) -> None:
        insort(self._free.setdefault((block.small, block.stream), []), _key(block))
        self._free_at[block.addr] = block

    def _remove_free(self, block: Block) -> None:
        keys = self._free[(block.small, block.stream)]
        del keys[bisect_left(keys, _key(block))]
        del self._free_at[block.addr]

    def _insert_unmapped(self, block: Block) -> None:
        insort(self._unmapped.setdefault((block.small, block.stream), []), block.addr)
        self._unmapped_at[block.addr] = block

    def _remove_unmapped(self, block: Block) -> None:
        addrs = self._unmapped[(block.small, block.stream)]
        del addrs[bisect_left(addrs, block.addr)]
        del self._unmapped_at[block.addr]

    def _take_address(self, nbytes: int) -> int:
        """The next segment's base: laid out in order, 20 MiB aligned (so page-aligned for both pools)."""
        base = self._next_address
        self._next_address += -(-nbytes // LARGE_BUFFER) * LARGE_BUFFER
        return base

    def _grow_reserved(self, nbytes: int) -> None:
        self.reserved += nbytes
        self.max_reserved = max(self.max_reserved, self.reserved)
        self.window_reserved = max(self.window_reserved, self.reserved)

    def _all_blocks(self) -> Iterator[Block]:
        return chain(self._active, self._free_at.values(), self._unmapped_at.values())


def _expandable_size(block: Block) -> int:
    """``get_free_block``'s ``expandable_size``: a block's size plus the unmapped space right after it."""
    after = block.next
    return block.size + (after.size if after is not None and not after.mapped else 0)


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise AssertionError(message)


def replay(
    events: Iterable[Event],
    *,
    expandable_segments: bool = False,
    capacity: int | None = None,
    max_split_size: int | None = None,
) -> Replay:
    """Replay ``events`` on a fresh allocator (``PYTORCH_CUDA_ALLOC_CONF``'s ``expandable_segments:True``
    and ``max_split_size_mb``, in bytes, as arguments); ``capacity``: the bytes the device can give this
    process (None: unlimited). The replay stops at the first allocation that does not fit, as the step
    would raise there. A zero-byte Alloc takes no memory (PyTorch hands out no block). ValueError for a
    Free of a key not live or an Alloc of a live one."""
    allocator = Allocator(
        expandable_segments=expandable_segments, capacity=capacity, max_split_size=max_split_size
    )
    live: dict[Hashable, Block | None] = {}
    phases: dict[str, tuple[int, int]] = {}
    phase: str | None = None
    oom = None

    def close_phase() -> None:
        if phase is not None:
            allocated, reserved = phases.get(phase, (0, 0))
            phases[phase] = (
                max(allocated, allocator.window_allocated),
                max(reserved, allocator.window_reserved),
            )

    for index, event in enumerate(events):
        if type(event) is Alloc:  # type(), not isinstance: the replay's loop
            if event.key in live:
                raise ValueError(f"Alloc of key {event.key!r}, already allocated and not freed")
            if event.size < 0:
                raise ValueError(f"Alloc of key {event.key!r} with a negative size, {event.size}")
            block = allocator.malloc(event.size, event.stream) if event.size else None
            if event.size and block is None:
                tried = allocation_size(round_size(event.size))
                oom = Oom(index, event.size, tried, allocator.allocated, allocator.reserved)
                break
            live[event.key] = block
        elif type(event) is Free:
            if event.key not in live:
                raise ValueError(f"Free of key {event.key!r}, which is not allocated")
            block = live.pop(event.key)
            if block is not None:
                allocator.free(block)
        elif type(event) is EmptyCache:  # ``emptyCache``: release_cached_blocks
            allocator._release_cached_blocks()
        elif type(event) is Mark:
            close_phase()
            phase = event.name
            allocator.reset_window()
        else:
            raise TypeError(f"not an allocator event: {event!r}")
    close_phase()
    return Replay(
        max_allocated=allocator.max_allocated,
        max_reserved=allocator.max_reserved,
        max_requested=allocator.max_requested,
        allocated=allocator.allocated,
        reserved=allocator.reserved,
        phases=phases,
        oom=oom,
        segments=allocator.segment_count(),
    )
