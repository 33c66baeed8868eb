#!/usr/bin/env bash
# Issue 14's device measurements as one prepared run on a lent GPU machine (about 12 minutes):
# the torch backend's equivalence tests there, then pp512 / tg128 / dg128 (reveal k = 1, 2, 4, 8
# tokens per pass, so the figure does not depend on random weights' confidence) on a 40-layer
# real-shape Q4_K_M file written there (sparse: the values do not matter for speed), all on the
# GPU, with --cpu-moe, and the CPU engine alone for the "CPU + 20 %" comparison.
#
#   OUT=/path/to/results bash benchmarks/gpu_check.sh
#
# The device image has torch, numba, tokenizers, typer and huggingface_hub but not gguf, fastapi
# or uvicorn; carry their wheels in an ignored `.whl/` folder (see the device tool's README for
# the `pip download --only-binary=:all: --python-version 3.12 ...` line) and this script installs
# them first.
set -euo pipefail
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if compgen -G ".whl/*.whl" > /dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
    export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
nvidia-smi --query-gpu=name,memory.total,memory.free --format=csv | tee "$OUT/gpu.txt"
python3 -m pytest -q -x tests/test_torch_backend.py -p no:cacheprovider 2>&1 | tail -3 | tee "$OUT/tests.txt"

MODEL=/tmp/real40-Q4_K_M.gguf
python3 -m clover_cli make-model "$MODEL" --preset real-shape --layers 40 --sparse
bench() {  # name, then bench flags
    local name=$1
    shift
    timeout 240 python3 -m clover_cli bench "$MODEL" "$@" -r 2 -o jsonl 2>&1 | tee "$OUT/bench-$name.jsonl"
}
bench gpu -ngl 99 -p 512 -n 128 -dg 128 --reveal-k 1,2,4,8
bench cpu-moe -ngl 99 --cpu-moe -p 512 -n 128 -dg 128 --reveal-k 4
bench cpu -ngl 0 -p 0 -n 128 -dg 0

# Issue 34: --decode auto against --decode ar on the GPU, interleaved (the timings' ar_n and
# diffusion_n say which mode wrote what; the text must be the same): a 4-layer real-shape file with
# random weights (previews never agree) and the shipped demo model.
REAL4=/tmp/real4-Q4_K_M.gguf
python3 -m clover_cli make-model "$REAL4" --preset real-shape --layers 4
for round in 1 2; do
    for d in ar auto; do
        timeout 120 python3 -m clover_cli run "$REAL4" "Write a short story about a robot who learns to paint." \
            -n 64 --temp 0 --no-think --json -ngl 99 --decode "$d" 2>/dev/null | tr -d '\n' >> "$OUT/auto-real4.jsonl"
        echo >> "$OUT/auto-real4.jsonl"
        timeout 60 python3 -m clover_cli run demo "What is 48 + 36?" -n 64 --no-think --json -ngl 99 \
            --decode "$d" 2>/dev/null | tr -d '\n' >> "$OUT/auto-demo.jsonl"
        echo >> "$OUT/auto-demo.jsonl"
    done
done
