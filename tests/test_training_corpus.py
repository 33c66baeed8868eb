"""The demo model's corpus (training/corpus.py): reproducible, held-out sets kept out, correct
worked arithmetic, and tool-call turns that clover's own parser reads back as the intended calls."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "training"))

import corpus as demo  # noqa: E402
import vocab as demo_vocab  # noqa: E402
from clover_runtime.text.chat_template import ChatTemplate  # noqa: E402
from clover_runtime.text.output_parser import parse_full  # noqa: E402
from clover_runtime.text.vocab import default_chat_template  # noqa: E402

SMALL = {"arithmetic_pairs": 400, "repeats": 2}


@pytest.fixture(scope="module")
def corpus() -> demo.Corpus:
    return demo.make_corpus(7, **SMALL)


@pytest.fixture(scope="module")
def template() -> ChatTemplate:
    return ChatTemplate(default_chat_template())


def test_same_seed_same_corpus_other_seed_other_corpus(corpus: demo.Corpus) -> None:
    again = demo.make_corpus(7, **SMALL)
    assert again == corpus
    assert demo.make_corpus(8, **SMALL).train != corpus.train


def test_held_out_questions_never_appear_in_training(corpus: demo.Corpus) -> None:
    questions = [m["content"] for d in corpus.train for m in d.messages if m["role"] == "user"]
    asked = set()
    for q in questions:
        m = re.search(r"(\d+) ([+-]) (\d+)", q)
        if m and "calculator" not in q:
            asked.add((int(m[1]), m[2], int(m[3])))
    assert asked and not asked & set(corpus.held_out_arithmetic)
    text = "\n".join(questions)
    assert corpus.held_out_cities and not any(city in text for city in corpus.held_out_cities)
    kinds = {d.kind for d in corpus.train}
    assert kinds == {"arithmetic", "fact", "greeting", "weather", "calculator", "followup", "chat", "refusal"}
    held_phrasings = {q[-demo.HELD_OUT_PHRASINGS] for q, _ in demo.FACTS} | {demo.GREETINGS[-1]}
    assert not held_phrasings & set(questions)
    assert corpus.held_out_refusals and not set(corpus.held_out_refusals) & set(questions)


@pytest.mark.parametrize("result_first", [False, True])
@pytest.mark.parametrize("op", ["+", "-"])
def test_every_worked_step_is_true_and_the_digits_make_the_result(op: str, result_first: bool) -> None:
    for a in range(0, 100, 3):
        for b in range(0, (100 if op == "+" else a + 1), 7):
            answer = demo.arithmetic_answer(a, op, b, result_first)
            steps = re.findall(r"(Ones|Tens|Hundreds): ([\d +-]+) = (\d+)", answer)
            for _, expr, value in steps:
                assert eval(expr) == int(value), answer  # noqa: S307 - digits and + - only
            digits = [int(v) % 10 for _, _, v in steps]
            written = sum(d * 10**i for i, d in enumerate(digits))
            if op == "+" and int(steps[-1][2]) >= 10:
                written += 10 ** len(steps)
            assert written == (a + b if op == "+" else a - b), answer
            stated = f"{a} {op} {b} = {eval(f'{a} {op} {b}')}."  # noqa: S307
            assert answer.startswith(stated + " Ones: ") if result_first else answer.endswith(f"So {stated}")


def test_segments_rebuild_the_whole_render(corpus: demo.Corpus, template: ChatTemplate) -> None:
    for d in corpus.train[:150]:
        pieces = list(demo.segments(d, template))
        whole = template.render(d.messages, tools=d.tools, add_generation_prompt=False, enable_thinking=d.think)
        assert whole.rstrip("\n") == "".join(t for t, _ in pieces)
        assert all(t.endswith("<|im_end|>") for t, is_reply in pieces if is_reply)
        assert sum(1 for _, r in pieces if r) == len(demo.trained_turns(d))


def test_tool_turns_parse_back_into_the_intended_calls(corpus: demo.Corpus, template: ChatTemplate) -> None:
    checked = 0
    for d in (d for d in corpus.train if d.tools):
        replies = [t for t, is_reply in demo.segments(d, template) if is_reply]
        turns = demo.trained_turns(d)
        for text, turn in zip(replies, turns, strict=True):
            parsed = parse_full(text.removesuffix("<|im_end|>"), d.tools, starts_in_reasoning=d.think)
            intended = [(c["function"]["name"], c["function"]["arguments"]) for c in turn.get("tool_calls", [])]
            got = [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls]
            assert got == intended and not parsed.errors
            assert (parsed.content or "") == turn["content"]
            assert (parsed.reasoning or None) == turn.get("reasoning_content")
            checked += 1
    assert checked >= 100


def test_held_out_cities_depend_on_the_seed_alone() -> None:
    """eval.py rebuilds the held-out sets with a one-pair corpus: they must be the training run's."""
    small = demo.make_corpus(0, arithmetic_pairs=1, repeats=1)
    full = demo.make_corpus(0, **SMALL)
    assert small.held_out_cities == full.held_out_cities
    assert small.held_out_arithmetic == full.held_out_arithmetic
    trained = {m["content"] for d in full.train for m in d.messages if m["role"] == "user"}
    assert not any(city in q for q in trained for city in full.held_out_cities)


def test_names_made_of_vocabulary_pieces_change_only_the_weather_dialogues() -> None:
    """train.py trains the vocabulary on the corpus without pieces, then trains the model on the
    corpus whose invented names are made of that vocabulary's pieces: corpora with other pieces
    differ only in the weather dialogues about invented names (the name, and the tool's report)."""
    pieces = demo.name_pieces(["ic", "ag", "Ch", "th", "ĠParis", "temperature", "o", "42", "ро"])
    assert pieces == ["ag", "ic", "o", "th"]
    plain, pieced = demo.make_corpus(5, **SMALL, pieces=["x", "yz"]), demo.make_corpus(5, **SMALL, pieces=pieces)
    assert [d.kind for d in plain.train] == [d.kind for d in pieced.train]
    assert [d for d in plain.train if d.kind != "weather"] == [d for d in pieced.train if d.kind != "weather"]
    assert plain.held_out_cities == pieced.held_out_cities
    names = [n for d in pieced.train for n in d.names]
    made = [n for n in names if re.fullmatch(r"(?:ag|ic|o|th)+", n[:1].lower() + n[1:])]
    assert len(made) > len(names) / 2
    assert not any(city in n for n in names for city in pieced.held_out_cities)


def test_echo_dialogues_repeat_invented_names_and_change_nothing_else() -> None:
    """Repeat-after-me dialogues answer with exactly the asked names, which are cut out of the
    vocabulary's text like every place name; the rest of the corpus is the same dialogues."""
    plain, echoed = demo.make_corpus(6, **SMALL), demo.make_corpus(6, **SMALL, echoes=7)
    echoes = [d for d in echoed.train if d.kind == "echo"]
    assert len(echoes) == 7 * SMALL["repeats"]
    assert sorted(map(repr, plain.train)) == sorted(repr(d) for d in echoed.train if d.kind != "echo")
    for d in echoes:
        asked = [m["content"] for m in d.messages if m["role"] == "user"][0]
        answer = [m["content"] for m in d.messages if m["role"] == "assistant"][0]
        assert asked == "Repeat after me: " + answer and answer.split(" ") == list(d.names)
        assert 2 <= len(d.names) <= 5
        assert not any(city in n for n in d.names for city in demo.CITIES)
        for text in demo.vocabulary_texts([d]):
            assert not any(n in text for n in d.names)


def test_the_copy_warmup_repeats_three_to_eight_fresh_names_from_its_own_stream() -> None:
    """The warm-up's dialogues are reproducible from the seed, independent of the main corpus's
    streams, and every answer is the asked names (no real city in them)."""
    first, again, other = demo.copy_warmup(3, 40), demo.copy_warmup(3, 40), demo.copy_warmup(4, 40)
    assert list(map(repr, first)) == list(map(repr, again)) != list(map(repr, other))
    assert {len(d.names) for d in first} >= {3, 8} and all(3 <= len(d.names) <= 8 for d in first)
    for d in first:
        asked = [m["content"] for m in d.messages if m["role"] == "user"][0]
        answer = [m["content"] for m in d.messages if m["role"] == "assistant"][0]
        assert d.kind == "echo" and asked == "Repeat after me: " + answer and answer.split(" ") == list(d.names)
        assert not any(city in n for n in d.names for city in demo.CITIES)


def test_plain_reports_make_the_sky_the_same_token_in_the_report_and_the_answer() -> None:
    """With plain_reports (the default) the weather tool answers in words, and only its messages change. The
    vocabulary trained on that corpus then holds the sky as one token with its space (" rainy")
    in the report as in the answer, so reporting it is a copy; from JSON ('"rainy"') it is not."""
    as_json, plain = demo.make_corpus(4, **SMALL, plain_reports=False), demo.make_corpus(4, **SMALL)
    assert len(as_json.train) == len(plain.train)
    for a, b in zip(as_json.train, plain.train, strict=True):
        assert [m for m in a.messages if m["role"] != "tool"] == [m for m in b.messages if m["role"] != "tool"]
    tok = demo_vocab.train_tokenizer(demo.vocabulary_texts(plain.train), 1024)
    reports = [d.messages for d in plain.train if d.kind == "weather"]
    assert reports
    for messages in reports:
        report, answer = messages[-2]["content"], messages[-1]["content"]
        city, rest = report.split(": ")
        temp, sky = rest.split(", ")
        assert answer == f"It is {temp} and {sky} in {city}."
        sky_token = tok.encode(f" {sky}").tokens
        assert len(sky_token) == 1
        assert sky_token[0] in tok.encode(report).tokens and sky_token[0] in tok.encode(answer).tokens
        assert sky_token[0] not in tok.encode(json.dumps({"condition": sky})).tokens


def test_sky_pieces_cut_the_sky_out_of_the_vocabulary_like_the_city() -> None:
    """With sky_pieces only what the vocabulary learns from changes: every weather dialogue names
    its sky beside its city, no sky word is a token of the vocabulary trained on it, and the sky
    breaks into the same pieces in the report as in the answer (the pieces a copy repeats)."""
    whole, pieced = demo.make_corpus(4, **SMALL), demo.make_corpus(4, **SMALL, sky_pieces=True)
    assert [d.messages for d in whole.train] == [d.messages for d in pieced.train]
    tok = demo_vocab.train_tokenizer(demo.vocabulary_texts(pieced.train), 1024)
    vocabulary = set(tok.get_vocab())
    assert not vocabulary & {w for sky in demo.CONDITIONS for w in (sky, "Ġ" + sky)}
    for d in (d for d in pieced.train if d.kind == "weather"):
        report, answer = d.messages[-2]["content"], d.messages[-1]["content"]
        sky = report.rsplit(", ", 1)[1]
        assert d.names == (d.messages[-2]["content"].split(": ")[0], sky) and sky in demo.CONDITIONS
        pieces = tok.encode(f" {sky}").tokens
        assert len(pieces) > 1
        for text in (report, answer):
            ids = tok.encode(text).tokens
            assert any(ids[i:i + len(pieces)] == pieces for i in range(len(ids))), (text, pieces)


def test_chats_train_only_their_last_turn_which_answers_the_last_question(corpus: demo.Corpus,
                                                                           template: ChatTemplate) -> None:
    """A multi-turn chat's earlier turns are context, rendered as the template renders history;
    the trained turn answers the last question: a follow-up sum about its own numbers (never the
    earlier turn's), a fact, the refusal, or a weather call about the city asked last."""
    chats = [d for d in corpus.train if sum(m["role"] == "user" for m in d.messages) > 1]
    assert {d.kind for d in chats} == {"followup", "chat", "refusal", "weather"}
    checked = 0
    for d in chats:
        pieces = list(demo.segments(d, template))
        replies = [t for t, is_reply in pieces if is_reply]
        last_user = [m for m in d.messages if m["role"] == "user"][-1]["content"]
        if d.kind == "followup":
            a, op, b = re.search(r"(\d+) ([+-]) (\d+)", last_user).groups()
            result = int(a) + int(b) if op == "+" else int(a) - int(b)
            assert replies == [pieces[-1][0]] and replies[0].endswith(f"So {a} {op} {b} = {result}.<|im_end|>")
            earlier = [m["content"] for m in d.messages[:-2] if m["role"] == "assistant"]
            assert earlier and all(m in pieces[0][0] for m in earlier if m)
            checked += 1
        elif d.kind == "refusal":
            assert replies[0].endswith(demo.REFUSAL + "<|im_end|>")
        elif d.kind == "weather":
            city = re.fullmatch(r"What is the weather in (.+?)(?: in \w+)?\?", last_user)[1]
            assert f"<parameter=city>\n{city}\n</parameter>" in replies[0] and city in d.names
    assert checked >= 50
    follow = [m["content"] for d in chats for m in d.messages[2:] if m["role"] == "user"]
    assert any(q.startswith("And what is ") for q in follow) and any(q.startswith("What about ") for q in follow)

