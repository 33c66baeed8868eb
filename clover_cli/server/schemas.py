"""Request bodies: the OpenAI fields that matter plus clover's decoding extras, validated up front.

Unknown fields are accepted and ignored (clients send `user`, `metadata`, ...); known fields with a
wrong type or range are a 400 that names the field. `parse_body` reads raw bytes so malformed JSON is
our error, not FastAPI's.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import bad_request, validation_message

M = TypeVar("M", bound=BaseModel)
MAX_JSON_DEPTH = 64  # far beyond any real request (tool schemas included); deeper is an attack
_SURROGATE = re.compile("[\ud800-\udfff]")
# Set by the server itself when it renders a template; passing them again would clash.
RESERVED_TEMPLATE_KWARGS = ("add_generation_prompt", "tools", "messages")
MAX_CHOICES = 16  # n, and prompts x n on /v1/completions


class _Model(BaseModel):
    # NaN and Infinity are valid to Python's json but never a sampling value: 400, not a NaN sampler.
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


class FunctionCall(_Model):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Model):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(_Model):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class FunctionDef(_Model):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Model):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(_Model):
    include_usage: bool = False


class JsonSchemaFormat(_Model):
    """OpenAI's `response_format.json_schema`: the schema under `schema` (`strict` is always honoured)."""

    name: str | None = None
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")  # llama-server: json_object + schema


class Sampling(_Model):
    """Fields shared by chat and raw completions."""

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    n_predict: int | None = Field(default=None, ge=-1)
    temperature: float | None = Field(default=None, ge=0.0, le=5.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    seed: int | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, ge=1e-3, le=100.0)
    stop: str | list[str] | None = None
    stream: bool | None = False  # null is valid OpenAI input: not streaming
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    block_length: int | None = Field(default=None, ge=1, le=4096)
    decode: Literal["auto", "diffusion", "ar"] | None = None
    verify: bool | None = None  # diffusion: the commit checks each block against greedy AR
    return_progress: bool = False
    logit_bias: dict[str, float] | None = None
    json_schema: dict[str, Any] | None = None  # llama-server: constrain the reply to this JSON schema
    grammar: str | None = None  # llama-server: constrain the reply to this GBNF (or Lark) grammar

    @field_validator("temperature")
    @classmethod
    def _greedy_below(cls, v: float | None) -> float | None:
        """A temperature so small that logits / T overflows means greedy, which 0 already says."""
        return 0.0 if v is not None and v < 1e-4 else v

    @field_validator("logit_bias")
    @classmethod
    def _no_logit_bias(cls, v: dict[str, float] | None) -> dict[str, float] | None:
        if v:
            raise ValueError("logit_bias is not supported by this server; leave it out (or send {})")
        return v
    cache_prompt: bool = True  # llama-server's field: False prefills the whole prompt again

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: str | list[str] | None) -> list[str] | None:
        if v is None:
            return None
        items = [v] if isinstance(v, str) else list(v)
        if len(items) > 16:
            raise ValueError("at most 16 stop sequences")
        if any(s == "" for s in items):
            raise ValueError("stop sequences must not be empty")
        return items

    @field_validator("n")
    @classmethod
    def _choices(cls, v: int) -> int:
        if v > MAX_CHOICES:
            raise ValueError(f"at most {MAX_CHOICES} choices (they are generated one after another)")
        return v

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def token_limit(self) -> int | None:
        """max_completion_tokens wins over max_tokens over n_predict; None lets the server decide."""
        for v in (self.max_completion_tokens, self.max_tokens, self.n_predict):
            if v is not None and v >= 0:
                return v
        return None


MAX_TOP_LOGPROBS = 20


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None
    reasoning_effort: str | None = None
    think: bool | Literal["low", "medium", "high"] | None = None  # Ollama's switch (or effort level)
    thinking_budget: int | None = Field(default=None, ge=0)  # Qwen's API: thinking tokens, 0 = off
    reasoning_budget_tokens: int | None = Field(default=None, ge=-1)  # llama-server's: -1 = no limit, 0 = off
    reasoning_budget: int | None = Field(default=None, ge=-1)  # the same, as `--reasoning-budget` spells it

    @field_validator("top_logprobs")
    @classmethod
    def _top_needs_logprobs(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is not None and not info.data.get("logprobs"):
            raise ValueError("needs logprobs: true")
        return v

    def logprob_count(self) -> int | None:
        """Alternatives per token when logprobs are asked for (None: not asked)."""
        return (self.top_logprobs or 0) if self.logprobs else None

    @field_validator("reasoning_effort")
    @classmethod
    def _known_effort(cls, v: str | None) -> str | None:
        from clover_runtime.reasoning_budget import EFFORT_BUDGETS

        if v is not None and v not in EFFORT_BUDGETS:
            raise ValueError(f"must be one of {', '.join(EFFORT_BUDGETS)}")
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_template_kwargs(v)


class SlotFileRequest(_Model):
    """POST /slots/{id}?action=save|restore: the file, a plain name inside --slot-save-path."""

    filename: str = Field(min_length=1, max_length=255)


class CompletionRequest(Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    echo: bool = False
    suffix: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)  # 0 with echo: the prompt's logprobs only
    logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS, strict=True)
    n_probs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)  # llama-server's

    def logprob_count(self) -> int | None:
        """Alternatives per token for `logprobs` or `n_probs` (None: neither asked)."""
        counts = [v for v in (self.logprobs, self.n_probs) if v is not None]
        return max(counts) if counts else None

    @field_validator("prompt")
    @classmethod
    def _prompts(cls, v: str | list[str] | list[int] | list[list[int]]) -> Any:
        """A prompt as text or token ids (OpenAI accepts both; the backend decodes ids); a list of
        several stays a list (`prompts`), answered one after another."""
        if isinstance(v, list) and v and not isinstance(v[0], int):
            if len(v) > MAX_CHOICES:
                raise ValueError(f"at most {MAX_CHOICES} prompts in one request")
            if any(not p for p in v):
                raise ValueError("a prompt is empty")
            if len(v) == 1:
                v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v

    @property
    def prompts(self) -> list[str | list[int]]:
        """Every prompt of the request (one, unless a list of several was sent)."""
        if isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int):
            return list(self.prompt)  # type: ignore[arg-type]
        return [self.prompt]  # type: ignore[list-item]


class TokenizeRequest(_Model):
    content: str | None = None
    prompt: str | None = None  # vLLM's name for it
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @model_validator(mode="after")
    def _text(self) -> TokenizeRequest:
        if (self.content is None) == (self.prompt is None):
            raise ValueError("send the text as content (llama-server) or prompt (vLLM)")
        if self.content is None:
            self.content = self.prompt
        return self


class DetokenizeRequest(_Model):
    tokens: list[int]


class ApplyTemplateRequest(_Model):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True

    @field_validator("chat_template_kwargs")
    @classmethod
    def _kwargs(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        return check_template_kwargs(v)


def check_template_kwargs(v: dict[str, Any] | None) -> dict[str, Any] | None:
    """Template variables the server sets itself cannot come in chat_template_kwargs."""
    for key in RESERVED_TEMPLATE_KWARGS:
        if v and key in v:
            raise ValueError(f"'{key}' is set by the server and cannot be a chat template kwarg"
                             + (f"; use the request's own '{key}' field" if key != "messages" else ""))
    return v


def check_json(data: Any) -> None:
    """400 for JSON nested deeper than MAX_JSON_DEPTH or holding a lone UTF-16 surrogate (`\\ud800`
    is valid JSON but no text: the tokenizer and the template cannot encode it). Iterative, so the
    check itself cannot overflow the stack."""
    stack: list[tuple[Any, str, int]] = [(data, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise bad_request(f"request JSON is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(value, str):
            found = _SURROGATE.search(value)
            if found:
                raise bad_request(f"{path or 'body'}: contains a lone UTF-16 surrogate "
                                  f"(\\u{ord(found.group()):04x}); send valid Unicode text", path or None)
        elif isinstance(value, dict):
            for key, item in value.items():
                sub = f"{path}.{key}" if path else str(key)
                if _SURROGATE.search(key):
                    raise bad_request(f"{path or 'body'}: a key contains a lone UTF-16 surrogate", path or None)
                stack.append((item, sub, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, f"{path}.{i}", depth + 1) for i, item in enumerate(value))


def parse_body(raw: bytes, model: type[M]) -> M:
    """Bytes to a validated request, or a 400 naming the bad field (or saying the JSON is broken)."""
    if not raw.strip():
        raise bad_request("request body is empty; send a JSON object")
    try:
        data = json.loads(raw)
    except UnicodeDecodeError as exc:
        raise bad_request(f"request body is not UTF-8: {exc.reason}") from None
    except json.JSONDecodeError as exc:
        raise bad_request(f"invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise bad_request(f"request JSON is nested more than {MAX_JSON_DEPTH} levels deep") from None
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    check_json(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, field = validation_message(list(exc.errors(include_url=False)))
        raise bad_request(message, field) from None
