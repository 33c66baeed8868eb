"""A grammar for Qwen3.5/3.6 tool calls, so `tool_choice` "required" or a named function is enforced.

The reply is constrained to start with `<tool_call>` and the `<function=NAME>` of an offered tool
(or the named one), each parameter block in the XML form of docs/tool-calls.md with its value
constrained by the tool's JSON schema: strings are raw text up to `\\n</parameter>\\n` (a string
enum or const: one of its literals), everything else JSON as Qwen3.6's template renders it. Required
parameters come first, in the schema's order, then optional ones in order, each at most once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from .decoding.constraint import JSON_OPTIONS
from .text.output_parser import _STRING_TYPES, _schema_type


def _literal(text: str) -> str:
    """A Lark string literal (JSON's escapes are Lark's)."""
    return json.dumps(text, ensure_ascii=False)


def _string_choices(schema: Mapping[str, Any]) -> list[str] | None:
    """The literals a string enum or const allows, None for free text."""
    if isinstance(schema.get("const"), str):
        return [schema["const"]]
    values = schema.get("enum")
    if isinstance(values, list) and values and all(isinstance(v, str) for v in values):
        return list(values)
    return None


def _value_rule(name: str, schema: Mapping[str, Any], defs: Mapping[str, Any]) -> str:
    """The Lark rule for one parameter's value, ending with the parameter's closing tag."""
    close = _literal("\n</parameter>\n")
    kind, _ = _schema_type(schema)
    if kind is None or kind in _STRING_TYPES:
        choices = _string_choices(schema)
        if choices is not None:
            return f"{name}: ({' | '.join(_literal(c) for c in choices)}) {close}"
        return f'{name}[suffix={close}]: /(?s:.*)/'  # lazy: the value ends at the first closing tag
    embedded = {**defs, **schema, "x-guidance": JSON_OPTIONS}
    return f"{name}: %json {json.dumps(embedded, ensure_ascii=False)} {close}"


def _function(fn: Mapping[str, Any], i: int) -> list[str]:
    """The rules of one tool's call: `call_i` and its parameters."""
    params = fn.get("parameters") if isinstance(fn.get("parameters"), Mapping) else {}
    props = params.get("properties") if isinstance(params.get("properties"), Mapping) else {}
    required = [k for k in params.get("required") or [] if k in props]
    order = required + [k for k in props if k not in required]
    defs = {k: params[k] for k in ("$defs", "definitions") if k in params}
    rules, body = [], []
    for j, key in enumerate(order):
        schema = props[key] if isinstance(props[key], Mapping) else {}
        value = f"v_{i}_{j}"
        rules.append(f"p_{i}_{j}: {_literal(f'<parameter={key}>' + chr(10))} {value}")
        rules.append(_value_rule(value, schema, defs))
        body.append(f"p_{i}_{j}" + ("" if key in required else "?"))
    head = _literal(f"<tool_call>\n<function={fn['name']}>\n")
    tail = _literal("</function>\n</tool_call>")
    rules.insert(0, f"call_{i}: {head} {' '.join(body)} {tail}")
    return rules


def tool_call_lark(tools: Sequence[Mapping[str, Any]], *, parallel: bool = True) -> str:
    """A Lark grammar (llguidance's dialect) for a reply that is one call to one of `tools` (or
    several calls, one newline apart, when `parallel`)."""
    fns = [t.get("function", t) for t in tools]
    fns = [f for f in fns if isinstance(f, Mapping) and isinstance(f.get("name"), str)]
    if not fns:
        raise ValueError("no tool to call")
    rules = [line for i, fn in enumerate(fns) for line in _function(fn, i)]
    call = " | ".join(f"call_{i}" for i in range(len(fns)))
    start = f"start: call ({_literal(chr(10))} call)*" if parallel else "start: call"
    return "\n".join([start, f"call: {call}", *rules]) + "\n"
