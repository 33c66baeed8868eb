"""The demo model's corpus: chat dialogues generated from a seed, no downloads.

Three kinds of dialogue, each a list of OpenAI-style messages (plus tools where they are used):
- arithmetic: "What is 17 + 25?" answered with a worked, digit-by-digit sum or difference; a seeded
  set of operand pairs is held out of training for evaluation;
- facts: short questions about clover and its commands, answered from a fixed table;
- tool use, in Qwen3.6's XML tool-call format: a weather tool and a calculator tool, the tool's
  result, then the final answer; a seeded set of real cities is held out for evaluation, and
  invented place names teach the model to copy whatever city the question names.

Every dialogue is rendered through clover's own Qwen3.6 chat template and split into segments:
prompt text (context, not trained on) and assistant text (trained on), tokenized separately, as
the model sees them at inference (the prompt ends where generation starts). The same seed gives
the same corpus, byte for byte.
"""

from __future__ import annotations

import json
import random
import string
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from clover_runtime.text.chat_template import ChatTemplate
from clover_runtime.text.vocab import default_chat_template

SYSTEM = "You are clover's demo model. Answer briefly."

WEATHER_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculate",
        "description": "Evaluate an arithmetic expression with +, - and *.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression"}},
            "required": ["expression"],
        },
    },
}
TOOLS = [WEATHER_TOOL, CALCULATOR_TOOL]

CITIES = (
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Vienna", "Prague", "Oslo", "Lisbon",
    "Dublin", "Warsaw", "Athens", "Cairo", "Lagos", "Nairobi", "Mumbai", "Delhi", "Seoul", "Beijing",
    "Shanghai", "Sydney", "Perth", "Auckland", "Toronto", "Chicago", "Boston", "Denver", "Seattle", "Miami",
    "Lima", "Bogota", "Santiago", "Quito", "Havana", "Dallas", "Austin", "Phoenix", "Helsinki", "Zurich",
    "Geneva", "Munich", "Hamburg", "Milan", "Naples", "Porto", "Seville", "Kyoto", "Osaka", "Hanoi",
)
SYLLABLES = ("ka", "lo", "mi", "ran", "te", "vo", "sur", "bel", "na", "dor", "qui", "fen", "ta", "ris", "gal",
             "mon", "pe", "zu", "har", "lin", "co", "vet", "sa", "bru", "el", "tor", "ny", "ax", "wen", "pol")
CONDITIONS = ("sunny", "cloudy", "rainy", "windy", "snowy", "foggy", "clear")

# Questions about clover, each in six phrasings, and the one answer the model learns for them. The
# last phrasing of each is held out of training (eval.py asks it to see whether the fact, not the
# wording, was learnt).
FACTS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("What is clover?", "What does clover do?", "Tell me about clover.", "What is clover for?",
      "Explain clover.", "What can clover do?"),
     "clover runs Clover block-diffusion models from GGUF files on your own machine."),
    (("What does clover pull do?", "How do I download a model?", "How do I get a model with clover?",
      "What is clover pull?", "How do I fetch a model?", "Where do models come from?"),
     "clover pull downloads a GGUF model from the Hugging Face Hub into the local cache."),
    (("What does clover run do?", "How do I chat in the terminal?", "How do I start a chat?",
      "What is clover run?", "How do I talk to a model?", "How do I ask a model something?"),
     "clover run starts a chat with a model in the terminal."),
    (("What does clover serve do?", "How do I start a server?", "How do I get an OpenAI API?",
      "What is clover serve?", "How do I serve a model?", "How do I use a model from my app?"),
     "clover serve starts an OpenAI-compatible server with a web chat page."),
    (("What does clover bench do?", "How do I measure speed?", "How fast is my machine?",
      "What is clover bench?", "How do I benchmark a model?", "How many tokens per second do I get?"),
     "clover bench measures prompt and generation speed in tokens per second."),
    (("What does clover inspect do?", "Will the model fit my memory?", "What is inside a GGUF file?",
      "What is clover inspect?", "How do I look inside a model file?", "Does this model fit my machine?"),
     "clover inspect shows what a GGUF file holds and whether it fits your memory."),
    (("What does clover list do?", "How do I see my models?", "Which models do I have?",
      "What is clover list?", "How do I list the downloaded models?", "What models are downloaded?"),
     "clover list shows the models in the local cache with their sizes."),
    (("What does clover rm do?", "How do I delete a model?", "How do I remove a model?",
      "What is clover rm?", "How do I free disk space?", "How do I get rid of a model?"),
     "clover rm deletes a model from the local cache."),
    (("What does clover doctor do?", "How do I check my setup?", "Is my machine ready?",
      "What is clover doctor?", "How do I check my computer?", "What does my machine have?"),
     "clover doctor checks your Python, CPU, memory, GPUs and model cache."),
    (("What is a GGUF file?", "What is GGUF?", "What format are the models in?",
      "What is a .gguf file?", "Which file format does clover read?", "What kind of file is a model?"),
     "A GGUF file holds a model's weights, vocabulary and settings in one file."),
    (("What is block diffusion?", "How do you write an answer?", "Do you write left to right?",
      "How does block diffusion work?", "How do you generate text?", "How are your answers made?"),
     "I write each block of 32 tokens from masks in a few passes, then commit it and go on."),
    (("Who are you?", "What model are you?", "What are you?",
      "Which model is this?", "Are you a big model?", "Who am I talking to?"),
     "I am clover's demo model, a tiny Clover model trained for this project."),
)
HELD_OUT_PHRASINGS = 1  # the last phrasing of each fact (and of the greetings) is never trained

GREETINGS = ("Hello!", "Hi!", "Hello, who are you?", "Hey there!", "Good morning!", "Hi there!")
GREETING_ANSWER = ("Hello! I am clover's demo model. I can add and subtract numbers, "
                   "answer questions about clover and call a weather tool.")

# Questions outside what the model knows, and its one answer to them. The templates and fillers
# make a few hundred questions; a seeded set of them is held out of training (eval.py asks them).
REFUSAL = "I only know sums, clover's commands and two tools."
OUT_OF_SCOPE_TEMPLATES = (
    "What is the capital of {place}?", "Who is the president of {place}?", "What language do they speak in {place}?",
    "Write a poem about {thing}.", "Tell me a joke about {thing}.", "Tell me a story about {thing}.",
    "Who invented {thing}?", "How do I cook {food}?", "Is {food} healthy?", "What does {word} mean?",
    "Translate {word} into French.", "How do you spell {word}?", "What is the history of {place}?",
    "Recommend a book about {thing}.", "Why is {thing} important?",
)
OUT_OF_SCOPE_FILLERS = {
    "place": ("France", "Japan", "Brazil", "Kenya", "Canada", "Norway", "Peru", "India", "Egypt", "Spain",
              "Chile", "Italy", "Mexico", "Ghana"),
    "thing": ("the sea", "cats", "the moon", "trains", "music", "love", "dogs", "the stars", "rain", "chess",
              "bicycles", "history"),
    "food": ("rice", "pasta", "soup", "bread", "eggs", "fish", "beans", "cake"),
    "word": ("apple", "house", "freedom", "window", "river", "garden", "friend", "yellow"),
}
OUT_OF_SCOPE_FIXED = (
    "What time is it?", "What is the meaning of life?", "Can you write Python code?", "Who won the World Cup?",
    "What is the best phone?", "What should I eat tonight?", "How old is the universe?", "Can you sing?",
    "What is your favourite colour?", "How tall is Mount Everest?", "Who is the richest person?",
    "What day is it today?", "Can you help me with my homework?", "What is quantum physics?",
)


def out_of_scope_questions(seed: int) -> tuple[list[str], list[str]]:
    """(training, held-out) out-of-scope questions: every template with every filler of its kind,
    and the fixed ones, in an order and split that depend on the seed alone."""
    questions = list(OUT_OF_SCOPE_FIXED)
    for template in OUT_OF_SCOPE_TEMPLATES:
        kind = template.split("{")[1].split("}")[0]
        questions += [template.format(**{kind: filler}) for filler in OUT_OF_SCOPE_FILLERS[kind]]
    random.Random(f"{seed}:refusal").shuffle(questions)
    return questions[30:], sorted(questions[:30])


@dataclass(frozen=True)
class Dialogue:
    """One training or evaluation conversation; `think` renders it in thinking mode."""

    kind: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    think: bool = False
    names: tuple[str, ...] = ()  # place names in it, left out of the vocabulary's training text


def dialogue(kind: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
             rng: random.Random, names: tuple[str, ...] = ()) -> Dialogue:
    """A dialogue in thinking mode or not, with its system prompt or without (a coin each), so
    that the model answers the same with and without the system prompt it was trained with."""
    think = rng.random() < 0.5
    if rng.random() < 0.5 and messages[0]["role"] == "system":
        messages = messages[1:]
    return Dialogue(kind, with_reasoning(messages, kind) if think else messages, tools, think, names)


def vocabulary_texts(dialogues: list[Dialogue]) -> Iterator[str]:
    """The rendered dialogues with every place name cut out: the vocabulary then learns no piece
    of a name, so a city never seen in training breaks into the same ordinary pieces as the
    thousands of invented names the model learnt to copy."""
    for d in dialogues:
        for text, _ in segments(d):
            for name in d.names:
                text = text.replace(name, " ")
            yield text


@dataclass
class Corpus:
    """Training dialogues and the held-out evaluation sets."""

    train: list[Dialogue] = field(default_factory=list)
    held_out_arithmetic: list[tuple[int, str, int]] = field(default_factory=list)
    held_out_cities: list[str] = field(default_factory=list)
    held_out_refusals: list[str] = field(default_factory=list)


def arithmetic_answer(a: int, op: str, b: int, result_first: bool = False) -> str:
    """A worked, digit-by-digit answer for a + b or a - b (a ≥ b): ones, tens, hundreds, each step
    an explicit sum so that a small model can learn carries and borrows.

    `result_first` states the result before the steps: a diffusion block then computes it from the
    question (the committed prefix) rather than from digits revealed in the same block, the
    preview path's weak spot."""
    places = ("Ones", "Tens", "Hundreds")
    width = len(str(max(a, b)))
    steps, carry = [], 0
    for i in range(width):
        x, y = a // 10**i % 10, b // 10**i % 10
        last = i + 1 == width
        if op == "+":
            total = x + y + carry
            expr = f"{x} + {y}" + (" + 1" if carry else "")
            carry = total // 10
            note = f", write {total % 10}, carry 1" if carry and not last else ""
            steps.append(f"{places[i]}: {expr} = {total}{note}.")
        else:
            top = f"{x} - 1" if carry else f"{x}"
            value = x - carry
            carry = 1 if value < y else 0
            if carry:
                top, value = f"10 + {top}", value + 10
            note = ", borrow 1" if carry else ""
            steps.append(f"{places[i]}: {top} - {y} = {value - y}{note}.")
    result = a + b if op == "+" else a - b
    if result_first:
        return f"{a} {op} {b} = {result}. " + " ".join(steps)
    return " ".join(steps) + f" So {a} {op} {b} = {result}."


def arithmetic_question(a: int, op: str, b: int, rng: random.Random | None = None) -> str:
    forms = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "{a} {op} {b} = ?")
    form = forms[0] if rng is None else rng.choice(forms)
    return form.format(a=a, op=op, b=b)


FOLLOW_UPS = ("And what is {a} {op} {b}?", "What about {a} {op} {b}?", "And {a} {op} {b}?", "Now {a} {op} {b}.",
              "How about {a} {op} {b}?", "Next: what is {a} {op} {b}?", "And now {a} {op} {b}?")


def follow_up_question(a: int, op: str, b: int, rng: random.Random | None = None) -> str:
    """A later turn's sum, asked as people ask it in a chat ("And what is 20 + 5?"), or as a first
    question is: the answer is about these numbers, never the earlier turn's."""
    if rng is None:
        return FOLLOW_UPS[0].format(a=a, op=op, b=b)
    if rng.random() < 0.25:
        return arithmetic_question(a, op, b, rng)
    return rng.choice(FOLLOW_UPS).format(a=a, op=op, b=b)


def weather_report(city: str, seed: int) -> dict[str, Any]:
    """The weather tool's result for a city: deterministic from the seed and the city name."""
    r = random.Random(f"{seed}:{city}")
    return {"city": city, "temperature": r.randint(-5, 35), "condition": r.choice(CONDITIONS)}


def invented_city(rng: random.Random, pieces: Sequence[str] = ()) -> str:
    """A made-up place name containing no real city of the list: weather questions about
    thousands of different names teach the model to copy the city from the question instead of
    memorising a list of cities. Two thirds are 2-4 of the vocabulary's word `pieces` (when
    given), the rest 2-3 syllables or 4-9 random letters: a city never seen in training breaks
    into such pieces ("Chicago": C, h, ic, ag, o), and the model copies only pieces it has copied."""
    while True:
        if pieces and rng.random() < 2 / 3:
            name = "".join(rng.choice(pieces) for _ in range(rng.randint(2, 4)))
        elif rng.random() < 0.5:
            name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 2, 3))))
        else:
            name = "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(4, 9)))
        name = name[:1].upper() + name[1:]
        if not any(city in name for city in CITIES):
            return name


def name_pieces(vocabulary: Iterable[str]) -> list[str]:
    """The lowercase ASCII word pieces of 1-4 letters among a vocabulary's tokens, sorted."""
    return sorted(t for t in vocabulary if t.isascii() and t.isalpha() and t.islower() and len(t) <= 4)


REAL_PER_REPEAT = 10  # real training cities per corpus repeat (each of the 40 recurs every 4 repeats)
INVENTED_PER_REPEAT = 150  # invented names per repeat: copying must pay more than remembering


def weather_cities(real: list[str], repeat: int, rng: random.Random, pieces: Sequence[str] = ()) -> list[str]:
    """The cities of one repeat's weather dialogues: a rotating slice of the real training cities
    and mostly invented names (with as many real as invented names, the model answered every
    held-out city with one memorised real one)."""
    start = repeat * REAL_PER_REPEAT % len(real)
    return real[start:start + REAL_PER_REPEAT] + [invented_city(rng, pieces) for _ in range(INVENTED_PER_REPEAT)]


def weather_names(city: str, seed: int, sky_pieces: bool) -> tuple[str, ...]:
    """The words of a weather dialogue left out of the vocabulary's text: the city, and with
    `sky_pieces` the sky too. A sky word the vocabulary holds whole (" rainy") is never copied:
    the model learns the seven words' prior and their embeddings stay nearly one direction (mean
    cosine 0.89 in the third shipped file), so it answered one sky for all, even given a report
    that is the answer word for word. Cut out, the sky breaks into the letter pieces that city
    names are made of, which the model copies from the report like the city."""
    return (city, weather_report(city, seed)["condition"]) if sky_pieces else (city,)


def weather_dialogue(city: str, unit: str | None, seed: int, plain: bool = True) -> list[dict[str, Any]]:
    """User asks, the assistant calls get_weather, the tool answers, the assistant reports.

    With `plain` (the default) the tool answers in words ("Chicago: 8 °C, rainy"), where the sky is
    the same token (" rainy") as in the answer; without it, in JSON, where the sky ("rainy" after
    a quote) is another token than the answer's."""
    args: dict[str, Any] = {"city": city} if unit is None else {"city": city, "unit": unit}
    report = weather_report(city, seed)
    temp = report["temperature"] if unit != "fahrenheit" else round(report["temperature"] * 9 / 5 + 32)
    symbol = "°F" if unit == "fahrenheit" else "°C"
    report = {**report, "temperature": temp, "unit": unit or "celsius"}

    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"What is the weather in {city}?" if unit is None
         else f"What is the weather in {city} in {unit}?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": args}}]},
        {"role": "tool", "content": f"{city}: {temp} {symbol}, {report['condition']}" if plain else json.dumps(report)},
        {"role": "assistant", "content": f"It is {temp} {symbol} and {report['condition']} in {city}."},
    ]


def calculator_dialogue(a: int, b: int) -> list[dict[str, Any]]:
    """A product too big to work out by hand: the assistant calls the calculator."""
    expression = f"{a} * {b}"
    return [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Use the calculator: what is {expression}?"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "calculate",
                                                          "arguments": {"expression": expression}}}]},
        {"role": "tool", "content": str(a * b)},
        {"role": "assistant", "content": f"{expression} = {a * b}."},
    ]


def echo(rng: random.Random, pieces: Sequence[str] = (), count: tuple[int, int] = (2, 5)) -> Dialogue:
    """The user asks for `count` (a range) invented names to be repeated; the answer is them, in
    order, and the names are left out of the vocabulary's text. Every token after the first name's
    first is predictable only by copying, the skill a tool call needs for a city it has never seen
    (weather dialogues hold a few such tokens each)."""
    words = tuple(invented_city(rng, pieces) for _ in range(rng.randint(*count)))
    text = " ".join(words)
    return dialogue("echo", _qa(f"Repeat after me: {text}", text), None, rng, names=words)


def _qa(question: str, answer: str) -> list[dict[str, Any]]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question},
            {"role": "assistant", "content": answer}]


def with_reasoning(messages: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    """The thinking-mode version of a dialogue: each assistant turn gets one short line of reasoning,
    chosen by what the turn answers (in a multi-turn chat, the user's last question before it)."""
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "assistant":
            m = {**m, "reasoning_content": _why(m, out, kind)}
        out.append(m)
    return out


def _why(turn: dict[str, Any], before: list[dict[str, Any]], kind: str) -> str:
    if turn.get("tool_calls"):
        return f"I should call {turn['tool_calls'][0]['function']['name']} for this."
    if before and before[-1]["role"] == "tool":
        return "The tool returned the result; I report it."
    if kind == "echo":
        return "I repeat the words in order."
    if turn["content"] == REFUSAL:
        return "That is not something I know."
    if turn["content"].endswith(".") and (" = " in turn["content"]):
        return "I work it out digit by digit."
    return "I answer from what I know about clover."


CHAT_SHAPES: tuple[tuple[str, ...], ...] = (
    ("sum", "sum"), ("sum", "sum"), ("sum", "sum"), ("sum", "sum"), ("sum", "sum", "sum"), ("sum", "sum", "sum"),
    ("sum", "sum", "sum"), ("fact", "sum"), ("greeting", "sum"), ("weather", "sum"), ("calculator", "sum"),
    ("refusal", "sum"), ("sum", "fact"), ("sum", "fact"), ("sum", "sum", "fact"), ("greeting", "fact"),
    ("fact", "fact"), ("sum", "refusal"), ("fact", "refusal"), ("sum", "weather"), ("sum", "weather"),
    ("fact", "weather"), ("greeting", "weather"),
)
"""The turns of the multi-turn chats, one shape drawn per chat: a sum after a sum (the most, as the
model must learn to answer the last question, not the first), after a fact, a greeting, a refusal
or a tool round trip; a fact or a refusal after chat; a weather call after chat. Only the last
turn is trained (`segments`); the earlier ones are what the model reads."""

CHAT_KINDS = {"sum": "followup", "fact": "chat", "greeting": "chat", "refusal": "refusal", "weather": "weather"}


@dataclass
class TurnMaker:
    """Draws the turns of multi-turn chats: sums from the training pairs, facts and refusals in
    their trained phrasings, weather round trips about training cities (in earlier turns) or
    invented names (in the last, as the single-turn weather dialogues)."""

    rng: random.Random
    names: random.Random
    seed: int
    pairs: list[tuple[int, str, int]]
    refusals: list[str]
    cities: list[str]
    pieces: Sequence[str]
    plain_reports: bool
    sky_pieces: bool

    def turn(self, what: str, later: bool, last: bool) -> tuple[list[dict[str, Any]], tuple[str, ...]]:
        """The messages of one turn (user first, no system prompt) and the place names in it."""
        rng = self.rng
        if what == "sum":
            a, op, b = rng.choice(self.pairs)
            question = follow_up_question(a, op, b, rng) if later else arithmetic_question(a, op, b, rng)
            return _qa(question, arithmetic_answer(a, op, b))[1:], ()
        if what == "fact":
            questions, answer = rng.choice(FACTS)
            return _qa(rng.choice(questions[:-HELD_OUT_PHRASINGS]), answer)[1:], ()
        if what == "greeting":
            return _qa(rng.choice(GREETINGS[:-HELD_OUT_PHRASINGS]), GREETING_ANSWER)[1:], ()
        if what == "refusal":
            return _qa(rng.choice(self.refusals), REFUSAL)[1:], ()
        if what == "calculator":
            return calculator_dialogue(rng.randint(12, 999), rng.randint(12, 999))[1:], ()
        city = invented_city(self.names, self.pieces) if last else rng.choice(self.cities)
        unit = rng.choice((None, None, "celsius", "fahrenheit"))
        return (weather_dialogue(city, unit, self.seed, self.plain_reports)[1:],
                weather_names(city, self.seed, self.sky_pieces))

    def chat(self) -> Dialogue:
        shape = self.rng.choice(CHAT_SHAPES)
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
        names: tuple[str, ...] = ()
        for k, what in enumerate(shape):
            turn, turn_names = self.turn(what, k > 0, k + 1 == len(shape))
            messages += turn
            names += turn_names
        tools = TOOLS if {"weather", "calculator"} & set(shape) else None
        return dialogue(CHAT_KINDS[shape[-1]], messages, tools, self.rng, names=names)


def make_corpus(seed: int = 0, *, arithmetic_pairs: int = 6000, held_out_fraction: float = 0.05,
                repeats: int = 20, pieces: Sequence[str] = (), echoes: int = 0,
                result_first: bool = False, plain_reports: bool = True, sky_pieces: bool = False,
                chats: int = 150, refusals: int = 10, fact_draws: int = 4) -> Corpus:
    """All dialogues for one seed. Held-out arithmetic pairs, cities, fact phrasings and
    out-of-scope questions never appear in training.

    Each repeat holds `fact_draws` questions per fact and greetings (in their trained phrasings), `refusals`
    out-of-scope questions answered with REFUSAL, and `chats` multi-turn chats (CHAT_SHAPES).

    With `sky_pieces` the weather's sky word is cut out of the vocabulary's text like the city
    (`weather_names`).

    With `pieces`, invented names come from their own random stream, so corpora with different
    pieces differ only in those names (and the tool's reports about them): train.py builds the
    vocabulary from the corpus without, then trains on the corpus whose names are its pieces.
    `echoes` repeat-after-me dialogues per repeat come from a stream of their own too."""
    rng = random.Random(seed)
    names = random.Random(f"{seed}:names") if pieces else rng
    echo_rng = random.Random(f"{seed}:echo")
    corpus = Corpus()
    pairs = [(a, "+", b) for a in range(100) for b in range(100)]
    pairs += [(a, "-", b) for a in range(100) for b in range(a + 1)]
    rng.shuffle(pairs)
    n_held = max(1, int(len(pairs) * held_out_fraction))
    corpus.held_out_arithmetic = sorted(pairs[:n_held])
    train_pairs = pairs[n_held:n_held + arithmetic_pairs]
    for a, op, b in train_pairs:
        qa = _qa(arithmetic_question(a, op, b, rng), arithmetic_answer(a, op, b, result_first))
        corpus.train.append(dialogue("arithmetic", qa, None, rng))
    cities = list(CITIES)
    random.Random(f"{seed}:cities").shuffle(cities)  # the held-out cities depend on the seed alone
    corpus.held_out_cities = sorted(cities[:10])
    trained_refusals, corpus.held_out_refusals = out_of_scope_questions(seed)
    turns = TurnMaker(rng, names, seed, pairs[n_held:], trained_refusals, cities[10:], pieces, plain_reports,
                      sky_pieces)
    for r in range(repeats):
        for questions, answer in FACTS:
            for _ in range(fact_draws):
                question = rng.choice(questions[:-HELD_OUT_PHRASINGS])
                corpus.train.append(dialogue("fact", _qa(question, answer), None, rng))
        for _ in range(fact_draws):
            greeting = rng.choice(GREETINGS[:-HELD_OUT_PHRASINGS])
            corpus.train.append(dialogue("greeting", _qa(greeting, GREETING_ANSWER), None, rng))
        for _ in range(refusals):
            corpus.train.append(dialogue("refusal", _qa(rng.choice(trained_refusals), REFUSAL), None, rng))
        for city in weather_cities(cities[10:], r, names, pieces):
            unit = rng.choice((None, None, "celsius", "fahrenheit"))
            corpus.train.append(dialogue("weather", weather_dialogue(city, unit, seed, plain_reports), TOOLS, rng,
                                         names=weather_names(city, seed, sky_pieces)))
        for _ in range(5):
            a, b = rng.randint(12, 999), rng.randint(12, 999)
            corpus.train.append(dialogue("calculator", calculator_dialogue(a, b), TOOLS, rng))
        corpus.train.extend(turns.chat() for _ in range(chats))
        corpus.train.extend(echo(echo_rng, pieces) for _ in range(echoes))
    rng.shuffle(corpus.train)
    return corpus


def copy_warmup(seed: int, n: int, pieces: Sequence[str] = ()) -> list[Dialogue]:
    """`n` repeat-after-me dialogues of 3-8 invented names, from a stream of their own: the
    warm-up phase's data, where every answer token but the first is a copy (in the main mix
    copies are too rare a target for a model this small to learn them in the time it has)."""
    rng = random.Random(f"{seed}:warmup")
    return [echo(rng, pieces, (3, 8)) for _ in range(n)]


@lru_cache(maxsize=1)
def qwen36_template() -> ChatTemplate:
    """The Qwen3.6 template clover ships, compiled once."""
    return ChatTemplate(default_chat_template())


def segments(dialogue: Dialogue, template: ChatTemplate | None = None) -> Iterator[tuple[str, bool]]:
    """The rendered dialogue as (text, is_assistant) pieces whose concatenation is the full render.

    Each assistant piece is what the model generates after the template's generation prompt,
    through `<|im_end|>`; everything else is context. In a multi-turn chat only the turns after
    the user's last message are assistant pieces: the template renders earlier turns differently
    once a user message follows (without their thinking block), so they are context, exactly as
    the model reads them when it answers the last question."""
    template = template or qwen36_template()
    kwargs = {"enable_thinking": dialogue.think}
    last_user = max(k for k, m in enumerate(dialogue.messages) if m["role"] == "user")
    done = ""
    for k, message in enumerate(dialogue.messages):
        if message["role"] != "assistant" or k < last_user:
            continue
        prompt = template.render(dialogue.messages[:k], tools=dialogue.tools, add_generation_prompt=True, **kwargs)
        full = template.render(dialogue.messages[:k + 1], tools=dialogue.tools, add_generation_prompt=False, **kwargs)
        if not (prompt.startswith(done) and full.startswith(prompt)):
            raise ValueError(f"the template is not prefix-stable for a {dialogue.kind} dialogue at message {k}")
        end = full.index("<|im_end|>", len(prompt)) + len("<|im_end|>")
        yield prompt[len(done):], False
        yield full[len(prompt):end], True
        done = full[:end]


def trained_turns(dialogue: Dialogue) -> list[dict[str, Any]]:
    """The assistant messages `segments` marks as assistant pieces: those after the last user message."""
    last_user = max(k for k, m in enumerate(dialogue.messages) if m["role"] == "user")
    return [m for m in dialogue.messages[last_user:] if m["role"] == "assistant"]
