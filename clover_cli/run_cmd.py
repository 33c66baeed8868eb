"""`clover run [MODEL] [PROMPT]`: chat in the terminal, or answer one prompt for a script."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from . import console
from .options import (
    CHAT,
    CONTEXT,
    DIFFUSION,
    MODEL,
    OUTPUT,
    PLACEMENT,
    SAMPLING,
    cpu_moe_option,
    ctx_option,
    device_option,
    main_gpu_option,
    mmap_option,
    n_cpu_moe_option,
    ngl_option,
)
from .usage import UsageError

_E = "CLOVER_"
_FROM_FILE = "Default: the model file's recommendation, else llama.cpp's"


def command(
    model: str | None = typer.Argument(None, metavar="MODEL", show_default=False,
                                       help="demo (ships with clover), a GGUF path or owner/repo[:QUANT] "
                                            "(default: the Clover model).",
                                       autocompletion=lambda incomplete: _complete(incomplete)),
    prompt: str | None = typer.Argument(None, metavar="PROMPT", show_default=False,
                                        help="Answer this prompt and exit."),
    model_opt: str | None = typer.Option(None, "-m", "--model", help="Model (same as MODEL).", envvar=_E + "MODEL",
                                         rich_help_panel=MODEL),
    offline: bool = typer.Option(False, "--offline", envvar=_E + "OFFLINE", rich_help_panel=MODEL,
                                 help="Use only models already in the local cache."),
    prompt_opt: str | None = typer.Option(None, "-p", "--prompt", metavar="TEXT", help="Prompt for a one-shot answer.",
                                          rich_help_panel=CHAT),
    file: Path | None = typer.Option(None, "-f", "--file", help="Read the prompt from a file.", rich_help_panel=CHAT),
    system: str | None = typer.Option(None, "-sys", "--system-prompt", metavar="TEXT", help="System prompt.",
                                      envvar=_E + "SYSTEM_PROMPT", rich_help_panel=CHAT),
    chat_template_file: Path | None = typer.Option(None, "--chat-template-file", envvar=_E + "CHAT_TEMPLATE_FILE",
                                                   help="Jinja chat template to use instead of the model's.",
                                                   rich_help_panel=CHAT),
    think: bool = typer.Option(True, "--think/--no-think", help="Let the model reason first (shown dimmed).",
                               envvar=_E + "THINK", rich_help_panel=CHAT),
    reasoning_budget: int = typer.Option(-1, "--reasoning-budget", envvar=_E + "REASONING_BUDGET", rich_help_panel=CHAT,
                                         help="As llama.cpp: -1 lets the model reason, 0 turns reasoning off."),
    ctx_size: int | None = ctx_option(),
    prompt_cache: Path | None = typer.Option(None, "--prompt-cache", rich_help_panel=CONTEXT,
                                             help="One-shot: resume from this saved prompt state (when it exists "
                                                  "and matches the model) and save the new one to it."),
    ctx_checkpoints: int = typer.Option(8, "--ctx-checkpoints", min=0, envvar=_E + "CTX_CHECKPOINTS",
                                        rich_help_panel=CONTEXT,
                                        help="Prompt-cache checkpoints of the recurrent state kept (0: none)."),
    checkpoint_every: int = typer.Option(2048, "--checkpoint-every", min=0, envvar=_E + "CHECKPOINT_EVERY",
                                         rich_help_panel=CONTEXT,
                                         help="Also checkpoint every N tokens of a long prefill (0: never)."),
    n_predict: int = typer.Option(-1, "-n", "--n-predict", help="Max tokens per reply (-1: until done or context).",
                                  envvar=_E + "N_PREDICT", rich_help_panel=SAMPLING),
    temp: float | None = typer.Option(None, "--temp", min=0.0, help=f"Temperature (0: greedy). {_FROM_FILE} 0.8.",
                                      envvar=_E + "TEMP", show_default=False, rich_help_panel=SAMPLING),
    top_k: int | None = typer.Option(None, "--top-k", min=0, help=f"{_FROM_FILE} 40.", envvar=_E + "TOP_K",
                                     show_default=False, rich_help_panel=SAMPLING),
    top_p: float | None = typer.Option(None, "--top-p", min=0.0, max=1.0, help=f"{_FROM_FILE} 0.95.",
                                       envvar=_E + "TOP_P", show_default=False, rich_help_panel=SAMPLING),
    min_p: float | None = typer.Option(None, "--min-p", min=0.0, max=1.0, help=f"{_FROM_FILE} 0.05.",
                                       envvar=_E + "MIN_P", show_default=False, rich_help_panel=SAMPLING),
    seed: int | None = typer.Option(None, "-s", "--seed", envvar=_E + "SEED", rich_help_panel=SAMPLING,
                                    help="Random seed (default: a new one each run)."),
    repeat_penalty: float | None = typer.Option(None, "--repeat-penalty", help=f"{_FROM_FILE} 1.0.",
                                                envvar=_E + "REPEAT_PENALTY", show_default=False,
                                                rich_help_panel=SAMPLING),
    presence_penalty: float = typer.Option(0.0, "--presence-penalty", envvar=_E + "PRESENCE_PENALTY",
                                           rich_help_panel=SAMPLING,
                                           help="Penalty for any token already in the reply."),
    frequency_penalty: float = typer.Option(0.0, "--frequency-penalty", envvar=_E + "FREQUENCY_PENALTY",
                                            rich_help_panel=SAMPLING,
                                            help="Penalty per earlier use of a token in the reply."),
    decode: str = typer.Option("auto", "--decode", metavar="auto|diffusion|ar", envvar=_E + "DECODE",
                               rich_help_panel=DIFFUSION,
                               help="Block diffusion, one token per pass, or the faster of the two block by block."),
    block_length: int | None = typer.Option(None, "--block-length", "--diffusion-block-length", min=1,
                                            envvar=_E + "BLOCK_LENGTH", rich_help_panel=DIFFUSION,
                                            help="Tokens per diffusion block (default: the file's, 32)."),
    threshold: float | None = typer.Option(None, "--threshold", min=0.0, max=1.0, envvar=_E + "THRESHOLD",
                                           help="Reveal threshold (file default 0.9).", rich_help_panel=DIFFUSION),
    verify: bool | None = typer.Option(None, "--verify/--no-verify", show_default=False, envvar=_E + "VERIFY",
                                       rich_help_panel=DIFFUSION,
                                       help="Diffusion: check each block against greedy AR at its commit "
                                            "(default: on when greedy)."),
    expert_coreset: int | None = typer.Option(None, "--expert-coreset", metavar="K", envvar=_E + "EXPERT_CORESET",
                                              help="Share K experts across a block's rows.", rich_help_panel=DIFFUSION),
    grammar: str | None = typer.Option(None, "--grammar", metavar="GBNF", envvar=_E + "GRAMMAR", rich_help_panel=OUTPUT,
                                       help="Constrain replies to this GBNF (or Lark) grammar."),
    grammar_file: Path | None = typer.Option(None, "--grammar-file", help="Read the --grammar from a file.",
                                             rich_help_panel=OUTPUT),
    json_schema: str | None = typer.Option(None, "-j", "--json-schema", metavar="SCHEMA", rich_help_panel=OUTPUT,
                                           help="Constrain replies to JSON valid under this schema "
                                                "(e.g. '{}' for any JSON object)."),
    json_schema_file: Path | None = typer.Option(None, "-jf", "--json-schema-file", rich_help_panel=OUTPUT,
                                                 help="Read the --json-schema from a file."),
    visual: bool = typer.Option(False, "--visual", help="Show each block resolving live.", rich_help_panel=OUTPUT),
    as_json: bool = typer.Option(False, "--json", help="One-shot: print answer, reasoning, tool calls, stats.",
                                 rich_help_panel=OUTPUT),
    show_timings: bool = typer.Option(True, "--show-timings/--no-show-timings", envvar=_E + "SHOW_TIMINGS",
                                      rich_help_panel=OUTPUT,
                                      help="Print the speed line after each reply (on stderr)."),
    threads: int | None = typer.Option(None, "-t", "--threads", min=1, help="CPU threads (default: physical cores).",
                                       envvar=_E + "THREADS", rich_help_panel=PLACEMENT),
    backend: str = typer.Option("auto", "--backend", metavar="auto|numba|numpy", help="CPU kernels.",
                                envvar=_E + "BACKEND", rich_help_panel=PLACEMENT),
    exact_kernels: bool = typer.Option(False, "--exact-kernels", envvar=_E + "EXACT_KERNELS", rich_help_panel=PLACEMENT,
                                       help="Float kernels for quantized weights (slower; no 8-bit activations)."),
    n_gpu_layers: str | None = ngl_option(),
    cpu_moe: bool = cpu_moe_option(),
    n_cpu_moe: int = n_cpu_moe_option(),
    mmap: bool | None = mmap_option(),
    device: str = device_option(),
    main_gpu: int = main_gpu_option(),
) -> None:
    """Chat with a model in the terminal, or answer one prompt (argument, -p, -f or stdin).

    Example:

        clover run demo "What is 17 + 25?" --no-think
    """
    from .options import offload_request
    from .usage import choice

    choice("--decode", decode, ("auto", "diffusion", "ar"))
    choice("--backend", backend, ("auto", "numba", "numpy"))
    model, prompt = _model_and_prompt(model, model_opt, prompt)
    if reasoning_budget not in (-1, 0):
        raise UsageError(f"--reasoning-budget {reasoning_budget}: clover takes -1 (reason) or 0 (no reasoning)",
                         "a token budget for the reasoning is not supported yet: use -1 or 0")
    if prompt is not None and prompt_opt is not None:
        raise UsageError("the prompt is given twice (argument and -p)", "give it once")
    constraint = _constraint_source(grammar, grammar_file, json_schema, json_schema_file)
    text = _one_shot_text(prompt or prompt_opt, file)
    if text is None and not sys.stdin.isatty():  # refused before the model loads
        raise UsageError("no prompt: pass one as an argument, with -p or -f, or pipe it on stdin")
    sampling = {k: v for k, v in (("temperature", temp), ("top_k", top_k), ("top_p", top_p), ("min_p", min_p),
                                  ("repetition_penalty", repeat_penalty)) if v is not None}
    _run(RunOptions(
        model=model, text=text, offline=offline, ctx=ctx_size, ctx_checkpoints=ctx_checkpoints,
        checkpoint_every=checkpoint_every, prompt_cache=prompt_cache, system=system,
        chat_template_file=chat_template_file, think=think and reasoning_budget != 0,
        sampling={**sampling, "seed": seed, "presence_penalty": presence_penalty,
                  "frequency_penalty": frequency_penalty},
        n_predict=n_predict, decode=decode, block_length=block_length, threshold=threshold, verify=verify,
        expert_coreset=expert_coreset, constraint=constraint, visual=visual, as_json=as_json,
        show_timings=show_timings, threads=threads, backend=backend, exact_kernels=exact_kernels,
        offload=offload_request(n_gpu_layers, cpu_moe, n_cpu_moe, device, main_gpu, mmap)))


@dataclass(frozen=True)
class RunOptions:
    """Everything `clover run` was asked, validated once where the flags are parsed (`command`):
    from here on nothing is checked again, and `-c` goes from this record to the fit check and on
    to the session."""

    model: str | None
    text: str | None  # the one-shot prompt; None: the chat in the terminal
    offline: bool
    ctx: int | None  # per sequence; None: the default, 0: as much as fits
    ctx_checkpoints: int
    checkpoint_every: int
    prompt_cache: Path | None
    system: str | None
    chat_template_file: Path | None
    think: bool
    sampling: dict[str, Any]  # the sampling flags given; the file's recommendation fills the rest
    n_predict: int
    decode: str
    block_length: int | None
    threshold: float | None
    verify: bool | None
    expert_coreset: int | None
    constraint: tuple[str, str, str | None, Path | None] | None  # (flag, kind, text, file) of a grammar or schema
    visual: bool
    as_json: bool
    show_timings: bool
    threads: int | None
    backend: str
    exact_kernels: bool
    offload: Any


def _model_and_prompt(model: str | None, model_opt: str | None, prompt: str | None) -> tuple[str | None, str | None]:
    """MODEL, -m and PROMPT sorted out: with -m, the one positional is the prompt; a prompt typed as
    the model is a usage error that names the demo."""
    from clover_runtime.hub.resolve import is_prompt_not_model

    if model_opt and model and prompt is not None:
        raise UsageError("the model is given twice (argument and -m)", "give it once")
    if model_opt and model:
        prompt, model = model, model_opt
    model = model_opt or model
    if model is not None and is_prompt_not_model(model):
        shown = '"' + model.replace('"', '\\"') + '"'
        raise UsageError(f"{shown} is not a model; did you mean: clover run demo {shown}")
    return model, prompt


def _run(opts: RunOptions) -> None:
    from dataclasses import replace

    from clover_runtime.chat import load_chat
    from clover_runtime.decoding import DecodeParams

    from .model_setup import compile_first_run, prepare

    prep = prepare(opts.model, ctx=opts.ctx, offline=opts.offline, ctx_checkpoints=opts.ctx_checkpoints,
                   offload=opts.offload)
    sampling = replace(prep.sampling, **opts.sampling)
    max_tokens = opts.n_predict if opts.n_predict > 0 else prep.n_ctx
    params = DecodeParams(decode=opts.decode, block_length=opts.block_length, threshold=opts.threshold,
                          expert_coreset=opts.expert_coreset, max_tokens=max_tokens, sampling=sampling,
                          verify=opts.verify)
    session = load_chat(prep.path, n_ctx=prep.n_ctx, chat_template_file=opts.chat_template_file,
                        n_threads=opts.threads, backend=opts.backend, defaults=params,
                        exact_kernels=opts.exact_kernels, offload=opts.offload)
    compile_first_run(session.model)
    think = opts.think
    if opts.constraint is not None:  # the grammar starts at the reply's first token: no reasoning
        params, think = replace(params, grammar=_compile_constraint(session, *opts.constraint)), False
    cache = session.new_cache(max_checkpoints=opts.ctx_checkpoints, checkpoint_every=opts.checkpoint_every)
    banner = _banner(session, prep, params)
    if session.template.is_fallback:
        console.warn("the model has no chat template; using ChatML")
    if opts.text is None:
        from .repl import Repl

        con = console.out()
        code = Repl(session, params, system=opts.system, think=think, visual=opts.visual,
                    show_timings=opts.show_timings, banner=banner, con=con, cache=cache).loop()
        raise typer.Exit(code)
    _answer_once(session, params, opts.text, system=opts.system, think=think, as_json=opts.as_json,
                 show_timings=opts.show_timings, banner=banner,
                 cache=cache if opts.prompt_cache is not None else None, cache_file=opts.prompt_cache)


def _constraint_source(grammar: str | None, grammar_file: Path | None, json_schema: str | None,
                       json_schema_file: Path | None) -> tuple[str, str, str | None, Path | None] | None:
    """The one reply constraint the flags give, as (flag, kind, text, file), or None; two of them is a
    usage error (as in llama-cli), found before the model loads."""
    given = [(flag, kind, value, path) for flag, kind, value, path in (
        ("--grammar", "gbnf", grammar, None), ("--grammar-file", "gbnf", None, grammar_file),
        ("--json-schema", "json_schema", json_schema, None),
        ("--json-schema-file", "json_schema", None, json_schema_file),
    ) if value is not None or path is not None]
    if len(given) > 1:
        raise UsageError(f"{given[0][0]} and {given[1][0]} both constrain the reply", "give one of them")
    return given[0] if given else None


def _compile_constraint(session, flag: str, kind: str, text: str | None, path: Path | None):  # noqa: ANN001, ANN202
    """The constraint compiled for the model's tokenizer; a bad grammar or schema is one line naming the flag."""
    from clover_runtime.decoding.constraint import GrammarError
    from clover_runtime.errors import CloverError
    from clover_runtime.text_files import read_text

    if path is not None:
        try:
            text = read_text(path)
        except (OSError, UnicodeDecodeError) as exc:
            raise CloverError(f"{flag}: cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return session.compile_grammar(kind, text)
    except GrammarError as exc:
        raise CloverError(f"{flag}: {exc.message}") from None


def _complete(incomplete: str) -> list[str]:
    from .completion import complete_model

    return complete_model(incomplete)


def _one_shot_text(prompt: str | None, file: Path | None) -> str | None:
    """The prompt from the argument / -p, a file, and stdin when it is not a terminal (prepended)."""
    from clover_runtime.errors import CloverError
    from clover_runtime.text_files import decode_text, read_text

    parts = []
    if not sys.stdin.isatty():  # bytes, decoded as UTF-8/UTF-16 here: never the Windows ANSI code page
        raw = sys.stdin.buffer.read() if hasattr(sys.stdin, "buffer") else sys.stdin.read().encode("utf-8")
        try:
            piped = decode_text(raw)
        except UnicodeDecodeError:
            raise CloverError("cannot read stdin: it is not UTF-8 or UTF-16 text") from None
        if piped.strip():
            parts.append(piped.rstrip("\n"))
    if file is not None:
        try:
            parts.append(read_text(file).rstrip("\n"))
        except OSError as exc:
            raise CloverError(f"cannot read {file}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise CloverError(f"cannot read {file}: it is not UTF-8 or UTF-16 text") from None
    if prompt:
        parts.append(prompt)
    return "\n\n".join(parts) if parts else None


def _banner(session, prep, params) -> str:  # noqa: ANN001 - internal
    from clover_runtime.decoding import resolve_mode

    from .model_setup import placement_text

    mode, exact, reason = resolve_mode(session.model, params)
    label = mode if exact else f"{mode} (approximate)"
    return (f"clover · {prep.model_id}\n"
            f"  context {prep.n_ctx} · decode {label}: {reason}\n"
            f"  chat template: {session.template.origin} · kernels: {session.model.backend}\n"
            f"  weights: {placement_text(session.model)}")


def _answer_once(session, params, text: str, *, system, think: bool, as_json: bool, show_timings: bool,  # noqa: ANN001
                 banner: str, cache=None, cache_file: Path | None = None) -> None:  # noqa: ANN001
    import threading

    from clover_runtime import state_file
    from clover_runtime.text.reply import Reply

    from .chat_view import OneShotPrinter, print_json, run_in_thread

    messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
    kwargs = {} if think else {"enable_thinking": False}
    err = console.err()
    out = console.out()
    if console.verbose():
        err.print(console.safe(banner, lines=True), markup=False)
    if cache_file is not None and cache_file.exists():
        state_file.load(cache, cache_file)  # another model's state: one line, exit 1
    reply = Reply()
    printer = OneShotPrinter(out, err)
    cancel = threading.Event()
    try:
        for ev in run_in_thread(lambda c: session.stream(messages, params=params, chat_template_kwargs=kwargs,
                                                         cancel=c, cache=cache), cancel):
            reply.add(ev)
            if not as_json:
                printer.feed(ev)
    except KeyboardInterrupt:
        cancel.set()
        raise
    if cache_file is not None:
        state_file.save(cache, cache_file)
    if as_json:
        print_json(reply, out)
        return
    printer.finish(reply, show_timings=show_timings)
