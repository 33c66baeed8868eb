"""Turning a Qwen3.5/3.6 reply back into OpenAI fields: reasoning, content and tool calls.

The parser is fed text as it is produced and emits deltas as soon as they are certain. It re-reads
the whole reply on every feed (replies are short next to the cost of generating them) and emits
only what grew since the last feed, holding back a possible partial tag; so the result never
depends on where the text was split.
"""

from __future__ import annotations

import ast
import json
import re
import secrets
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
_FUNC_RE = re.compile(r"<function=([^>\n]+)>")
_PARAM_RE = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.DOTALL)


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallStart:
    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArgs:
    index: int
    fragment: str


@dataclass(frozen=True)
class ParseError:
    message: str
    raw: str = ""


@dataclass
class ParsedOutput:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


def new_call_id() -> str:
    alphabet = string.ascii_letters + string.digits
    return "call_" + "".join(secrets.choice(alphabet) for _ in range(24))


def _partial_suffix(text: str, tags: Iterable[str]) -> int:
    """Length of the longest end of `text` that could be the start of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), 0, -1):
            if text.endswith(tag[:k]):
                best = max(best, k)
                break
    return best


def _schema_types(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function", tool)
        props = (fn.get("parameters") or {}).get("properties") or {}
        out[fn.get("name", "")] = {k: (v or {}) for k, v in props.items()}
    return out


def _literal(text: str) -> Any:
    """JSON, else a Python literal (Qwen3.5 writes True/False/None), else a ValueError."""
    try:
        return json.loads(text)
    except (json.JSONDecodeError, ValueError):
        pass
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(text) from None


_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def _schema_type(schema: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(the first non-null type, nullable) of a parameter schema, following `anyOf`."""
    if "anyOf" in schema:
        branches = [b for b in schema["anyOf"] if isinstance(b, Mapping)]
        nullable = any(b.get("type") == "null" for b in branches)
        first = next((b for b in branches if b.get("type") != "null"), {})
        return (str(first.get("type")) if first.get("type") else None), nullable
    t = schema.get("type")
    if isinstance(t, list):
        return "list", "null" in t
    if t is None and "enum" in schema:
        return "enum", False
    return (str(t) if t is not None else None), t == "null"


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter value typed by its JSON schema (tool-calls.md table 2.1); strings stay verbatim."""
    if schema is None:
        return raw
    kind, nullable = _schema_type(schema)
    text = raw.strip()
    is_null = text.lower() in ("null", "none")
    if nullable and is_null:
        return None
    if kind is None or kind.startswith(_STRING_TYPES):
        return raw
    if is_null:
        return None
    if kind.startswith(("int", "uint", "long", "short", "unsigned")):
        try:
            return int(text)
        except ValueError:
            return raw
    if kind.startswith(("number", "float", "double")):
        try:
            num = float(text)
        except ValueError:
            return raw
        return int(num) if num.is_integer() else num
    if kind.startswith(("boolean", "bool")):
        return text.lower() == "true"
    try:
        return _literal(text)
    except ValueError:
        return raw


def _strip_one_newline(value: str) -> str:
    if value.startswith("\n"):
        value = value[1:]
    if value.endswith("\n"):
        value = value[:-1]
    return value


@dataclass
class _Call:
    name: str | None
    args_fragments: list[str]  # JSON pieces for completed parameters, in order
    complete: bool
    error: str | None = None
    raw: str = ""


class OutputParser:
    """Incremental parser of one reply. `feed` and `finish` return lists of deltas."""

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None, *, starts_in_reasoning: bool = False) -> None:
        self.tools = list(tools or [])
        self.schemas = _schema_types(self.tools)
        self.starts_in_reasoning = starts_in_reasoning
        self.text = ""
        self._sent_reasoning = 0
        self._sent_content = 0
        self._calls: list[tuple[str, int]] = []  # (id, args chars sent) per started call
        self._errors_sent = 0

    def feed(self, text: str) -> list[Any]:
        self.text += text
        return self._emit(final=False)

    def finish(self) -> list[Any]:
        return self._emit(final=True)

    # -- parsing ----------------------------------------------------------------------------------
    def _split_reasoning(self, final: bool) -> tuple[str, str, bool]:
        """(reasoning, rest, reasoning closed)."""
        text = self.text
        opened = self.starts_in_reasoning
        if not opened:
            stripped = text.lstrip()
            if stripped.startswith(THINK_OPEN):
                opened, text = True, stripped[len(THINK_OPEN):]
            elif not final and THINK_OPEN.startswith(stripped) and stripped:
                return "", "", False  # could still become <think>
        if not opened:
            return "", text, True
        end = text.find(THINK_CLOSE)
        if end < 0:
            hold = 0 if final else _partial_suffix(text, [THINK_CLOSE])
            return text[: len(text) - hold], "", final
        return text[:end], text[end + len(THINK_CLOSE):], True

    def _parse(self, final: bool) -> tuple[str, str, list[_Call], list[str]]:
        reasoning, rest, closed = self._split_reasoning(final)
        reasoning = reasoning.lstrip("\n")
        reasoning = reasoning.rstrip("\n") if closed else reasoning[: len(reasoning.rstrip("\n"))]
        if not closed:
            return reasoning, "", [], []
        rest = rest.lstrip("\n")
        start = rest.find(CALL_OPEN)
        errors: list[str] = []
        if start < 0:
            content = rest
            if not final:
                hold = _partial_suffix(content, [CALL_OPEN])
                content = content[: len(content) - hold]
                content = content[: len(content.rstrip())]
            else:
                content = content.rstrip()
            return reasoning, content, [], errors
        content = rest[:start].rstrip()
        calls: list[_Call] = []
        pos = start
        tail = ""
        while pos >= 0 and pos < len(rest):
            end = rest.find(CALL_CLOSE, pos)
            body = rest[pos + len(CALL_OPEN): end if end >= 0 else len(rest)]
            calls.append(self._parse_call(body, complete=end >= 0, final=final))
            if end < 0:
                break
            nxt = rest.find(CALL_OPEN, end)
            between = rest[end + len(CALL_CLOSE): nxt if nxt >= 0 else len(rest)]
            if nxt < 0:
                tail = between if final else ""
                break
            if between.strip():
                tail += between
            pos = nxt
        if tail.strip():
            content = (content + "\n\n" + tail.strip()).strip()
        for c in calls:
            if c.error:
                errors.append(c.error)
        return reasoning, content, calls, errors

    def _parse_call(self, body: str, *, complete: bool, final: bool) -> _Call:
        stripped = body.strip()
        if stripped.startswith("{"):
            if not complete:
                return _Call(None, [], False)
            try:
                obj = json.loads(stripped)
                name = obj["name"]
                args = obj.get("arguments", obj.get("parameters", {}))
                if isinstance(args, str):
                    args = json.loads(args)
            except (json.JSONDecodeError, KeyError, TypeError):
                return _Call(None, [], True, f"malformed tool call: {stripped[:80]!r}", body)
            frags = _object_fragments(list(args.items()) if isinstance(args, dict) else [])
            return _Call(name, frags, True, self._unknown(name))
        m = _FUNC_RE.search(body)
        if m is None:
            if complete or final:
                return _Call(None, [], True, f"malformed tool call (no <function=NAME>): {stripped[:80]!r}", body)
            return _Call(None, [], False)
        name = m.group(1).strip()
        schema = self.schemas.get(name, {})
        params = [(k.strip(), convert_value(_strip_one_newline(v), schema.get(k.strip())))
                  for k, v in _PARAM_RE.findall(body, m.end())]
        done = complete or final
        frags = _object_fragments(params, closed=done)
        return _Call(name, frags, done, self._unknown(name) if done else None)

    def _unknown(self, name: str) -> str | None:
        if self.tools and name not in self.schemas:
            return f"the model called an unknown function {name!r}"
        return None

    # -- emission ---------------------------------------------------------------------------------
    def _emit(self, final: bool) -> list[Any]:
        reasoning, content, calls, errors = self._parse(final)
        out: list[Any] = []
        if len(reasoning) > self._sent_reasoning:
            out.append(ReasoningDelta(reasoning[self._sent_reasoning:]))
            self._sent_reasoning = len(reasoning)
        raw_failures = "".join(c.raw for c in calls if c.name is None and c.raw)
        shown = content
        if final and raw_failures:
            shown = (content + ("\n\n" if content else "") + raw_failures.strip()).strip()
        if len(shown) > self._sent_content and shown.startswith(content[: self._sent_content]):
            out.append(ContentDelta(shown[self._sent_content:]))
            self._sent_content = len(shown)
        for i, call in enumerate(c for c in calls if c.name is not None):
            if i >= len(self._calls):
                cid = new_call_id()
                self._calls.append((cid, 0))
                out.append(ToolCallStart(i, cid, call.name or ""))
            cid, sent = self._calls[i]
            args = "".join(call.args_fragments)
            if len(args) > sent:
                out.append(ToolCallArgs(i, args[sent:]))
                self._calls[i] = (cid, len(args))
        for err in errors[self._errors_sent:]:
            out.append(ParseError(err))
        self._errors_sent = len(errors)
        return out


def _object_fragments(items: list[tuple[str, Any]], closed: bool = True) -> list[str]:
    """Pieces of a JSON object string, one per parameter, whose concatenation is the object."""
    frags = []
    for k, (key, value) in enumerate(items):
        prefix = "{" if k == 0 else ", "
        frags.append(prefix + json.dumps(key, ensure_ascii=False) + ": " + json.dumps(value, ensure_ascii=False))
    if closed:
        frags.append("}" if items else "{}")
    return frags


def accumulate(deltas: Iterable[Any]) -> ParsedOutput:
    content, reasoning = "", ""
    calls: list[dict[str, Any]] = []
    errors: list[str] = []
    for d in deltas:
        if isinstance(d, ContentDelta):
            content += d.text
        elif isinstance(d, ReasoningDelta):
            reasoning += d.text
        elif isinstance(d, ToolCallStart):
            calls.append({"id": d.id, "type": "function", "function": {"name": d.name, "arguments": ""}})
        elif isinstance(d, ToolCallArgs):
            calls[d.index]["function"]["arguments"] += d.fragment
        elif isinstance(d, ParseError):
            errors.append(d.message)
    return ParsedOutput(content or None, reasoning or None, calls, errors)


def parse_full(text: str, tools: Sequence[Mapping[str, Any]] | None = None, *,
               starts_in_reasoning: bool = False) -> ParsedOutput:
    parser = OutputParser(tools, starts_in_reasoning=starts_in_reasoning)
    return accumulate(parser.feed(text) + parser.finish())
