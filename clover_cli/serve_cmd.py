"""`clover serve`: an OpenAI-compatible server with a web chat page, in the foreground or detached.

Every option can also come from the environment as `CLOVER_<OPTION>` (e.g. `CLOVER_PORT=9000`);
a flag on the command line wins over the environment.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from . import api_keys
from .completion import complete_model

if TYPE_CHECKING:
    from clover_runtime.offload import OffloadRequest

    from .model_setup import PreparedModel
from .options import (
    CHAT,
    CONTEXT,
    CTX_HELP,
    DIFFUSION,
    MODEL,
    PLACEMENT,
    SERVER,
    cpu_moe_option,
    ctx_option,
    device_option,
    main_gpu_option,
    mmap_option,
    n_cpu_moe_option,
    ngl_option,
    offload_request,
)

DEFAULT_PORT = 8085
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0  # within `docker stop`'s 10 s before it kills


def _env(name: str) -> str:
    return f"CLOVER_{name}"


@dataclass
class ServeOptions:
    model: str | None
    host: str
    port: int
    ctx: int | None  # per sequence, as in run and inspect
    parallel: int
    alias: str | None
    api_keys: tuple[str, ...]
    cors_origins: tuple[str, ...]
    allowed_hosts: tuple[str, ...]
    webui: bool
    timeout: float
    chat_template_file: Path | None
    threads: int | None
    exact_kernels: bool
    decode: str | None
    threshold: float | None
    block_length: int | None
    max_queue: int
    offline: bool
    ctx_checkpoints: int = 8
    checkpoint_every: int = 2048
    slot_save_path: Path | None = None
    verify: bool | None = None
    reasoning_budget: int = -1  # chat requests' default: -1 thinks freely, 0 not at all (--no-think), N tokens
    offload: OffloadRequest | None = None  # -ngl, --cpu-moe, --n-cpu-moe, --device, --main-gpu
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT_S
    slots_verbose: bool = False


def command(
    context: typer.Context,
    model_arg: Annotated[str | None, typer.Argument(
        metavar="MODEL", autocompletion=complete_model, show_default=False,
        help="Model: demo (shipped with clover), a .gguf path, owner/repo[:QUANT], hf.co/owner/repo[:QUANT] "
             "or a Hub file URL "
             "(as in pull); "
             "default: the Clover preview model.")] = None,
    model_opt: Annotated[str | None, typer.Option(
        "-m", "--model", rich_help_panel=MODEL, envvar=_env("MODEL"), show_default=False,
        help="The model, as an option instead of the argument.")] = None,
    host: Annotated[str, typer.Option(
        "--host", rich_help_panel=SERVER, envvar=_env("HOST"),
        help="Address to listen on; 0.0.0.0 opens it to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(
        "--port", rich_help_panel=SERVER, envvar=_env("PORT"), min=0, max=65535, help="TCP port.")] = DEFAULT_PORT,
    ctx: Annotated[int | None, ctx_option(
        CTX_HELP + " The server holds -c × -np tokens in all.", annotated=True)] = None,
    parallel: Annotated[int, typer.Option(
        "-np", "--parallel", rich_help_panel=SERVER, envvar=_env("PARALLEL"), min=1, max=256,
        help="Sequences generated at once, each with its own -c tokens.")] = 1,
    alias: Annotated[str | None, typer.Option(
        "-a", "--alias", rich_help_panel=MODEL, envvar=_env("ALIAS"), show_default=False,
        help="Model id reported by /v1/models and in responses.")] = None,
    api_key: Annotated[list[str] | None, typer.Option(
        "--api-key", rich_help_panel=SERVER, envvar=_env("API_KEY"), show_default=False,
        help="Require this API key (repeat, or comma-separate, for several; a key may hold spaces).")] = None,
    api_key_file: Annotated[Path | None, typer.Option(
        "--api-key-file", rich_help_panel=SERVER, envvar=_env("API_KEY_FILE"), show_default=False,
        help="File with one API key per line (UTF-8 or UTF-16; keep it private: chmod 600).")] = None,
    cors_origins: Annotated[str | None, typer.Option(
        "--cors-origins", rich_help_panel=SERVER, envvar=_env("CORS_ORIGINS"), show_default=False,
        help="Extra browser origins allowed, comma-separated ('*' for any); "
             "localhost is always allowed.")] = None,
    allowed_hosts: Annotated[str | None, typer.Option(
        "--allowed-hosts", rich_help_panel=SERVER, envvar=_env("ALLOWED_HOSTS"), show_default=False,
        help="Extra Host names the server answers to, comma-separated ('*' for any); "
             "on a loopback --host only localhost, 127.0.0.1 and [::1] are.")] = None,
    no_webui: Annotated[bool, typer.Option(
        "--no-webui", rich_help_panel=SERVER, envvar=_env("NO_WEBUI"),
        help="Do not serve the chat page at /.")] = False,
    timeout: Annotated[float, typer.Option(
        "-to", "--timeout", rich_help_panel=SERVER, envvar=_env("TIMEOUT"), min=1.0,
        help="Seconds one request may take, queueing included.")] = 3600.0,
    chat_template_file: Annotated[Path | None, typer.Option(
        "--chat-template-file", rich_help_panel=CHAT, envvar=_env("CHAT_TEMPLATE_FILE"), show_default=False,
        help="Jinja chat template to use instead of the model's.")] = None,
    threads: Annotated[int | None, typer.Option(
        "-t", "--threads", rich_help_panel=PLACEMENT, envvar=_env("THREADS"), min=1, show_default=False,
        help="CPU threads for the engine.")] = None,
    exact_kernels: Annotated[bool, typer.Option(
        "--exact-kernels", rich_help_panel=PLACEMENT, envvar=_env("EXACT_KERNELS"),
        help="Float kernels for quantized weights (slower; no 8-bit activations).")] = False,
    n_gpu_layers: Annotated[str | None, ngl_option(annotated=True)] = None,
    cpu_moe: Annotated[bool, cpu_moe_option(annotated=True)] = False,
    n_cpu_moe: Annotated[int, n_cpu_moe_option(annotated=True)] = 0,
    mmap: Annotated[bool | None, mmap_option(annotated=True)] = None,
    device: Annotated[str, device_option(annotated=True)] = "auto",
    main_gpu: Annotated[int, main_gpu_option(annotated=True)] = 0,
    decode: Annotated[str | None, typer.Option(
        "--decode", rich_help_panel=DIFFUSION, metavar="auto|diffusion|ar", envvar=_env("DECODE"), show_default=False,
        help="Default decoding: auto, diffusion or ar.")] = None,
    threshold: Annotated[float | None, typer.Option(
        "--threshold", rich_help_panel=DIFFUSION, envvar=_env("THRESHOLD"), min=0.0, max=1.0, show_default=False,
        help="Default diffusion confidence threshold.")] = None,
    block_length: Annotated[int | None, typer.Option(
        "--block-length", rich_help_panel=DIFFUSION, envvar=_env("BLOCK_LENGTH"), min=1, show_default=False,
        help="Default diffusion block length.")] = None,
    verify: Annotated[bool | None, typer.Option(
        "--verify/--no-verify", rich_help_panel=DIFFUSION, envvar=_env("VERIFY"), show_default=False,
        help="Diffusion: check each block against greedy AR at its commit (default: on when greedy).")] = None,
    think: Annotated[bool | None, typer.Option(
        "--think/--no-think", rich_help_panel=CHAT, envvar=_env("THINK"), show_default=False,
        help="Whether chat replies reason first by default (default: --think); a request overrides it "
             "(chat_template_kwargs.enable_thinking, reasoning_budget_tokens, reasoning_effort).")] = None,
    reasoning_budget: Annotated[int, typer.Option(
        "--reasoning-budget", rich_help_panel=CHAT, envvar=_env("REASONING_BUDGET"), min=-1,
        help="Default thinking tokens per chat reply: -1 no limit, 0 no thinking (--no-think), N at most N "
             "(then </think> is written for the model); a request's own budget wins.")] = -1,
    max_queue: Annotated[int, typer.Option(
        "--max-queue", rich_help_panel=SERVER, envvar=_env("MAX_QUEUE"), min=0,
        help="Requests that may wait for a free sequence; beyond that, 503.")] = 16,
    offline: Annotated[bool, typer.Option(
        "--offline", rich_help_panel=MODEL, envvar=_env("OFFLINE"),
        help="Use only models already in the local cache.")] = False,
    ctx_checkpoints: Annotated[int, typer.Option(
        "--ctx-checkpoints", rich_help_panel=CONTEXT, envvar=_env("CTX_CHECKPOINTS"), min=0,
        help="Prompt-cache checkpoints of the recurrent state kept per slot (0: none).")] = 8,
    checkpoint_every: Annotated[int, typer.Option(
        "--checkpoint-every", rich_help_panel=CONTEXT, envvar=_env("CHECKPOINT_EVERY"), min=0,
        help="Also checkpoint every N tokens of a long prefill (0: never).")] = 2048,
    slot_save_path: Annotated[Path | None, typer.Option(
        "--slot-save-path", rich_help_panel=SERVER, metavar="DIR", envvar=_env("SLOT_SAVE_PATH"), show_default=False,
        help="Folder for POST /slots/{id}?action=save|restore (a slot's prompt state as a file).")] = None,
    slots_verbose: Annotated[bool, typer.Option(
        "--slots-verbose", rich_help_panel=SERVER, envvar=_env("SLOTS_VERBOSE"),
        help="GET /slots also shows each slot's prompt text (off: counts and state only).")] = False,
    shutdown_timeout: Annotated[float, typer.Option(
        "--shutdown-timeout", rich_help_panel=SERVER, envvar=_env("SHUTDOWN_TIMEOUT"), min=0.0, show_default=False,
        help=f"On Ctrl-C, SIGTERM or clover stop, seconds running replies may take to finish (default "
             f"{DEFAULT_SHUTDOWN_TIMEOUT_S:g}); then they are cut with a server_shutting_down error. Queued and "
             "new requests get 503 at once.")
    ] = DEFAULT_SHUTDOWN_TIMEOUT_S,
    detach: Annotated[bool, typer.Option(
        "--detach", rich_help_panel=SERVER, envvar=_env("DETACH"),
        help="Run in the background; return once it is ready (see clover ps, clover stop).")] = False,
) -> None:
    """Serve a model over an OpenAI-compatible API at /v1 with a chat page at /.

    Every option can also be set as CLOVER_<OPTION> in the environment (CLOVER_PORT=9000).

    Example:

        clover serve demo -np 2 --detach
    """
    from clover_runtime.errors import CloverError

    from .usage import UsageError, choice

    model = model_opt or model_arg  # None: the default model, as `clover run` does
    if model_arg and model_opt and model_arg != model_opt:
        raise UsageError("the model is given twice (argument and -m)", "give it once")
    if decode is not None:
        choice("--decode", decode, ("auto", "diffusion", "ar"))
    if think is False and reasoning_budget > 0 or think and reasoning_budget == 0:
        raise UsageError(f"--{'no-' if think is False else ''}think and --reasoning-budget {reasoning_budget} "
                          "disagree", "give one of them")
    if think is False:
        reasoning_budget = 0
    opts = ServeOptions(
        model=model, host=host, port=port, ctx=ctx, parallel=parallel, alias=alias,
        api_keys=api_keys.collect(api_key, api_key_file,
                                  from_env=context.get_parameter_source("api_key").name == "ENVIRONMENT"),
        cors_origins=tuple(o.strip() for o in (cors_origins or "").split(",") if o.strip()),
        allowed_hosts=tuple(h.strip() for h in (allowed_hosts or "").split(",") if h.strip()),
        webui=not no_webui, timeout=timeout, chat_template_file=chat_template_file, threads=threads,
        exact_kernels=exact_kernels, decode=decode, threshold=threshold, block_length=block_length, max_queue=max_queue,
        verify=verify, reasoning_budget=reasoning_budget, offline=offline, ctx_checkpoints=ctx_checkpoints,
        checkpoint_every=checkpoint_every, slot_save_path=slot_save_path,
        offload=offload_request(n_gpu_layers, cpu_moe, n_cpu_moe, device, main_gpu, mmap),
        shutdown_timeout=shutdown_timeout, slots_verbose=slots_verbose)
    from clover_runtime.torch_backend.group import request_device

    if not detach:  # a detached server checks in the child: the parent holds no CUDA context while it sizes -ngl
        request_device(opts.offload)  # an offload that cannot be met fails before the port is bound
    if slot_save_path is not None:
        try:
            slot_save_path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CloverError(f"cannot use --slot-save-path {slot_save_path}: {exc.strerror}") from None
    if chat_template_file is not None and not chat_template_file.is_file():
        raise CloverError(f"chat template file not found: {chat_template_file}")
    if detach:
        _detach(opts)
    else:
        _foreground(opts)


def _prepare(opts: ServeOptions) -> PreparedModel:
    """The shared model set-up (resolve, memory fit, refusal with the fit table) with -c per sequence,
    as in run and inspect, so `clover inspect -c N -np P --fit` checks exactly what this runs; the
    model's name is `--alias` when given."""
    from .model_setup import prepare

    prep = prepare(opts.model, ctx=opts.ctx, parallel=opts.parallel, offline=opts.offline,
                   ctx_checkpoints=opts.ctx_checkpoints, offload=opts.offload)
    return replace(prep, model_id=opts.alias or prep.model_id)


def _child_args(opts: ServeOptions, prep: PreparedModel) -> list[str]:
    """The foreground command the detached process runs (keys go through the environment)."""
    args = [str(prep.path), "--host", opts.host, "--port", str(opts.port), "-c", str(prep.n_ctx),
            "-np", str(opts.parallel), "--alias", prep.model_id, "-to", f"{opts.timeout:g}",
            "--max-queue", str(opts.max_queue), "--offline", "--ctx-checkpoints", str(opts.ctx_checkpoints),
            "--checkpoint-every", str(opts.checkpoint_every), "--shutdown-timeout", f"{opts.shutdown_timeout:g}"]
    if opts.slots_verbose:
        args.append("--slots-verbose")
    if opts.cors_origins:
        args += ["--cors-origins", ",".join(opts.cors_origins)]
    if opts.allowed_hosts:
        args += ["--allowed-hosts", ",".join(opts.allowed_hosts)]
    if not opts.webui:
        args.append("--no-webui")
    if opts.chat_template_file is not None:
        args += ["--chat-template-file", str(opts.chat_template_file.resolve())]
    if opts.exact_kernels:
        args.append("--exact-kernels")
    args += _offload_args(opts.offload)
    if opts.slot_save_path is not None:
        args += ["--slot-save-path", str(opts.slot_save_path.resolve())]
    for flag, value in (("-t", opts.threads), ("--decode", opts.decode), ("--threshold", opts.threshold),
                        ("--block-length", opts.block_length)):
        if value is not None:
            args += [flag, str(value)]
    if opts.verify is not None:
        args.append("--verify" if opts.verify else "--no-verify")
    if opts.reasoning_budget != -1:
        args += ["--reasoning-budget", str(opts.reasoning_budget)]
    return args


def _offload_args(offload: OffloadRequest | None) -> list[str]:
    """The GPU flags that give `offload` again (none for the defaults)."""
    from clover_runtime.offload import AUTO

    if offload is None:
        return []
    args = [] if offload.n_gpu_layers == AUTO else ["-ngl", str(offload.n_gpu_layers)]
    if offload.cpu_moe:
        args.append("--cpu-moe")
    if offload.n_cpu_moe:
        args += ["--n-cpu-moe", str(offload.n_cpu_moe)]
    if offload.device != "auto":
        args += ["--device", offload.device]
    if offload.main_gpu:
        args += ["--main-gpu", str(offload.main_gpu)]
    return args


def _detach(opts: ServeOptions) -> None:
    import os

    from clover_runtime import paths

    from . import console, service
    from .server.launch import bind

    prep = _prepare(opts)
    probe = bind(opts.host, opts.port)  # fail here, in the foreground, if the port is taken
    opts = replace(opts, port=probe.getsockname()[1])  # --port 0: the child gets the port we found
    probe.close()
    log_path = paths.log_dir() / f"serve-{opts.port}.log"
    env = dict(os.environ)
    for name in ("CLOVER_API_KEY", "CLOVER_API_KEY_FILE", "CLOVER_DETACH", "CLOVER_MODEL"):
        env.pop(name, None)
    if opts.api_keys:
        env[api_keys.ENV] = api_keys.to_env(opts.api_keys)  # one per line: a key may hold spaces or commas
    console.info(f"starting clover serve in the background (log: {log_path})")
    proc = service.spawn_detached(_child_args(opts, prep), log_path, env)
    record = service.wait_ready(proc, opts.port, log_path, timeout=max(60.0, opts.timeout))
    console.out().print(f"clover serve is running: {record.url} (pid {record.pid})", markup=False)
    console.info(f"stop it with: clover stop {record.port}")


def client_line(host: str, port: int, model_id: str, n_ctx: int, keyed: bool) -> str:
    """The settings to paste into an OpenAI-compatible client (Hermes Agent, the agent SDKs), with an
    address a client on this machine can connect to even when the server listens on all of them."""
    from .service import display_host

    local = "127.0.0.1" if host in ("0.0.0.0", "") else "::1" if host == "::" else host
    key = "<your --api-key>" if keyed else "none"
    return (f"for OpenAI-compatible clients: base_url=http://{display_host(local)}:{port}/v1 model={model_id} "
            f"api_key={key} context_length={n_ctx}")


def _foreground(opts: ServeOptions) -> None:
    import logging
    import os
    import sys
    import time

    from . import __version__, console, service
    from .advice import AGENT_CTX
    from .server import ServerSettings, access_log, create_app
    from .server.launch import bind, serve

    prep = _prepare(opts)
    per_seq = prep.n_ctx
    noun = "sequence" if opts.parallel == 1 else "sequences"
    console.info(f"model: {prep.model_id} ({prep.path})")
    console.info(f"context: {per_seq} tokens per sequence × {opts.parallel} parallel {noun} = "
                 f"{per_seq * opts.parallel} tokens in all (-c × -np)")
    if not service.is_loopback(opts.host) and not opts.api_keys:
        console.warn(f"listening on {opts.host} without an API key: anyone who can reach this machine "
                     "can use the model (set --api-key)")
    token = service.new_token()
    settings = ServerSettings(
        model_id=prep.model_id, model_path=str(prep.path), n_ctx_slot=per_seq, n_parallel=opts.parallel,
        max_queue=opts.max_queue, api_keys=opts.api_keys, cors_origins=opts.cors_origins,
        host=opts.host, allowed_hosts=opts.allowed_hosts, webui=opts.webui,
        timeout_s=opts.timeout, decode=opts.decode, threshold=opts.threshold,
        block_length=opts.block_length, verify=opts.verify, reasoning_budget=opts.reasoning_budget,
        ctx_checkpoints=opts.ctx_checkpoints,
        checkpoint_every=opts.checkpoint_every,
        slot_save_path=str(opts.slot_save_path) if opts.slot_save_path is not None else None,
        shutdown_timeout_s=opts.shutdown_timeout, slots_verbose=opts.slots_verbose,
        shutdown_token=token, build=f"clover-{__version__}")

    def load_session() -> object:
        from clover_runtime.chat import load_chat

        from .model_setup import compile_first_run

        session = load_chat(str(prep.path), n_ctx=per_seq, chat_template_file=opts.chat_template_file,
                            n_threads=opts.threads, exact_kernels=opts.exact_kernels, offload=opts.offload)
        compile_first_run(session.model, spinner=False)
        return session

    logging.basicConfig(level=logging.INFO if console.verbose() else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    access_log.enable(sys.stderr)  # one line per request, at every verbosity
    app = create_app(load_session, settings)
    sock = bind(opts.host, opts.port)
    port = sock.getsockname()[1]
    url = f"http://{service.display_host(opts.host)}:{port}"
    started = time.monotonic()
    record = service.ServerRecord(pid=os.getpid(), port=port, host=opts.host, model=prep.model_id,
                                  started=time.time(), token=token, log=os.environ.get(service.LOG_ENV),
                                  version=__version__, shutdown_timeout=opts.shutdown_timeout)

    def on_listening() -> None:  # /health answers 503 "Loading model" until the model has loaded
        service.write_record(record)
        console.info("loading the model…")

    def on_loaded() -> None:  # only now does `listening on` tell a user the server can answer
        console.info(f"model loaded in {time.monotonic() - started:.1f} s; ready")
        where = "web UI at /, API at /v1" if opts.webui else "API at /v1"
        console.out().print(f"listening on {url} ({where})", markup=False, highlight=False)
        console.out().print(client_line(opts.host, port, prep.model_id, per_seq, bool(opts.api_keys)),
                            markup=False, highlight=False)
        if per_seq < AGENT_CTX <= prep.config.context_length:
            console.info(f"agent clients such as Hermes Agent need {AGENT_CTX} tokens per request: -c {AGENT_CTX}")

    try:
        serve(app, sock, on_listening=on_listening, on_loaded=on_loaded,
              on_exit=lambda: service.remove_record(port, os.getpid()), verbose=console.verbose())
    finally:
        service.remove_record(port, os.getpid())
