"""Request bodies: the OpenAI fields that matter plus clover's decoding extras, validated up front.

Unknown fields are accepted and ignored (clients send `user`, `metadata`, ...); known fields with a
wrong type or range are a 400 that names the field. `parse_body` reads raw bytes so malformed JSON is
our error, not FastAPI's.
"""

from __future__ import annotations

import json
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import bad_request, validation_message

M = TypeVar("M", bound=BaseModel)


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


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


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict[str, Any] | None = None


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
    repetition_penalty: float | None = Field(default=None, gt=0.0)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    logprobs: bool | int | None = None
    threshold: float | None = Field(default=None, gt=0.0, le=1.0)
    block_length: int | None = Field(default=None, ge=1, le=4096)
    decode: Literal["auto", "diffusion", "ar"] | None = None
    return_progress: bool = False
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
    def _single_choice(cls, v: int) -> int:
        if v != 1:
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("logprobs")
    @classmethod
    def _no_logprobs(cls, v: bool | int | None) -> bool | int | None:
        if v:
            raise ValueError("log probabilities are not supported")
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


class ChatRequest(Sampling):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_format: str | None = None


class SlotFileRequest(_Model):
    """POST /slots/{id}?action=save|restore: the file, a plain name inside --slot-save-path."""

    filename: str = Field(min_length=1, max_length=255)


class CompletionRequest(Sampling):
    prompt: str | list[str]
    echo: bool = False
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, v: str | list[str]) -> str:
        if isinstance(v, list):
            if len(v) != 1:
                raise ValueError("exactly one prompt is supported")
            v = v[0]
        if not v:
            raise ValueError("the prompt is empty")
        return v


class TokenizeRequest(_Model):
    content: str
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


class DetokenizeRequest(_Model):
    tokens: list[int]


class ApplyTemplateRequest(_Model):
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


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
    if not isinstance(data, dict):
        raise bad_request("request body must be a JSON object")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, field = validation_message(list(exc.errors(include_url=False)))
        raise bad_request(message, field) from None
