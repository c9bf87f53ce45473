"""Split softmax rows with every chunk held in shared memory across the row's wait (Gluon, CUDA).

One kernel, two directions (``BWD`` constexpr):

- forward: x (M, N) -> y = softmax(x) and lse; a program's statistic of its chunk is (max, sum of
  exp(x - max)), merged with the LSE rule;
- backward: y, dy (M, N) -> dx = y * (dy - delta), delta = sum(y * dy); the statistic is a partial
  dot product, merged by a sum.

A split row must see its whole-row statistic before any output: Q programs share a row, each
reduces its chunk and publishes the partial as one 64-bit word (two float32 halves; the words start
as PENDING_WORD, so a reader knows which have arrived without a counter, an atomic or a release
fence, which would wait for the program's earlier stores). Where the Triton persistent kernel
(``softmax_fwd.py``) re-reads the chunk from L2 once the row's partials are in, this one keeps it on
chip: chunks arrive by ``cp.async`` (or one TMA bulk copy per chunk, where the config asks for it on
sm_90+) into a ring of shared-memory slots, and a chunk is written LAG steps after its own
reduction, when the other programs' partials have long arrived (``RINGS``): with lag 1 it waits in
its slot of 3 (the next chunk loads one step ahead); with lag 2 in its slot of 4, or in registers:
its slot of 3 refilled at once (two ahead), or refilled one step before its write, the chunk then
moved into registers (one ahead); with lag L in its slot of L + 2, or of L + 1 and in registers
for the step before its write, or of L and in registers for the two steps before it (the deep rings,
L >= 3, for rows of up to L - 1 chunks per program:
a program keeps its units behind in small vectors and the last row statistic it merged, which its
next units often share).
HBM traffic is the floor (one read of each input, one write); the wait itself is off the critical
path unless a program falls LAG steps behind.
Where ``MERGE_PARTITIONS`` asks for it (deep rings), the merge of a row's words runs beside the
steps, in a partition of 4 more warps (``gl.warp_specialize``): the steps send it the row a step
before they write a unit of it and take the row's statistic back through shared memory; where some
of the words are still pending then, the partition waits for them or, per config, leaves that row
to the steps, which read and merge it themselves at the write.

A chunk whose length is not a power of two (``sub_tile``) is KSUB sub-tiles of SUB elements, a power of
two: a slot holds KSUB of them, and the chunk is copied, reduced and written a sub-tile at a time (its
row statistic is still one partial word per chunk). Rows then get chunks between the powers of two,
which fill their last chunk better or fit more programs (``STAGED_CONFIG_SHIFTED``).

Work: M * Q units, unit u being chunk u % Q of row u // Q, one per program and step. Grid: the
programs the GPU holds at once (the waits assume they all run together: the launcher sizes the grid
from the compiled kernel's occupancy). Where rows have few chunks (``grid_plan``), every program
takes its next unit in memory order from a counter (``CLAIM``): the programs then stay together on
one stretch of memory, as a hardware-scheduled grid does, where fixed units let them drift apart
(a persistent copy ran at 90% of torch's copy with fixed chunks and 98% with claimed ones, H200).
Longer rows take fixed units: G = grid / Q whole rows in flight, program (slot, q) on chunk q of rows
slot, slot + G, ... (claims there spread a row over more steps than a lag of 1 covers; with lag 2
or more units are always claimed). A program never
waits for a row it holds an unreduced unit of (it reduces that unit first), nor, in the deep rings,
for one it has claimed but not yet taken (``LATE_CLAIM``). A wait that gives up
after ``spin_max`` polls counts itself in ``ERR`` and recomputes the row's statistic from global
memory, so the result stays right.

The kernel is Gluon (``triton.experimental.gluon``), which has no interpreter: on CPU the split rows
take the two-pass Triton path instead (see ``softmax_fwd.py``); the GPU tests run this one.

Layouts: inputs (M, N) with unit column stride and any row stride, float32 / float16 / bfloat16;
outputs contiguous in the input dtype (dy.dtype backward); lse (M,) float32; math in float32.
"""
from __future__ import annotations

import functools

import torch
import triton

from . import softmax_fwd as F
from .attention_config import cuda_major
from .compile_options import COMPILE_OPTIONS
from .gluon_compat import (TensorDescriptor, async_copy, cp_async as _cp_async, cta_barrier as _cta_barrier,
                           fence_async_shared, gl, gluon, mbarrier, tma, tma_load as _tma_load)
from .hostmath import cdiv, next_power_of_2
from .launcher import launch_kernel
from .plan_memo import memo

#: Configurations, by direction and element size (the larger of y and dy backward), each a list of
#: (shortest row, config) in increasing row length: the last entry whose row length is reached applies.
#: Config: (chunk elements per program, num_warps, shared-memory slots, rows loaded ahead, rows of
#: lag, loads by TMA); the ring is one of ``RINGS``. A chunk that is not a power of two is KSUB sub-tiles
#: of the largest power of two that divides it (``sub_tile``; at least 16 bytes a thread), copied,
#: reduced and written one after another (rings whose chunks wait in their slots only). Chosen on
#: an H200 from benchmarks/probes/softmax_staged.py (.notes/softmax.md): 3 slots (2 programs per
#: multiprocessor at 32 KB per slot) beat 4 slots with a lag of 2 by 20-30 points (session 5); 16-bit
#: forward chunks of 16K against 8K: +0.5-1 point at 64K-1M, +2 at 2M, +5 at 4M (session 6); TMA
#: loads against cp.async (session 12): 16-bit forward +0.5 to +4.6 points at 64K-4M; fp32 forward
#: -0.4 to +0.6; backward -0.5 to -14.6. Backward rings of lag 2 (session 14, units claimed): fp32
#: (4096, 4) +0.2 / +1.9 / +5.4 / +9.4 points at 64K / 256K / 512K / 1M against lag 1; bf16
#: (8192, 4) -1.7 to -0.4 up to 512K, +1.9 at 1M, +5.4 at 2M. Forward rings of lag 2 in registers
#: measured 49-77% of copy against 88-96% (168-255 registers: three chunks live); the forward's lag 2
#: takes a fourth slot instead, by TMA: fp32 (4096, 8) 96.8 / 96.4 / 96.7 / 96.7 / 96.6% at 64K /
#: 128K / 256K / 512K / 1M against 96.9 / 96.4 / 96.2 / 91.7 / 89.2 for lag 1 (its chunks of 4096 fit
#: 1.6M-element rows on 396 programs: lag 1 beyond 1M); bf16 (8192, 4) 92.0 / 91.9% at 1M / 2M against
#: 87.7 / 86.4, 92.2-92.4 against 92.2-92.8 at 128K-512K. Deep rings (lag 5 in 7 slots of 16 KB, two
#: programs per multiprocessor, units claimed; session 15) for rows the others cannot keep on chip,
#: against the two-pass path: fp32 forward 4M 87.7% against 66.1, bf16 forward 8M 81.2 against 61.0;
#: fp32 backward 2M (chunks of 2048) 85.1 against 62.9, bf16 backward 4M (TMA) 89.1 against 61.8.
#: Where the rings of lag <= 2 hold the rows they stay ahead: deep rings measured 75-77% at fp32 1M
#: forward (96% lag 2), 79% at bf16 4M forward (83.5% lag 1), 92% at bf16 2M backward (96%).
#: 16-bit backward by TMA in the register ring (session 17, bf16 / fp16): chunks of 4096 (396
#: programs) 100.7 / 100.5, 100.6 / 100.5, 100.8 / 100.3% at 64K / 256K / 512K against the lag-1
#: cp.async ring's 100.2 / 100.5, 99.9 / 99.8, 97.7 / 98.2 (but 92.4 at 1.25M: 320 chunks of 396);
#: chunks of 8192 99.1 / 99.0 at 1M, 97.8 / 97.6 at 1.25M against 96.2 / 95.5, 96.1 / 95.3 by
#: cp.async; from 1.5M cp.async is ahead (2M: 96.0 / 95.3 against 91.7 / 89.8). Session 20: the
#: same ring in chunks of 16384 by 8 warps (one program per multiprocessor, 192 KB of slots, rows
#: up to 2.16M elements), two processes on an H200: bf16 / fp16 100.1-100.3 / 100.6 at 1M, 100.1-100.3
#: / 100.5 at 1.5M, 100.1-100.2 / 100.5 at 2M against the table's 98.7-99.1 / 98.9-99.1, 95.8-96.8 /
#: 95.4-96.4, 96.0 / 95.3-95.4; at 64K-256K 100.0-100.6 against 100.5-100.9 (kept there). By
#: cp.async that config ran 88-90%, so rows that cannot take TMA keep the entry of the same length
#: before it (8192 by cp.async: 95-96%; ``TMA_ONLY_CONFIGS``). Two entries may share a length only
#: so: the later one TMA-only. Entries whose slots need more shared memory than a block gets on the
#: device give way to the entry before them (``staged_config``'s ``max_shared``).
#: Deep rings of one program per multiprocessor (7 slots of 32 KB, chunks twice as long as before;
#: session 20, H200, two processes): fp32 forward (8192, 4 warps) 83.0 / 86.8 / 89.8 / 90.9-91.0% at
#: 1.5M / 2M / 3M / 4M against 79.6-79.8 (lag 1) / 87.0 (lag 1) / 88.4 / 88.1-88.2 (lag 5, 4096 x 8);
#: fp32 backward (4096, 4) 97.0 / 98.0 / 96.7-96.9 at 1.25M / 1.5M / 2M against 84.2 / 87.2 / 85.1
#: (2048 by cp.async); 16-bit backward (8192, 4) 94.5-94.7 at 4M against 87.0-90.2, but 92.4-93.4
#: at 2.5M-3M against 93.2-95.2 (kept there). All three by TMA only (cp.async rows keep the entries
#: they had).
#: Lag 2 in 3 slots, the chunk written moved into registers a step early (session 27, H200): fp32
#: forward (8192, 4 warps, cp.async; 231 registers, two programs per multiprocessor, rows up to
#: 2.16M elements) 96.6 / 97.3 / 96.7 / 97.1 / 97.1% at 1.06M / 1.25M / 1.5M / 1.75M / 2M against
#: 79.8 / 82.3 / 84.7 / 86.6 / 88.0 for the deep ring the table had there (8192, 4, lag 5, TMA);
#: by TMA 91-95; three runs at 256K / 512K / 1M 96.6-97.0 / 96.8-97.2 / 96.7-97.8 against 95.7-96.4 /
#: 96.1-96.6 / 95.5-96.7 for the 4-slot ring by TMA; at 64K-128K a tie with lag 1 (kept there). 16-bit
#: chunks held as tensors (a register per element) spilled: 16384 x 4, 255 registers and 184 bytes,
#: 60-63% at 1M-4M forward; 8192 x 4 (233 registers: two programs) 68-73. Held two to a 32-bit word
#: (``_held_words``; 255 registers, no spill): bf16 forward 16384 x 4 by TMA, folded, 92.7 /
#: 92.3-92.6% at 4M (two runs) against 83.6-83.9 for lag 1, 93.0 / 92.7 at 2.5M / 3M against 59.4 /
#: 69.6 (lag 1), fp16 93.4 / 93.4 / 92.8 at 2.5M / 3M / 4M against 64.3 / 75.8 / 84.1; by cp.async 87;
#: at 1M-2M 93.2-93.4 against 94.4-94.7 for the 4-slot ring (kept there); the bf16 backward (8192, 4)
#: 91-100 at 256K-2M against the table's 97.8-100.1.
#: Lag 4 in 6 slots of 16 KB (4096 x 4 warps by TMA, two programs per multiprocessor, rows up to 3.2M;
#: session 27, H200): fp32 forward 92.3 / 93.0 / 93.1 / 90.3% at 2.06M / 2.25M / 2.375M / 2.5M against
#: 88.7 / 89.3 / 89.6 / 90.0 for the one-program deep ring (8192, lag 5; 2.25M in two runs: 93.0 / 93.0
#: against 89.3 / 89.3), but 75.7 at 3M (its slots 97% full) against 91.0.
#: Deep rings of lag L in L + 1 slots, the chunk written next held in registers (session 27, H200, TMA):
#: one lag more for the same slots, so rows up to (L - 1) / (L - 2) times longer stay on chip. fp32
#: forward (8192, 4, lag 6; rows up to 5.4M) 89.3-89.6 / 89.8-90.0% at 4.5M / 5M (two runs; the held
#: path ran them at 80.8 / 77.9), but 90.2 at 4M against 91.7 (lag 5 kept there); fp32 backward (4096,
#: 4, lag 6; up to 2.7M) 99.7 / 99.6 at 2M against 98.2 / 98.0, 99.0-99.2 / 99.0-99.4 at 2.25M / 2.5M
#: (held path 87.5 / 83.7); bf16 forward (8192, 4, lag 6; up to 10.8M) 75.3-75.4 at 9M, 76.0 at 10M
#: (two-pass 62.5 / 62.6), but 79.1 at 8M against 81.7 (lag 5 kept to its 8.65M); bf16 backward (4096,
#: 4, lag 6; up to 5.4M) 93.9 at 3.25M against 93.2, 94.8-94.9 at 4M against 93.8, 96.2-96.4 at 4.5M
#: (held path 83.3), but 93.7 at 3M against 96.8 (lag 5 by 4096 kept there). The 16-bit backward's
#: lag 6 / 7 in chunks of 8192 (one program per multiprocessor; rows of up to 8M then have at most
#: 1024 chunks): 92.2-93.2 at 4.5M-6M against 94.5-95.3 for 4096 (session 33).
#: Lag 3 in 4 slots of 16 KB, three programs per multiprocessor (session 28, H200): bf16 forward
#: (8192, 4 warps; by cp.async with its registers capped, ``REGISTER_CAPS``; rows up to 2 x 396 x
#: 8192 = 6488064) by TMA 87.2 / 88.8 / 89.1 / 89.1 / 85.0 / 84.9 / 84.7% at 4M + 64 / 4.5M / 5M /
#: 5.5M / 5.75M / 6M / 6.125M against 76.4 / 77.8 / 78.5 / 79.2 / 79.5 / 79.8 / 80.1 for the deep
#: ring (8192, 4, lag 5); by cp.async 81.2-85.9 against 69.3-74.6; fp16 90.7 / 86.1 at 4.5M / 5.5M
#: against 79.1 / 80.7. Its slots full, it slows: A/B of three rounds, bf16 / fp16 84.3 / 83.2 at 6M
#: against 79.9 / 81.5, 80.7 / 80.9 at 6488064 against 80.1 / 81.8 (from 6M + 1 the next ring). Lag
#: 4 in the same 4 slots, two chunks in registers (capped too; rows up to 3 x 396 x 8192 = 9.7M):
#: bf16 83.9 / 84.3 / 84.6 at 6.5M / 7M / 8M against 80.4 / 80.7 / 81.4 for lag 5, fp16 85.5 against
#: 82.4 at 7M, by cp.async 82.7-84.5; but 83.5 at 6M against lag 3's 84.5, 81.2 at 4.5M, and 74.0 /
#: 71.2 at 8.5M / 9M (near its capacity) against 74.8 for lag 6: from 6M + 1 to 8M.
#: Merging partitions (``MERGE_PARTITIONS``, session 31, H200, A/B against main of 3 rounds): the
#: 16-bit forward's lag 5 in 7 slots (two programs per multiprocessor) with the rows' words merged by
#: 4 more warps, one step early, bf16 / fp16 86.9 / 88.1% at 5.875M, bf16 86.8 / 86.7 / 86.5 / 86.4
#: at 6.25M / 7M / 7.5M / 8M against 82.5 / 81.3 (lag 3) and 83.9 / 84.6 / 84.7 / 84.8 (lag 4 in 4
#: slots, out of the table since); fp16 88.0 at 7M against 85.5; by cp.async 84.8 at 7M. At 5.625M
#: lag 3 stays (84.5-84.8 either way): from 5.75M + 1 to 8M; past 8M the partition's wait for pending
#: words lost (8M + 64: 68.5 against 75.5), so from 8M + 1 it leaves those rows to the steps (session
#: 32: 78.7 against 75.7; see ``MERGE_PARTITIONS``, which the lag-6 ring from 8.25M + 1 takes too).
#: Lag 7 in 7 slots (two chunks in registers; session 32, H200, TMA) past each lag-6 ring's capacity,
#: where rows went to the held path (``softmax_held``): one chunk per program more of a row on chip,
#: up to 6.5M float32 / 13M 16-bit elements forward, 3.2M / 6.5M backward. fp32 forward (8192, one
#: program per multiprocessor) 86.3 / 86.7% at 5.5M / 6M against 78.8 / 76.6; bf16 forward 72.9 /
#: 73.1 at 11M / 12M against 62.1 / 62.2 (but 71.4-72.5 at 9M-10M against lag 6's 77.6-77.8); bf16
#: backward 94.9 / 94.8 / 94.7 at 5.25M / 5.5M / 6M against 87.2 / 84.4 / 81.2 (at 4.5M / 5M 94.3 /
#: 94.8 against lag 6's 95.2 / 95.0; at 4M 95.2 against 97.0 for lag 6 with the partition); fp32
#: backward (with the partition to 2.5M) 99.7 / 100.0 / 98.0 / 98.2 at 2.375M /
#: 2.5M / 2.625M / 3M against 99.0 / 99.2 / 93.5 / 86.8. Rows past these take the held path with
#: the lag-7 ring: fp32 / bf16 backward 4M / 8M 82.7 / 79.3 against 78.6 / 74.2, fp32 forward 8M
#: 74.7 against 73.4, bf16 forward 16M 62.1 against 62.3.
#: Rows under 32769 that the backward sends here (``softmax_bwd.staged_first``; session 37, H200,
#: ``logs/2026-11-24-h200-s37-call2.log``): 16-bit chunks of 4096 by 4 warps, lag 1, 97.9 / 84.0 / 80.4 /
#: 81.7% of copy at bf16 10240 / 20001 / 24577 / 32767 against 84.0 / 71.0 / 69.4 / 73.7 for 8192 by 4
#: (32000: 98.9 against 100.5). Aligned 16-bit rows from 30720 (``softmax_bwd.BWD_STAGED_ALIGNED_MIN_N``)
#: take 8192 by 4 (session 38, ``-s38-call12.log``: 32000 100.2 against 99.1 for 4096 by 4).
STAGED_CONFIG = {
    ("fwd", 4): [(0, (8192, 4, 3, 1, 1, False)), (262144, (8192, 4, 3, 1, 2, False)),
                 (2097153, (4096, 8, 7, 1, 5, True)), (2097153, (4096, 4, 6, 1, 4, True)),
                 (2621441, (4096, 8, 7, 1, 5, True)), (2621441, (8192, 4, 7, 1, 5, True)),
                 (4194305, (4096, 8, 7, 1, 5, True)), (4194305, (8192, 4, 7, 1, 6, True)),
                 (5406721, (8192, 4, 7, 1, 7, True))],
    ("fwd", 2): [(0, (8192, 4, 3, 1, 1, True)), (65536, (16384, 4, 3, 1, 1, True)),
                 (1048576, (8192, 4, 4, 1, 2, True)), (2097153, (16384, 4, 3, 1, 2, True)),
                 (4194305, (8192, 4, 4, 1, 3, True)), (6029313, (8192, 4, 7, 1, 5, True)),
                 (8388609, (8192, 4, 7, 1, 5, True)), (8650753, (8192, 4, 7, 1, 6, True)),
                 (10813441, (8192, 4, 7, 1, 7, True))],
    ("bwd", 4): [(0, (4096, 4, 3, 2, 2, False)), (1048577, (2048, 4, 7, 1, 5, False)),
                 (1048577, (4096, 4, 7, 1, 5, True)), (2097152, (4096, 4, 7, 1, 6, True)),
                 (2359297, (4096, 4, 7, 1, 7, True))],
    ("bwd", 2): [(0, (4096, 4, 3, 1, 1, False)), (30720, (8192, 4, 3, 1, 1, False)),
                 (65536, (4096, 4, 3, 2, 2, True)), (1048576, (8192, 4, 3, 2, 2, False)),
                 (1048576, (16384, 8, 3, 2, 2, True)),
                 (2097153, (4096, 4, 7, 1, 5, True)), (3145729, (4096, 4, 7, 1, 6, True)),
                 (5406721, (4096, 4, 7, 1, 7, True))],
}
#: Configs for rows that are not 16-byte aligned (``F.row_align`` > 1: cp.async copies of rows shifted
#: to 16 bytes, no TMA), by (direction, element size): entries (shortest row, config) as in
#: ``STAGED_CONFIG``, where None hands rows from that length on back to ``STAGED_CONFIG`` and a tuple of
#: configs is alternatives, of which rows take the one that pads them least (``least_padded``). Session 35,
#: H200, % of copy (``benchmarks/probes/softmax_staged.py --configs``, logs
#: ``benchmarks/logs/2026-11-23-h200-s35-*``), against the main table's configs on these rows:
#: - bf16 forward: lag 1 of 8192 (capped, ``SHIFTED_REGISTER_CAPS``) 76.6 / 81.2 / 81.3 at 50257 /
#:   100003 / 300007 against 51.3 / 59.9 / 74.2; from 2^19 lag 2 of 16384 in 3 slots, 81.1 / 81.1 / 81.6 /
#:   82.2 at 600011 / 1000003 / 2000003 / 3000017 (lag 1 74.1 / 72.2 / 69.9 / 61.8; main 56-57).
#: - bf16 backward: lag 1 of 4096 84.2 / 82.7 at 50257 / 100003 (main 78.1 / 69.3); from 2^18 lag 2 in 4
#:   slots, 85.9 / 85.9 / 85.4 at 300007 / 600011 / 1000003 (lag 5 84.0 / 84.2 / 83.2, main 69); from
#:   2^20 + 1 lag 5 (lag 2's capacity is 1.6M), 84.0 at 2000003 (the main table's config 51.0, 28.1 at
#:   the session's start).
#: - float32 forward: lag 1 of 4096 87.7 / 86.7 at 50257 / 100003 against 81.6 / 86.4; from 2^18 the
#:   main table (93.5 at 300007 against 84.8).
#: - float32 backward: lag 1 of 4096 90.6 / 89.7 at 50257 / 100003 against 57.7 / 58.7; from 2^18 lag 5
#:   of 4096 (by TMA only in the main table), 91.8 / 92.6 / 92.9 / 93.4 / 80.9 at 300007 / 600011 /
#:   1000003 / 1500007 / 2000003 against lag 1's 80.2 / 58.5 / 75.2 and the main table's 60-61 (2048 in
#:   lag 5 at 1500007 / 2000003: 80.9 / 78.8).
#: Session 39 (H200, ``knobs.py``, logs ``benchmarks/logs/2026-11-24-h200-s39-call3.log``, ``-call4.log``),
#: against the entries before, on rows that fell further behind as they grew:
#: - float32 forward, 8192 by 4 warps from 65536: 87.5 / 90.1 / 89.3 / 90.2 / 90.0 / 89.7 / 88.7 / 87.9 at
#:   65537 / 80001 / 100003 / 120001 / 151937 / 200003 / 250007 / 262143 against 86.9 / 87.7 / 86.6 / 85.7 /
#:   84.7 / 83.1 / 81.2 / 80.4 (50257: 86.6 against 87.9 in call 3).
#: - float32 backward, lag 2 of 4096 with the written chunk in registers from 196608: 84.4 / 84.3 / 83.9 at
#:   200003 / 250007 / 262143 against 83.3 / 80.3 / 77.2 (at 50257-151937 it lost 3-7 points, call 3).
#: - bf16 backward, 8192 by 4 warps from 80000: 86.0 / 84.8 / 86.4 / 85.8 / 85.2 / 83.9 / 82.4 at 80001 /
#:   100003 / 120001 / 151937 / 200003 / 250007 / 262143 against 83.7 / 82.5 / 81.5 / 79.7 / 77.9 / 76.2 /
#:   74.6; it lost at 50257 / 65537 (80.6 / 82.0-82.1 against 84.1 / 82.6-82.9).
#: - Not taken: bf16 forward chunks of 16384 (58-78 against 77-82), the bf16 backward's lag 2 of 4096 in
#:   registers (67-69 against 76-84).
#: Session 40 (H200, ``knobs.py``, logs ``benchmarks/logs/2026-11-24-h200-s40-call1.log``, ``-call2.log``): the
#: main table's deep rings of lag 6 / 7, measured there by TMA only, by cp.async on long shifted rows, each
#: from the length where the ring before it is full (its ``capacity`` on an H200), against what these rows
#: took before (the main table's entries that cp.async can take, or the held path past their capacity):
#: - float32 backward, lag 6 of 4096 from 2097153: 81.5 / 81.6 / 82.1 at 2200001 / 2500007 / 2650001
#:   against 78.3 / 74.8 / 73.2 (lag 5 of 2048); lag 7 from 2703361: 79.6 / 81.7 / 71.8 at 2750003 /
#:   3200003 / 4194305 (the held path past 3.2M) against 72.4 / 70.1 / 66.4 (lag 6 there: 77.7 / 73.9 / 69.1).
#: - bf16 backward, lag 6 of 4096 from 4325377: 80.6 at 5000011 against 67.0; lag 7 from 5406721: 77.0 /
#:   76.9 at 5500007 / 6400013 against 63.0 / 58.6 (lag 6 75.6 / 66.8). Lag 5 stays to its capacity (79.9
#:   at 3600001 against 78.4 for lag 6).
#: - bf16 forward, lag 5 of 8192 from 5767169: 78.9 at 6000011 against 70.8 for the main table's lag 3 (at
#:   5500007 lag 3 81.5 against 78.9); lag 6 from 8650753: 69.7 / 69.1 at 8700007 / 9000011 against 54.2 /
#:   54.0; lag 7 from 10813441: 66.0 / 66.4 at 11000027 / 12500003 against 54.4 / 54.2.
#: - float32 forward (``-call4.log``), lag 6 of 4096 by 4 warps from 4194305: 80.9 at 4194305 against 77.8 for
#:   the main table's lag 5 of 4096 by 8 (80.2 / 79.4 at 3000017); lag 7 from 5406721: 80.0 at 6000011
#:   against 69.1 (lag 6 70.8).
#: - Not taken: float32 forward lag 5 / 6 of 8192 by cp.async (-0.7 to -5.5 points at 3M-6M), lag 7 (25-40%),
#:   lag 4 of 4096 in 6 slots (65-68 at 3M-6M); bf16 backward lag 5 of 8192, lag 4 / 6 of 4096 in place
#:   of lag 5 at 1.5M-3.6M (62-82 against 79-84).
#: Session 41 (H200, ``benchmarks/probes/softmax_staged.py --configs``, log
#: ``benchmarks/logs/2026-11-24-h200-s41-call2.log``): chunks that are not a power of two (``sub_tile``), in
#: the lag-1 ring, against the entries before:
#: - float32 backward, 4608 (9 sub-tiles of 512; still two programs per multiprocessor) from 32769: 89.6 /
#:   89.8 / 90.1 / 88.0 / 87.5 at 33001 / 40001 / 50257 / 65537 / 80001 against 82.1 / 84.8 / 84.2 / 83.9 /
#:   85.4 for 4096 (100003, call 1: 87.0 against 85.1); at 120001-262143 it lost 0.4-1.6.
#: - bf16 backward, 6144 (3 of 2048, three programs instead of four) from 32769: 87.2 / 87.8 / 86.6 / 88.0 /
#:   86.4 / 87.2 at 33001 / 40001 / 50257 / 65537 / 80001 / 120001 against 84.0 / 86.0 / 84.8 / 83.1 / 84.3
#:   (4096) and 85.8 / 86.4 (8192 from 80000); at 151937-262143 within a point of 8192 (alternatives, below).
#: - float32 forward, 6144 (3 of 2048) from 32769: 89.9 / 89.3 / 89.4 at 40001 / 50257 / 65537 against 88.7 /
#:   87.5 / 87.4 (4096, and 8192 at 65537); 89.1 against 90.0 for 8192 at 80001.
#: - Entries of several configs (alternatives): the one whose chunks pad the row least, a sub-tiled chunk's
#:   padding counted ``SUB_TILE_COST`` more (``least_padded``). The bf16 forward (``-call4.log``), where a chunk
#:   of sub-tiles costs more (it reads them twice: max, then exponentials), from 20481 to 2^19: 8192 or 9216 /
#:   10240 / 12288, which took 74.0 / 75.3 / 80.0 / 80.3 / 79.2 / 75.6 at 24577 / 28673 / 36001 / 45001 / 50257 /
#:   57345 against 64.7 / 73.8 / 75.2 / 78.2 / 76.4 / 73.5 for 8192; 8192 kept at 20483, 40001, 65537, 75001,
#:   90001, 130001-262143 (the others 0.6-16 points under it); in 17 lengths of 20K-400K the rule's choice was
#:   within 1.7 points of the best (400009: 12288 81.1, 8192 79.4). The bf16 backward from 10^5: 6144 or 8192
#:   (8192 at 130001: 89.0 against 85.7, call 3; 6144 at 110001 / 140001 87.8 / 86.5 against 86.0 / 85.0; 8192
#:   0.5-0.6 ahead at 200003 / 230001). Under 10^5 6144 alone: 8192, padded less at 40001, ran 83.5 against
#:   87.8 (two programs per multiprocessor instead of three).
#: - Not taken: the bf16 backward's lag 2 in 4 slots of 5120 / 6144 (78-87 against 87 for 4096 at 300007 /
#:   600011).
#: Session 46 (``knobs.py``, 3 rounds, logs ``-s46-call2-winners.log`` H100, ``-s46-call3-winners.log`` H200): the
#: float32 backward's lag 2 from 196608 one chunk ahead in 3 slots (``RINGS``' (3, 1, 2)) instead of two ahead
#: (3, 2, 2): 93.9 / 93.7 (H200) and 98.0 / 97.6 (H100) at 200003 / 250007 against 83.9 / 83.8 and 93.6 / 93.2
#: on triton 3.6; on 3.9, whose (3, 2, 2) build spills, 95.1 / 94.2 against 51.6 / 51.2 on the H200.
#: - bf16 backward, lag 6 of 4096 from 4194305 (0.97 of lag 5's capacity on an H200; it was from 4325377, past
#:   it), ``-s46-call6-bwd16-lag6.log`` (H200): 82.2 / 78.0 at 4194305 / 4325375 against 74.3 / 65.4 on 3.9, 79.1 /
#:   78.7 against 78.4 / 74.5 on 3.6 (H100, 3.9, call 1: 83.5 against 78.2 at 4194305); lost at 3200003-3900001
#:   (-8.9 to -13.2 on 3.9, -0.6 to -2.4 on 3.6).
#: - Not taken: the bf16 backward's lag 5 of 8192 in place of 4096 (H100 +2.5 to +10.7 points at 3M-4.19M on
#:   both releases; H200 -2.4 to -7.6 at 2.5M-4.19M on 3.6, -4.9 to -12.4 at 2.5M-3.6M on 3.9, +2.6 at 4194305).
#: Session 52: a deep ring hands its rows to the next where it is full, which for shifted rows (their chunks
#: count N + ALIGN - 1 columns) is ALIGN - 1 columns before the aligned rows' limit: the last few lengths
#: before 5406721 / 8650753 / 10813441 / 2703361 went through the held path (the launch refused them).
STAGED_CONFIG_SHIFTED = {
    ("fwd", 4): [(0, (4096, 4, 3, 1, 1, False)), (32769, (6144, 4, 3, 1, 1, False)),
                 (73728, (8192, 4, 3, 1, 1, False)), (262144, None),
                 (4194305, (4096, 4, 7, 1, 6, False)), (5406718, (4096, 4, 7, 1, 7, False))],
    ("fwd", 2): [(0, (8192, 4, 3, 1, 1, False)),
                 (20481, ((8192, 4, 3, 1, 1, False), (9216, 4, 3, 1, 1, False), (10240, 4, 3, 1, 1, False),
                          (12288, 4, 3, 1, 1, False))),
                 (524288, (16384, 4, 3, 1, 2, False)), (4194305, None),
                 (5767169, (8192, 4, 7, 1, 5, False)), (8650746, (8192, 4, 7, 1, 6, False)),
                 (10813434, (8192, 4, 7, 1, 7, False))],
    ("bwd", 4): [(0, (4096, 4, 3, 1, 1, False)), (32769, (4608, 4, 3, 1, 1, False)),
                 (110000, (4096, 4, 3, 1, 1, False)), (196608, (4096, 4, 3, 1, 2, False)),
                 (262144, (4096, 4, 7, 1, 5, False)), (2097153, (4096, 4, 7, 1, 6, False)),
                 (2703358, (4096, 4, 7, 1, 7, False))],
    ("bwd", 2): [(0, (4096, 4, 3, 1, 1, False)), (32769, (6144, 4, 3, 1, 1, False)),
                 (100000, ((6144, 4, 3, 1, 1, False), (8192, 4, 3, 1, 1, False))), (262144, (4096, 4, 4, 1, 2, False)),
                 (1048577, (4096, 4, 7, 1, 5, False)), (4194305, (4096, 4, 7, 1, 6, False)),
                 (5406714, (4096, 4, 7, 1, 7, False))],
}
#: Entries of the tables for one GPU model, where it measured other winners than the H200 that the tables
#: follow (the issue's GPU), keyed by the name CUDA gives the device (``gpu_model``; other models of a family,
#: e.g. an H100 PCIe, take the tables as they are): by table ("main": ``STAGED_CONFIG``, "shifted":
#: ``STAGED_CONFIG_SHIFTED``) and (direction, element size), (shortest row, config) entries merged into the
#: table's by length, where they take the place of the table's entries of the same length (``gpu_tables``).
#: H100 SXM (the H200 lost with each where measured: session 46, ``-s46-call3-winners.log``; session 52 calls 6 and
#: 12), ``knobs.py``, % of copy against the tables' configs, triton 3.6 unless said:
#: - bf16 forward, lag 5 of 8192 from 65537 (the tables: 16384 in lag 1, from 1048576 lag 2 of 8192 in 4 slots, from
#:   2097153 lag 2 of 16384, from 4194305 lag 3 in 4 slots, from 6029313 lag 5 as here). Aligned rows (TMA), session
#:   52, % of copy: 98.0-98.1 against 93.8-95.1 at 65792 / 81920 / 98304 / 114688 / 131072 and 98.0 against 97.0 at
#:   1048576 (``-s52-call10-fwd16-from-64k.log``, 5 rounds; 3.9: 97.9-98.0 against 93.8-95.8 at 131072 / 262144 /
#:   786432); 97.8-97.9 against 93.8-95.7 at 262144 / 524288 / 786432 (``-call9-fwd16-below-1m.log``); 97.8-98.0
#:   against 94.7-96.7 at 1048832-2097152 (``-call8-fwd16-from-1m.log``); 97.7-97.8 against 96.0-96.8 at
#:   2097408-4194304 (``-call2-below-4m-tests.log``); 97.8 / 97.8 / 96.6 / 97.3 / 95.5 against 94.1 / 95.7 / 82.0 /
#:   88.4 / 88.1 at 4194560 / 4718592 / 5000192 / 5767168 / 6029312 (``-call1-gpu-entries.log``, 3 rounds). Shifted
#:   rows (by cp.async; below 4194305 they keep ``STAGED_CONFIG_SHIFTED``'s entries: lag 5 tied its lag 2 of 16384
#:   at 2097153-4000037, call 2): 93.2 / 91.3 / 88.7 against 92.3 / 77.6 / 75.3 at 4194305 / 5000011 / 5767167 (on 3.9
#:   they take it already, ``SPILL_FALLBACKS``). The H200: 84.0-84.9 against 89.1-90.4 aligned at 4.19M-6.03M
#:   (session 46), 83.9-85.8 against 92.3-94.9 at 131072-4194304 (``-s52-call12-h100-entries-on-h200.log``).
#: - bf16 forward, odd rows of 100000-524287 in the same ring by cp.async (the shifted table: lag 1 of 8192-12288,
#:   the least padded), ``-s52-call13-fwd16-odd.log``, 5 rounds: 93.8 / 95.3 / 96.4 against 90.3 / 89.5 / 88.0 at
#:   100003 / 151937 / 300007; it lost at 32001 / 50257 (87.6 / 86.6 against 90.6 / 91.2), tied at 65537 (88.8 /
#:   89.1) and, past 524287 (where the shifted table's lag 2 of 16384 starts), at 1000003 (95.1 / 94.9).
#: - bf16 backward, shifted rows, lag 5 of 8192 (one program per multiprocessor; rows to 4325369) from 2883585
#:   (the tables: lag 5 of 4096, from 4194305 lag 6), session 52 call 1: 89.3 / 88.0 / 89.6 / 87.8 / 87.3 against
#:   84.4 / 77.9 / 81.6 / 84.7 / 87.2 at 2883585 / 3000017 / 3600001 / 4194305 / 4325369; from 2621441 it lost
#:   (87.2 / 87.5 against 88.8 / 91.3 at 2621441 / 2750003). Session 46 on 3.9: 88.2 / 89.6 / 88.1 against 85.7 /
#:   82.1 / 77.6 at 3000017 / 3600001 / 4194305. The H200: -2.4 to -12.4 at 2.5M-3.6M.
#: - Not taken: the bf16 backward's aligned rows in chunks of 8192 (TMA) from 2621441, -0.3 to +1.6 (call 1).
#: - float32 forward, shifted rows, lag 7 of 8192 by 8 warps (one program per multiprocessor; rows to 6.49M, as the
#:   table's lag 7 of 4096) from 4194305 (the table: lag 6 of 4096, from 5406718 lag 7), session 53 (calls 3-4,
#:   ``-s53-call3-fp32-fwd-shifted.log``, ``-call4-fp32-shifted.log``, 3 rounds): 89.9 / 90.6 / 91.0 / 92.1 / 92.0 /
#:   91.1 against 86.2 / 85.1 / 83.0 / 88.9 / 86.9 / 85.5 at 4194305 / 5000011 / 5406717 / 6000001 / 6200001 /
#:   6488061, and the held path's longer rows with it 78.7 against 77.5 at 8000001; as landed (call 6, against
#:   ``STAGED_CONFIG_GPU = {}``): 89.9 / 91.0 / 91.2 against 86.0 / 82.6 / 85.3 at 4194305 / 5406717 / 6488061.
#:   Below 4194305 the table's configs won (92.5 / 91.7 against 86.3 / 88.0 at 2621441 / 3200001). The same ring
#:   by 4 warps ran 31% (two chunks of 64 elements a thread in registers). Aligned rows (TMA) run the table's at
#:   97.0-99.5 and tie this ring (call 7). The H200: 71.5-73.4 against 79.7-82.0 (call 5). The float32 backward's
#:   shifted rows in 4096s by 8 warps from 2097153: lag 7 tied (-0.9 to +1.3), lags 5-6 lost (to -14.4), call 4.
STAGED_CONFIG_GPU = {
    "NVIDIA H100 80GB HBM3": {
        ("main", "fwd", 2): [(65537, (8192, 4, 7, 1, 5, True)), (1048576, (8192, 4, 7, 1, 5, True)),
                             (2097153, (8192, 4, 7, 1, 5, True)), (4194305, (8192, 4, 7, 1, 5, True))],
        ("shifted", "fwd", 2): [(100000, (8192, 4, 7, 1, 5, False))],
        ("shifted", "bwd", 2): [(2883585, (8192, 4, 7, 1, 5, False)), (4194305, (8192, 4, 7, 1, 5, False)),
                                (4325370, (4096, 4, 7, 1, 6, False))],  # (the 8192s hold rows to 4325369)
        ("shifted", "fwd", 4): [(4194305, (8192, 8, 7, 1, 7, False)), (5406718, (8192, 8, 7, 1, 7, False))],
    },
}
#: Configs that give way to another where their build spills registers on the triton installed (its
#: ptxas and flags: triton 3.9 passes ``--regAllocOptLevel=2``, and there these builds spill where 3.6's do
#: not), keyed by (direction, element size, chunk, warps, slots, ahead, lag, rows shifted (ALIGN > 1)):
#: fallback configs in order, of which the launch takes the first whose plan holds the row (``_launch_plan``;
#: none: the table's). H100, session 43
#: (``-s43-call5-configs.log``), % of copy, spilling table build against the fallback, on 3.9 (3.6 keeps
#: the table's, which runs 2-13 points ahead there):
#:  - bf16 forward shifted lag 2 of 16384 (532 bytes spilled): 49.4-51.7 against 88.2 at 600011-2000003;
#:  - bf16 forward shifted lag 1 of 8192 at maxnreg 128 (52 bytes, the claimed build): 76.0 against 89.5
#:    at 65537 (chunks of 9216);
#:  - float32 backward lag 2 ahead 2 of 4096 (8 bytes): 89.2 / 89.3 against 100.7 / 95.7 at 128256 /
#:    256000 (lag 1).
#: Session 44 (H100, ``-s44-call2-gaveup-bwd16.log``, ``knobs.py``, 3 rounds):
#:  - bf16 backward lag 2 ahead 2 of 16384 by 8 warps, TMA (92 bytes): 58.0 / 58.1 / 57.8 against 100.3 /
#:    100.2 / 100.2 at 2^20 / 1.5 * 2^20 / 2^21 for lag 5 of 4096 by TMA (3.6, where the table's build does
#:    not spill: 99.4 / 99.3 / 99.0 against 100.3 for lag 5).
#: Session 46 (``knobs.py``, 3 rounds, logs ``-s46-call1-t39-configs.log``, ``-s46-call2-winners.log`` on an
#: H100, ``-s46-call3-winners.log`` on an H200), on 3.9, % of copy H100 / H200:
#:  - bf16 forward shifted lag 2 of 16384: lag 2 of 12288 in 4 slots (three sub-tiles of 4096, no spill; rows
#:    to 3.24M) 94.5-95.8 / 82.3-82.6 at 600011-2000003 against 88.2-88.3 / 71.3-71.7 for the lag 2 of 8192 in
#:    4 slots this list had (whose rows end at 2.16M: past it the spilling build ran, 52.3 / 43.4 at
#:    3000017); past 3.24M lag 5 of 8192 (the 16-bit forward's merging ring): H200 79.8 / 79.6 at 3600001 /
#:    4000037 against 42.9 / 42.2 (on 3.6 the table's build ran 94.4-96.0 on the H100, 12288 91.0-91.8);
#:  - bf16 forward shifted lag 3 of 8192 at maxnreg 168 (the main table's, rows 4194305-5767168, 232 bytes):
#:    lag 5 of 8192 94.1 / 94.3 / 92.1 (H100) and 78.4 / 78.9 / 78.3 (H200) against 78.7 / 76.3 / 72.7 and
#:    65.4 / 65.2 / 64.0 at 4194305 / 5000011 / 5767167 (on 3.6 the H200 kept lag 3, 78.6-79.7 against
#:    77.5-78.1);
#:  - float32 backward lag 2 ahead 2 of 4096: lag 2 in 3 slots one ahead (the written chunk in registers,
#:    217 registers, no spill) 100.8 / 102.3 at 256000 and 101.1 / 102.1 at 1000000 against 95.6 / 92.6 and
#:    94.0 / 88.4 for lag 1 (on 3.6 a tie with the table's, 101.0-102.4 against 100.9-102.3);
#:  - float32 backward shifted lag 7 of 4096, the held path's build (with a prior and ``LATE_CLAIM``, 60
#:    bytes; the build without a prior 16, and lag 6 does not hold the rows it takes): lag 6, 73.6 / 68.4
#:    against 61.3 / 60.6 at 4194305 / 6000011 (H100, ``-s46-call8-fp32bwd-held.log``; the claims at the
#:    step's top 76.0 / 69.6, as session 43's tree; 3.6 78.0 / 71.5).
SPILL_FALLBACKS = {
    ("fwd", 2, 16384, 4, 3, 1, 2, True): ((12288, 4, 4, 1, 2, False), (8192, 4, 7, 1, 5, False)),
    ("fwd", 2, 8192, 4, 3, 1, 1, True): ((9216, 4, 3, 1, 1, False),),
    ("fwd", 2, 8192, 4, 4, 1, 3, True): ((8192, 4, 7, 1, 5, False),),
    ("bwd", 4, 4096, 4, 3, 2, 2, False): ((4096, 4, 3, 1, 2, False),),
    ("bwd", 2, 16384, 8, 3, 2, 2, False): ((4096, 4, 7, 1, 5, True),),
    ("bwd", 4, 4096, 4, 7, 1, 7, True): ((4096, 4, 7, 1, 6, False),),
}
#: Padding a row's chunks of sub-tiles (``sub_tile``) counts this much more than a power of two's, by
#: (direction, element size), where an entry of ``STAGED_CONFIG_SHIFTED`` has alternatives (``least_padded``):
#: the bf16 forward's lag-1 ring reads a chunk of sub-tiles twice to reduce it; 5% put the rule's choice within
#: 1.7 points of the best config in 17 lengths of 20K-400K (H200, session 41, ``-s41-call4.log``).
SUB_TILE_COST = {("fwd", 2): 0.05}
#: Configs for rows of a whole number of their chunks, where TMA loads them, in place of the main
#: table's entry: entries as in ``STAGED_CONFIG_SHIFTED`` (None: the main table's from that length on),
#: each taken only where its chunk divides N. A ragged last chunk costs the 16-bit forward's chunks of
#: 16384 a step: session 40 (H200, ``knobs.py``, 3-5 rounds, logs ``-s40-call1.log``, ``-call2.log``), bf16
#: forward 16384 by 4 warps against the table's 8192 by 4 at 32768 / 49152: 93.0-93.5 / 92.8-93.3% of copy
#: against 88.6-89.4 / 88.1-88.8, but 85.8-86.0 against 88.5-88.9 at 32000, 62-86 against 85-89 at
#: other lengths of 20K-64K.
STAGED_CONFIG_WHOLE = {
    ("fwd", 2): [(20481, (16384, 4, 3, 1, 1, True)), (65536, None)],
}
#: Shortest rows that take the staged kernel; shorter ones stay whole in registers (the rows
#: kernels), which measured faster there: fp32 forward 97% of copy at 32K against 87% staged,
#: bf16 92% at 16K against 82%, backward 96-100% at 32K against 94-96%. (Shorter rows take it too where
#: the rows kernel cannot hold them, ``softmax_fwd.staged_fits``, or the backward sends masked rows
#: there, ``softmax_bwd.BWD_STAGED_MASKED``.) The 16-bit forward's rows kernel holds rows to 20480
#: (main tile 16384, tail up to 4096; H200, % of copy against staged, session 37, logs
#: ``2026-11-24-h200-s37-call3.log``, ``-call4.log``): bf16 N = 16385 / 16392 / 16400 / 16500 / 17500 /
#: 19000 / 20000 / 20400 / 20480 78.2 / 86.9 / 91.0 / 87.7 / 87.3 / 88.8 / 92.0 / 92.5 / 96.6 against
#: 56.6 / 61.3 / 64.6 / 58.8 / 62.0 / 69.9 / 79.8 / 78.3 / 81.9, but 18000 65.6 against 70.4 (78.2 against
#: 70.3 in the other run), 18433 / 19999 / 20001 62.1 / 64.6 / 64.6 against 62.9 / 67.4 / 67.5; past
#: 20480 the staged kernel (22000 82.5 against 74.8, 24577 64.7 against 56.8). Since session 38 (tail tiles
#: widened to a vector a thread, exponentials as exp2) the rows kernel runs 18000 at 92.3
#: (``-s38-call6.log``); rows of 20481-24576 stay staged (``-s38-call12.log``: 22528 87.0 staged against
#: 81.1 on the rows kernel).
STAGED_MIN_N = {("fwd", 4): 32769, ("fwd", 2): 20481, ("bwd", 4): 32769, ("bwd", 2): 32769}
#: Use the staged kernel for split rows on CUDA (False: the Triton persistent / two-pass paths).
STAGED = True
#: Forward with 16-bit outputs: fold the division by the row's sum into the exponent (one multiply
#: less per element; see ``_exp_over``), in rings of at least FOLD_MIN_LAG steps of lag. On an H200
#: (session 17, benchmarks/probes/softmax_staged.py --folds 0,1, 5 rounds) folding gained +1.6 /
#: +1.9 points of copy in bf16 rows of 1M-2M (the 4-slot ring) and 8M (deep), but lost 1.6 at 4M and
#: 0.2-0.5 at 64K-256K in the lag-1 ring (16K chunks; fp16 -0.8 at 4M, the others within 0.4).
FOLD_DIVISION_16BIT = True
FOLD_MIN_LAG = 2
#: Cache policies of the cp.async loads and of the output stores ("" = the default policy). On an
#: H200 (session 11) the default store policy beat evict_first by 0.1-1.0 points of copy in every
#: forward cell at 64K-4M and 0.1-0.4 backward. The loads' evict_first measured nothing then, because
#: triton <= 3.6 drops the policy of a cp.async; triton 3.9 emits it (an L2 cache hint), and there it
#: cost the backward 2-3 points (H100, session 43: float32 50257 91.0 against 94.4% of copy, bf16
#: 1000003 91.0 against 94.3, float32 128256 87.0 against 89.2), where 3.6 gives the same figures with
#: and without it.
LOAD_EVICT = ""
STORE_EVICT = ""
#: Deep rings (lag >= 3) with claimed units start a step's claim after the step's wait for a row's partial
#: words where the unit taken at that step is in the row written then (elsewhere at the step's top; each
#: claim is taken a step after it starts, as in every ring). A program then never waits for itself: a claim
#: started at the top is past the unit taken there, so in a later row than the written one, and the units it
#: took are reduced early where in that row. With every claim at the step's top (False), a program could wait
#: on a row whose last unit was its own claim, started but not taken, until the waits gave up (~1 s of polls;
#: the row then read again from global memory: right, but slow). Seen on an H100 (sessions 44-45, 2^16 polls):
#: rows at 0.96 and 1.0 of a lag-7 ring's capacity (bf16 backward 6225920, 6488064) and the held path's full
#: rows (bf16 backward 8M, float32 backward 4M), in 1-6 of 24 calls on triton 3.9, 0-1 on 3.6; with it, none
#: (7 cases x 24 calls on each release). Cost against every claim at the top (session 45, side by side, % of
#: copy): H200 within 0.3 points at bf16 backward 1M-3M and float32 backward 2M-3.2M, -1.1 to -1.9 at bf16
#: backward 4M-6.5M, bf16 forward 6.5M-8M and float32 forward 4M; H100 within 1.3. (The fix it replaced, a
#: program publishing its started claim's unit from global memory after 64 re-reads, cost 3-9 points on the
#: H200 in every build that had it, by its code alone, never run: ptxas then copied the claim's atomic result
#: out of its register right after the atomic, which waits out the atomic's round trip at every step.)
LATE_CLAIM = True
#: TMA (Hopper's bulk tensor copies, sm_90+): the configs that ask for it load each chunk as one
#: copy per program and row, completing on an mbarrier, where the rows allow it (``tma_width``;
#: others take cp.async). False: cp.async everywhere. (TMA stores, the output written back into its
#: slot and out by one bulk copy, measured -5.6 to +0.6 points against pointer stores in the forward,
#: lower in 12 of 14 cells, and -2.5 to +0.3 backward on an H200 in session 12: not kept.)
TMA_LOADS = True
#: Programs take their units (chunks) in memory order from a counter, where one row's chunks are at
#: most CLAIM_MAX_ROW_SHARE[direction, lag] of the resident programs (else program p takes units p, p +
#: grid, ... of a grid of whole rows). On an H200 (session 13) a persistent copy kernel reached 90% of
#: torch's copy with fixed chunks per program and 98% with chunks claimed in memory order; with claims
#: the staged forward gained +3.5 to +6.5 points of copy at 64K-256K and the backward +2 to +5 at
#: 64K-512K (up to 64 chunks per row), but the forward lost 3 points at 64 chunks per row (bf16 1M)
#: and both directions lost 5-18 at 128 (a row's chunks then spread over more of the programs' steps
#: than the one step of lag covers). With two steps of lag (session 14, the table's backward configs)
#: claims beat fixed units by 1.8-3.5 points at 64K-1M fp32 (up to 256 chunks per row on 264
#: programs) and by -0.2 to +1.1 at 64K-2M bf16.
CLAIM = True
CLAIM_MAX_ROW_SHARE = {("fwd", 1): 0.125, ("bwd", 1): 0.25,
                       **{(direction, lag): lag - 1.0 for direction in ("fwd", "bwd") for lag in range(2, 8)}}
#: The rings the kernel has, (slots, rows loaded ahead, rows of lag): a chunk waits for its row's
#: statistic in its slot (lag 1; lag L >= 2 in a ring of L + 2 slots), or in registers (lag 2 with
#: 3 slots: its slot is refilled at once, 2 ahead; lag L >= 2 in L + 1 slots, 1 ahead: the chunk moves
#: into registers at the end of the step before its write, which refills its slot; lag L >= 3 in L
#: slots: the chunk written after it too, two chunks in registers; up to lag 7 there). With a lag of L,
#: one row's chunks may outnumber the resident programs L - 1 times (``CLAIM_MAX_ROW_SHARE``,
#: ``capacity``): the deep rings (L >= 3) keep rows on chip that the GPU's programs hold only a few
#: chunks each of.
RINGS = ((3, 1, 1), (3, 2, 2)) + tuple((lag + extra, 1, lag) for extra in (0, 1, 2) for lag in range(2, 7)
                                        if lag + extra >= 3) + ((7, 1, 7),)
#: Configs (chunk, warps, slots, ahead, lag) the table takes only with TMA loads, by (direction,
#: element size): the 16-bit backward's 16384 x 8 warps 88-90% at
#: 512K-2M against 95-96% for its neighbour in the table; the one-program deep rings were measured
#: by TMA only (session 20, H200).
TMA_ONLY_CONFIGS = {("fwd", 4): ((8192, 4, 7, 1, 5), (4096, 4, 6, 1, 4), (8192, 4, 7, 1, 6), (8192, 4, 7, 1, 7)),
                    ("fwd", 2): ((8192, 4, 4, 1, 2), (8192, 4, 7, 1, 6), (8192, 4, 7, 1, 7)),
                    ("bwd", 4): ((4096, 4, 7, 1, 5), (4096, 4, 7, 1, 6), (4096, 4, 7, 1, 7)),
                    ("bwd", 2): ((16384, 8, 3, 2, 2), (4096, 4, 7, 1, 6), (4096, 4, 7, 1, 7))}


#: Registers a thread of a config may take (ptx ``.maxnreg``), by (direction, element size,
#: config[:5]): where the compiler, unbounded, takes more than lets the programs its slots allow fit
#: a multiprocessor's register file. 16-bit forward (8192, 4 warps, lag 3 in 4 slots of 16 KB),
#: loading by cp.async (rows TMA cannot take): 198 registers unbounded, two programs per
#: multiprocessor (rows up to 4.3M elements); at most 168 it takes 167 without a spill and three
#: programs fit (rows up to 6.5M). By TMA it takes 155 unbounded, 161 capped: three either way (H200,
#: triton 3.6; the table's figures are of the capped builds). (Lag 4 in the same 4 slots, capped at
#: 168 too, left the table in session 31 for the merging partition's lag 5.)
REGISTER_CAPS = {("fwd", 2, (8192, 4, 4, 1, 3)): 168}
#: The same for builds on rows not 16-byte aligned (ALIGN > 1), whose end vectors take registers: the
#: 16-bit forward's lag-1 ring of 8192 (4 warps, 3 slots of 16 KB) takes 168 unbounded (three programs
#: per multiprocessor), 128 capped without a spill (four; session 35, H200, before the end vectors
#: were written apart (``_write_ends``): 72.5 / 78.4% of copy at bf16 50257 / 100003 against 51.5 /
#: 60.2 uncapped).
SHIFTED_REGISTER_CAPS = {("fwd", 2, (8192, 4, 3, 1, 1)): 128}

#: Deep-ring configs (lag >= 3) whose rows' partial words a partition of more warps merges, beside
#: the program's steps (``_merge_partition``), by (direction, element size, config[:5]): (its warps,
#: steps early it gets the row, registers per thread of the build, longest row it takes, longest row
#: on which it waits for a row's pending words: on longer rows it leaves those rows to the steps,
#: which then read and merge the words themselves a step later, as without a partition). A
#: program's steps otherwise only take the statistic from shared memory, where they merged up to 2048
#: words themselves (what that costs: .notes/softmax.md, session 29). Triton gives a partition a warp
#: group (4 warps) of registers whatever its warps: the build's registers (at launch) must let the
#: programs that its slots allow fit a multiprocessor's 64K with 4 more warps each (two programs of
#: 4 + 4 warps: 128; one: 248); the merging warps then keep ``MERGE_REGS`` and the steps the rest.
#: Hopper and later only (Ampere runs these configs without the partition).
#: Measured on an H200 (sessions 31-32; .notes/softmax.md), % of copy against the same run's library
#: without the partition:
#: - 16-bit forward, waiting: see ``STAGED_CONFIG`` (5.75M + 1 to 8M); leaving pending rows to the steps
#:   there measured 82.2-83.1 against 86.1-86.8 at 6.25M-7M (and the wait past 8M lost: 8M + 64 68.5
#:   against 75.5). Leaving them: lag 5 78.7 / 78.5 at 8M + 64 / 8.25M against 75.7 / 74.8 (cp.async
#:   76.9 against 66.8 at 8.25M), lag 6 77.4 / 77.3 at 9M / 10M against 74.9 / 75.5, fp16 9M 78.6
#:   against 76.0; the held path (rows past 10.8M) the same with or without (62.3 at bf16 16M).
#: - 16-bit backward, leaving pending rows to the steps: lag 5 97.4 / 97.7 / 98.3-98.4 / 98.2 at 2.06M /
#:   2.25M / 2.5M / 3M against 94.1 / 94.4 / 95.3 / 95.9 (cp.async 89.9 / 91.6 at 2.5M / 3M against 82.6
#:   / 85.2; fp16 98.3 at 3M against 96.6), lag 6 96.4 / 96.9 at 3.25M / 4M against 93.1 / 94.2, but
#:   85.9 / 85.2 at 4.5M / 5M against 94.8 (rows of more than 1024 chunks, whose words are read as a
#:   block of 2048; lag 7 lost the same at 4.5M, 73% full): to 4M. Waiting lost at 3M (83.6: a
#:   partition re-reading a row's words about once per merge).
#: - float32 backward (one program per multiprocessor), waiting: lag 5 102.5 / 102.6 / 101.9-102.1 at
#:   1.06M / 1.25M / 1.5M against 98.8 / 99.3 / 99.8-99.9, but 88.9 / 85.7 at 1.75M / 2M - 4K; leaving
#:   them to the steps there 91.4 / 83.2 (against 100.3 / 96.3; at 1.25M 101.0 against waiting's
#:   101.9): to 1.5M. Lag 6 leaving them: 100.6-100.9 / 100.1-100.2 at 2M / 2.25M against 99.7-99.9 /
#:   99.0-99.1 (three runs / two), but 94.8-95.0 at 2.5M against 98.8-99.1: to 2.25M.
#: - Not taken: float32 forward (lag 5 by 8192, 4M: 86.1 against 92.2 leaving rows to the steps); the
#:   waiting lag-6 rings near their capacity gave waits up (bf16 backward 5M, float32 2.5M: tens of
#:   thousands of fallbacks). The row sent at the write's own step (early 0) lost to one step early:
#:   bf16 forward 9M 77.4 against 78.9, backward 4M 89.0 against 96.4 (both waiting). A second read
#:   at the top of the write's own step, then a wait there, where the first read finds words pending
#:   (session 33, branch wip/words-per-program): bf16 forward 9M 80.5 against 77.4, but 8M + 64 / 10M
#:   73.1 / 76.0 against 78.9 / 77.3, backward 3M 84.0 against 97.9.
#: - Not taken either (session 33, same branch): one word per program and row instead of one per
#:   chunk (a reader then merges the grid's 132-396 words, not up to 2048): 6-11 points slower
#:   everywhere but the lag-7 forward at 12M (+2) (our reading: every row then waits for every program).
MERGE_PARTITIONS = {("fwd", 2, (8192, 4, 7, 1, 5)): (4, 1, 128, 8650752, 8388608),
                    ("fwd", 2, (8192, 4, 7, 1, 6)): (4, 1, 128, 1 << 40, 0),
                    ("bwd", 2, (4096, 4, 7, 1, 5)): (4, 1, 128, 3145728, 0),
                    ("bwd", 2, (4096, 4, 7, 1, 6)): (4, 1, 128, 4194304, 0),
                    ("bwd", 4, (4096, 4, 7, 1, 5)): (4, 1, 248, 1572864, 1572864),
                    ("bwd", 4, (4096, 4, 7, 1, 6)): (4, 1, 248, 2359296, 0),
                    ("bwd", 4, (4096, 4, 7, 1, 7)): (4, 1, 248, 2621440, 0)}
MERGE_REGS = 64


def tma_only(direction: str, elem: int, config) -> bool:
    """Whether the table takes ``config`` for (direction, element size) only on rows that can take
    TMA loads."""
    return tuple(config[:5]) in TMA_ONLY_CONFIGS[direction, elem]

#: Most chunks one row can have (the partial words of a row are read as one block of at least
#: WORDS_BLOCK, a power of two).
MAX_PROGRAMS_PER_ROW = 2048
WORDS_BLOCK = 512
#: A partial word not written yet: low half the bits of -1.0, which no partial's low half can be
#: (forward: a sum of exponentials, >= 0 or NaN; backward: the flag 1.0).
PENDING_WORD = 0xBF800000


if gluon is not None:
    PENDING_LO = gl.constexpr(PENDING_WORD - (1 << 32))  # the low half as an int32
    PENDING = gl.constexpr(PENDING_WORD)
    IDENTITY_FWD = gl.constexpr(-(1 << 55))  # the word of (max, sum) = (-inf, 0): bits 0xFF800000 << 32
    LOG2E = gl.constexpr(1.4426950408889634)
    FIFO = gl.constexpr(8)  # the longest lag of a deep ring (its units behind are kept in vectors of 8)

    @gluon.jit
    def _row_start(row, stride, ALIGN: gl.constexpr):
        """(offset, h) of ``row``'s chunks: the row's start (h = 0) or, ALIGN > 1 (rows not 16-byte
        aligned, ``softmax_fwd.row_align``), that rounded down to ALIGN elements, in a form the compiler
        knows aligned, and the h elements of the row before it that this took off; chunk q then holds
        the row's elements q * CHUNK - h ... (its first one's head and the last one's tail are a
        neighbour's elements, in the same 16 bytes, or copied as zeros)."""
        o = row.to(gl.int64) * stride
        if ALIGN > 1:
            base = (o // ALIGN) * ALIGN
            return base, (o - base).to(gl.int32)
        else:
            return o, 0

    @gluon.jit
    def _issue(A, B, DA, DB, ring_a, ring_b, bars, i, row, q, N, stride_a, stride_b, offs,
               BWD: gl.constexpr, EVICT: gl.constexpr, TMA: gl.constexpr, ALIGN: gl.constexpr,
               CHUNK: gl.constexpr):
        """Start the copies of chunk ``q`` of ``row`` into ring slot ``i``: its CHUNK / SUB sub-tiles of
        SUB = ``offs.shape[0]`` elements (``offs`` from the sub-tile's start; the chunk's from the row's,
        ``_row_start``) into the ring's entries i * KSUB + j (``sub_tile``); cp.async (counted by the
        thread's commit groups) or, ``TMA``, one bulk copy per input and sub-tile, all completing on
        ``bars[i]``."""
        SUB: gl.constexpr = offs.shape[0]
        KSUB: gl.constexpr = CHUNK // SUB
        if TMA:
            if BWD:
                mbarrier.expect(bars.index(i), KSUB * (DA.block_type.nbytes + DB.block_type.nbytes))
            else:
                mbarrier.expect(bars.index(i), KSUB * DA.block_type.nbytes)
            rows_per_sub: gl.constexpr = DA.block_type.shape[1]
            for j in gl.static_range(KSUB):
                _tma_load(DA, [row, (q * KSUB + j) * rows_per_sub, 0], bars.index(i), _box(ring_a.index(i * KSUB + j)))
                if BWD:
                    _tma_load(DB, [row, (q * KSUB + j) * rows_per_sub, 0], bars.index(i),
                              _box(ring_b.index(i * KSUB + j)))
        else:
            base_a, h = _row_start(row, stride_a, ALIGN)
            if BWD:
                base_b, _ = _row_start(row, stride_b, ALIGN)
            end = N + h
            if ALIGN > 1:  # whole aligned vectors: the row's last one too
                end = (end + ALIGN - 1) // ALIGN * ALIGN
            for j in gl.static_range(KSUB):
                start = q.to(gl.int64) * CHUNK + j * SUB
                ok = offs < (end - start).to(gl.int32)
                _cp_async(_flat(ring_a.index(i * KSUB + j)), A + base_a + start + offs, mask=ok, eviction_policy=EVICT)
                if BWD:
                    _cp_async(_flat(ring_b.index(i * KSUB + j)), B + base_b + start + offs, mask=ok,
                              eviction_policy=EVICT)

    @gluon.jit
    def _claim_start(P, M, Q, lanes):
        """Take the next unit in memory order from the counter ``P[M * Q]`` (which starts at
        PENDING_WORD): one atomic, by lane 0 of ``lanes`` (an arange); its result stays in that lane
        until ``_claim_take``, so no thread waits for it here."""
        return gl.atomic_add(P + M * Q + lanes * 0, gl.where(lanes == 0, 1, 0).to(gl.int64), mask=lanes == 0,
                             sem="relaxed")

    @gluon.jit
    def _claim_take(claim, lanes, Q):
        """(row, chunk) of a unit started by ``_claim_start``; a row >= M: none left."""
        u = (gl.sum(gl.where(lanes == 0, claim, 0), axis=0) - PENDING).to(gl.int32)
        row = u // Q
        return row, u - row * Q

    @gluon.jit
    def _load_unit(ring_a, ring_b, i, row, q, N, stride_a, offs, BWD: gl.constexpr, layout: gl.constexpr,
                   ALIGN: gl.constexpr, CHUNK: gl.constexpr, j: gl.constexpr = 0):
        """Sub-tile ``j`` of chunk ``q`` of ``row`` (landed in ring slot ``i``; ``_issue``) in registers, in
        the inputs' dtypes: (a, b), b = a forward. Outside the row (past its end; with ALIGN > 1 also the
        neighbours' elements of its end vectors, ``_row_start``) the forward reads -inf, the backward 0
        (rewritten in the slot, where the write reads the chunk again)."""
        SUB: gl.constexpr = offs.shape[0]
        KSUB: gl.constexpr = CHUNK // SUB
        _, h = _row_start(row, stride_a, ALIGN)
        start = q.to(gl.int64) * CHUNK + j * SUB
        first = (h - start).to(gl.int32)  # the sub-tile's elements first ... end - 1 are the row's
        end = N + h - start
        if (not BWD) or (ALIGN > 1):  # (the backward's tail was copied as zeros)
            if (first > 0) | (end < SUB):
                ok = (offs >= first) & (offs < end.to(gl.int32))
                slot = _flat(ring_a.index(i * KSUB + j))
                if BWD:
                    slot.store(gl.where(ok, slot.load(layout), 0.0))
                    slot = _flat(ring_b.index(i * KSUB + j))
                    slot.store(gl.where(ok, slot.load(layout), 0.0))
                else:
                    slot.store(gl.where(ok, slot.load(layout), float("-inf")))
        a = _flat(ring_a.index(i * KSUB + j)).load(layout)
        b = a
        if BWD:
            b = _flat(ring_b.index(i * KSUB + j)).load(layout)
        return a, b

    @gluon.jit
    def _publish(P, row, q, Q, a, b, BWD: gl.constexpr):
        """Reduce a chunk (a, b) of ``row`` to its partial and publish it as word ``q`` of the row."""
        cm, cs = _chunk_stat(a.to(gl.float32), b.to(gl.float32), BWD)
        gl.store(P + row.to(gl.int64) * Q + q, _pack(cm, cs))

    @gluon.jit
    def _reduce_unit(ring_a, ring_b, i, P, row, q, Q, N, stride_a, offs, BWD: gl.constexpr, layout: gl.constexpr,
                     ALIGN: gl.constexpr, CHUNK: gl.constexpr):
        """Reduce chunk ``q`` of ``row`` (landed in ring slot ``i``) to its partial and publish it as
        its word. A chunk of several sub-tiles (KSUB > 1) is reduced a sub-tile at a time, into
        per-element accumulators and then across the CTA once (the forward reads its sub-tiles twice:
        their max, then the sum of exponentials). Sub-tiles wholly past the row's end read as such
        (``_load_unit``); skipping them by a branch cost the bf16 forward up to 10 points (session 41)."""
        SUB: gl.constexpr = offs.shape[0]
        KSUB: gl.constexpr = CHUNK // SUB
        if KSUB == 1:
            a, b = _load_unit(ring_a, ring_b, i, row, q, N, stride_a, offs, BWD, layout, ALIGN, CHUNK)
            _publish(P, row, q, Q, a, b, BWD)
        else:
            if BWD:
                acc = gl.zeros([SUB], gl.float32, layout)
                for j in gl.static_range(KSUB):
                    a, b = _load_unit(ring_a, ring_b, i, row, q, N, stride_a, offs, BWD, layout, ALIGN, CHUNK, j)
                    acc += a.to(gl.float32) * b.to(gl.float32)
                cm = gl.sum(acc, axis=0)
                cs = gl.to_tensor(1.0)
            else:
                top = gl.full([SUB], float("-inf"), gl.float32, layout)
                for j in gl.static_range(KSUB):
                    a, a_again = _load_unit(ring_a, ring_b, i, row, q, N, stride_a, offs, BWD, layout, ALIGN, CHUNK, j)
                    top = gl.maximum(top, a.to(gl.float32))
                cm = gl.max(top, axis=0)
                shift = gl.where(cm == float("-inf"), 0.0, cm)
                acc = gl.zeros([SUB], gl.float32, layout)
                for j in gl.static_range(KSUB):  # (outside the row: -inf, rewritten by _load_unit)
                    a = _slot_f32(ring_a, i * KSUB + j, layout)
                    acc += _exp_over(a, shift, None, False)
                cs = gl.sum(acc, axis=0)
            gl.store(P + row.to(gl.int64) * Q + q, _pack(cm, cs))

    @gluon.jit
    def _pending(DEEP: gl.constexpr, fifo_row, old_row, prev_row, cur_row, M):
        """Whether a program has a unit left to reduce or write (rows >= M stand for none)."""
        if DEEP:
            return (gl.min(fifo_row, axis=0) < M) | (cur_row < M)
        else:
            return (old_row < M) | (prev_row < M) | (cur_row < M)

    @gluon.jit
    def _fifo_get(fifo, idx, i):
        """Entry ``i`` of a small int32 vector held whole by every thread (entries >= 0)."""
        return gl.max(gl.where(idx == i, fifo, -1), axis=0)

    @gluon.jit
    def _fifo_put(fifo, idx, i, value):
        """The vector with entry ``i`` set to ``value`` (each thread changes its own copy)."""
        return gl.where(idx == i, value, fifo)

    @gluon.jit
    def _wait_slot(bars, i, phase, outstanding: gl.constexpr, TMA: gl.constexpr):
        """Wait until the copies into ring slot ``i`` have landed: its barrier's ``phase`` (TMA), or
        all but the last ``outstanding`` cp.async groups of this thread, then the CTA's."""
        if TMA:
            mbarrier.wait(bars.index(i), phase)
        else:
            async_copy.wait_group(outstanding)
            _cta_barrier()

    @gluon.jit
    def _flat(slot):
        """A ring slot seen as one row of its elements (the registers' view)."""
        n: gl.constexpr = slot.shape[0] * slot.shape[1]
        return slot.reinterpret(slot.dtype, [n], gl.SwizzledSharedLayout(1, 1, 1, [0]))

    @triton.constexpr_function
    def _word_layout(layout):
        """The registers' layout of a 16-bit ``layout``'s elements two to a 32-bit word."""
        return gl.BlockedLayout([layout.size_per_thread[0] // 2], layout.threads_per_warp, layout.warps_per_cta,
                                layout.order)

    @gluon.jit
    def _held_words(slot, layout: gl.constexpr):
        """A slot's chunk as registers hold it while it waits: 16-bit elements two to a 32-bit word
        (the first in the low half), 32-bit ones as they are. (A 16-bit tensor takes a register per
        element: held so, a bf16 chunk of 16384 by 4 warps spilled 184 bytes.)"""
        n: gl.constexpr = slot.shape[0] * slot.shape[1]
        if slot.dtype.primitive_bitwidth == 16:
            words = slot.reinterpret(gl.int32, [n // 2], gl.SwizzledSharedLayout(1, 1, 1, [0])).load(
                _word_layout(layout))
        else:
            words = _flat(slot).load(layout)
        return words

    @gluon.jit
    def _slot_f32(ring, e, layout: gl.constexpr):
        """Ring entry ``e`` (a chunk, or a chunk's sub-tile) in registers (``layout``), as float32."""
        return _flat(ring.index(e)).load(layout).to(gl.float32)

    @gluon.jit
    def _held_f32(held, HOLD: gl.constexpr, dtype: gl.constexpr, layout: gl.constexpr):
        """A chunk of ``dtype`` that waited in registers, as float32: ``HOLD`` as loaded, else as
        ``_held_words`` keeps it."""
        if HOLD:
            chunk = held.to(gl.float32)
        else:
            chunk = _held_chunk(held, dtype, layout).to(gl.float32)
        return chunk

    @gluon.jit
    def _held_zeros(dtype: gl.constexpr, n: gl.constexpr, layout: gl.constexpr):
        """``_held_words`` of n zeros of ``dtype`` (the loop's first value)."""
        if dtype.primitive_bitwidth == 16:
            words = gl.zeros([n // 2], gl.int32, _word_layout(layout))
        else:
            words = gl.zeros([n], dtype, layout)
        return words

    @gluon.jit
    def _held_chunk(words, dtype: gl.constexpr, layout: gl.constexpr):
        """The chunk (``dtype``, ``layout``) of its ``_held_words`` (no data moves between threads)."""
        if dtype.primitive_bitwidth == 16:
            lo = words.to(gl.int16).to(dtype, bitcast=True)
            hi = (words >> 16).to(gl.int16).to(dtype, bitcast=True)
            chunk = gl.convert_layout(gl.join(lo, hi).reshape([2 * words.shape[0]]), layout, assert_trivial=True)
        else:
            chunk = words
        return chunk

    @gluon.jit
    def _box(slot):
        """A ring slot (R, W) seen as the (1, R, W) box of an (M, N / W, W) descriptor (TMA's view)."""
        return slot.reinterpret(slot.dtype, [1, slot.shape[0], slot.shape[1]],
                                gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                     element_bitwidth=slot.dtype.primitive_bitwidth, rank=3))

    @gluon.jit
    def _pack(stat, aux):
        """One 64-bit word from two float32 scalars (stat in the high half): stored in one piece, so a
        reader sees all of a partial or none of it."""
        hi = stat.to(gl.int32, bitcast=True).to(gl.int64)
        lo = aux.to(gl.int32, bitcast=True).to(gl.int64) & 0xFFFFFFFF
        return (hi << 32) | lo

    @gluon.jit
    def _row_words(P, Q, BWD: gl.constexpr, PBLK: gl.constexpr, layout: gl.constexpr):
        """The Q partial words of a row (Q <= PBLK), read past L1; padding is the merge's identity."""
        idx = gl.arange(0, PBLK, layout)
        return gl.load(P + idx, mask=idx < Q, other=0 if BWD else IDENTITY_FWD, volatile=True)

    @gluon.jit
    def _add_pair(p, s, q, t):
        """gl.reduce's combine of (count, sum) pairs."""
        return p + q, s + t

    @gluon.jit
    def _count_max(p, m, q, cm):
        """gl.reduce's combine of (count, max) pairs."""
        return p + q, gl.maximum(m, cm)

    @gluon.jit
    def _words_stat(w, BWD: gl.constexpr):
        """(words still PENDING, stat) of a row's partial words ``w`` in one reduction across the CTA:
        forward the largest max, backward the sum of the dots."""
        pending = (w.to(gl.int32) == PENDING_LO).to(gl.int32)
        hi = (w >> 32).to(gl.int32).to(gl.float32, bitcast=True)
        if BWD:
            n, stat = gl.reduce((pending, hi), 0, _add_pair)
        else:
            n, stat = gl.reduce((pending, hi), 0, _count_max)
        return n, stat

    @gluon.jit
    def _row_stat(P, w, Q, spin_max, ERR, BWD: gl.constexpr, PBLK: gl.constexpr, layout: gl.constexpr):
        """(all in, stat, sum) of a row from its partial words ``w``, re-read until none is PENDING.

        A word still PENDING after ``spin_max`` re-reads counts in ``ERR``; the caller then computes the
        row's statistic from the inputs (``spin_max < 0``: always, which tests use). Each read of the
        words takes one reduction across the CTA (``_words_stat``: whether all are in and the stat
        together), the forward's sum one more: four were taken before (the loop's test, the final test,
        the max, the sum). On an H200 +1.7 to +2.9 points of copy in the forward at bf16 1M-2M and fp32
        2M, -0.2 to -1.2 at 64K, fp32 1M, bf16 4M and the bf16 backward (session 26)."""
        n, stat = _words_stat(w, BWD)
        spins = 0
        while (n != 0) & (spins < spin_max):
            w = _row_words(P, Q, BWD, PBLK, layout)
            n, stat = _words_stat(w, BWD)
            spins += 1
        done = (n == 0) & (spin_max >= 0)
        gl.atomic_add(ERR, 1, mask=done == 0, sem="relaxed")
        return done, stat, _words_aux(w, stat, BWD)

    @gluon.jit
    def _words_aux(w, stat, BWD: gl.constexpr):
        """The second half of a row's statistic from its partial words ``w``, all in, and their merged
        ``stat``: forward the sum of exp(x - stat) over the row; backward 0 (unused)."""
        if BWD:
            aux = 0.0
        else:
            hi = (w >> 32).to(gl.int32).to(gl.float32, bitcast=True)
            lo = w.to(gl.int32).to(gl.float32, bitcast=True)
            shift = gl.where(stat == float("-inf"), 0.0, stat)
            aux = gl.sum(lo * gl.exp(hi - shift), axis=0)
        return aux

    @gluon.jit
    def _exp2_ftz(x):
        """2^x of a float32 block as one MUFU op (ex2.approx.ftz): results below 2^-126 flush to 0.

        Plain ex2.approx.f32 costs three more instructions per element for subnormal results; the
        bf16 forward (two exponentials per element) went from 64-70% to 81-84% of copy without them
        on an H200. Only float32 results under 1.2e-38 change (to 0)."""
        return gl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=gl.float32,
                                         is_pure=True, pack=1)

    @gluon.jit
    def _exp_over(a, shift, total, FOLD: gl.constexpr):
        """exp(a - shift) / total of a float32 block (a <= shift or -inf; shift finite; ``total``
        None: no division; total 0 gives 0).

        a - shift first (exact for close values), then times log2(e), 2^, and 1 / total, each
        rounded once: float32 digits are kept at |x| ~ 1e4. (Folding the shift into one FMA saved
        nothing measurable on an H200 and cost float16 its tolerance at |x| ~ 6e4.)
        ``FOLD``: the division folded into the exponent instead, 2^((a - shift) log2(e) - log2(total))
        in one FMA: one multiply less per element, at a relative error of ~6e-8 * log2(total) (1e-6
        for rows of 2^20), so only for 16-bit outputs, which round to 4e-3."""
        d = a - shift
        if total is None:
            e = _exp2_ftz(d * LOG2E)
        elif FOLD:
            e = _exp2_ftz(gl.fma(d, LOG2E, -gl.where(total > 0, gl.log2(total), 0.0)))
        else:
            e = _exp2_ftz(d * LOG2E) * gl.where(total > 0, 1.0 / total, 0.0)
        return e

    @gluon.jit
    def _output(a, b, m, s, BWD: gl.constexpr, FOLD: gl.constexpr):
        """What the write stores for float32 inputs a, b of a row with statistic (m, s): backward dx =
        y * (dy - dot) (a = y, b = dy, m = dot); forward y = exp(a - m) / s (``_exp_over``; a row
        with sum 0 is all -inf: y = 0)."""
        if BWD:
            return a * (b - m)
        else:
            return _exp_over(a, gl.where(m == float("-inf"), 0.0, m), s, FOLD)

    @gluon.jit
    def _body(cols, first, end, ALIGN: gl.constexpr):
        """Mask of the columns ``cols`` of a chunk in the aligned vectors wholly inside the row, whose
        elements are its columns first ... end - 1 (int32; ALIGN > 1, ``_row_start``)."""
        return (cols >= (first + ALIGN - 1) // ALIGN * ALIGN) & (cols < end // ALIGN * ALIGN)

    @gluon.jit
    def _write_ends(A, B, OUT, row, start, first, end, stride_a, stride_b, stride_o, m, s, BWD: gl.constexpr,
                    FOLD: gl.constexpr, CHUNK: gl.constexpr, EVICT: gl.constexpr, ALIGN: gl.constexpr):
        """Write the row's elements in the chunk at column ``start`` of its shifted row (``_row_start``;
        its elements are the chunk's columns first ... end - 1) that lie in its end vectors, the ones
        only partly in the row (the chunk's vectors store the others, ``_body``): computed again from the
        inputs (a few bytes, just read) on a tile of those two vectors, stored one element at a time."""
        elayout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        j = gl.arange(0, 2 * ALIGN, elayout)
        # the vector at the chunk's first column, then the one holding column end (where the row ends)
        cols = gl.where(j < ALIGN, j, end // ALIGN * ALIGN + j - ALIGN)
        ok = (cols >= first) & (cols < end) & (cols >= 0) & (cols < CHUNK) & (_body(cols, first, end, ALIGN) == 0)
        base_a, _ = _row_start(row, stride_a, ALIGN)
        a = gl.load(A + base_a + start + cols, mask=ok, other=0.0).to(gl.float32)
        b = a
        if BWD:
            base_b, _ = _row_start(row, stride_b, ALIGN)
            b = gl.load(B + base_b + start + cols, mask=ok, other=0.0).to(gl.float32)
        base_o, _ = _row_start(row, stride_o, ALIGN)
        gl.store(OUT + base_o + start + cols, _output(a, b, m, s, BWD, FOLD).to(OUT.dtype.element_ty), mask=ok,
                 eviction_policy=EVICT)

    @gluon.jit
    def _store_sub(OUT, o, a, b, m, s, offs, first, end, BWD: gl.constexpr, FOLD: gl.constexpr, EVICT: gl.constexpr,
                   ALIGN: gl.constexpr):
        """Store the outputs (``_output``) of one sub-tile of float32 inputs a, b of a row with statistic
        (m, s) at OUT + o + offs, where its columns first ... end - 1 are the row's (int32): all of those,
        or, ALIGN > 1, the vectors wholly inside the row (``_body``; ``_write_ends`` writes the rest)."""
        out = _output(a, b, m, s, BWD, FOLD).to(OUT.dtype.element_ty)
        if ALIGN > 1:
            ok = _body(offs, first, end, ALIGN)
        else:
            ok = offs < end
        gl.store(OUT + o + offs, out, mask=ok, eviction_policy=EVICT)

    @gluon.jit
    def _chunk_stat(a, b, BWD: gl.constexpr):
        """(stat, aux) of one float32 chunk: forward (max, sum of exp(a - max)); backward (dot, 1).

        Elements past the row's end must read -inf forward and 0 backward."""
        if BWD:
            return gl.sum(a * b, axis=0), gl.to_tensor(1.0)
        else:
            m = gl.max(a, axis=0)
            shift = gl.where(m == float("-inf"), 0.0, m)
            return m, gl.sum(_exp_over(a, shift, None, False), axis=0)

    @gluon.jit
    def _merge_pair(m, s, cm, cs, BWD: gl.constexpr):
        """Fold one partial (cm, cs) into a running (m, s): backward a sum, forward the LSE rule."""
        if BWD:
            return m + cm, s
        else:
            m_new = gl.maximum(m, cm)
            shift = gl.where(m_new == float("-inf"), 0.0, m_new)
            return m_new, s * gl.exp(m - shift) + cs * gl.exp(cm - shift)

    @gluon.jit
    def _row_from_global(A, B, row, N, stride_a, stride_b, BWD: gl.constexpr, PIECE: gl.constexpr,
                         layout: gl.constexpr, ALIGN: gl.constexpr):
        """The row's statistic read from the inputs themselves, PIECE elements (``layout``) at a time
        (from ``_row_start``'s offset): the fallback after a wait gives up (``_staged_steps`` picks
        PIECE)."""
        if BWD:
            m = 0.0
        else:
            m = float("-inf")
        s = 0.0
        offs = gl.arange(0, PIECE, layout)
        base_a, h = _row_start(row, stride_a, ALIGN)
        base_b, _ = _row_start(row, stride_b, ALIGN)
        end = N + h
        for c in range(0, (end + PIECE - 1) // PIECE):
            start = c.to(gl.int64) * PIECE
            last = end
            if ALIGN > 1:  # whole vectors, the neighbours' elements then dropped
                last = (end + ALIGN - 1) // ALIGN * ALIGN
            ok = offs < (last - start).to(gl.int32)
            a = gl.load(A + base_a + start + offs, mask=ok, other=0.0).to(gl.float32)
            b = a
            if BWD:
                b = gl.load(B + base_b + start + offs, mask=ok, other=0.0).to(gl.float32)
            inside = (offs >= h - start) & (offs < (end - start).to(gl.int32))
            if BWD:
                a = gl.where(inside, a, 0.0)
                b = gl.where(inside, b, 0.0)
            else:
                a = gl.where(inside, a, float("-inf"))
                b = a
            cm, cs = _chunk_stat(a, b, BWD)
            m, s = _merge_pair(m, s, cm, cs, BWD)
        return m, s

    @gluon.jit
    def _merged_row(A, B, P, ERR, PRIOR, words, row, M, N, stride_a, stride_b, Q, spin_max, BWD: gl.constexpr,
                    PIECE: gl.constexpr, PBLK: gl.constexpr, HAS_PRIOR: gl.constexpr, layout: gl.constexpr,
                    playout: gl.constexpr, ALIGN: gl.constexpr):
        """(stat, sum) of ``row`` from its partial words (``words``: a first read of them), or, where
        the wait gives up, from the inputs themselves (``_row_stat``, ``_row_from_global``); with
        ``HAS_PRIOR``, merged with the statistic of the row's other columns, (PRIOR[row],
        PRIOR[M + row])."""
        done, m, s = _row_stat(P + row.to(gl.int64) * Q, words, Q, spin_max, ERR, BWD, PBLK, playout)
        if not done:
            m, s = _row_from_global(A, B, row, N, stride_a, stride_b, BWD, PIECE, layout, ALIGN)
        if HAS_PRIOR:
            m, s = _merge_pair(m, s, gl.load(PRIOR + row), gl.load(PRIOR + M + row), BWD)
        return m, s

    @gluon.jit(do_not_specialize=["M", "Q", "spin_max"])
    def _staged_kernel(A, B, OUT, DA, DB, LSE, P, ERR, PRIOR, M, N, stride_a, stride_b, stride_o, Q, spin_max,
                       BWD: gl.constexpr, CHUNK: gl.constexpr, STAGES: gl.constexpr, AHEAD: gl.constexpr,
                       LAG: gl.constexpr, PBLK: gl.constexpr, LOAD_EVICT: gl.constexpr,
                       STORE_EVICT: gl.constexpr, FOLD: gl.constexpr, TMA_LOAD: gl.constexpr,
                       TMA_W: gl.constexpr, CLAIM: gl.constexpr, HAS_PRIOR: gl.constexpr,
                       MERGE_WARPS: gl.constexpr, MERGE_EARLY: gl.constexpr, MERGE_REGS: gl.constexpr,
                       MERGE_WAITS: gl.constexpr, ALIGN: gl.constexpr, LATE_CLAIM: gl.constexpr):
        """One program of the grid: one unit (chunk u % Q of row u // Q) per step, claimed from the
        counter (``CLAIM``) or fixed (see the module doc); the steps are ``_staged_steps``.

        A (M, N) is x forward / y backward, B is dy backward (A again forward); OUT (M, N) contiguous;
        LSE (M,) float32 (forward only); P (M * Q + 1) int64: the partial words, all PENDING_WORD,
        and the claim counter (also PENDING_WORD); Q <= PBLK and Q <= max(LAG - 1, 1) x the grid (without
        CLAIM, Q <= the grid, a multiple of Q). The ring is one of ``RINGS``.
        HAS_PRIOR: A and B are the first N columns of longer rows, whose other columns' statistic
        (forward (max, sum of exp(x - max)), backward (dot, unused)) is PRIOR[0:2M] as two (M,) float32
        vectors; it merges into each row's statistic, which goes to PRIOR[2M:4M] (the other columns
        are then written from it). Unused otherwise.
        FOLD: the forward's division folded into its exponent (16-bit outputs, see ``_exp_over``).
        TMA_LOAD: the chunks arrive by TMA through DA, DB, the (M, N / TMA_W, TMA_W) views of A and
        B with (1, CHUNK / TMA_W, TMA_W) boxes (unused otherwise).
        MERGE_WARPS > 0 (deep rings, LAG >= 3): a partition of that many more warps (MERGE_REGS
        registers each) merges the rows' partial words (``_merge_partition``), MERGE_EARLY (0 or 1)
        steps before the unit that needs the row's statistic is written, off the steps' path; where
        some of a row's words are still pending then, the partition waits for them (``MERGE_WAITS``)
        or leaves the row to the steps, which read its words as without a partition.
        ALIGN > 1 (cp.async rows that do not start on 16 bytes, ``softmax_fwd.row_align``): each row's
        chunks start at its start rounded down to ALIGN elements (``_row_start``), so that the copies
        and the stores move 16-byte vectors; Q then counts N + ALIGN - 1 elements.
        """
        gl.static_assert((MERGE_WARPS == 0) | ((LAG >= 3) & ((MERGE_EARLY == 0) | (MERGE_EARLY == 1))),
                         "a merging partition serves the deep rings (LAG >= 3), 0 or 1 steps early")
        gl.static_assert(((STAGES == 3) & (AHEAD == 1) & (LAG == 1)) | ((STAGES == 3) & (AHEAD == 2) & (LAG == 2))
                         | (((STAGES == LAG + 2) | (STAGES == LAG + 1) | (STAGES == LAG)) & (STAGES >= 3) & (AHEAD == 1)
                            & (LAG >= 2) & (LAG <= FIFO)),
                         "the rings are 3 slots, 1 ahead, lag 1; 3 slots, 2 ahead, lag 2 (in registers); "
                         "LAG + 2 slots, or LAG + 1 and one chunk in registers, or LAG (>= 3) and two, 1 ahead, "
                         "lag 2..8")
        # the ring: STAGES slots of KSUB sub-tiles (R, W) each, SUB = R * W elements (the largest power of
        # two that divides CHUNK), row-major (no swizzle) in both layouts; slot i's sub-tile j is entry
        # i * KSUB + j
        SUB: gl.constexpr = CHUNK & (-CHUNK)
        KSUB: gl.constexpr = CHUNK // SUB
        if TMA_LOAD:
            W: gl.constexpr = TMA_W
            shared_a: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                          element_bitwidth=A.dtype.element_ty.primitive_bitwidth,
                                                          rank=2)
            shared_b: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=0,
                                                          element_bitwidth=B.dtype.element_ty.primitive_bitwidth,
                                                          rank=2)
        else:
            W: gl.constexpr = SUB
            shared_a: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
            shared_b: gl.constexpr = shared_a
        ring_a = gl.allocate_shared_memory(A.dtype.element_ty, [STAGES * KSUB, SUB // W, W], shared_a)
        if BWD:
            ring_b = gl.allocate_shared_memory(B.dtype.element_ty, [STAGES * KSUB, SUB // W, W], shared_b)
        else:
            ring_b = ring_a
        if TMA_LOAD:  # one barrier per slot: its copies have landed
            bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(STAGES):
                mbarrier.init(bars.index(i), count=1)
            fence_async_shared()
        else:
            bars = ring_a  # unused
        MERGE: gl.constexpr = MERGE_WARPS > 0
        if MERGE:  # two-item queues between the partitions: rows to merge, their statistics back
            queue_layout: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [0])
            rows = gl.allocate_shared_memory(gl.int32, [2, 2], queue_layout)
            stats = gl.allocate_shared_memory(gl.float32, [2, 2], queue_layout)
            queue_bars = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
            for i in gl.static_range(4):
                mbarrier.init(queue_bars.index(i), count=1)
            fence_async_shared()
            gl.warp_specialize([(_staged_steps, (A, B, OUT, DA, DB, LSE, P, ERR, PRIOR, M, N, stride_a, stride_b,
                                                 stride_o, Q, spin_max, ring_a, ring_b, bars, rows, stats, queue_bars,
                                                 BWD, CHUNK, STAGES, AHEAD, LAG, PBLK, LOAD_EVICT, STORE_EVICT, FOLD,
                                                 TMA_LOAD, CLAIM, HAS_PRIOR, MERGE, MERGE_EARLY, MERGE_WAITS,
                                                 ALIGN, LATE_CLAIM)),
                                (_merge_partition, (A, B, P, ERR, PRIOR, M, N, stride_a, stride_b, Q, spin_max, rows,
                                                    stats, queue_bars, BWD, PBLK, HAS_PRIOR, MERGE_WAITS, ALIGN))],
                               [MERGE_WARPS], [MERGE_REGS])
        else:
            _staged_steps(A, B, OUT, DA, DB, LSE, P, ERR, PRIOR, M, N, stride_a, stride_b, stride_o, Q, spin_max,
                          ring_a, ring_b, bars, bars, bars, bars, BWD, CHUNK, STAGES, AHEAD, LAG, PBLK, LOAD_EVICT,
                          STORE_EVICT, FOLD, TMA_LOAD, CLAIM, HAS_PRIOR, MERGE, MERGE_EARLY, MERGE_WAITS, ALIGN,
                          LATE_CLAIM)

    @gluon.jit
    def _staged_steps(A, B, OUT, DA, DB, LSE, P, ERR, PRIOR, M, N, stride_a, stride_b, stride_o, Q, spin_max,
                      ring_a, ring_b, bars, rows, stats, queue_bars, BWD: gl.constexpr, CHUNK: gl.constexpr,
                      STAGES: gl.constexpr, AHEAD: gl.constexpr, LAG: gl.constexpr, PBLK: gl.constexpr,
                      LOAD_EVICT: gl.constexpr, STORE_EVICT: gl.constexpr, FOLD: gl.constexpr,
                      TMA_LOAD: gl.constexpr, CLAIM: gl.constexpr, HAS_PRIOR: gl.constexpr, MERGE: gl.constexpr,
                      MERGE_EARLY: gl.constexpr, MERGE_WAITS: gl.constexpr, ALIGN: gl.constexpr,
                      LATE_CLAIM: gl.constexpr):
        """A program's steps (``_staged_kernel``'s arguments; ``ring_a``, ``ring_b``: its slots, ``bars``
        their TMA barriers). ``MERGE``: the rows' statistics come from the merging partition through
        ``rows`` and ``stats`` (``_queue_put``, ``_queue_get``; ``queue_bars`` 0-1 and 2-3): item t is
        the row of the unit written at step t, sent at step t - MERGE_EARLY, its statistic taken at
        step t (every item, in order: a slot is reused two items on), a sum < 0 where the partition
        left the row to the steps (not ``MERGE_WAITS``: its read found words pending). ``LATE_CLAIM``: see
        the module's knob (deep rings with claimed units)."""
        VEC: gl.constexpr = 128 // A.dtype.element_ty.primitive_bitwidth
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
        playout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        SUB: gl.constexpr = CHUNK & (-CHUNK)  # a chunk's sub-tiles (``_issue``): KSUB of SUB elements
        KSUB: gl.constexpr = CHUNK // SUB
        offs = gl.arange(0, SUB, layout)
        LAG2: gl.constexpr = LAG == 2
        AHEAD2: gl.constexpr = AHEAD == 2
        HOLD: gl.constexpr = LAG2 and (STAGES == 3) and AHEAD2  # the waiting chunks are held in registers
        # lag L in L + 1 slots, 1 ahead: the unit written at step t moves from its slot into registers at
        # the end of step t - 1 (old_a, old_b: ``_held_words``), so that its slot takes the load at the top
        # of step t
        HOLD_OLD: gl.constexpr = (LAG >= 2) and (STAGES <= LAG + 1) and (AHEAD == 1)
        # lag L in L slots: the unit written at step t + 1 leaves its slot at the end of step t - 1 too
        # (next_a, next_b; at the end of step t it becomes old_a, old_b): two chunks in registers
        HOLD2: gl.constexpr = HOLD_OLD and (STAGES == LAG)
        gl.static_assert((KSUB == 1) | ((not HOLD) & (not HOLD_OLD)),
                         "chunks of several sub-tiles (CHUNK not a power of two) wait in their slots only")
        # the fallback's reads of a row (``_row_from_global``): a vector per thread at a time, but whole
        # chunks in aligned rings that hold chunks in registers. (Session 35, H200, bf16 forward: vectors
        # ran 80.9% of copy at 1000448, lag 2 in 4 slots, against 75.3 by chunks, but 89.8 against 93.4
        # at 2M-4M in lag 2 in 3 slots, a chunk in registers; equal elsewhere: the registers its code
        # takes shift what the compiler allocates to the steps.) Not in the backward's lag 2 in 3 slots:
        # since session 34 its whole-chunk reads (y and dy, masked) took the bf16 builds of 8192 x 4 and
        # 16384 x 8 warps past 255 registers (72-80 bytes spilled; 39% of copy at 2M, session 41).
        PIECE: gl.constexpr = (CHUNK if (ALIGN == 1) and (HOLD_OLD or (HOLD and not BWD))
                               else VEC * 32 * gl.num_warps())
        DEEP: gl.constexpr = LAG >= 3  # the units behind in vectors (fifo_row, fifo_q), the row's stat kept
        STEPS_MERGE: gl.constexpr = (not MERGE) or (not MERGE_WAITS)  # the steps read and merge words
        LATE: gl.constexpr = LATE_CLAIM and CLAIM and DEEP  # (LATE_CLAIM)
        # step t holds units, each a (row, chunk): AHEAD loading (for steps t + 1, ..), cur (reduced
        # now), and LAG behind it: the oldest is written now (LAG 2: the one between waits in its slot
        # or, HOLD, in registers). A row >= M stands for none; once no unit is left, none is taken.
        lanes = gl.arange(0, 32 * gl.num_warps(), playout)  # one per thread
        if CLAIM:  # units in memory order from the counter; each claim is taken one step after it starts
            cur_row, cur_q = _claim_take(_claim_start(P, M, Q, lanes), lanes, Q)
            if AHEAD2:
                nxt_row, nxt_q = _claim_take(_claim_start(P, M, Q, lanes), lanes, Q)
            claim = _claim_start(P, M, Q, lanes)
        else:
            cur_row = gl.program_id(0) // Q
            cur_q = gl.program_id(0) - cur_row * Q
            if AHEAD2:
                nxt_row = cur_row + gl.num_programs(0) // Q
                nxt_q = cur_q + 0  # a value of its own (see old_row)
        prev_row = M
        prev_q = 0
        if cur_row < M:
            _issue(A, B, DA, DB, ring_a, ring_b, bars, 0, cur_row, cur_q, N, stride_a, stride_b, offs, BWD,
                   LOAD_EVICT, TMA_LOAD, ALIGN, CHUNK)
        if not TMA_LOAD:
            async_copy.commit_group()
        # LAG 2: the unit written now (prev waits for its step, in its slot or, HOLD, in registers:
        # held_a, held_b). Every carried variable starts as a value of its own: triton carries a
        # variable through a loop only where one pass of the body changes its value, and
        # old_row = prev_row would not change M.
        old_row = M + 0
        old_q = 0
        if AHEAD2:
            if nxt_row < M:
                _issue(A, B, DA, DB, ring_a, ring_b, bars, 1, nxt_row, nxt_q, N, stride_a, stride_b, offs, BWD,
                       LOAD_EVICT, TMA_LOAD, ALIGN, CHUNK)
            if not TMA_LOAD:
                async_copy.commit_group()
            nxt_done = False
        if HOLD:
            old_a = gl.zeros([CHUNK], A.dtype.element_ty, layout)
            if BWD:  # (forward, b is a: not carried twice)
                old_b = gl.zeros([CHUNK], B.dtype.element_ty, layout)
        if HOLD_OLD:  # (as _held_words)
            old_a = _held_zeros(A.dtype.element_ty, CHUNK, layout)
            if BWD:
                old_b = _held_zeros(B.dtype.element_ty, CHUNK, layout)
        if HOLD2:
            next_a = _held_zeros(A.dtype.element_ty, CHUNK, layout)
            if BWD:
                next_b = _held_zeros(B.dtype.element_ty, CHUNK, layout)
        if HOLD:
            held_a = gl.zeros([CHUNK], A.dtype.element_ty, layout)
            if BWD:
                held_b = gl.zeros([CHUNK], B.dtype.element_ty, layout)
        if DEEP:
            # entry t % LAG: the unit reduced at step t - LAG, written at step t; and the last row
            # statistic merged (consecutive written units often share a row: its words are read once)
            flayout: gl.constexpr = gl.BlockedLayout([FIFO], [32], [gl.num_warps()], [0])
            fidx = gl.arange(0, FIFO, flayout)
            fifo_row = gl.zeros([FIFO], gl.int32, flayout) + M
            fifo_q = gl.zeros([FIFO], gl.int32, flayout)
            st_row = M * 0 - 1
            st_m = gl.to_tensor(0.0)
            st_s = gl.to_tensor(1.0)
        else:
            fifo_row = M  # (unused)
        if MERGE:  # items 0 .. MERGE_EARLY - 1 are sent before step 0: none (no unit is written before step LAG)
            for k in gl.static_range(MERGE_EARLY):
                _queue_put(rows, queue_bars, k, M, 0)
        cur_done = False   # cur was reduced early (see below)
        t = 0
        while _pending(DEEP, fifo_row, old_row, prev_row, cur_row, M):
            # every thread is done with the slot refilled below (its unit was written, or LAG 2 loaded
            # into registers, last step)
            _cta_barrier()
            if TMA_LOAD:
                fence_async_shared()  # the threads' accesses to the slot come before the copy's writes
            # the unit AHEAD steps on: from the counter, or the same chunk of the row grid / Q further on
            if AHEAD2:
                last_row = nxt_row
                last_q = nxt_q
            else:
                last_row = cur_row
                last_q = cur_q
            new_row = M
            new_q = 0
            late = False
            if last_row < M:
                if CLAIM:
                    new_row, new_q = _claim_take(claim, lanes, Q)
                    if LATE:  # (the next claim comes after new: in the written unit's row only if new is;
                        # the written unit is read again below: computing it once, up here, ran 0-0.9 points
                        # slower on an H200, session 45)
                        late = new_row == _fifo_get(fifo_row, fidx, t % LAG)
                    if (new_row < M) & (not late):
                        claim = _claim_start(P, M, Q, lanes)
                else:
                    new_row = last_row + gl.num_programs(0) // Q
                    new_q = last_q
            if new_row < M:
                _issue(A, B, DA, DB, ring_a, ring_b, bars, (t + AHEAD) % STAGES, new_row, new_q, N, stride_a,
                       stride_b, offs, BWD, LOAD_EVICT, TMA_LOAD, ALIGN, CHUNK)
            if not TMA_LOAD:
                async_copy.commit_group()  # one group per step, empty or not, so the counts below hold

            # the unit written now; its row's partial words start arriving, used after the reduction
            if DEEP:
                w_row = _fifo_get(fifo_row, fidx, t % LAG)
                w_q = _fifo_get(fifo_q, fidx, t % LAG)
                fresh = w_row != st_row  # the row's statistic is not the one kept
            elif LAG2:
                w_row = old_row
                w_q = old_q
                fresh = True
            else:
                w_row = prev_row
                w_q = prev_q
                fresh = True
            if MERGE:  # the merging partition's read of them: item t + MERGE_EARLY is the row written then
                _queue_put(rows, queue_bars, t + MERGE_EARLY, _fifo_get(fifo_row, fidx, (t + MERGE_EARLY) % LAG), 0)
            words = gl.zeros([PBLK], gl.int64, playout)
            if STEPS_MERGE:
                if (w_row < M) & fresh:
                    words = _row_words(P + w_row.to(gl.int64) * Q, Q, BWD, PBLK, playout)

            # reduce cur as soon as it is in and publish its partial (no wait, no fence); LAG 2 keeps it
            # in registers
            if HOLD:
                cur_a = held_a
                cur_b = held_a
                if BWD:
                    cur_b = held_b
                if cur_row < M:
                    if not cur_done:
                        _wait_slot(bars, t % STAGES, (t // STAGES) & 1, AHEAD, TMA_LOAD)
                    cur_a, cur_b = _load_unit(ring_a, ring_b, t % STAGES, cur_row, cur_q, N, stride_a, offs, BWD, layout,
                                              ALIGN, CHUNK)
                    if not cur_done:
                        _publish(P, cur_row, cur_q, Q, cur_a, cur_b, BWD)
            else:
                if cur_row < M and not cur_done:
                    _wait_slot(bars, t % STAGES, (t // STAGES) & 1, AHEAD, TMA_LOAD)
                    _reduce_unit(ring_a, ring_b, t % STAGES, P, cur_row, cur_q, Q, N, stride_a, offs, BWD, layout, ALIGN,
                                 CHUNK)
            # a program never waits for a row it still holds an unreduced unit of: units in flight
            # in the written unit's row (claims came fast) are reduced now, ahead of their steps. (A
            # claim started this step is in that row only if new is too: deep rings then start it after
            # the wait, LATE; in the others the wait's give-up covers it, never seen there.)
            new_done = False
            if CLAIM:
                if AHEAD2:
                    if (nxt_row == w_row) & (w_row < M) & (not nxt_done):
                        _wait_slot(bars, (t + 1) % STAGES, ((t + 1) // STAGES) & 1, 1, TMA_LOAD)
                        _reduce_unit(ring_a, ring_b, (t + 1) % STAGES, P, nxt_row, nxt_q, Q, N, stride_a, offs, BWD,
                                     layout, ALIGN, CHUNK)
                        nxt_done = True
                if (new_row == w_row) & (w_row < M):
                    _wait_slot(bars, (t + AHEAD) % STAGES, ((t + AHEAD) // STAGES) & 1, 0, TMA_LOAD)
                    _reduce_unit(ring_a, ring_b, (t + AHEAD) % STAGES, P, new_row, new_q, Q, N, stride_a, offs, BWD, layout,
                                 ALIGN, CHUNK)
                    new_done = True

            # write the unit LAG steps back (from registers, or its slot), with the row statistic
            # merged from every program's partial
            if MERGE:  # the partition's statistic of item t's row (a sum < 0: it found words pending)
                merged_m, merged_s = _queue_get(stats, queue_bars, t, 2)
            if w_row < M:
                if DEEP:
                    m = st_m
                    s = st_s
                    if MERGE:
                        if fresh:
                            m = merged_m
                            s = merged_s
                        fresh = fresh & (merged_s < 0)  # left to merge here, from the words read above
                    if STEPS_MERGE:
                        if fresh:
                            m, s = _merged_row(A, B, P, ERR, PRIOR, words, w_row, M, N, stride_a, stride_b, Q,
                                               spin_max, BWD, PIECE, PBLK, HAS_PRIOR, layout, playout, ALIGN)
                    st_row = w_row
                    st_m = m
                    st_s = s
                    if LATE:  # (the wait is over)
                        if late & (new_row < M):
                            claim = _claim_start(P, M, Q, lanes)
                else:
                    m, s = _merged_row(A, B, P, ERR, PRIOR, words, w_row, M, N, stride_a, stride_b, Q, spin_max,
                                       BWD, PIECE, PBLK, HAS_PRIOR, layout, playout, ALIGN)
                if HAS_PRIOR:  # the whole row's statistic, for its other columns
                    gl.store(PRIOR + 2 * M + w_row, m, mask=w_q == 0)
                    gl.store(PRIOR + 3 * M + w_row, s, mask=w_q == 0)
                slot = (t + STAGES - LAG) % STAGES
                ONE: gl.constexpr = HOLD or HOLD_OLD or (KSUB == 1)  # the chunk is one tile (KSUB = 1)
                if ONE:
                    if HOLD or HOLD_OLD:
                        a = _held_f32(old_a, HOLD, A.dtype.element_ty, layout)
                        b = a
                        if BWD:
                            b = _held_f32(old_b, HOLD, B.dtype.element_ty, layout)
                    else:
                        a = _slot_f32(ring_a, slot, layout)
                        b = a
                        if BWD:
                            b = _slot_f32(ring_b, slot, layout)
                if not BWD:
                    gl.store(LSE + w_row, m + gl.log(s), mask=w_q == 0)
                base_o, h = _row_start(w_row, stride_o, ALIGN)
                start = w_q.to(gl.int64) * CHUNK
                first = h - w_q * CHUNK  # the chunk's elements first ... end - 1 are the row's
                end = (N + h - start).to(gl.int32)
                if ONE:
                    _store_sub(OUT, base_o + start, a, b, m, s, offs, first, end, BWD, FOLD, STORE_EVICT, ALIGN)
                else:  # from its slot, a sub-tile at a time
                    for j in gl.static_range(KSUB):
                        a = _slot_f32(ring_a, slot * KSUB + j, layout)
                        b = a
                        if BWD:
                            b = _slot_f32(ring_b, slot * KSUB + j, layout)
                        _store_sub(OUT, base_o + start + j * SUB, a, b, m, s, offs, first - j * SUB, end - j * SUB,
                                   BWD, FOLD, STORE_EVICT, ALIGN)
                if ALIGN > 1:  # the row's end vectors' elements
                    if (first > 0) | (end < CHUNK):
                        _write_ends(A, B, OUT, w_row, start, first, end, stride_a, stride_b, stride_o, m, s, BWD, FOLD,
                                    CHUNK, STORE_EVICT, ALIGN)
            if DEEP:
                fifo_row = _fifo_put(fifo_row, fidx, t % LAG, cur_row)
                fifo_q = _fifo_put(fifo_q, fidx, t % LAG, cur_q)
            elif LAG2:
                old_row = prev_row
                old_q = prev_q
            if HOLD:
                old_a = held_a
                held_a = cur_a
                if BWD:
                    old_b = held_b
                    held_b = cur_b
            if HOLD_OLD:  # the unit in slot (t + 2) % STAGES, refilled next step, leaves it: written
                # next step (L + 1 slots), or, L slots, the step after, the one held now written next
                left_a = _held_words(ring_a.index((t + 2) % STAGES), layout)
                if BWD:
                    left_b = _held_words(ring_b.index((t + 2) % STAGES), layout)
                if HOLD2:
                    old_a = next_a
                    next_a = left_a
                    if BWD:
                        old_b = next_b
                        next_b = left_b
                else:
                    old_a = left_a
                    if BWD:
                        old_b = left_b
            prev_row = cur_row
            prev_q = cur_q
            if AHEAD2:
                cur_row = nxt_row
                cur_q = nxt_q
                cur_done = nxt_done
                nxt_row = new_row
                nxt_q = new_q
                nxt_done = new_done
            else:
                cur_row = new_row
                cur_q = new_q
                cur_done = new_done
            t += 1
        if not TMA_LOAD:
            async_copy.wait_group(0)
        if MERGE:  # the merging partition's last item
            _queue_put(rows, queue_bars, t + MERGE_EARLY, -1, 0)

    @gluon.jit
    def _queue_put(buf, queue_bars, k, a, b, BARS: gl.constexpr = 0):
        """Send item ``k`` = (a, b) of a two-slot queue between partitions: into slot k % 2 of ``buf``
        (2, 2), then one arrival on barrier BARS + k % 2 of ``queue_bars``. Item k - 2 must have been
        taken."""
        pair: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])  # both in every thread
        i = gl.arange(0, 2, pair)
        buf.index(k % 2).store(gl.where(i == 0, a, b).to(buf.dtype))
        mbarrier.arrive(queue_bars.index(BARS + k % 2))

    @gluon.jit
    def _queue_get(buf, queue_bars, k, BARS: gl.constexpr = 0):
        """Item ``k`` (a, b) of the queue ``_queue_put`` sends, once it is in."""
        mbarrier.wait(queue_bars.index(BARS + k % 2), (k // 2) & 1)
        pair: gl.constexpr = gl.BlockedLayout([2], [32], [gl.num_warps()], [0])
        i = gl.arange(0, 2, pair)
        v = buf.index(k % 2).load(pair)
        return gl.sum(gl.where(i == 0, v, 0), axis=0), gl.sum(gl.where(i == 1, v, 0), axis=0)

    @gluon.jit
    def _merge_partition(A, B, P, ERR, PRIOR, M, N, stride_a, stride_b, Q, spin_max, rows, stats, queue_bars,
                         BWD: gl.constexpr, PBLK: gl.constexpr, HAS_PRIOR: gl.constexpr, WAITS: gl.constexpr,
                         ALIGN: gl.constexpr):
        """The merging partition of ``_staged_kernel`` (its own warps): for each item of ``rows`` (a
        row; >= M: none; -1: the end), the row's statistic from its partial words, sent back through
        ``stats`` (the last row's kept, as consecutive items often share it). Where a word is still
        PENDING at its first read: ``WAITS``, re-read until all are in (``_merged_row``, which gives up
        to the inputs); else a sum of -1 is sent (also for ``spin_max < 0``, the tests' give-up), and
        the steps merge the row from their own read of its words, a step later. (Waiting here gained
        in the 16-bit forward up to 8M; in the backward it lost where its first read often found words
        pending, about one re-read per merge at bf16 3M: .notes/softmax.md, sessions 31-32.)"""
        VEC: gl.constexpr = 128 // A.dtype.element_ty.primitive_bitwidth
        layout: gl.constexpr = gl.BlockedLayout([VEC], [32], [gl.num_warps()], [0])
        playout: gl.constexpr = gl.BlockedLayout([1], [32], [gl.num_warps()], [0])
        k = 0
        row = M * 0
        last = M * 0 - 1
        m = gl.to_tensor(0.0)
        s = gl.to_tensor(1.0)
        while row >= 0:
            row, _unused = _queue_get(rows, queue_bars, k)
            if row >= 0:
                sent_m = m
                sent_s = s
                if (row < M) & (row != last):
                    words = _row_words(P + row.to(gl.int64) * Q, Q, BWD, PBLK, playout)
                    if WAITS:
                        m, s = _merged_row(A, B, P, ERR, PRIOR, words, row, M, N, stride_a, stride_b, Q, spin_max,
                                           BWD, VEC * 32 * gl.num_warps(), PBLK, HAS_PRIOR, layout, playout, ALIGN)
                        last = row
                        sent_m = m
                        sent_s = s
                    else:  # (not through _merged_row: its forward sum would run on pending rows too, -1.7
                        # points at bf16 9M, where a third of the rows are pending: session 32)
                        n, stat = _words_stat(words, BWD)
                        sent_s = gl.to_tensor(-1.0)
                        if (n == 0) & (spin_max >= 0):
                            m = stat
                            s = _words_aux(words, stat, BWD)
                            if HAS_PRIOR:
                                m, s = _merge_pair(m, s, gl.load(PRIOR + row), gl.load(PRIOR + M + row), BWD)
                            last = row
                            sent_m = m
                            sent_s = s
                _queue_put(stats, queue_bars, k, sent_m, sent_s, 2)
            k += 1


# ----------------------------------------------------------------------------------------------
# Launchers (host side)
# ----------------------------------------------------------------------------------------------
def available(*tensors: torch.Tensor) -> bool:
    """Whether split rows of these (M, N) tensors (inputs and output) can take the staged kernel:
    CUDA sm_80+, Gluon, and for 16-bit tensors, rows and pointers 16-byte aligned or rows that
    ``F.row_align`` can shift to be (cp.async copies 4, 8 or 16 bytes)."""
    t = tensors[0]
    if not (STAGED and gluon is not None and t.is_cuda and cuda_major(t.device) >= 8):
        return False
    return all(u.element_size() >= 4 or (u.data_ptr() % 16 == 0 and u.shape[1] % 16 == 0
                                          and (u.shape[0] == 1 or u.stride(0) % 16 == 0))
               for u in tensors) or F.row_align(*tensors) > 1


def staged_config(direction: str, elem: int, n: int, tma: bool = True, max_shared: int | None = None,
                  shifted: bool = False, gpu: str | None = None) -> tuple:
    """The table's config for rows of ``n`` elements of ``elem`` bytes (see ``STAGED_CONFIG``);
    without ``tma`` (rows that cannot take TMA loads), entries that are ``tma_only`` are passed over,
    and so are entries whose slots need more than ``max_shared`` bytes (a block's shared memory on
    the device; None: no limit). With ``tma``, rows of a whole number of chunks take
    ``STAGED_CONFIG_WHOLE``'s entry where it has one; ``shifted``: rows not 16-byte aligned, which take
    ``STAGED_CONFIG_SHIFTED``'s entry where it has one. ``gpu``: the GPU model's name (``gpu_model``), whose
    ``STAGED_CONFIG_GPU`` entries the tables take (None: the tables as they are)."""
    def fits(config):
        return max_shared is None or slot_bytes(direction, elem, config) <= max_shared

    whole = _entry(STAGED_CONFIG_WHOLE, direction, elem, n) if tma else None
    if whole is not None and n % whole[0] == 0 and fits(whole):
        return whole
    main, shifted_table = gpu_tables(gpu)
    own = _entry(shifted_table, direction, elem, n) if shifted else None
    if own is not None:
        # (shifted rows span up to 16 bytes more: their chunks start on 16 bytes, ``_row_start``)
        own = least_padded(direction, elem, n + 16 // elem - 1, [c for c in alternatives(own) if fits(c)])
        if own is not None:
            return own
    return [config for shortest, config in main[(direction, elem)]
            if n >= shortest and (tma or not tma_only(direction, elem, config)) and fits(config)][-1]


def gpu_tables(gpu: str | None) -> tuple[dict, dict]:
    """(``STAGED_CONFIG``, ``STAGED_CONFIG_SHIFTED``) as GPU model ``gpu`` takes them: its ``STAGED_CONFIG_GPU``
    entries merged into each list by length, in place of the list's entries of the same lengths (None, or a
    model without entries: the tables themselves)."""
    own = STAGED_CONFIG_GPU.get(gpu, {})
    tables = {"main": STAGED_CONFIG, "shifted": STAGED_CONFIG_SHIFTED}
    merged = {name: dict(table) for name, table in tables.items()}
    for (name, direction, elem), entries in own.items():
        lengths = {n for n, _ in entries}
        kept = [e for e in tables[name].get((direction, elem), []) if e[0] not in lengths]
        merged[name][direction, elem] = sorted(kept + list(entries), key=lambda e: e[0])  # (stable: own last)
    return merged["main"], merged["shifted"]


@functools.lru_cache(maxsize=None)
def gpu_model(index: int) -> str:
    """The name CUDA gives device ``index`` (``torch.cuda.get_device_name``: "NVIDIA H200", "NVIDIA H100 80GB
    HBM3"), the key of ``STAGED_CONFIG_GPU``."""
    return torch.cuda.get_device_name(index)


def alternatives(entry) -> list:
    """The configs of a table entry: one config, or a tuple of them (``STAGED_CONFIG_SHIFTED``)."""
    return list(entry) if isinstance(entry[0], tuple) else [entry]


def least_padded(direction: str, elem: int, span: int, configs: list):
    """Of ``configs``, the one whose chunks cover ``span`` elements with the least padding, that of a chunk of
    sub-tiles counted ``SUB_TILE_COST`` more (the first of equals; None where there is none)."""
    cost = SUB_TILE_COST.get((direction, elem), 0.0)
    return min(configs, key=lambda c: cdiv(span, c[0]) * c[0] * (1.0 + (cost if sub_tile(c[0]) < c[0] else 0.0)),
               default=None)


def _entry(table: dict, direction: str, elem: int, n: int):
    """The config of ``table``'s last entry (shortest row, config) for (direction, elem) that rows of
    ``n`` elements reach; None where there is none or it is None."""
    reached = [config for shortest, config in table.get((direction, elem), ()) if n >= shortest]
    return reached[-1] if reached else None


def slot_bytes(direction: str, elem: int, config) -> int:
    """Shared memory of ``config``'s slots for elements of ``elem`` bytes, plus ``SLOT_SLACK`` for
    the kernel's barriers and scratch (backward: slots for y and dy)."""
    chunk, _, stages = config[:3]
    return stages * chunk * elem * (2 if direction == "bwd" else 1) + SLOT_SLACK


#: Bytes a staged launch takes beyond its slots (mbarriers, the reductions' scratch; ~600 B measured
#: in session 15), rounded up: 7 slots of 32 KB plus this still fit a Hopper block's 227 KB.
SLOT_SLACK = 2048


@functools.lru_cache(maxsize=None)
def block_shared_limit(index: int) -> int:
    """Shared memory one block may take on CUDA device ``index`` (opt-in limit): 227 KB on sm_90,
    163 KB on sm_80."""
    return triton.runtime.driver.active.utils.get_device_properties(index)["max_shared_mem"]


def launch_config(direction: str, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> tuple:
    """The table's config for (M, N) rows a, b (output ``out``, where given) (``staged_config``): a
    ``tma_only`` config only where these rows take TMA loads, ``STAGED_CONFIG_SHIFTED``'s where they
    are not 16-byte aligned, slots only as large as a block's shared memory on their GPU, and that GPU
    model's ``STAGED_CONFIG_GPU`` entries."""
    elem, n = F.element_size(a, b), a.shape[1]
    index = (a.device.index if a.device.index is not None else torch.cuda.current_device()) if a.is_cuda else None
    limit, gpu = (None, None) if index is None else (block_shared_limit(index), gpu_model(index))
    config = staged_config(direction, elem, n, max_shared=limit, gpu=gpu)
    if TMA_LOADS and tma_width(n, sub_tile(config[0]), a, b):
        return config
    shifted = F.row_align(a, b, *(() if out is None else (out,))) > 1
    return staged_config(direction, elem, n, tma=False, max_shared=limit, shifted=shifted, gpu=gpu)


def sub_tile(chunk: int) -> int:
    """Elements of a chunk's sub-tiles: the largest power of two that divides ``chunk`` (the chunk
    itself where it is one). The kernel copies, reduces and writes a chunk a sub-tile at a time."""
    return chunk & -chunk


def tma_width(n: int, chunk: int, *tensors: torch.Tensor) -> int:
    """W of the (M, N / W, W) views through which TMA moves chunks (sub-tiles, ``sub_tile``) of
    ``chunk`` elements of these (M, N) rows, or 0 where
    it cannot: W is the widest power of two <= 256 that divides N with CHUNK / W <= 256 (a TMA box
    has at most 256 entries per dimension) and W elements a multiple of 16 bytes; pointers and row
    strides must be 16-byte aligned and the GPU sm_90+."""
    if not tensors[0].is_cuda or cuda_major(tensors[0].device) < 9:
        return 0
    if any(t.data_ptr() % 16 or (t.shape[0] > 1 and t.stride(0) * t.element_size() % 16) for t in tensors):
        return 0
    return box_width(n, chunk, min(t.element_size() for t in tensors))


def box_width(n: int, chunk: int, elem: int) -> int:
    """``tma_width`` of 16-byte aligned rows of ``n`` elements, the narrowest ``elem`` bytes, on sm_90+."""
    w = 256
    while w * elem >= 16 and chunk // w <= 256:
        if n % w == 0 and chunk % w == 0:
            return w
        w //= 2
    return 0


def _row_stride(t: torch.Tensor) -> int:
    """The row stride the kernel gets: 0 for one row (never used; an unaligned one would make the
    compiler narrow the 16-bit copies to 2 bytes, which cp.async cannot do)."""
    return t.stride(0) if t.shape[0] > 1 else 0


def _descriptor(t: torch.Tensor, w: int, chunk: int):
    """The (M, N / w, w) view of (M, N) rows ``t`` as a TMA descriptor with (1, chunk / w, w) boxes
    (one row: its stride is never used, and may be any number; the descriptor gets N, aligned)."""
    m, n = t.shape
    return TensorDescriptor(t, [m, n // w, w], [t.stride(0) if m > 1 else n, w, 1], [1, chunk // w, w],
                            _box_layout(t.element_size()))


def _box_layout(elem: int):
    """The shared layout of a TMA box of ``elem``-byte elements (built once: ~2 us of host each)."""
    if elem not in _BOX_LAYOUTS:
        _BOX_LAYOUTS[elem] = gl.NVMMASharedLayout(swizzle_byte_width=0, element_bitwidth=8 * elem, rank=3)
    return _BOX_LAYOUTS[elem]


_BOX_LAYOUTS: dict = {}


def launch(direction: str, a, b, out, lse, config=None, prior=None) -> bool:
    """Run the staged kernel on (M, N) rows if one row's chunks fit the resident grid; else False.

    Forward (``direction="fwd"``): a = b = x, out = y (M, N) in x.dtype, lse (M,) float32.
    Backward (``"bwd"``): a = y, b = dy, out = dx (M, N) in dy.dtype; lse is not written.
    Inputs float32 / float16 / bfloat16 with unit column stride (see ``available``).

    ``config``: (chunk, num_warps, stages, ahead, lag, loads by TMA), default ``launch_config``.
    ``prior``: None, or a (4, M) float32 tensor (contiguous) when a, b, out are the first N columns
    of longer rows (``softmax_held``): rows 0-1 the other columns' statistic (forward max and sum of
    exp(x - max), backward dot and anything), merged into each row's; rows 2-3 receive the whole
    row's (forward max and sum, backward dot and 1).
    """
    plan = memo("launch", (a, b, out), (direction, config, prior is None),
                lambda: _launch_plan(direction, a, b, out, lse, config, prior), plan_knobs())
    if plan is None:
        return False
    launch_planned(plan, a, b, out, lse, prior)
    return True


def launch_planned(plan: tuple, a, b, out, lse, prior=None) -> None:
    """``launch`` by a plan its caller keeps (``_launch_plan``'s, for tensors of these layouts)."""
    grid, claim, q, consts, warps = plan
    words = torch.full((a.shape[0] * q + 1,), PENDING_WORD, dtype=torch.int64, device=a.device)
    args = _kernel_args(a, b, out, lse, prior, consts, words, q)
    launch_kernel(_staged_kernel, (grid,), *args, **consts, CLAIM=claim, num_warps=warps, **COMPILE_OPTIONS)


def _launch_plan(direction: str, a, b, out, lse, config, prior):
    """(grid, claim, Q, constexprs, num_warps) of ``launch`` on these rows, or None where one row's
    chunks outnumber what the resident grid holds. Without a given ``config``: the table's
    (``launch_config``), or where the table's build spills here the first of its ``SPILL_FALLBACKS``
    whose plan holds the row."""
    chosen = config or launch_config(direction, a, b, out)
    plan = _plan(direction, a, b, out, lse, chosen, prior)
    if plan is None or config is not None:
        return plan
    plans = (_plan(direction, a, b, out, lse, fallback, prior)
             for fallback in _spill_fallbacks(direction, a, b, out, lse, prior, chosen, plan))
    return next((p for p in plans if p is not None), plan)


def _plan(direction: str, a, b, out, lse, config, prior):
    """``_launch_plan`` of one config."""
    m, n = a.shape
    chunk, _, stages, ahead, lag, _ = config
    if (stages, ahead, lag) not in RINGS:
        raise ValueError(f"staged softmax config {config}: the kernel's rings, (STAGES, AHEAD, LAG), are {RINGS} "
                         f"(see RINGS); others measured slower in sessions 5-11 and are not built")
    vector = 16 // a.element_size() * 32 * config[1]  # the elements one tile of the kernel's layout holds
    if chunk <= 0 or chunk % vector or sub_tile(chunk) < vector:
        raise ValueError(f"staged softmax config {config}: a chunk must be a multiple of a power of two of at least "
                         f"{vector} elements (16 bytes a thread over {config[1]} warps) for {a.dtype} rows")
    consts, warps = _constexprs(direction, a, b, out, config, prior is not None)
    q = cdiv(n + consts["ALIGN"] - 1, chunk)
    if q > MAX_PROGRAMS_PER_ROW or m * q >= 2**31 - 2**20:  # units are counted in int32
        return None
    args = _kernel_args(a, b, out, lse, prior, consts, _stand_in_words(a.device), q)
    programs = _resident(args, consts, warps, True)
    if q > capacity(lag, programs):
        return None
    grid, claim = grid_plan(direction, m, q, programs, lag=lag)
    if not claim:  # the fixed-unit build sizes its own grid (its occupancy may differ)
        grid, _ = grid_plan(direction, m, q, _resident(args, consts, warps, False), claim=False, lag=lag)
        if grid == 0:
            return None
    return grid, claim, q, consts, warps


def _spill_fallbacks(direction: str, a, b, out, lse, prior, config, plan) -> tuple:
    """``config``'s ``SPILL_FALLBACKS`` where the build ``plan`` launches (its constexprs and claim) spills
    registers here, else ()."""
    grid, claim, q, consts, warps = plan
    fallbacks = SPILL_FALLBACKS.get((direction, F.element_size(a, b), *config[:5], consts["ALIGN"] > 1), ())
    if not fallbacks:
        return ()
    args = _kernel_args(a, b, out, lse, prior, consts, _stand_in_words(a.device), q)
    spills = F.local_bytes(_staged_kernel, args, dict(consts, CLAIM=claim), warps, _build_key(args)) > 0
    return fallbacks if spills else ()


def held_config(direction: str, a, b, out) -> tuple:
    """The config of ``softmax_held``'s staged launch (leading columns, with a prior) on (M, N) rows a, b
    (out) longer than one launch holds: the table's (its deepest ring), or its first ``SPILL_FALLBACKS``
    config where that build with a prior spills here (the fallback's held columns are its own
    ``held_columns``, so it holds them)."""
    config = launch_config(direction, a, b, out)
    held = held_columns(direction, a, b, out, config)
    views, prior = (a[:, :held], b[:, :held], out[:, :held]), torch.empty((4, a.shape[0]), device=a.device)
    plan = _plan(direction, *views, None, config, prior)
    fallbacks = () if plan is None else _spill_fallbacks(direction, *views, None, prior, config, plan)
    return fallbacks[0] if fallbacks else config


def held_columns(direction: str, a, b, out, config=None) -> int:
    """How many leading columns of (M, N) rows a, b (out) one launch with a ``prior`` keeps on chip:
    ``capacity`` chunks of ``config`` (default: the table's, for rows of N), at most N."""
    chunk, _, _, _, lag, _ = config = config or launch_config(direction, a, b, out)
    m = a.shape[0]
    probe = (a[:, :chunk], b[:, :chunk], out[:, :chunk])  # as the launch's views (its key and TMA width)
    consts, warps = _constexprs(direction, *probe, config, True)
    args = _kernel_args(*probe, None, torch.empty((4, m), device=a.device), consts, _stand_in_words(a.device), 2)
    chunks = min(capacity(lag, _resident(args, consts, warps, True)), MAX_PROGRAMS_PER_ROW)
    # (rows shifted by up to ALIGN - 1 elements, _row_start: the last ALIGN columns wait for the
    # streamed ones, so that those start on 16 bytes too)
    return min(chunks * chunk - (consts["ALIGN"] if consts["ALIGN"] > 1 else 0), a.shape[1])


def _constexprs(direction: str, a, b, out, config, has_prior: bool) -> tuple[dict, int]:
    """(constexprs but CLAIM, num_warps) of a launch of ``config`` on (M, N) rows a, b (out); the
    constexprs carry the compile option ``maxnreg`` too where ``REGISTER_CAPS`` has the config."""
    n = a.shape[1]
    chunk, warps, stages, ahead, lag, tma_load = config
    bwd = direction == "bwd"
    width = tma_width(n, sub_tile(chunk), a, b) if tma_load and TMA_LOADS else 0
    key = (direction, F.element_size(a, b), tuple(config[:5]))
    merge_warps, merge_early, merge_cap, longest, longest_waiting = MERGE_PARTITIONS.get(key, (0, 0, None, 0, 0))
    if n > longest or (a.is_cuda and cuda_major(a.device) < 9):
        # (the partitions' register split, setmaxnreg, is sm_90+: for sm_80 LLVM aborts the compile)
        merge_warps, merge_early, merge_cap = 0, 0, None
    align = 1 if width else F.row_align(a, b, out)
    consts = dict(BWD=bwd, CHUNK=chunk, STAGES=stages, AHEAD=ahead, LAG=lag,
                  PBLK=max(WORDS_BLOCK, next_power_of_2(cdiv(n + align - 1, chunk))),
                  LOAD_EVICT=LOAD_EVICT, STORE_EVICT=STORE_EVICT,
                  FOLD=FOLD_DIVISION_16BIT and lag >= FOLD_MIN_LAG and not bwd and out.element_size() == 2,
                  TMA_LOAD=width > 0, TMA_W=width, HAS_PRIOR=has_prior,
                  MERGE_WARPS=merge_warps, MERGE_EARLY=merge_early, MERGE_REGS=MERGE_REGS,
                  MERGE_WAITS=merge_warps > 0 and n <= longest_waiting, ALIGN=align,
                  LATE_CLAIM=LATE_CLAIM and lag >= 3)
    caps = [REGISTER_CAPS.get(key), merge_cap, SHIFTED_REGISTER_CAPS.get(key) if align > 1 else None]
    if any(caps):
        consts["maxnreg"] = min(cap for cap in caps if cap)
    return consts, warps


def _kernel_args(a, b, out, lse, prior, consts, words, q) -> list:
    """The kernel's arguments on these rows, with ``words`` the partial words (int64, M * Q + 1,
    PENDING_WORD) and ``q`` chunks per row (a plan compiles with stand-ins: the kernel does not
    specialize on either)."""
    m, n = a.shape
    err = F.error_counter(a.device)
    width, sub = consts["TMA_W"], sub_tile(consts["CHUNK"])
    descriptors = [_descriptor(t, width, sub) for t in (a, b)] if width else [a, b]
    return [a, b, out, *descriptors, out if lse is None else lse, words, err, err if prior is None else prior,
            m, n, *map(_row_stride, (a, b, out)), q, F.SPIN_MAX]


def _stand_in_words(device):
    return torch.empty(1, dtype=torch.int64, device=device)


def _resident(args, consts, warps, claim: bool) -> int:
    """Programs of this build the GPU holds at once: the grid is what it holds, sized from the
    compiled kernel (``softmax_fwd.resident_programs``)."""
    return F.resident_programs(_staged_kernel, args, dict(consts, CLAIM=claim), warps, _build_key(args))


def _build_key(args) -> tuple:
    """What a staged build specializes on beyond its constexprs (``_kernel_args``'s arguments)."""
    a, b, out, n = args[0], args[1], args[2], args[10]
    return ("softmax_staged", n % 16 == 0) + F.spec_key(a, b, out)


def plan_knobs() -> tuple:
    """The module knobs that launch plans read, and ``softmax_fwd``'s that they and the held path's plans
    of the two-pass passes (``stats_plan`` and the like) read, as they are now (references): the
    ``knobs`` of their ``plan_memo.memo``."""
    return (F.RESIDENT_PROGRAMS, TMA_LOADS, CLAIM, LOAD_EVICT, STORE_EVICT, LATE_CLAIM, FOLD_DIVISION_16BIT,
            FOLD_MIN_LAG, WORDS_BLOCK, MAX_PROGRAMS_PER_ROW, RINGS, TMA_ONLY_CONFIGS, SLOT_SLACK, REGISTER_CAPS,
            SHIFTED_REGISTER_CAPS, SPILL_FALLBACKS, MERGE_PARTITIONS, MERGE_REGS, STAGED_CONFIG_SHIFTED,
            SUB_TILE_COST, CLAIM_MAX_ROW_SHARE, STAGED_CONFIG, STAGED_CONFIG_WHOLE,
            STAGED_CONFIG_GPU) + F.stream_knobs()


#: Shared memory a staged block takes beside its slots (mbarriers, the reductions' scratch: ~600 B measured in
#: session 15), as ``longest_row`` counts it (``SLOT_SLACK`` rounds it up for the launch's fit).
SLOT_SCRATCH = 640


def longest_row(direction: str, elem: int, config, sms: int, shared_per_sm: int) -> int:
    """The longest row (in elements, for rows 16-byte aligned) one launch of ``config`` holds on a GPU of ``sms``
    multiprocessors of ``shared_per_sm`` bytes of shared memory: ``capacity`` chunks with as many programs per
    multiprocessor as its slots let fit (CUDA reserves ``RESERVED_SHARED_PER_BLOCK`` a block; registers may let
    fewer fit), at most ``MAX_PROGRAMS_PER_ROW``. (An H100 / H200: 132 and 233472.)"""
    block = slot_bytes(direction, elem, config) - SLOT_SLACK + SLOT_SCRATCH + F.RESERVED_SHARED_PER_BLOCK
    return config[0] * min(capacity(config[4], sms * (shared_per_sm // block)), MAX_PROGRAMS_PER_ROW)


def capacity(lag: int, programs: int) -> int:
    """The most chunks one row may have in a ring of ``lag`` over ``programs`` resident programs:
    a chunk is written ``lag`` steps after its reduction, and its row's other chunks are claimed within
    about lag - 1 steps of the grid (lag 1: the fixed units of whole rows, one chunk per program)."""
    return max(lag - 1, 1) * programs


def grid_plan(direction: str, m: int, q: int, programs: int, claim: bool | None = None,
              lag: int = 1) -> tuple[int, bool]:
    """(grid, claim) of a launch over ``m`` rows of ``q`` chunks (at most ``capacity(lag, programs)``)
    when ``programs`` fit the GPU at once: every program, the units claimed from the counter, where a
    row's chunks are at most ``CLAIM_MAX_ROW_SHARE[direction, lag]`` of them (and ``claim``, default
    ``CLAIM``); else the most whole rows' worth of programs (0 if one row's chunks outnumber them)."""
    if (CLAIM if claim is None else claim) and q <= CLAIM_MAX_ROW_SHARE[direction, lag] * programs:
        return min(programs, m * q), True
    return min(programs // q, m) * q, False
