"""The scratch a bf16 matmul allocates on the CPU: oneDNN's brgemm matmul, as torch calls it.

On the CPU accelerator a 16-bit ``aten::mm`` of more than 16 x 16 x 16 multiply-adds goes to oneDNN
(``mkldnn_bf16_gemm`` / ``mkldnn_matmul``), which torch runs with a user scratchpad: one allocation,
beside the output, for the primitive's whole call. On a CPU with AVX-512 bf16 and no AMX the primitive
is ``brg_matmul:avx512_core_bf16`` (``src/cpu/x64/matmul/brgemm_matmul_utils.cpp``, oneDNN 3.12):
``compute_blocking_heuristic_avx512`` picks the blocks (``M_blk`` by the least thread imbalance, ``N_blk``
= min(64, N), ``K_blk`` = min(K, 512)) and ``init_scratchpad`` books, per thread, each as its size plus
oneDNN's 128-byte alignment (``memory_tracking.hpp``):

- the brgemm batch: 16 elements of 40 B;
- B copied to the VNNI layout: 2 B x rnd_up(N_blk, 64) x rnd_up(K_blk, 32) (always, for bf16: a
  transposed view, ``x @ weight.t()``'s, books the same);
- the fp32 accumulator: 4 B x N_blk x M_blk (bf16 output; ``is_buffer_c_required`` runs before the K
  chunks are set, so it is always booked), M x N_blk when K is split over threads;
- A copied when it is a transposed view (a weight gradient's x^T, of two or more rows and columns):
  2 B x M_blk x rnd_up(K_blk, 32), + 32 elements when that is a power of two of at least 512.

fp32 goes to MKL's sgemm, which allocates none. Other ISAs block differently (AMX's
``compute_blocking_heuristic_amx`` books a 4 KiB tile workspace per thread and pads K to 32, AVX2 has no
bf16 brgemm): there the rank measures the shape instead (``CpuMatmul.measure``: one lone ``mm`` under
the profiler, ``kit.ranks.memory_timeline.lone_mm_scratch``), B's layout included (on AMX a transposed B
books less than a plain one: 7,168 B against 38,912 B for 16 x 64 by 64 x 256 on one thread), and without
a rank the scratch is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

#: oneDNN's alignment of each scratchpad entry (``memory_tracking::default_alignment``)
ALIGN = 128
#: ``sizeof(brgemm_batch_element_t)`` and the elements booked per batch of one
BATCH_ELEMENT_BYTES, BATCH_ELEMENTS = 40, 16
#: torch sends a bf16 mm to oneDNN above this many multiply-adds (``mkldnn_bf16_gemm``)
ONEDNN_MIN_MACS = 16 * 16 * 16
#: the ISA whose blocking is modelled
AVX512_BF16 = "avx512_core_bf16"
#: a measured mm's shape: (m, k, n, transposed_a, transposed_b)
Shape = tuple[int, int, int, bool, bool]


@dataclass(frozen=True)
class CpuMatmul:
    """How the CPU ranks' matmuls run: oneDNN's ISA and its threads (a rank's ``torch.get_num_threads``);
    on a rank, ``measure(m, k, n, transposed_a, transposed_b)`` measures the scratch of a shape the model
    does not cover."""

    isa: str = AVX512_BF16
    threads: int = 1
    measure: Callable[[int, int, int, bool, bool], int] | None = field(
        default=None, compare=False, repr=False
    )
    #: the shapes measured so far: (m, k, n, transposed_a, transposed_b) -> bytes
    measured: dict[Shape, int] = field(default_factory=dict, compare=False, repr=False)

    @property
    def modelled(self) -> bool:
        return self.isa == AVX512_BF16

    def record(self) -> dict:
        """The record's ``cpu_matmul``: ``{"isa", "threads", "measured": [[m, k, n, transposed_a,
        transposed_b, bytes], ...]}``."""
        shapes = [[*shape, n] for shape, n in self.measured.items()]
        return {"isa": self.isa, "threads": self.threads, "measured": shapes}

    @classmethod
    def from_record(cls, data: dict) -> CpuMatmul:
        """The rank's matmuls again from its record (``record()``): the shapes it measured, no more (a
        record from before ``transposed_b`` has rows of five, every B plain)."""
        measured: dict[Shape, int] = {}
        for row in data.get("measured", []):
            m, k, n, a, *b, nbytes = row
            measured[(m, k, n, bool(a), bool(b and b[0]))] = nbytes
        return cls(data["isa"], data["threads"], measured=measured)


def bf16_mm_scratch(
    m: int, k: int, n: int, transposed_a: bool, cpu: CpuMatmul, *, transposed_b: bool = False
) -> int:
    """Bytes of the scratchpad a bf16 ``mm`` of an m x k by a k x n matrix allocates (``transposed_a``:
    the first is a transposed view; ``transposed_b``: the second is, as in ``x @ weight.t()``): modelled
    on AVX-512 bf16 (where a transposed B books what a plain one does), measured on a rank of another ISA;
    0 below oneDNN's size or with neither."""
    if m * k * n <= ONEDNN_MIN_MACS:
        return 0
    if not cpu.modelled:
        shape = (m, k, n, transposed_a, transposed_b)
        if shape not in cpu.measured and cpu.measure is not None:
            cpu.measured[shape] = cpu.measure(*shape)
        return cpu.measured.get(shape, 0)
    nthr = cpu.threads
    transposed = transposed_a and m > 1 and k > 1  # a row or column is plain whatever its strides
    big_pow2_k = not transposed and _pow2(k) and k >= 8192 // 2
    copy_a = transposed or (big_pow2_k and m >= 1024)  # prefer_copy_a
    m_blk, n_blk, chunk, k_blk, nthr_k = _blocking(m, k, n, transposed, copy_a, nthr)
    entries = [nthr * BATCH_ELEMENTS * BATCH_ELEMENT_BYTES]
    if copy_a:
        lda = -(-k_blk // 32) * 32
        lda += 32 if lda >= 512 and _pow2(lda) else 0
        entries.append(nthr * 2 * m_blk * lda)
    entries.append(nthr * 2 * -(-n_blk // 64) * 64 * -(-k_blk // 32) * 32)
    if nthr_k > 1:  # the whole M x N for the reduction over K
        entries.append(nthr * 4 * n * m)
    else:  # a block's, or with K in more than one block each of the N chunk's blocks
        entries.append(nthr * 4 * n_blk * m_blk * (chunk if k_blk < k else 1))
    return sum(size + ALIGN for size in entries)


def _pow2(x: int) -> bool:
    return x > 0 and x & (x - 1) == 0


def _spatial(work: int, block: int) -> float:
    mod = work % block
    return ((block - mod) if work < block else min(block - mod, mod)) / block


def _blocking(m: int, k: int, n: int, transposed: bool, copy_a: bool, nthr: int) -> tuple[int, ...]:
    """(M_blk, N_blk, N_chunk_size, K_blk, nthr_k): ``compute_blocking_heuristic_avx512``, 2-D bf16."""
    n_blk = min(64, n)
    max_m_blk, min_m_blk = min(256, m), min(32, m)
    n_chunks = -(-n // n_blk)
    chunks_start = min(16 if copy_a else 1, n_chunks)
    k_blk = min(k, 1024 if k > 1024 and not transposed else 512)
    start_nthr_k = 1
    if nthr > n_chunks:  # low parallel work
        min_m_blk = min(m, 16)
        if transposed and _pow2(k) and k >= 2048:
            start_nthr_k = min(nthr, 4)

    def imbalance(m_blk: int, chunk: int, nthr_k: int) -> float:
        threads = nthr // nthr_k
        work = -(-m // m_blk) * -(-n // (n_blk * chunk))
        blocks = -(-n // n_blk)
        return (
            _spatial(work, threads)
            + (m_blk * -(-m // m_blk)) % m / m
            + (-(-blocks // chunk) * chunk - blocks) / blocks
            + ((nthr - threads * nthr_k) / nthr if threads * nthr_k != nthr else 0)
            + _spatial(k, nthr_k * k_blk)
        ) / 5

    best, best_score = None, 1.0
    for nthr_k in range(start_nthr_k, 0, -1):
        found = False
        for chunk in range(chunks_start, 0, -1):
            for m_blk in range(max_m_blk, min_m_blk - 1, -1):
                score = imbalance(m_blk, chunk, nthr_k)
                work, threads = -(-m // m_blk) * -(-n // (n_blk * chunk)), nthr // nthr_k
                if work < threads * 3 and work % threads and start_nthr_k == 1:
                    continue
                if score < best_score:
                    best, best_score, found = (m_blk, n_blk, chunk, k_blk, nthr_k), score, True
        if not found:
            score = imbalance(min_m_blk, 1, nthr_k)
            if score < best_score:
                best, best_score = (min_m_blk, n_blk, 1, k_blk, nthr_k), score
    if best is None:
        raise ValueError(f"no oneDNN blocking for a {m} x {k} by {k} x {n} mm on {nthr} threads")
    return best


__all__ = ["CpuMatmul", "bf16_mm_scratch"]
