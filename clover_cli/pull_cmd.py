"""`clover pull MODEL`: download a model into the Hugging Face cache, checking first that it fits."""

from __future__ import annotations

from typing import Any

import typer

from .completion import complete_model
from .options import CTX_HELP, ctx_option

_E = "CLOVER_"


def _check_fit(p: Any, *, ctx_size: int | None, force: bool, token: str | None) -> None:
    """Read the header remotely (a few MB) and stop before the download when the model cannot run here."""
    from clover_runtime import memory_fit
    from clover_runtime.errors import CloverError, ModelFileError
    from clover_runtime.hub import remote_header
    from clover_runtime.model_config import describe_tensors

    from . import console
    from .advice import fit_hint

    try:
        model = remote_header(p, token=token)
        cfg = describe_tensors(model.metadata, model.tensors)
    except ModelFileError as exc:
        if force:
            console.warn(f"{exc.message}; downloading anyway (--force)")
            return
        raise CloverError(exc.message, "clover cannot run this file; pass --force to download it anyway") from None
    system = memory_fit.probe_system()
    n_ctx = min(memory_fit.context_for(ctx_size, cfg, model.tensor_bytes, system=system), cfg.context_length)
    estimate = memory_fit.estimate(cfg, model.tensor_bytes, n_ctx)
    verdict = memory_fit.assess(estimate, system, tensors=model.tensors, n_layer=cfg.n_layer,
                                layer_state=memory_fit.layer_state_bytes(cfg, estimate))
    console.info(f"memory fit at -c {n_ctx} (from the header, {model.bytes_read:,} bytes read): {verdict.message}")
    if verdict.verdict == memory_fit.NO_FIT:
        from .fit_table import print_fit_table

        print_fit_table(estimate, system, verdict)
        if not force:
            hint = fit_hint(verdict.advice)
            raise CloverError(f"{p.ref} does not fit this machine at -c {n_ctx}",
                              (hint + "; " if hint else "") + "or pass --force to download anyway")
        console.warn("downloading anyway (--force)")
    elif verdict.verdict == memory_fit.PAGING:
        console.warn(f"{verdict.message} (expect slow generation)")


def command(
    model: str | None = typer.Argument(None, metavar="[MODEL]", autocompletion=complete_model,
                                       help="owner/repo[:QUANT], hf.co/owner/repo[:QUANT], or a Hub file URL "
                                            "(default: Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M)."),
    file: str | None = typer.Option(None, "--file", "-f", help="Exact file in the repository (overrides :QUANT)."),
    ctx_size: int | None = ctx_option(CTX_HELP + " The memory fit is checked at this context."),
    force: bool = typer.Option(False, "--force", help="Download even when the model does not fit this machine."),
    hf_token: str | None = typer.Option(None, "--hf-token", envvar="HF_TOKEN",
                                        help="Token for gated or private repositories (default: HF_TOKEN)."),
    offline: bool = typer.Option(False, "--offline", envvar=_E + "OFFLINE",
                                 help="Use the cache only (also HF_HUB_OFFLINE=1)."),
) -> None:
    """Download a model (every shard) into the Hugging Face cache, resuming interrupted downloads.

    Checks first that the model fits this machine (from its header, read remotely) and that the disk
    has room; verifies each file's sha256 against the Hub before it counts as downloaded.

    Example:

        clover pull Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M
    """
    from clover_runtime.demo import demo_path, is_demo
    from clover_runtime.hub import offline_mode, resolve_model
    from clover_runtime.hub.remote import endpoint

    from . import console
    from .hub_progress import HubProgress

    if is_demo(model):
        console.out().print(f"demo ships with clover, nothing to download: {demo_path()}", markup=False,
                            highlight=False, soft_wrap=True)
        return
    if not offline_mode(offline):
        console.info(f"connecting to {endpoint()}…")

    def fit_first(p: Any) -> None:
        _check_fit(p, ctx_size=ctx_size, force=force, token=hf_token)

    with HubProgress() as progress:
        path = resolve_model(model, file=file, offline=offline, token=hf_token, refresh=True,
                             before_download=fit_first, reporter=progress)
    console.out().print(f"done: {path}", markup=False, highlight=False, soft_wrap=True)
