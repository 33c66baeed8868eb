"""`clover pull MODEL`: download a model into the Hugging Face cache, checking it fits first."""

from __future__ import annotations

import typer

from . import console

_E = "CLOVER_"


def command(
    model: str | None = typer.Argument(None, help="owner/repo[:QUANT], hf.co/…, a file URL (default: Clover Q4_K_M)."),
    file: str | None = typer.Option(None, "--file", "-f", help="Exact file name in the repository."),
    ctx_size: int = typer.Option(4096, "-c", "--ctx-size", help="Context to check the memory fit for.",
                                 envvar=_E + "CTX_SIZE"),
    force: bool = typer.Option(False, "--force", help="Download even when the model does not fit this machine."),
    hf_token: str | None = typer.Option(None, "--hf-token", help="Token for gated or private repos (or HF_TOKEN)."),
    offline: bool = typer.Option(False, "--offline", help="Only look in the cache.", envvar=_E + "OFFLINE"),
) -> None:
    """Download a model (all shards) into the Hugging Face cache; resumes interrupted downloads.

    Example:

        clover pull Diffuspace/Clover-35B-A3B-Preview-GGUF:Q4_K_M
    """
    from runtime.errors import CloverError
    from runtime.hub import resolve_model

    def fit_first(ref, files) -> None:  # noqa: ANN001 - callback from the Hub layer
        from runtime import memory_fit
        from runtime.hub import remote_header
        from runtime.model_config import describe_tensors

        header = remote_header(ref, token=hf_token)
        cfg = describe_tensors(header.metadata, header.tensors)
        weight_bytes = sum(f.size for f in files)
        system = memory_fit.probe_system()
        estimate = memory_fit.estimate(cfg, weight_bytes, min(ctx_size, cfg.context_length))
        verdict = memory_fit.assess(estimate, system)
        console.info(f"memory fit at -c {ctx_size}: {verdict.message}")
        if verdict.verdict == "does not fit" and not force:
            from .fit_table import print_fit_table

            print_fit_table(estimate, system, verdict)
            raise CloverError(f"{ref} does not fit this machine: {verdict.message}",
                              "pass --force to download anyway, or choose a smaller quant")

    path = resolve_model(model, file=file, offline=offline, token=hf_token, before_download=fit_first)
    console.out().print(f"done: {path}", markup=False, highlight=False)
