"""Where a causal pass cuts its rows (`engine.align.segments`): pieces over `small` rows follow the
absolute cuts (so a continuation from an aligned position computes what a cold pass does), and
neighbours of at most `small` rows run as one call (the few-row kernels give a row the same bits
in any call; tests/test_commit_exact.py checks a commit against AR's steps)."""

from __future__ import annotations

import itertools

from clover_runtime.engine.align import ALIGN, segments


def _covers(pieces: list[tuple[int, int]], n: int) -> bool:
    return pieces[0][0] == 0 and pieces[-1][1] == n and all(a[1] == b[0] for a, b in itertools.pairwise(pieces))


def test_a_block_that_straddles_a_cut_is_one_call() -> None:
    assert segments(ALIGN - 10, 32, 32) == [(0, 32)]
    assert segments(ALIGN - 1, 2, 32) == [(0, 2)]


def test_a_piece_over_small_keeps_its_absolute_cuts() -> None:
    # 4 rows before the cut, then 36 (over small): the 36 are computed as a cold pass from the cut would
    assert segments(ALIGN - 4, 40, 32) == [(0, 4), (4, 40)]
    assert segments(0, ALIGN + 7, 32) == [(0, ALIGN), (ALIGN, ALIGN + 7)]
    assert segments(0, 3 * ALIGN, 32) == [(0, 3 * ALIGN)]


def test_every_row_once_in_order_and_no_call_mixes_the_forms() -> None:
    for pos0 in (0, 1, ALIGN - 1, ALIGN, 3 * ALIGN + 17):
        for n in (1, 5, 31, 32, 33, 64, 65, 200):
            for small in (0, 8, 32):
                pieces = segments(pos0, n, small)
                assert _covers(pieces, n), (pos0, n, small, pieces)
                cuts = sorted({0, n, *range(ALIGN - pos0 % ALIGN, n, ALIGN)})
                aligned = list(itertools.pairwise(cuts))
                for a, b in pieces:  # a call holds only few-row pieces or only larger ones
                    inside = [(x, y) for x, y in aligned if a <= x and y <= b]
                    assert inside and (all(y - x <= small for x, y in inside) or all(y - x > small for x, y in inside))
                    if all(y - x <= small for x, y in inside):
                        assert b - a <= small  # the few-row kernels take the whole call
