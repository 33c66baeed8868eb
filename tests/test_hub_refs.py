"""Model identifiers and the choice of file from a repository listing (no network involved)."""

from __future__ import annotations

import pytest
from clover_runtime.errors import HubError
from clover_runtime.hub import DEFAULT_REPO, ModelRef, looks_like_path, parse_model_ref
from clover_runtime.hub.select import Ambiguous, choose, first_shards, matches, quant_of, shards_of

from clover_cli.advice import hint_for

INVALID = "invalid model reference '{}', expected <user>/<model>[:quant]"


@pytest.mark.parametrize(("text", "file", "want"), [
    ("acme/Tiny-GGUF", None, ModelRef("acme/Tiny-GGUF")),
    ("acme/Tiny-GGUF:q4_k_m", None, ModelRef("acme/Tiny-GGUF", "Q4_K_M")),
    ("acme/Tiny-GGUF:UD-Q4_K_XL", None, ModelRef("acme/Tiny-GGUF", "UD-Q4_K_XL")),
    ("hf.co/acme/Tiny-GGUF:Q8_0", None, ModelRef("acme/Tiny-GGUF", "Q8_0")),
    ("huggingface.co/acme/Tiny-GGUF", None, ModelRef("acme/Tiny-GGUF")),
    ("HF.CO/acme/Tiny.v2_GGUF:Q8_0", None, ModelRef("acme/Tiny.v2_GGUF", "Q8_0")),
    ("https://huggingface.co/acme/Tiny-GGUF", None, ModelRef("acme/Tiny-GGUF")),
    ("https://huggingface.co/acme/Tiny-GGUF/tree/dev", None, ModelRef("acme/Tiny-GGUF", revision="dev")),
    ("https://huggingface.co/acme/Tiny-GGUF/blob/main/Q8_0/Tiny-Q8_0-00001-of-00002.gguf", None,
     ModelRef("acme/Tiny-GGUF", None, "Q8_0/Tiny-Q8_0-00001-of-00002.gguf", "main")),
    ("https://hf.co/acme/Tiny-GGUF/resolve/0123abc/My%20Model-Q8_0.gguf?download=true", None,
     ModelRef("acme/Tiny-GGUF", None, "My Model-Q8_0.gguf", "0123abc")),
    ("huggingface.co/acme/Tiny-GGUF/blob/main/x.gguf", None, ModelRef("acme/Tiny-GGUF", None, "x.gguf", "main")),
    ("acme/Tiny-GGUF", "Tiny-Q8_0.gguf", ModelRef("acme/Tiny-GGUF", None, "Tiny-Q8_0.gguf")),
    ("acme/Tiny-GGUF:Q4_K_M", "Tiny-Q8_0.gguf", ModelRef("acme/Tiny-GGUF", "Q4_K_M", "Tiny-Q8_0.gguf")),
    (None, None, ModelRef(DEFAULT_REPO, "Q4_K_M")),
    ("  ", None, ModelRef(DEFAULT_REPO, "Q4_K_M")),
    (None, "other.gguf", ModelRef(DEFAULT_REPO, None, "other.gguf")),
])
def test_identifier_forms(text: str | None, file: str | None, want: ModelRef) -> None:
    assert parse_model_ref(text, file) == want


def test_default_is_the_clover_preview() -> None:
    assert str(parse_model_ref(None)) == "Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M"


@pytest.mark.parametrize("text", ["noslash", "a/b/c", "a/b:", "a b/c", "a/b:Q4:K", "-a/b", "a--b/c", "a/b..c",
                                  "https://example.com/a/b", "http://huggingface.co/a/b/blob/main", "a/b:Q4 K"])
def test_invalid_forms_get_one_line(text: str) -> None:
    with pytest.raises(HubError) as err:
        parse_model_ref(text)
    assert err.value.message == INVALID.format(text)
    assert "\n" not in err.value.message


@pytest.mark.parametrize(("text", "path"), [
    ("model.gguf", True), ("./m", True), ("/abs/m.GGUF", True), ("~/models/m", True), ("C:\\m\\x.gguf", True),
    ("D:/x", True), ("sub\\m", True), ("acme/Tiny-GGUF", False), ("acme/Tiny-GGUF:Q8_0", False),
    ("hf.co/acme/Tiny-GGUF", False), ("https://huggingface.co/a/b/blob/main/x.gguf", False),
])
def test_local_paths_are_told_apart(text: str, path: bool) -> None:
    assert looks_like_path(text) is path


LISTING = [
    ".gitattributes", "README.md",
    "Clover-Q4_K_M.gguf", "Clover-UD-Q4_K_M.gguf", "Clover-Q4_K_S.gguf", "Clover.Q5_K_M.gguf",
    "Q8_0/Clover-Q8_0-00001-of-00003.gguf", "Q8_0/Clover-Q8_0-00002-of-00003.gguf",
    "Q8_0/Clover-Q8_0-00003-of-00003.gguf",
    "BF16/Clover-00001-of-00002.gguf", "BF16/Clover-00002-of-00002.gguf",
    "mmproj-Clover-F16.gguf", "Clover-F16.imatrix.gguf", "mtp-Clover-Q8_0.gguf",
]


def test_candidates_exclude_projectors_imatrix_and_mtp_and_later_shards() -> None:
    assert first_shards(LISTING) == ["Clover-Q4_K_M.gguf", "Clover-UD-Q4_K_M.gguf", "Clover-Q4_K_S.gguf",
                                     "Clover.Q5_K_M.gguf", "Q8_0/Clover-Q8_0-00001-of-00003.gguf",
                                     "BF16/Clover-00001-of-00002.gguf"]


@pytest.mark.parametrize(("path", "quant"), [
    ("Clover-Q4_K_M.gguf", "Q4_K_M"), ("Clover-UD-Q4_K_M.gguf", "UD-Q4_K_M"), ("Clover.Q5_K_M.gguf", "Q5_K_M"),
    ("Q8_0/Clover-Q8_0-00001-of-00003.gguf", "Q8_0"), ("BF16/Clover-00001-of-00002.gguf", "BF16"),
    ("clover-iq4_xs.gguf", "IQ4_XS"), ("model.gguf", None),
])
def test_quant_of_a_file_name(path: str, quant: str | None) -> None:
    assert quant_of(path) == quant


@pytest.mark.parametrize(("path", "tag", "hit"), [
    ("Clover-Q4_K_M.gguf", "q4_k_m", True), ("Clover-UD-Q4_K_M.gguf", "Q4_K_M", True),
    ("Clover-UD-Q4_K_M.gguf", "UD-Q4_K_M", True), ("Clover-Q4_K_M.gguf", "UD-Q4_K_M", False),
    ("Clover-Q4_K_M.gguf", "Q4_K", False), ("Clover-Q4_K_M_L.gguf", "Q4_K_M", False),
    ("Q8_0/Clover-Q8_0-00001-of-00003.gguf", "Q8_0", True), ("BF16/Clover-00001-of-00002.gguf", "bf16", True),
    ("Clover-Q4_K_M-imat.gguf", "Q4_K_M", True), ("Clover-Q8_0.gguf", "Q8", False),
])
def test_tag_matching(path: str, tag: str, hit: bool) -> None:
    assert matches(path, tag) is hit


def test_split_files_choose_the_first_shard_and_fetch_all() -> None:
    first, why = choose(LISTING, "acme/Clover", "q8_0", None)
    assert first == "Q8_0/Clover-Q8_0-00001-of-00003.gguf"
    assert why == "Q8_0: Q8_0/Clover-Q8_0-00001-of-00003.gguf"
    assert shards_of(first, LISTING) == [f"Q8_0/Clover-Q8_0-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    assert choose(LISTING, "acme/Clover", "BF16", None)[0] == "BF16/Clover-00001-of-00002.gguf"


def test_a_later_shard_named_with_file_means_the_whole_set() -> None:
    assert choose(LISTING, "r", None, "clover-q8_0-00002-of-00003.gguf")[0] == "Q8_0/Clover-Q8_0-00001-of-00003.gguf"


def test_an_incomplete_split_set_is_refused() -> None:
    with pytest.raises(HubError) as err:
        shards_of("m-00001-of-00003.gguf", ["m-00001-of-00003.gguf", "m-00003-of-00003.gguf"])
    assert err.value.message == "split model m-00001-of-00003.gguf is incomplete: missing m-00002-of-00003.gguf"


def test_ambiguous_tag_lists_the_files_and_asks_for_file() -> None:
    with pytest.raises(Ambiguous) as err:
        choose(LISTING, "acme/Clover", "Q4_K_M", None)
    assert err.value.message == "2 files match Q4_K_M in acme/Clover: Clover-Q4_K_M.gguf, Clover-UD-Q4_K_M.gguf"
    assert err.value.needs == "file" and hint_for(err.value) == "choose one with --file NAME"
    assert choose(LISTING, "acme/Clover", "UD-Q4_K_M", None)[0] == "Clover-UD-Q4_K_M.gguf"
    assert choose(LISTING, "acme/Clover", "Q4_K_M", "Clover-Q4_K_M.gguf") == ("Clover-Q4_K_M.gguf",
                                                                             "file Clover-Q4_K_M.gguf")


def test_a_miss_lists_the_quants_and_files() -> None:
    with pytest.raises(HubError) as err:
        choose(LISTING, "acme/Clover", "Q6_K", None)
    assert err.value.message == ("no Q6_K file in repository acme/Clover; available quants: BF16, Q4_K_M, Q4_K_S, "
                                 "Q5_K_M, Q8_0, UD-Q4_K_M")
    assert err.value.needs == "quant_or_file"
    assert hint_for(err.value) == ("files: Clover-Q4_K_M.gguf, Clover-UD-Q4_K_M.gguf, Clover-Q4_K_S.gguf, "
                                   "Clover.Q5_K_M.gguf, Q8_0/Clover-Q8_0-00001-of-00003.gguf, "
                                   "BF16/Clover-00001-of-00002.gguf (pick one with :QUANT or --file NAME)")
    with pytest.raises(HubError) as err:
        choose(LISTING, "acme/Clover", None, "nope.gguf")
    assert err.value.message == "file 'nope.gguf' not found in repository acme/Clover"
    with pytest.raises(HubError) as err:
        choose(["README.md", "mmproj-x-F16.gguf"], "acme/Empty", None, None)
    assert err.value.message == "no GGUF files found in repository acme/Empty"


def test_default_order_is_q4_k_m_then_q8_0_then_the_first_file() -> None:
    assert choose(["m-Q8_0.gguf", "m-Q4_K_M.gguf"], "r", None, None) == (
        "m-Q4_K_M.gguf", "no quant given, chose Q4_K_M: m-Q4_K_M.gguf")
    assert choose(["m-F16.gguf", "m-Q8_0.gguf"], "r", None, None)[0] == "m-Q8_0.gguf"
    assert choose(["m-F16.gguf", "m-BF16.gguf"], "r", None, None) == (
        "m-F16.gguf", "no quant given and no Q4_K_M or Q8_0 file, chose m-F16.gguf")
    with pytest.raises(Ambiguous):
        choose(["m-Q4_K_M.gguf", "m-UD-Q4_K_M.gguf", "m-Q8_0.gguf"], "r", None, None)
