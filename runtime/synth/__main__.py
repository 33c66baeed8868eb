"""`python -m clover_runtime.synth OUT.gguf --preset tiny --quant Q4_K ...`: write a synthetic Clover model."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from ..errors import CloverError
from .spec import ARCHITECTURES, PRESETS, QUANTS, VOCABULARIES, build_spec
from .writer import write_model


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m clover_runtime.synth", description=__doc__)
    ap.add_argument("out", type=Path, help="output .gguf path")
    ap.add_argument("--preset", default="tiny", choices=PRESETS)
    ap.add_argument("--quant", type=str.upper, choices=QUANTS, help="file type (default: the preset's)")
    ap.add_argument("--layers", type=int, help="number of layers")
    ap.add_argument("--vocab", choices=VOCABULARIES)
    ap.add_argument("--arch", choices=ARCHITECTURES)
    ap.add_argument("--seed", type=int)
    ap.add_argument("--no-clover-tensors", dest="clover_tensors", action="store_false", default=None)
    ap.add_argument("--no-diffusion-keys", dest="diffusion_keys", action="store_false", default=None)
    ap.add_argument("--fused-qkv", action="store_true", default=None)
    ap.add_argument("--fused-gate-up", action="store_true", default=None)
    ap.add_argument("--tied-output", action="store_true", default=None)
    ap.add_argument("--sparse", action="store_true", help="leave the tensor data as a sparse hole")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        spec = build_spec(
            args.preset, quant=args.quant, layers=args.layers, vocab=args.vocab, arch=args.arch,
            seed=args.seed, clover_tensors=args.clover_tensors, diffusion_keys=args.diffusion_keys,
            fused_qkv=args.fused_qkv, fused_gate_up=args.fused_gate_up, tied_output=args.tied_output,
        )
        start = time.perf_counter()
        path = write_model(args.out, spec, sparse=args.sparse)
    except CloverError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 1
    size = path.stat().st_size
    print(f"wrote {path} ({spec.arch}, {spec.n_layer} layers, {spec.quant}, {size:,} bytes) "
          f"in {time.perf_counter() - start:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
