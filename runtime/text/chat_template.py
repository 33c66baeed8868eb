"""Chat templates: the GGUF's own Jinja template rendered the way transformers renders it.

A sandboxed jinja2 environment with the globals and filters Hugging Face templates expect
(`raise_exception`, `strftime_now`, `tojson` with `ensure_ascii=False`), `trim_blocks` and
`lstrip_blocks`, and loop controls. Errors name the template line. Files without a template get
ChatML, and `is_fallback` lets callers announce it.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from ..errors import TemplateError
from ..text_files import read_text

TEMPLATE_KEY = "tokenizer.chat_template"
_RESERVED = frozenset(("messages", "tools", "add_generation_prompt"))  # user kwargs never replace these


def _raise_exception(message: str) -> None:
    raise TemplateError(f"chat template error: {message}")


def _tojson(value: Any, indent: int | None = None, separators: Any = None, sort_keys: bool = False,
            ensure_ascii: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> Any:
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _template_line(tb: Any) -> int | None:
    """The line of the template being rendered when an exception was raised."""
    line = None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style messages as Hugging Face templates expect them: tool-call arguments as objects."""
    out = []
    for msg in messages:
        m = dict(msg)
        calls = m.get("tool_calls")
        if calls:
            fixed = []
            for call in calls:
                call = dict(call)
                fn = dict(call.get("function") or {})
                args = fn.get("arguments")
                if isinstance(args, str):
                    try:
                        fn["arguments"] = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError:
                        raise TemplateError(f"tool call arguments are not valid JSON: {args[:80]!r}") from None
                call["function"] = fn
                fixed.append(call)
            m["tool_calls"] = fixed
        out.append(m)
    return out


class ChatTemplate:
    """One compiled chat template."""

    def __init__(self, source: str, *, bos_token: str = "", eos_token: str = "", is_fallback: bool = False,
                 origin: str = "file") -> None:
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.is_fallback = is_fallback
        self.origin = origin
        try:
            self._template = _environment().from_string(source)
        except Exception as exc:  # jinja2.TemplateSyntaxError and friends
            line = getattr(exc, "lineno", None)
            where = f" at line {line}" if line else ""
            raise TemplateError(f"chat template ({origin}) does not compile{where}: {exc}") from None

    @classmethod
    def from_metadata(cls, meta: Mapping[str, Any], override_path: str | Path | None = None) -> ChatTemplate:
        """The `--chat-template-file` override, else the file's template, else ChatML (announced)."""
        tokens = meta.get("tokenizer.ggml.tokens") or []

        def tok(key: str) -> str:
            tid = meta.get(f"tokenizer.ggml.{key}_token_id")
            return tokens[int(tid)] if tid is not None and int(tid) < len(tokens) else ""

        bos, eos = tok("bos"), tok("eos")
        if override_path is not None:
            path = Path(override_path)
            try:
                text = read_text(path)
            except OSError as exc:
                raise TemplateError(f"cannot read chat template file {path}: {exc.strerror}") from None
            except UnicodeDecodeError:
                raise TemplateError(f"cannot read chat template file {path}: it is not UTF-8 or UTF-16 text") from None
            return cls(text, bos_token=bos, eos_token=eos, origin=str(path))
        source = meta.get(TEMPLATE_KEY)
        if isinstance(source, str) and source.strip():
            return cls(source, bos_token=bos, eos_token=eos, origin="GGUF")
        from .vocab import chatml_template

        return cls(chatml_template(), bos_token=bos, eos_token=eos, is_fallback=True, origin="ChatML fallback")

    @property
    def supports_tools(self) -> bool:
        """Whether the template reads a `tools` variable at all (else tools never reach the model)."""
        from jinja2 import meta

        return "tools" in meta.find_undeclared_variables(_environment().parse(self.source))

    def generation_prompt(self, **kwargs: Any) -> str:
        """What `add_generation_prompt` appends after a one-message conversation ("" if unknown)."""
        probe = [{"role": "user", "content": "x"}]
        kwargs = {k: v for k, v in kwargs.items() if k not in _RESERVED}
        try:
            with_prompt = self.render(probe, add_generation_prompt=True, **kwargs)
            without = self.render(probe, add_generation_prompt=False, **kwargs)
        except TemplateError:
            return ""
        return with_prompt[len(without):] if with_prompt.startswith(without) else ""

    def opens_think(self, **kwargs: Any) -> bool:
        """Whether the generation prompt leaves a `<think>` block open with these template kwargs
        (Qwen3.6: yes unless enable_thinking=False), so the reply starts as reasoning."""
        return opens_reasoning(self.generation_prompt(**kwargs))

    def render(self, messages: Sequence[Mapping[str, Any]], /, *, tools: Sequence[Mapping[str, Any]] | None = None,
               add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """The prompt text for a conversation; extra kwargs (enable_thinking, …) reach the template."""
        context = {
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            **{k: v for k, v in kwargs.items() if k not in _RESERVED},
            "messages": normalize_messages(messages),
            "add_generation_prompt": add_generation_prompt,
        }
        if tools:
            context["tools"] = list(tools)
        try:
            return self._template.render(**context)
        except TemplateError as exc:
            line = _template_line(sys.exc_info()[2])
            where = f" (template line {line})" if line else ""
            raise TemplateError(exc.message + where) from None
        except Exception as exc:  # noqa: BLE001 - any failure inside the template is the template's
            line = _template_line(sys.exc_info()[2])
            where = f" at template line {line}" if line else ""
            raise TemplateError(f"chat template ({self.origin}) failed{where}: {type(exc).__name__}: {exc}") from None


def opens_reasoning(prompt: str) -> bool:
    """True when the rendered prompt leaves a `<think>` block open (Qwen's thinking mode), so the
    model's first tokens are reasoning."""
    tail = prompt.rstrip(" \n")
    return tail.endswith("<think>")
