"""Integer-path products: 8-bit activation rows (`q8`) times quantized weights (`intdot`).

Every activation row is quantized once per call (before the rows are grouped by expert), then
each work item (expert, run of output rows) walks its weight rows against the rows routed to
that expert, four at a time, in tiles of activation rows small enough to stay in cache, and
writes each result to its row's own place (`dest`: grouped position -> output row), so the
grouped order never has to be undone by a copy. The same code serves batch 1, batch N and the
grouped-MoE call: the integer dot products beat decoding to float32 and sgemm at every batch
size measured (benchmarks/RESULTS.md). At one thread, an expert with one activation row (every
product of a decode step) walks its weight rows eight at a time instead (`gemv_x8`; the caller
decides, `Matrices._x8`), and Q8_0/Q4_0 weight rows meet two or more activation rows four at a
time, Q4_K/Q5_K rows two at a time, two a register (`pair_rows`), with the same bits.
"""

from __future__ import annotations

from ..quants.formats import Q4_0, Q4_K, Q5_K, Q6_K, Q8_0
from .gemv_x8 import LEAD_BYTES, ROWS, idot_x8
from .intdot import INT_GEOMETRY, idot_rows
from .jit import njit, prange
from .pair_rows import idot_pair

ROW_TILE = 64  # activation rows kept hot while a run of weight rows streams past


@njit(inline="always")
def _one_weight_row(t, raw, p, n_blocks, xq, xd, xs, s0, r, rend, o, dest, yg):
    """Weight row o (at byte p) against grouped activation rows r .. rend - 1: eight, four, two,
    then one at a time."""
    while rend - r >= 8:
        v8 = idot_rows(t, 8, raw, p, n_blocks, xq, xd, xs, s0 + r)
        for i in range(8):
            yg[dest[s0 + r + i], o] = v8[i]
        r += 8
    if rend - r >= 4:
        v4 = idot_rows(t, 4, raw, p, n_blocks, xq, xd, xs, s0 + r)
        for i in range(4):
            yg[dest[s0 + r + i], o] = v4[i]
        r += 4
    if rend - r >= 2:
        v2 = idot_rows(t, 2, raw, p, n_blocks, xq, xd, xs, s0 + r)
        yg[dest[s0 + r], o] = v2[0]
        yg[dest[s0 + r + 1], o] = v2[1]
        r += 2
    if rend - r >= 1:
        yg[dest[s0 + r], o] = idot_rows(t, 1, raw, p, n_blocks, xq, xd, xs, s0 + r)[0]


@njit(inline="always")
def _weight_rows(t, w, raw, p, rb, n_blocks, xq, xd, xs, s0, rt, rend, o, dest, yg):
    """Weight rows o .. o + w - 1 (the first at byte p) against grouped activation
    rows rt .. rend - 1, two weight rows a register (`pair_rows`), a last single activation row
    a weight row at a time."""
    r = rt
    while rend - r >= 8:
        v = idot_pair(t, w, 8, raw, p, rb, n_blocks, xq, xd, xs, s0 + r)
        for j in range(w):
            for i in range(8):
                yg[dest[s0 + r + i], o + j] = v[8 * j + i]
        r += 8
    if rend - r >= 4:
        v = idot_pair(t, w, 4, raw, p, rb, n_blocks, xq, xd, xs, s0 + r)
        for j in range(w):
            for i in range(4):
                yg[dest[s0 + r + i], o + j] = v[4 * j + i]
        r += 4
    if rend - r >= 2:
        v = idot_pair(t, w, 2, raw, p, rb, n_blocks, xq, xd, xs, s0 + r)
        for j in range(w):
            yg[dest[s0 + r], o + j] = v[2 * j]
            yg[dest[s0 + r + 1], o + j] = v[2 * j + 1]
        r += 2
    for j in range(w):
        _one_weight_row(t, raw, p + j * rb, n_blocks, xq, xd, xs, s0, r, rend, o + j, dest, yg)


@njit(inline="always")
def _next_rows(item_expert, item_row0, item_row1, it, expert_bytes, rb):
    """The byte where the first later work item of another expert begins (the rows a thread
    reads after this expert's, in prange's order), or -1: where the eight-row pass's prefetches
    go once they reach its expert's end. Only items whose prefetches can reach it look."""
    if expert_bytes - item_row1[it] * rb > LEAD_BYTES + 2 * ROWS * rb:
        return -1
    e = item_expert[it]
    for nx in range(it + 1, item_expert.shape[0]):
        if item_expert[nx] != e:
            return item_expert[nx] * expert_bytes + item_row0[nx] * rb
    return -1


@njit(inline="always")
def _igrouped(t, pairs, x8, raw, n_blocks, tsize, expert_bytes, xq, xd, xs, starts, item_expert, item_row0,
              item_row1, dest, yg):
    rb = n_blocks * tsize
    for it in prange(item_expert.shape[0]):
        e = item_expert[it]
        s0 = starts[e]
        cnt = starts[e + 1] - s0
        for rt in range(0, cnt, ROW_TILE):
            rend = min(cnt, rt + ROW_TILE)
            o0 = item_row0[it]
            o1 = item_row1[it]
            if x8 and rend - rt == 1:  # one activation row (a decode step): eight weight rows a pass
                d = dest[s0 + rt]
                then = _next_rows(item_expert, item_row0, item_row1, it, expert_bytes, rb)
                while o1 - o0 >= ROWS:
                    v = idot_x8(t, raw, e * expert_bytes + o0 * rb, rb, n_blocks, (e + 1) * expert_bytes, then, xq, xd,
                                xs, s0 + rt)
                    for j in range(ROWS):
                        yg[d, o0 + j] = v[j]
                    o0 += ROWS
            # many activation rows (a block): `pairs` weight rows a pass, two a register (0: none)
            if pairs and rend - rt >= 2:
                while o1 - o0 >= pairs:
                    _weight_rows(t, pairs, raw, e * expert_bytes + o0 * rb, rb, n_blocks, xq, xd, xs, s0, rt, rend,
                                 o0, dest, yg)
                    o0 += pairs
            for o in range(o0, o1):
                _one_weight_row(t, raw, e * expert_bytes + o * rb, n_blocks, xq, xd, xs, s0, rt, rend, o, dest, yg)


_P = {"parallel": True, "cache": True}


@njit(**_P)
def _int_q4_0(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg):
    _igrouped(Q4_0, 4, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg)


@njit(**_P)
def _int_q8_0(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg):
    _igrouped(Q8_0, 4, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg)


@njit(**_P)
def _int_q4_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg):
    _igrouped(Q4_K, 2, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg)


@njit(**_P)
def _int_q5_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg):
    _igrouped(Q5_K, 2, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg)


@njit(**_P)
def _int_q6_k(x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg):
    _igrouped(Q6_K, 0, x8, raw, nb, ts, eb, xq, xd, xs, st, ie, r0, r1, dest, yg)


INT_KERNELS = {Q4_0: _int_q4_0, Q8_0: _int_q8_0, Q4_K: _int_q4_k, Q5_K: _int_q5_k, Q6_K: _int_q6_k}


def integer_code(t: int, n_in: int) -> bool:
    """Whether the integer kernels handle this type and row length (whole weight blocks)."""
    return t in INT_KERNELS and n_in % INT_GEOMETRY[t][1] == 0


def activation_block(t: int) -> int:
    """The activation block size that matches weight type t (32: Q8_0 rows, 256: Q8_K rows)."""
    return INT_GEOMETRY[t][2]
