"""clover: run Clover block-diffusion GGUF models locally (pull, run, serve, bench, inspect)."""

__version__ = "0.1.0"
