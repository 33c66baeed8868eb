"""`clover make-model OUT.gguf`: write a synthetic Clover model with seeded random weights.

A front end only: the spec, weights and GGUF writing live in `clover_runtime.synth`. Module top imports
only typer and the standard library.
"""

from __future__ import annotations

import time
from pathlib import Path

import typer


def command(
    out_path: str = typer.Argument(..., metavar="OUT.gguf", help="Output .gguf path."),
    preset: str = typer.Option(
        "tiny", "--preset", "-p", help="tiny, small (all rows multiples of 256) or real-shape."
    ),
    quant: str = typer.Option(
        None, "--quant", "-q",
        help="F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q4_K_M, Q5_K or Q6_K "
             "(default: F32, Q4_K_M for real-shape).",
    ),
    layers: int = typer.Option(None, "--layers", "-l", min=1, help="Layers (default: the preset's)."),
    vocab: str = typer.Option(None, "--vocab", help="small, or qwen36 for the real Qwen3.6 vocabulary."),
    clover_tensors: bool = typer.Option(
        True, "--clover-tensors/--no-clover-tensors", help="Include the Clover-only GDN preview tensors."
    ),
    diffusion_keys: bool = typer.Option(
        True, "--diffusion-keys/--no-diffusion-keys", help="Write the diffusion keys and the mask token id."
    ),
    arch: str = typer.Option(None, "--arch", help="clover-moe (default), qwen35moe or qwen3next."),
    seed: int = typer.Option(None, "--seed", min=0, help="Random seed (default 0): same seed, same bytes."),
    fused_qkv: bool = typer.Option(False, "--fused-qkv", help="Attention layers store one attn_qkv tensor."),
    fused_gate_up: bool = typer.Option(False, "--fused-gate-up", help="Experts store ffn_gate_up_exps."),
    tied_output: bool = typer.Option(False, "--tied-output", help="No output.weight: reuse token_embd."),
    sparse: bool = typer.Option(False, "--sparse", help="Leave the tensor data as a sparse hole."),
    force: bool = typer.Option(False, "--force", "-f", help="Overwrite a file that clover did not make."),
) -> None:
    """Write a synthetic Clover GGUF (seeded random weights) from a tiny test model to the real shape.

    Example:

        clover make-model tiny.gguf && clover run tiny.gguf "hello"

        clover make-model big.gguf --preset real-shape --layers 4 --sparse
    """
    from clover_runtime.errors import CloverError
    from clover_runtime.quants import type_name
    from clover_runtime.synth.spec import build_spec
    from clover_runtime.synth.writer import is_synthetic, plan_model, write_model

    from . import console

    out = Path(out_path)
    spec = build_spec(
        preset, quant=quant, layers=layers, vocab=vocab, arch=arch, seed=seed,
        clover_tensors=clover_tensors, diffusion_keys=diffusion_keys, fused_qkv=fused_qkv,
        fused_gate_up=fused_gate_up, tied_output=tied_output,
    )
    if out.is_dir():
        raise CloverError(f"{out} is a directory", "give a file name such as tiny.gguf")
    if out.exists() and not force and not is_synthetic(out):
        raise CloverError(f"{out} already exists and is not a model clover made",
                          "pass --force to overwrite it")
    plans = plan_model(spec)
    start = time.perf_counter()
    path = write_model(out, spec, sparse=sparse)
    seconds = time.perf_counter() - start
    n_attn = sum(spec.is_attention(i) for i in range(spec.n_layer))
    size = sum(p.n_bytes for p in plans)
    console.out().print(
        f"Wrote {path}: {spec.arch}, {spec.n_layer} layers ({n_attn} attention, {spec.n_layer - n_attn} "
        f"Gated DeltaNet), {spec.n_expert} experts top-{spec.n_expert_used}, {spec.quant}, "
        f"{size / 1e6:,.1f} MB of weights{' (sparse)' if sparse else ''} in {seconds:.2f} s",
        highlight=False, markup=False,
    )
    fell_back = [p for p in plans if p.fell_back]
    if fell_back:
        kinds = sorted({f"{type_name(p.wanted_type)}->{type_name(p.ggml_type)}" for p in fell_back})
        console.info(f"{len(fell_back)} tensors stored in a fallback type ({', '.join(kinds)}): "
                     "their rows are not a multiple of 256; use --preset small for K-quants throughout")
