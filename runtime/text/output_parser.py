"""Turning a Qwen3.5/3.6 reply back into OpenAI fields: reasoning, content and tool calls.

The parser is fed text as it is produced and emits deltas as soon as they are certain. Each feed
re-reads the reply with a pure function of (text so far, finished?) that reports only what no
later text can change, and emits what grew since the previous feed. So the result never depends
on where the text was split, and a 32-token block that completes several parameters or calls at
once emits all of them in order. Re-reading starts at the last settled point (a finished call,
the end of the reasoning), which keeps long replies linear.

Format and rules: docs/tool-calls.md. In short: reasoning runs to `</think>` (or to a
`<tool_call>` when the reply ends without closing it); content runs to the first `<tool_call>`;
each call is `<function=NAME>` with `<parameter=KEY>` blocks whose values lose one leading and
one trailing newline and are typed by the tool's JSON schema. Tags inside values only count in
context (docs/tool-calls.md §2.2), so values may quote the format itself.

Markup that is no call of an offered tool (a call to a function the request did not offer, or when
it offered none; a malformed call; stray tags of a broken call, such as a `</parameter>` with no
opening) stays in the content, as llama-server keeps it, but is emitted as `ToolMarkup` so that a
screen can show a note in its place.
"""

from __future__ import annotations

import ast
import json
import math
import re
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .reply import ContentDelta, ParseError, ReasoningDelta, Reply, ToolCallArgs, ToolCallStart, ToolMarkup

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
FUNC_OPEN, FUNC_CLOSE = "<function=", "</function>"
PARAM_OPEN, PARAM_CLOSE = "<parameter=", "</parameter>"
_NAME_RE = re.compile(r"[^\s{}<>\"']*")
_MAX_NAME = 200
_PENDING = object()  # "cannot decide before more text arrives"
_JUNK = object()
_OFFERED = object()  # "a call to an offered tool: parse it"
_TAG = r"</?tool_call>|</function>|</parameter>|<(?:function|parameter)=[^\s{}<>\"']{1,200}>"
_STRAY_RUN = re.compile(rf"(?:{_TAG})(?:\s*(?:{_TAG}))*")  # tags outside a call, whitespace between
_OPEN_AT_END = re.compile(rf"(?:(?:{_TAG})\s*)*(?:<(?:function|parameter)=[^\s{{}}<>\"']{{0,200}})?\Z")
_STRAY_TAGS = (CALL_OPEN, CALL_CLOSE, FUNC_OPEN, FUNC_CLOSE, PARAM_OPEN, PARAM_CLOSE)
_WRITTEN_PARAM = re.compile(r"<parameter=([^\s{}<>\"']{1,200})>\r?\n?(.*?)\r?\n?</parameter>", re.DOTALL)


# -- result ---------------------------------------------------------------------------------------
@dataclass
class ParsedOutput:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    markup: list[ToolMarkup] = field(default_factory=list)


def new_call_id() -> str:
    """`call_` and 24 random hex digits, like vLLM's qwen3_coder parser."""
    return "call_" + secrets.token_hex(12)


# -- typing values by schema (docs/tool-calls.md §2.1) -------------------------------------------
_STRING_TYPES = ("string", "str", "text", "varchar", "char", "enum")


def _schema_type(schema: Mapping[str, Any]) -> tuple[str | None, bool]:
    """(kind, nullable): kind is the first non-null type name, "other" for what the table calls
    "anything else" (a list of types, `$ref`, `oneOf`), None when the schema names no type."""
    if "anyOf" in schema and isinstance(schema["anyOf"], list):
        branches = [b for b in schema["anyOf"] if isinstance(b, Mapping)]
        nullable = any(b.get("type") == "null" for b in branches)
        first = next((b for b in branches if b.get("type") != "null"), {})
        t = first.get("type")
        if isinstance(t, str):
            return t.strip().lower(), nullable
        return ("other" if t is not None or not first or "$ref" in first else None), nullable
    t = schema.get("type")
    if isinstance(t, list):
        return "other", "null" in t
    if isinstance(t, str):
        return t.strip().lower(), t.strip().lower() == "null"
    if "$ref" in schema or "oneOf" in schema or "allOf" in schema:
        return "other", False
    if "enum" in schema:
        return "enum", False
    return None, False


def _literal(text: str) -> Any:
    """JSON, else a Python literal (Qwen3.5 writes True/False/None), else ValueError."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise ValueError(text) from None
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        raise ValueError(text) from None  # sets, bytes, complex: not JSON
    return value


def convert_value(raw: str, schema: Mapping[str, Any] | None) -> Any:
    """A parameter value typed by its JSON schema; strings (and unknown parameters) stay verbatim."""
    if schema is None or not isinstance(schema, Mapping):
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
            return int(text)
        except ValueError:
            pass
        try:
            num = float(text)
        except ValueError:
            return raw
        if not math.isfinite(num):
            return raw
        return int(num) if num.is_integer() else num
    if kind.startswith(("boolean", "bool")):
        return text.lower() == "true"
    try:
        return _literal(text)
    except ValueError:
        return raw


def _schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, dict[str, Any] | None]:
    """Function name → its parameter properties (None when the tool gives no properties)."""
    out: dict[str, dict[str, Any] | None] = {}
    for tool in tools or []:
        fn = tool.get("function", tool) if isinstance(tool, Mapping) else {}
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        props = params.get("properties") if isinstance(params, Mapping) else None
        out[fn["name"]] = {str(k): (v if isinstance(v, Mapping) else {}) for k, v in props.items()} \
            if isinstance(props, Mapping) else None
    return out


# -- small text helpers ---------------------------------------------------------------------------
def _partial_suffix(text: str, tags: Iterable[str]) -> int:
    """Length of the longest end of `text` that could be the start of one of `tags`."""
    best = 0
    for tag in tags:
        for k in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:k]):
                best = k
                break
    return best


def _skip_ws(text: str, pos: int) -> int:
    n = len(text)
    while pos < n and text[pos].isspace():
        pos += 1
    return pos


def _name_ok(name: str, *, allow_empty: bool = False) -> bool:
    """Function/parameter names: no whitespace, braces, angle brackets or quotes (phantom calls
    echo unrendered template text)."""
    return (allow_empty or bool(name)) and len(name) <= _MAX_NAME and _NAME_RE.fullmatch(name) is not None


def _parameter_name(text: str, pos: int) -> tuple[Any, int]:
    """The NAME of the `<parameter=NAME>` tag at `pos` and the index of its `>`; (_PENDING, -1) when
    the text ends where a name could still be growing, (None, -1) when no name can be there."""
    n0 = pos + len(PARAM_OPEN)
    gt = text.find(">", n0, n0 + _MAX_NAME + 1)
    if gt >= 0:
        return text[n0:gt], gt
    if len(text) - n0 <= _MAX_NAME and _name_ok(text[n0:], allow_empty=True):
        return _PENDING, -1
    return None, -1


def _is_tag_prefix(rest: str, tags: Iterable[str]) -> bool:
    """`rest` (the end of the text) could still grow into one of `tags`."""
    return any(len(rest) < len(t) and t.startswith(rest) for t in tags)


def _strip_one_newline(value: str) -> str:
    if value.startswith("\r\n"):
        value = value[2:]
    elif value.startswith("\n"):
        value = value[1:]
    if value.endswith("\r\n"):
        value = value[:-2]
    elif value.endswith("\n"):
        value = value[:-1]
    return value


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


# -- snapshot of what is certain ------------------------------------------------------------------
@dataclass
class _CallSnap:
    index: int
    name: str
    fragments: list[str]


@dataclass(frozen=True)
class _Markup:
    text: str
    name: str | None = None
    arguments: tuple[tuple[str, Any], ...] = ()


@dataclass
class _Snapshot:
    # (kind, item, glued): ("content", text) | ("markup", _Markup) | ("call", _CallSnap); a glued
    # piece continues the one before it (no blank line between)
    reasoning: str = ""
    items: list[tuple[str, Any, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    n_calls: int = 0

    def copy(self) -> _Snapshot:
        return _Snapshot(self.reasoning, list(self.items), list(self.errors), self.n_calls)

    def content(self, text: str, *, stray: bool = False) -> None:
        """A stretch of content; `stray`: tag runs in it (no call around them) become markup pieces."""
        text = text.strip()
        if not text:
            return
        if not stray:
            self.items.append(("content", text, False))
            return
        pos, glued = 0, False
        for m in _STRAY_RUN.finditer(text):
            if m.start() > pos:
                self.items.append(("content", text[pos:m.start()], glued))
                glued = True
            self.items.append(("markup", _Markup(m.group()), glued))
            glued, pos = True, m.end()
        if pos < len(text):
            self.items.append(("content", text[pos:], glued))

    def markup(self, raw: str, name: str | None = None, arguments: tuple[tuple[str, Any], ...] = ()) -> None:
        raw = raw.strip()
        if raw:
            self.items.append(("markup", _Markup(raw, name, arguments), False))

    def call(self, name: str, fragments: list[str]) -> _CallSnap:
        snap = _CallSnap(self.n_calls, name, fragments)
        self.n_calls += 1
        self.items.append(("call", snap, False))
        return snap


class OutputParser:
    """Incremental parser of one reply. `feed` and `finish` return lists of deltas.

    `starts_in_reasoning`: the prompt left a `<think>` block open (see chat_template.opens_reasoning).
    `parse_tool_calls=False` leaves any `<tool_call>` text in the content (tool_choice "none").
    """

    def __init__(self, tools: Sequence[Mapping[str, Any]] | None = None, *, starts_in_reasoning: bool = False,
                 parse_tool_calls: bool = True) -> None:
        self.tools = list(tools or [])
        self.schemas = _schemas(self.tools)
        self.starts_in_reasoning = starts_in_reasoning
        self.parse_tool_calls = parse_tool_calls
        self.text = ""
        self.finished = False
        self._sent_reasoning = 0
        self._sent_content = 0
        self._calls: list[list[Any]] = []  # [id, fragments sent] per started call
        self._errors_sent = 0
        # Caches that keep long replies linear; they hold only decisions later text cannot change.
        self._checkpoint: _Snapshot | None = None  # everything before `_checkpoint_pos` is settled
        self._checkpoint_pos = 0
        self._value_scan: dict[int, int] = {}  # value start → where to resume looking for its end

    @property
    def has_tool_calls(self) -> bool:
        return bool(self._calls)

    def feed(self, text: str) -> list[Any]:
        if self.finished:
            raise RuntimeError("OutputParser.feed after finish")
        if not text:
            return []
        self.text += text
        return self._emit(final=False)

    def finish(self) -> list[Any]:
        """The reply is complete: resolve everything still held back."""
        if self.finished:
            return []
        self.finished = True
        return self._emit(final=True)

    # -- emission ---------------------------------------------------------------------------------
    def _emit(self, final: bool) -> list[Any]:
        snap = self._parse(self.text, final)
        out: list[Any] = []
        if len(snap.reasoning) > self._sent_reasoning:
            out.append(ReasoningDelta(snap.reasoning[self._sent_reasoning:]))
            self._sent_reasoning = len(snap.reasoning)
        joined = 0  # length of the content so far, segments joined by a blank line
        for kind, item, glued in snap.items:
            if kind in ("content", "markup"):
                piece = ("\n\n" if joined and not glued else "") + (item if kind == "content" else item.text)
                end = joined + len(piece)
                if end > self._sent_content:
                    rest = piece[max(0, self._sent_content - joined):]
                    out.append(ContentDelta(rest) if kind == "content" else ToolMarkup(rest, item.name, item.arguments))
                    self._sent_content = end
                joined = end
                continue
            if item.index >= len(self._calls):
                self._calls.append([new_call_id(), 0])
                out.append(ToolCallStart(item.index, self._calls[item.index][0], item.name))
            state = self._calls[item.index]
            if len(item.fragments) > state[1]:
                out.append(ToolCallArgs(item.index, "".join(item.fragments[state[1]:])))
                state[1] = len(item.fragments)
        for message in snap.errors[self._errors_sent:]:
            out.append(ParseError(message))
        self._errors_sent = max(self._errors_sent, len(snap.errors))
        return out

    # -- parsing: a pure function of (text, final), cached at settled points ---------------------
    def _parse(self, text: str, final: bool) -> _Snapshot:
        if self._checkpoint is not None:
            snap = self._checkpoint.copy()
            self._body(text, self._checkpoint_pos, final, snap, settled=True)
            return snap
        snap = _Snapshot()
        start = self._reasoning_start(text, final)
        if start is None:
            return snap
        if start < 0:
            self._body(text, 0, final, snap, settled=True)
            return snap
        end, body_at = self._reasoning_end(text, start, final)
        snap.reasoning = text[start:end].strip()  # open: trailing whitespace waits for what follows
        if body_at is not None:
            self._body(text, body_at, final, snap, settled=body_at == end + len(THINK_CLOSE))
        return snap

    def _reasoning_start(self, text: str, final: bool) -> int | None:
        """Where reasoning text starts, -1 for none, None while undecided (`<thi…` so far)."""
        if self.starts_in_reasoning:
            return 0
        stripped = text.lstrip()
        if stripped.startswith(THINK_OPEN):
            return len(text) - len(stripped) + len(THINK_OPEN)
        if not final and THINK_OPEN.startswith(stripped):
            return None
        return -1

    def _reasoning_end(self, text: str, start: int, final: bool) -> tuple[int, int | None]:
        """(end of the reasoning text so far, where content and calls start or None)."""
        close = text.find(THINK_CLOSE, start)
        if close >= 0:
            return close, close + len(THINK_CLOSE)
        if self.parse_tool_calls:
            pos = start
            while (c := text.find(CALL_OPEN, pos)) >= 0:
                verdict, nxt = self._calls_in_reasoning(text, c, final)
                if verdict == "calls":
                    return c, c
                if verdict == "wait":
                    return c, None
                pos = nxt
        if final:
            return len(text), None
        return len(text) - _partial_suffix(text[start:], (THINK_CLOSE, CALL_OPEN)), None

    def _calls_in_reasoning(self, text: str, c: int, final: bool) -> tuple[str, int]:
        """A `<tool_call>` before any `</think>`: a draft the model goes on thinking about
        ("draft", where reasoning resumes), real calls if the reply ends with them ("calls"), or
        not yet known ("wait")."""
        q = c
        while True:
            close = text.find(CALL_CLOSE, q + len(CALL_OPEN))
            if close < 0:
                return ("calls" if final else "wait"), 0
            r = _skip_ws(text, close + len(CALL_CLOSE))
            if text.startswith(CALL_OPEN, r):
                q = r
                continue
            if r == len(text) or _is_tag_prefix(text[r:], (CALL_OPEN,)):
                return ("calls" if final else "wait"), 0
            return "draft", r

    def _body(self, text: str, pos: int, final: bool, snap: _Snapshot, *, settled: bool) -> None:
        """Content and tool calls from `pos` on. `settled`: the reasoning is decided, so each
        completed call is a checkpoint the next parse starts from."""
        while True:
            if settled and not final:
                self._checkpoint, self._checkpoint_pos = snap.copy(), pos
            c = text.find(CALL_OPEN, pos) if self.parse_tool_calls else -1
            if c < 0:
                tail = text[pos:]
                if not final and self.parse_tool_calls:  # a tag (or a run of stray ones) may still grow
                    tail = tail[: len(tail) - _partial_suffix(tail, _STRAY_TAGS)]
                    if (m := _OPEN_AT_END.search(tail)) is not None:
                        tail = tail[:m.start()]
                snap.content(tail, stray=self.parse_tool_calls)
                return
            snap.content(text[pos:c], stray=True)
            end = self._call(text, c, final, snap)
            if end is None:
                return
            pos = end

    # -- one call ---------------------------------------------------------------------------------
    def _call(self, text: str, c: int, final: bool, snap: _Snapshot) -> int | None:
        """Parse the call at `c` into `snap`; the index after it, or None while incomplete."""
        q = _skip_ws(text, c + len(CALL_OPEN))
        if text.startswith(FUNC_OPEN, q):
            return self._xml_call(text, c, q, final, snap)
        if q < len(text) and text[q] == "{":
            return self._json_call(text, c, q, final, snap)
        if not final and (q == len(text) or _is_tag_prefix(text[q:], (FUNC_OPEN,))):
            return None
        return self._malformed(text, c, final, snap, "no <function=NAME>")

    def _malformed(self, text: str, c: int, final: bool, snap: _Snapshot, why: str, *,
                   message: str | None = None, name: str | None = None,
                   arguments: tuple[tuple[str, Any], ...] | None = None) -> int | None:
        """A block that is not a call: reported, and its text kept as content (markup)."""
        close = text.find(CALL_CLOSE, c + len(CALL_OPEN))
        if close < 0 and not final:
            return None
        end = close + len(CALL_CLOSE) if close >= 0 else len(text)
        raw = text[c:end]
        snap.errors.append(message or f"malformed tool call ({why}): {raw[:120]!r}")
        snap.markup(raw, name, arguments if arguments is not None else _written_arguments(raw))
        return end

    def _unknown(self, text: str, c: int, final: bool, snap: _Snapshot, name: str,
                 arguments: tuple[tuple[str, Any], ...] | None = None) -> Any:
        """A call to a function the request did not offer (or when it offered none, as llama-server
        and OpenAI answer such a request) is no tool call: its text stays content, as markup, and is
        reported. `_OFFERED` when the name is one of the offered tools."""
        if name in self.schemas:
            return _OFFERED
        why = (f"the model called an unknown function {name!r}; its text is kept as content" if self.tools
               else f"the model called {name!r} but no tools were given; its text is kept as content")
        return self._malformed(text, c, final, snap, "", message=why, name=name, arguments=arguments)

    def _json_call(self, text: str, c: int, q: int, final: bool, snap: _Snapshot) -> int | None:
        """The older form: `<tool_call>{"name": …, "arguments": {…}}</tool_call>`."""
        close = text.find(CALL_CLOSE, q)
        if close < 0 and not final:
            return None
        body = text[q: close if close >= 0 else len(text)].strip()
        try:
            obj = json.loads(body)
            name = obj["name"]
            args = obj.get("arguments", obj.get("parameters", {}))
            if isinstance(args, str):
                args = json.loads(args) if args.strip() else {}
            if not isinstance(name, str) or not _name_ok(name) or not isinstance(args, dict):
                raise TypeError
        except (ValueError, KeyError, TypeError, AttributeError):
            return self._malformed(text, c, final, snap, "not a JSON object with a name and arguments")
        unknown = self._unknown(text, c, final, snap, name, tuple(args.items()))
        if unknown is not _OFFERED:
            return unknown
        snap.call(name, [_dumps(args)])
        if close < 0:
            snap.errors.append(f"tool call {snap.n_calls - 1} ({name}) has no </tool_call>")
            return len(text)
        return close + len(CALL_CLOSE)

    def _xml_call(self, text: str, c: int, q: int, final: bool, snap: _Snapshot) -> int | None:
        n0 = q + len(FUNC_OPEN)
        gt = text.find(">", n0, n0 + _MAX_NAME + 1)
        if gt < 0:
            if not final and len(text) - n0 <= _MAX_NAME and _name_ok(text[n0:], allow_empty=True):
                return None
            return self._malformed(text, c, final, snap, "bad function name")
        name = text[n0:gt]
        if not _name_ok(name):
            return self._malformed(text, c, final, snap, f"bad function name {name[:40]!r}")
        unknown = self._unknown(text, c, final, snap, name)
        if unknown is not _OFFERED:
            return unknown
        call = snap.call(name, ["{"])
        props = self.schemas.get(name)
        used: list[str] = []
        pos = gt + 1
        while True:
            pos = _skip_ws(text, pos)
            if text.startswith(PARAM_OPEN, pos):
                nxt = self._parameter(text, pos, final, call, props, used, snap)
                if nxt is _PENDING:
                    return None
                if nxt is not _JUNK:
                    if nxt is None:
                        return self._cut_off(call, snap, len(text))
                    pos = nxt
                    continue
            elif text.startswith(FUNC_CLOSE, pos):
                call.fragments.append("}")
                pos = _skip_ws(text, pos + len(FUNC_CLOSE))
                if text.startswith(CALL_CLOSE, pos):
                    return pos + len(CALL_CLOSE)
                if pos == len(text) or _is_tag_prefix(text[pos:], (CALL_CLOSE,)):
                    return len(text) if final else None
                return pos  # no </tool_call>: what follows is content or the next call
            elif text.startswith(CALL_CLOSE, pos):  # no </function>
                call.fragments.append("}")
                return pos + len(CALL_CLOSE)
            elif pos == len(text) or _is_tag_prefix(text[pos:], (PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE)):
                return self._cut_off(call, snap, len(text)) if final else None
            # Stray text inside the function: report it and resume at the next tag.
            marks = [m for m in (text.find(t, pos + 1) for t in (PARAM_OPEN, FUNC_CLOSE, CALL_CLOSE)) if m >= 0]
            if not marks:
                if not final:
                    return None
                snap.errors.append(f"unexpected text in tool call {name!r}: {text[pos:pos + 80]!r}")
                return self._cut_off(call, snap, len(text))
            snap.errors.append(f"unexpected text in tool call {name!r}: {text[pos:min(marks)][:80]!r}")
            pos = min(marks)

    def _cut_off(self, call: _CallSnap, snap: _Snapshot, end: int) -> int:
        if call.fragments[-1] != "}":
            call.fragments.append("}")
        snap.errors.append(f"tool call {call.index} ({call.name}) was cut off: the reply ended inside it")
        return end

    def _parameter(self, text: str, pos: int, final: bool, call: _CallSnap, props: dict[str, Any] | None,
                   used: list[str], snap: _Snapshot) -> Any:
        """One `<parameter=KEY>VALUE</parameter>`: the index after it, _PENDING, _JUNK (not a
        parameter tag), or None when the reply ended inside it."""
        key, gt = _parameter_name(text, pos)
        if key is _PENDING:
            return None if final else _PENDING
        if key is None or not _name_ok(key) or key in used:
            return _JUNK
        found = self._value_end(text, gt + 1, final, key, props, used)
        if found is _PENDING:
            return _PENDING
        raw_end, nxt, closed = found
        schema = props.get(key) if props is not None else None
        value = convert_value(_strip_one_newline(text[gt + 1:raw_end]), schema)
        try:
            encoded = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError):
            encoded = _dumps(text[gt + 1:raw_end])
        call.fragments.append(("" if not used else ", ") + _dumps(key) + ": " + encoded)
        used.append(key)
        if not closed:
            snap.errors.append(f"parameter {key!r} of tool call {call.index} ({call.name}) has no </parameter>")
            return None
        return nxt

    def _value_end(self, text: str, v0: int, final: bool, key: str, props: dict[str, Any] | None,
                   used: list[str]) -> Any:
        """(end of the raw value, where parsing resumes, properly closed) or _PENDING.

        `</parameter>` ends the value only when followed by another parameter tag, `</function>`,
        `</tool_call>` or the end of the reply; with a schema, a known unused `<parameter=` at the
        start of a line also ends it (a forgotten `</parameter>`)."""
        taken = {*used, key}
        s = max(v0, self._value_scan.get(v0, v0))
        nl_open = "\n" + PARAM_OPEN
        i1 = text.find(PARAM_CLOSE, s)
        i2 = text.find(nl_open, s) if props is not None else -1
        while True:
            if i1 < 0 and i2 < 0:
                if final:
                    return len(text), len(text), False
                self._value_scan[v0] = max(s, len(text) - len(nl_open))
                return _PENDING
            if i1 >= 0 and (i2 < 0 or i1 < i2):
                b = _skip_ws(text, i1 + len(PARAM_CLOSE))
                ok = self._ends_value(text, b, final, taken, props, v0, i1)
                if ok is _PENDING:
                    self._value_scan[v0] = i1
                    return _PENDING
                if ok:
                    return i1, i1 + len(PARAM_CLOSE), True
                s = i1 + 1
                i1 = text.find(PARAM_CLOSE, s)
            else:
                ok = self._parameter_tag_ok(text, i2 + 1, final, taken, props)
                if ok is _PENDING:
                    self._value_scan[v0] = i2
                    return _PENDING
                if ok:
                    return i2 + 1, i2 + 1, True
                s = i2 + 1
                i2 = text.find(nl_open, s)
            self._value_scan[v0] = s

    def _ends_value(self, text: str, b: int, final: bool, taken: set[str], props: dict[str, Any] | None,
                    v0: int, v1: int) -> Any:
        """Is the `</parameter>` at `v1` followed (after whitespace, at `b`) by structure?"""
        if b == len(text):
            return True if final else _PENDING
        if text.startswith(FUNC_CLOSE, b) or text.startswith(CALL_CLOSE, b):
            # not when the value quotes a whole call of its own
            return text.count(CALL_OPEN, v0, v1) <= text.count(CALL_CLOSE, v0, v1)
        if text.startswith(PARAM_OPEN, b):
            return self._parameter_tag_ok(text, b, final, taken, props)
        if _is_tag_prefix(text[b:], (FUNC_CLOSE, CALL_CLOSE, PARAM_OPEN)):
            return True if final else _PENDING
        return False

    def _parameter_tag_ok(self, text: str, b: int, final: bool, taken: set[str],
                          props: dict[str, Any] | None) -> Any:
        """Does the `<parameter=` at `b` open a new parameter (well-formed name, not used yet, and
        known to the schema when there is one)?"""
        name, _ = _parameter_name(text, b)
        if name is _PENDING:
            return True if final else _PENDING
        return name is not None and _name_ok(name) and name not in taken and (props is None or name in props)


def _written_arguments(raw: str) -> tuple[tuple[str, str], ...]:
    """The `<parameter=KEY>VALUE</parameter>` pairs of a call's text, as written (for a note)."""
    return tuple((m.group(1), m.group(2)) for m in _WRITTEN_PARAM.finditer(raw))


def accumulate(deltas: Iterable[Any]) -> ParsedOutput:
    """Fold deltas into the whole message (what a non-streaming response returns)."""
    reply = Reply()
    for d in deltas:
        reply.add(d)
    return ParsedOutput(reply.content or None, reply.reasoning or None, reply.tool_calls, reply.errors,
                        reply.markup)


def parse_full(text: str, tools: Sequence[Mapping[str, Any]] | None = None, *,
               starts_in_reasoning: bool = False, parse_tool_calls: bool = True) -> ParsedOutput:
    """Parse a complete reply in one piece."""
    parser = OutputParser(tools, starts_in_reasoning=starts_in_reasoning, parse_tool_calls=parse_tool_calls)
    return accumulate(parser.feed(text) + parser.finish())
