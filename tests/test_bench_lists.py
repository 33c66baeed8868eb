"""llama-bench list syntax and the tests it expands to."""

from __future__ import annotations

import pytest
from clover_runtime.bench import BenchTest, make_configs, make_tests
from clover_runtime.errors import CloverError

from clover_cli.bench_args import parse_float_list, parse_int_list, parse_pairs


@pytest.mark.parametrize("values, expected", [
    (["512"], [512]),
    (["128,512"], [128, 512]),
    (["128", "256"], [128, 256]),  # repeated flag
    (["1-4"], [1, 2, 3, 4]),
    (["0-64+16"], [0, 16, 32, 48, 64]),
    (["16-128*2"], [16, 32, 64, 128]),
    (["1,8-32*2", "100"], [1, 8, 16, 32, 100]),
])
def test_int_lists_expand_like_llama_bench(values, expected):
    assert parse_int_list(values) == expected


@pytest.mark.parametrize("bad", ["x", "4-1", "1-8*1", "0-8*2", "1-8+0"])
def test_bad_lists_are_one_line_errors(bad):
    with pytest.raises(CloverError):
        parse_int_list([bad])


def test_float_lists_and_pairs():
    assert parse_float_list(["0.9,0.5", "0.7"]) == [0.9, 0.5, 0.7]
    assert parse_pairs(["512,128", "16,4"]) == [(512, 128), (16, 4)]
    with pytest.raises(CloverError, match="pp,tg"):
        parse_pairs(["512"])


def test_tests_cover_every_combination_with_llama_bench_names():
    tests = make_tests([512, 0], [128], [(512, 128)], [64], [0, 1024])
    names = [t.name for t in tests]
    assert names == ["pp512", "tg128", "pp512+tg128", "dg64",
                     "pp512 @ d1024", "tg128 @ d1024", "pp512+tg128 @ d1024", "dg64 @ d1024"]
    assert BenchTest(512, 128).n_tokens == 640 and BenchTest(0, 64, diffusion=True).n_tokens == 64
    assert len(make_configs([1, 2], ["numba", "numpy"], [16, 32], [], [])) == 8
