"""The seam between HTTP and the runtime: requests become chat-session calls, and back.

Everything the server needs from the loaded model (chat session, tokenizer, template, config) is
reached through this one class, so the rest of the server speaks only OpenAI shapes.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from .errors import APIError, bad_request, context_exceeded, template_error
from .generation import Job
from .schemas import (
    ApplyTemplateRequest,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    Message,
    Sampling,
    TokenizeRequest,
    Tool,
)
from .settings import ServerSettings

if TYPE_CHECKING:
    from clover_runtime.chat import PreparedPrompt
    from clover_runtime.decoding import DecodeParams

JSON_OBJECT_HINT = "Respond with a single valid JSON object and nothing else."


def _content_text(content: Any, where: str) -> str | None:
    """OpenAI content (string, parts or null) as the text the template renders."""
    if content is None or isinstance(content, str):
        return content
    texts = []
    for i, part in enumerate(content):
        ptype = part.get("type")
        if ptype in ("text", "input_text"):
            text = part.get("text")
            if not isinstance(text, str):
                raise bad_request(f"{where}.{i}.text: must be a string", f"{where}.{i}.text")
            texts.append(text)
        elif ptype in ("image_url", "input_image", "image", "input_audio", "video", "file"):
            raise bad_request(f"{where}.{i}: {ptype} content is not supported by this model (text only)",
                              f"{where}.{i}")
        else:
            raise bad_request(f"{where}.{i}.type: unknown content part type {ptype!r}", f"{where}.{i}.type")
    return "".join(texts)


def template_messages(messages: list[Message]) -> list[dict[str, Any]]:
    """OpenAI messages as the chat template wants them: text content, arguments as dicts."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        role = {"developer": "system", "function": "tool"}.get(msg.role, msg.role)
        item: dict[str, Any] = {"role": role, "content": _content_text(msg.content, f"messages.{i}.content")}
        if msg.reasoning_content is not None:
            item["reasoning_content"] = msg.reasoning_content
        if msg.name is not None:
            item["name"] = msg.name
        if msg.tool_call_id is not None:
            item["tool_call_id"] = msg.tool_call_id
        if msg.tool_calls:
            calls = []
            for j, call in enumerate(msg.tool_calls):
                args = call.function.arguments
                if isinstance(args, str):
                    field = f"messages.{i}.tool_calls.{j}.function.arguments"
                    try:
                        args = json.loads(args) if args.strip() else {}
                    except json.JSONDecodeError as exc:
                        raise bad_request(f"{field}: not valid JSON ({exc.msg})", field) from None
                    if not isinstance(args, dict):
                        raise bad_request(f"{field}: must encode a JSON object", field)
                calls.append({"id": call.id, "type": "function",
                              "function": {"name": call.function.name, "arguments": args}})
            item["tool_calls"] = calls
        out.append(item)
    return out


def with_json_hint(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`response_format: json_object` also as an instruction in the system turn: the grammar makes
    the reply JSON, the hint lets the model know it is writing JSON."""
    if messages[0]["role"] == "system":
        first = messages[0]
        text = f"{first.get('content') or ''}\n\n{JSON_OBJECT_HINT}".strip()
        return [{**first, "content": text}] + messages[1:]
    return [{"role": "system", "content": JSON_OBJECT_HINT}] + messages


def thinking(req: ChatRequest, default_budget: int = -1) -> tuple[dict[str, Any], int | None]:
    """Template kwargs and reasoning budget from every way clients ask for thinking. The most
    specific switch wins: `chat_template_kwargs.enable_thinking`, then Ollama's `think: bool`, then
    a budget or effort (`thinking_budget`, llama-server's `reasoning_budget_tokens`, `reasoning_effort`
    or a `think` level: 0 or "none" is off, anything else on), then the server's default
    (`clover serve --reasoning-budget`/`--no-think`: -1 thinks without limit, 0 not at all, N
    tokens at most)."""
    from clover_runtime.reasoning_budget import effort_budget

    kwargs = dict(req.chat_template_kwargs or {})
    effort = req.think if isinstance(req.think, str) else req.reasoning_effort
    given = next((v for v in (req.thinking_budget, req.reasoning_budget_tokens, req.reasoning_budget)
                  if v is not None), None)
    asked = given is not None or effort is not None
    if given is not None:
        budget = None if given < 0 else given
    else:
        budget = effort_budget(effort) if effort is not None else None
    if "enable_thinking" not in kwargs:
        if isinstance(req.think, bool):
            kwargs["enable_thinking"] = req.think
        elif asked:
            kwargs["enable_thinking"] = budget != 0
        elif default_budget == 0:
            kwargs["enable_thinking"] = False
    if not kwargs.get("enable_thinking", True):
        return kwargs, None
    if not asked:
        return kwargs, default_budget if default_budget > 0 else None
    if budget == 0 and given is None:
        return kwargs, None  # effort "none" overruled by a switch that turned thinking on
    return kwargs, budget


def grammar_request(req: Sampling) -> tuple[str, Any, str] | None:
    """(kind, spec, field) of the constraint a request asks for, or None: `response_format`
    (json_object, json_schema), else llama-server's `json_schema`, else its `grammar` (GBNF)."""
    rf = getattr(req, "response_format", None)
    if rf is not None and rf.type == "json_schema":
        field = "response_format.json_schema.schema"
        if rf.json_schema is None or rf.json_schema.schema_ is None:
            raise bad_request(f"{field}: missing; json_schema needs a schema", field)
        return "json_schema", rf.json_schema.schema_, field
    if rf is not None and rf.type == "json_object":
        schema = rf.schema_ if rf.schema_ is not None else {"type": "object"}
        return "json_schema", schema, "response_format.schema" if rf.schema_ is not None else "response_format"
    if req.json_schema is not None:
        return "json_schema", req.json_schema, "json_schema"
    if req.grammar:
        return "gbnf", req.grammar, "grammar"
    return None


def tool_dicts(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    if not tools:
        return None
    return [t.model_dump(exclude_none=True) for t in tools]


class Backend:
    """A loaded chat session plus what the native endpoints need from its tokenizer and template."""

    def __init__(self, session: Any, settings: ServerSettings) -> None:
        self.session = session
        self.settings = settings
        self.tokenizer = session.tokenizer
        self.template = session.template
        self.model = session.model
        self._lock = threading.Lock()
        # one prompt cache per -np slot: a request continues the slot that holds most of its prompt
        self.caches = [session.new_cache(max_checkpoints=settings.ctx_checkpoints,
                                         checkpoint_every=settings.checkpoint_every)
                       for _ in range(settings.n_parallel)]

    # ---- facts about the model -------------------------------------------------------------
    def meta(self) -> dict[str, Any]:
        cfg = self.model.config
        tensors = self.model.file.tensors
        return {
            "n_ctx": self.n_ctx,  # first: what a request can use (clients size their prompts by it)
            "n_vocab": cfg.n_vocab,
            "n_ctx_train": cfg.context_length,
            "n_embd": cfg.n_embd,
            "n_params": int(sum(math.prod(t.shape) for t in tensors.values())),
            "size": self.model.file.tensor_bytes,
            "diffusion": {
                "block_length": self.settings.block_length or cfg.diffusion.block_length,
                "threshold": _rounded(self.settings.threshold or cfg.diffusion.threshold),
            },
        }

    def default_sampling(self) -> Any:
        """The model file's recommended sampling, llama.cpp's defaults elsewhere (what /props shows)."""
        from clover_runtime.decoding import recommended_sampling

        return recommended_sampling(self.model.file.metadata)

    def chat_template_text(self) -> str | None:
        return self.template.source

    # ---- generation ------------------------------------------------------------------------
    def _params(self, req: Sampling) -> Any:
        from dataclasses import replace

        from clover_runtime.decoding import DecodeParams

        s = self.settings
        sampling = replace(  # what the request leaves out: the model file's sampling, as in `clover run`
            self.default_sampling(),
            **_drop_none(temperature=req.temperature, top_k=req.top_k, top_p=req.top_p, min_p=req.min_p,
                         seed=None if req.seed is None or req.seed < 0 else req.seed,  # -1: random
                         presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
                         repetition_penalty=req.repetition_penalty))
        return DecodeParams(
            **_drop_none(decode=req.decode or s.decode, block_length=req.block_length or s.block_length,
                         threshold=req.threshold or s.threshold, max_tokens=req.token_limit(),
                         stop=req.stop, verify=s.verify if req.verify is None else req.verify),
            sampling=sampling, logprobs=req.logprob_count(), grammar=self._grammar(req))

    @property
    def n_ctx(self) -> int:
        """Context of one sequence, as the loaded session has it (each slot is one such sequence)."""
        return self.session.n_ctx

    def _check_context(self, n_prompt: int, what: str = "messages") -> None:
        if n_prompt >= self.n_ctx:
            raise context_exceeded(n_prompt, self.n_ctx, what)

    def _rank(self, ids: list[int], reuse: bool) -> Any:
        """Slot preference: the longest reusable prefix, then the least recently used."""
        def rank(slot: int) -> tuple[int, float]:
            cache = self.caches[slot]
            return (cache.reusable(ids) if reuse else 0, -cache.last_used)

        return rank

    def slot_action(self, slot: int, action: str, path: Any) -> dict[str, Any]:
        """Save, restore or erase one idle slot's prompt state (llama-server's response shapes)."""
        import time

        from clover_runtime import state_file

        cache = self.caches[slot]
        t0 = time.perf_counter()
        if action == "erase":
            n = cache.n_cached
            cache.clear()
            return {"id_slot": slot, "n_erased": n}
        try:
            if action == "save":
                written = state_file.save(cache, path)
                return {"id_slot": slot, "filename": path.name, "n_saved": cache.n_cached, "n_written": written,
                        "timings": {"save_ms": round((time.perf_counter() - t0) * 1e3, 3)}}
            loaded = state_file.load(cache, path)
        except state_file.StateFileError as exc:  # named by the file only: the folder is the server's own
            raise APIError(404 if exc.missing else 400, f"slot file {path.name!r}: {exc.reason}",
                           param="filename") from None
        return {"id_slot": slot, "filename": path.name, "n_restored": loaded.n_past, "n_read": loaded.n_bytes,
                "timings": {"restore_ms": round((time.perf_counter() - t0) * 1e3, 3)}}

    def slot_info(self, slot: int, processing: bool) -> dict[str, Any]:
        """One slot for GET /slots, in llama-server's shape plus what its prompt cache holds. The
        prompt is another client's conversation: its text is shown only with --slots-verbose."""
        cache = self.caches[slot]
        tokens = list(cache.tokens)
        info: dict[str, Any] = {
            "id": slot, "id_task": -1, "n_ctx": self.n_ctx, "speculative": False, "is_processing": processing,
            "params": {},
            "next_token": [{"has_next_token": processing, "has_new_line": False, "n_remain": -1, "n_decoded": 0,
                            "stopping_word": ""}],
            "n_cached_tokens": len(tokens),
            "checkpoints": [{"n_past": c.n_past} for c in list(cache.checkpoints)],
            "checkpoint_bytes": cache.checkpoint_bytes,
        }
        if self.settings.slots_verbose:
            info["prompt"] = self.tokenizer.decode(tokens)
        return info

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                kwargs: dict[str, Any], add_generation_prompt: bool = True) -> str:
        from clover_runtime.errors import TemplateError

        try:
            return self.template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                        **kwargs)
        except TemplateError as exc:
            raise template_error(exc) from None

    def chat_job(self, req: ChatRequest) -> Job:
        """Validate a chat request against the model (400s, context size) and return its generation."""
        messages = template_messages(req.messages)
        tools = tool_dicts(req.tools)
        choice = req.tool_choice or "auto"
        if not isinstance(choice, str):
            names = {t["function"]["name"] for t in tools or []}
            if choice.function.name not in names:
                raise bad_request(f"tool_choice: no tool named {choice.function.name!r} in tools",
                                  "tool_choice")
            choice = {"type": "function", "function": {"name": choice.function.name}}
        elif choice == "required" and not tools:
            raise bad_request("tool_choice: 'required' needs at least one tool in tools", "tool_choice")
        if tools and choice != "none" and not self.template.supports_tools:
            raise bad_request("tools: this model's chat template has no tool support; "
                              "pass --chat-template-file with one that has", "tools")
        if req.response_format is not None and req.response_format.type == "json_object":
            messages = with_json_hint(messages)
        params = self._params(req)
        kwargs, budget = thinking(req, self.settings.reasoning_budget)  # a grammar waits for the answer
        from clover_runtime.decoding.constraint import GrammarError
        from clover_runtime.errors import TemplateError

        try:  # rendered and tokenized once: the context check, slot choice and generation share these ids
            prompt = self.session.prepare(messages, tools=tools, tool_choice=choice, chat_template_kwargs=kwargs,
                                          parallel_tool_calls=req.parallel_tool_calls is not False)
        except TemplateError as exc:
            raise template_error(exc) from None
        except GrammarError as exc:  # a forced call whose tool schema the grammar cannot express
            raise bad_request(f"tools: cannot enforce tool_choice with these schemas: {exc.message}", "tools") from None
        return self._job(prompt, replace(params, reasoning_budget=budget), req.cache_prompt, "messages")

    def _grammar(self, req: Sampling) -> Any:
        """The request's compiled constraint, or None; a 400 naming the field when it is invalid."""
        from clover_runtime.decoding.constraint import GrammarError

        asked = grammar_request(req)
        if asked is None:
            return None
        kind, spec, field = asked
        try:
            return self.session.compile_grammar(kind, spec)
        except GrammarError as exc:
            raise bad_request(f"{field}: {exc.message}", field) from None

    def prompt_text(self, req: CompletionRequest) -> str:
        """The prompt as text: token ids (OpenAI's other prompt form) are checked and decoded."""
        if isinstance(req.prompt, str):
            return req.prompt
        n_vocab = self.model.config.n_vocab
        for i, t in enumerate(req.prompt):
            if t < 0 or t >= n_vocab:
                raise bad_request(f"prompt.{i}: token id {t} is outside the vocabulary", f"prompt.{i}")
        return self.tokenizer.decode(req.prompt)

    def completion_job(self, req: CompletionRequest) -> Job:
        """A raw completion; prompt token ids are generated from as they are (not decoded and
        encoded again), so scores line up with the client's own tokenization (lm-eval's ctxlen)."""
        from clover_runtime.chat import PreparedPrompt

        ids = None if isinstance(req.prompt, str) else list(req.prompt)
        req.prompt = self.prompt_text(req)  # from here on the request carries text (echo uses it)
        prompt = PreparedPrompt(req.prompt, ids, chat=False) if ids else self.session.prepare_text(req.prompt)
        score = req.logprob_count() if req.echo else None
        return self._job(prompt, self._params(req), req.cache_prompt, "prompt", score)

    def _job(self, prompt: PreparedPrompt, params: DecodeParams, reuse: bool, what: str,
             score_prompt: int | None = None) -> Job:
        """Check a prepared prompt against the context and make its generation, on the slot that
        holds most of exactly these ids."""
        self._check_context(len(prompt.ids), what)
        session, caches = self.session, self.caches

        def run(cancel: threading.Event, slot: int) -> Any:
            return session.generate(prompt, params=params, cancel=cancel, cache=caches[slot], cache_prompt=reuse,
                                    score_prompt=score_prompt)

        return Job(run, self._rank(prompt.ids, reuse), len(prompt.ids))

    def progress_body(self, event: Any) -> dict[str, Any]:
        return {"block": event.block, "step": event.pass_index, "steps": event.passes,
                "preview": event.tokens_preview}

    # ---- native endpoints ------------------------------------------------------------------
    def tokenize(self, req: TokenizeRequest) -> dict[str, Any]:
        ids = list(self.tokenizer.encode(req.content))
        if req.with_pieces:
            return {"tokens": [{"id": i, "piece": self.tokenizer.token_to_piece(i)} for i in ids]}
        return {"tokens": ids}

    def detokenize(self, req: DetokenizeRequest) -> dict[str, Any]:
        n_vocab = self.model.config.n_vocab
        for i, t in enumerate(req.tokens):
            if t < 0 or t >= n_vocab:
                raise bad_request(f"tokens.{i}: token id {t} is outside the vocabulary", f"tokens.{i}")
        text = self.tokenizer.decode(req.tokens)
        return {"content": text, "prompt": text}  # llama-server's name, then vLLM's

    def tokenizer_info(self) -> dict[str, Any]:
        """vLLM's /tokenizer_info: the special tokens and template a client needs to tokenize as this
        server does (lm-evaluation-harness's `local-completions` then uses /tokenize, no local copy).
        A BOS the model does not prepend is not reported, as Hugging Face's Qwen tokenizer has none."""
        tok = self.tokenizer

        def piece(tid: int | None) -> str | None:
            return None if tid is None else tok.token_to_piece(tid)

        return {"tokenizer_class": "clover", "eos_token": piece(tok.eos_id),
                "bos_token": piece(tok.bos_id) if tok.add_bos else None, "pad_token": piece(tok.pad_id),
                "chat_template": self.chat_template_text(), "model_max_length": self.n_ctx,
                "vocab_size": self.model.config.n_vocab}

    def apply_template(self, req: ApplyTemplateRequest) -> dict[str, Any]:
        prompt = self._render(template_messages(req.messages), tool_dicts(req.tools),
                              dict(req.chat_template_kwargs or {}), req.add_generation_prompt)
        return {"prompt": prompt}


def _drop_none(**kw: Any) -> dict[str, Any]:
    return {k: v for k, v in kw.items() if v is not None}


def _rounded(value: float | None) -> float | None:
    """Float32 metadata as the short decimal it was written as (0.9, not 0.8999999761581421)."""
    return None if value is None else float(f"{value:.6g}")


__all__ = ["Backend", "template_messages"]
