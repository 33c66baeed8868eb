"""clover and llama.cpp side by side on real-shape files: pp and tg rows at two depths, the time per
layer, and the full 40-layer model extrapolated from them.

The files (hidden 2048, 256 experts x 512, top-8, the real GDN/attention layout, 4 and 8 layers,
architecture `qwen35moe` so both engines read them) are written by the synthetic generator on
first use. A 4-layer file is dominated by the 248K-row head, so one depth hides the layers: the
time per token at L layers is a + b*L, b is the time per layer from the two depths, and the full
model's time is a + 40b. Each round runs every file with both engines, and the slope is taken
within a round (its two depths minutes apart), so a machine whose speed drifts between rounds
moves both depths together; the table gives the medians over the rounds and the range of the
per-round ratios, which says how far one run can be trusted.

llama.cpp runs as users run it: `llama-bench` with its defaults (weights repacked for the SIMD
width, `repack 1`), found with `--llama-bench PATH`, `$LLAMA_BENCH` or on PATH; without it the
`llama-cpp-python` bindings (repacked too unless `--llama-plain-bufts`). Where the VM lists AMX but
its tile instructions fault, build llama.cpp with `-DGGML_NATIVE=OFF -DGGML_AVX512=ON
-DGGML_AVX512_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF`.

Each engine runs in its own subprocess (so peak RSS is its own), interleaved round by round within
one invocation: compare the ratios, not absolute times, on a shared machine.

    python benchmarks/vs_llama_cpp.py [--threads 1 2] [--layers 4 8] [--quant Q4_K Q4_K_M]
                                      [-p 512] [-n 128] [--rounds 3] [-d 16384]

`-d N` decodes after N tokens already in context (llama-bench's `-d`: `tg128 @ d16384`), prefilled
outside the timing.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tokens(n: int, seed: int, vocab: int) -> list[int]:
    """n token ids drawn from 1000-100K (ordinary text's range in a 248K vocabulary), or from
    the upper half of a smaller file's vocabulary."""
    import numpy as np

    low, high = (1000, 100_000) if vocab > 100_000 else (vocab // 2, vocab)
    return np.random.default_rng(seed).integers(low, high, size=n).tolist()


class _PeakRss:
    """Samples this process's resident set every few milliseconds while active."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak, self._on = psutil.Process(), 0, False

    def __enter__(self) -> _PeakRss:
        self._on = True
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while self._on:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.005)

    def __exit__(self, *exc: object) -> None:
        self._on = False
        self._t.join()


def _clover(path: str, threads: int, n_prompt: int, n_gen: int, reps: int, backend: str,
            exact: bool = False, depth: int = 0) -> dict:
    from clover_runtime.loader import load_model

    model = load_model(path, n_threads=threads, backend=backend, exact_kernels=exact)
    vocab = model.n_vocab
    n_ctx = depth + max(n_prompt, n_gen) + 8
    deep = model.new_state(n_ctx)
    if depth:
        model.forward(_tokens(depth, 4, vocab), deep, last_only=True)
    snapshot = deep.copy()

    def pp() -> float:
        state = model.new_state(n_ctx)
        t0 = time.perf_counter()
        model.forward(_tokens(n_prompt, 1, vocab), state, last_only=True)
        return time.perf_counter() - t0

    def tg() -> float:
        model.restore(deep, snapshot)
        toks = _tokens(n_gen, 2, vocab)
        t0 = time.perf_counter()
        for tok in toks:
            model.forward([tok], deep, last_only=True)
        return time.perf_counter() - t0

    def tg_warm() -> None:
        model.restore(deep, snapshot)
        model.forward(_tokens(1, 2, vocab), deep, last_only=True)

    return _measure(pp, tg, tg_warm, n_prompt, n_gen, reps)


def _llama(path: str, threads: int, n_prompt: int, n_gen: int, reps: int, extra_bufts: bool,
           depth: int = 0) -> dict:
    """The bindings' fallback when no llama-bench binary is found (repacked weights unless told)."""
    import llama_cpp
    import llama_cpp.llama as llama_module
    from llama_cpp import Llama

    if not extra_bufts:  # --llama-plain-bufts: plain CPU buffers, no repacking
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_module.llama_cpp.llama_model_default_params = params
    llm = Llama(model_path=path, n_ctx=depth + max(n_prompt, n_gen) + 8, n_batch=n_prompt, n_ubatch=n_prompt,
                n_threads=threads, n_threads_batch=threads, verbose=False)
    vocab = llm.n_vocab()

    def pp() -> float:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(_tokens(n_prompt, 1, vocab))
        return time.perf_counter() - t0

    def tg() -> float:
        llm.reset()
        if depth:
            llm.eval(_tokens(depth, 4, vocab))
        toks = _tokens(n_gen, 2, vocab)
        t0 = time.perf_counter()
        for tok in toks:
            llm.eval([tok])
        return time.perf_counter() - t0

    def tg_warm() -> None:
        llm.reset()
        if depth:
            llm.eval(_tokens(depth, 4, vocab))
        llm.eval(_tokens(1, 2, vocab))

    return _measure(pp, tg, tg_warm, n_prompt, n_gen, reps)


def _measure(pp, tg, tg_warm, n_prompt: int, n_gen: int, reps: int) -> dict:
    """llama-bench's order: an untimed prompt run before the pp repetitions and an untimed
    one-token generation before the tg ones. Without them the first repetition of each test paid
    for loading its compiled kernels (~0.15 s in a 3 s tg128: one repetition in two ran ~5 %
    slow, enough to halve or double a two-depth slope)."""
    pp()
    pp_s = [pp() for _ in range(reps)]
    with _PeakRss() as rss:
        tg_warm()
        tg_s = [tg() for _ in range(reps)]
    return {"pp_ts": [n_prompt / s for s in pp_s], "tg_ts": [n_gen / s for s in tg_s], "peak_rss": rss.peak}


def _worker(args: argparse.Namespace) -> None:
    if args.worker == "clover":
        out = _clover(args.model, args.threads, args.p, args.n, args.r, args.backend, depth=args.d)
    else:
        out = _llama(args.model, args.threads, args.p, args.n, args.r, not args.llama_plain_bufts, args.d)
    print("RESULT " + json.dumps(out), flush=True)


def _model_path(layers: int, quant: str) -> Path:
    from clover_runtime.paths import cache_dir
    from clover_runtime.synth import SynthSpec, write_model

    path = cache_dir() / "bench" / f"real-shape-{layers}L-qwen35moe-{quant}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"writing {path} ...", file=sys.stderr, flush=True)
        tmp = path.with_suffix(".tmp")
        write_model(tmp, SynthSpec.real_shape(n_layer=layers, arch="qwen35moe", quant=quant,
                                                clover_tensors=False))
        for_llama_cpp(tmp, path)
        tmp.unlink()
    return path


_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _kv_spans(buf: bytes, n_kv: int) -> dict[str, tuple[int, int]]:
    """Byte range of every key/value pair of a GGUF header (which starts at byte 24)."""
    import struct

    pos, spans = 24, {}
    for _ in range(n_kv):
        start = pos
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen].decode()
        pos += 8 + klen
        vtype = struct.unpack_from("<I", buf, pos)[0]
        pos += 4
        count, etype = 1, vtype
        if vtype == 9:
            etype, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
        for _ in range(count):
            if etype == 8:
                pos += 8 + struct.unpack_from("<Q", buf, pos)[0]
            else:
                pos += _SCALAR[etype]
        spans[key] = (start, pos)
    return spans


def _kv_array(key: str, etype: int, values: list) -> bytes:
    import struct

    out = struct.pack("<Q", len(key)) + key.encode() + struct.pack("<IIQ", 9, etype, len(values))
    if etype == 8:
        return out + b"".join(struct.pack("<Q", len(v.encode())) + v.encode() for v in values)
    return out + struct.pack(f"<{len(values)}i", *values)


def for_llama_cpp(src: Path, dst: Path, sections: tuple[int, ...] = (11, 11, 10, 0)) -> Path:
    """Copy src to dst with the two header changes llama.cpp's loader needs, tensor data untouched.

    llama.cpp's qwen35moe requires `<arch>.rope.dimension_sections` (text positions make the
    sections plain NEOX RoPE, which is what clover computes) and a token list as long as the
    embedding; the synthetic stand-in vocabulary is padded with unused tokens to that length.
    """
    import struct

    from clover_runtime.gguf_header import parse_header

    with open(src, "rb") as fh:
        buf = fh.read(256 << 20)
    head = parse_header(buf, file_size=src.stat().st_size)
    meta = head.metadata
    arch = meta["general.architecture"]
    n_kv = struct.unpack_from("<Q", buf, 16)[0]
    spans = _kv_spans(buf, n_kv)
    kv_end = max(e for _, e in spans.values())
    rows = next(t.shape[0] for t in head.tensors if t.name == "token_embd.weight")
    tokens = list(meta["tokenizer.ggml.tokens"])
    replace = {}
    if len(tokens) < rows:
        pad = rows - len(tokens)
        types = [int(v) for v in meta["tokenizer.ggml.token_type"]]
        replace["tokenizer.ggml.tokens"] = _kv_array("tokenizer.ggml.tokens", 8,
                                                     tokens + [f"[PAD{i}]" for i in range(pad)])
        replace["tokenizer.ggml.token_type"] = _kv_array("tokenizer.ggml.token_type", 5, types + [5] * pad)
    key = f"{arch}.rope.dimension_sections"
    extra = b"" if key in spans else _kv_array(key, 5, list(sections))
    kvs = b"".join(replace.get(k, buf[a:b]) for k, (a, b) in sorted(spans.items(), key=lambda kv: kv[1][0]))
    new_head = (buf[:16] + struct.pack("<Q", n_kv + (1 if extra else 0)) + kvs + extra
                + buf[kv_end:head.header_size])
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        fout.write(new_head + b"\0" * ((-len(new_head)) % head.alignment))
        fin.seek(head.data_offset)
        while chunk := fin.read(64 << 20):
            fout.write(chunk)
    return dst


def _run_worker(kind: str, args: argparse.Namespace, model: Path, threads: int) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", kind, "--model", str(model), "--threads", str(threads),
           "-p", str(args.p), "-n", str(args.n), "-r", str(args.r), "-d", str(args.d), "--backend", args.backend]
    if args.llama_plain_bufts:
        cmd.append("--llama-plain-bufts")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep the caller's too
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{kind} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def _llama_bench(binary: str, args: argparse.Namespace, model: Path, threads: int) -> dict | None:
    """llama-bench with its defaults (repacked weights), `-o json`; its own warm-up run is untimed."""
    cmd = [binary, "-m", str(model), "-p", str(args.p), "-n", str(args.n), "-t", str(threads), "-r", str(args.r),
           "-o", "json"]
    if args.d:
        cmd += ["-d", str(args.d)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    try:
        tests = json.loads(proc.stdout)
    except json.JSONDecodeError:
        print(f"llama-bench failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
        return None
    pp = next((t for t in tests if t["n_prompt"] and not t["n_gen"]), None)
    tg = next((t for t in tests if t["n_gen"]), None)
    if pp is None or tg is None:
        return None
    return {"pp_ts": pp["samples_ts"], "tg_ts": tg["samples_ts"], "peak_rss": 0,
            "repack": bool(tg.get("repack", True)), "build": tg.get("build_commit", "")}


def _llama_bench_binary(given: str | None) -> str | None:
    path = given or os.environ.get("LLAMA_BENCH") or shutil.which("llama-bench")
    return path if path and Path(path).exists() else None


def _llama_installed() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return False
    return True


def _ms_per_token(ts: list[float]) -> float:
    return 1e3 / statistics.median(ts)


def extrapolate(ms_by_layers: dict[int, float], full: int = 40) -> tuple[float, float]:
    """(ms per layer, ms per token of the `full`-layer model) from the times at two depths: the
    time per token is a + b * layers (the head, embedding and sampling are a; each layer adds b)."""
    (l0, t0), (l1, t1) = sorted(ms_by_layers.items())[:1] + sorted(ms_by_layers.items())[-1:]
    per_layer = (t1 - t0) / (l1 - l0)
    return per_layer, t0 + (full - l0) * per_layer


def paired_rounds(by_depth: dict[int, list[dict]], key: str, full: int = 40) -> dict[int, tuple[float, float]]:
    """round -> (ms per layer, ms per token of the `full`-layer model) from that round's runs
    alone (the median of its repetitions at each depth), for the rounds that ran at every depth.
    A round's depths run minutes apart, not a round apart: on a shared machine whose speed drifts,
    a slope within a round is steadier than one between medians pooled over all rounds."""
    rounds = set.intersection(*({r["round"] for r in rs} for rs in by_depth.values()))
    out = {}
    for i in sorted(rounds):
        ms = {d: _ms_per_token(next(r for r in rs if r["round"] == i)[key]) for d, rs in by_depth.items()}
        out[i] = extrapolate(ms, full)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", "-t", type=int, nargs="+", default=[2])
    ap.add_argument("--layers", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--quant", nargs="+", default=["Q4_K"])
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=2, help="repetitions inside each engine's run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved runs of both engines (medians over all)")
    ap.add_argument("-d", type=int, default=0, help="tokens already in context for the tg test (llama-bench -d)")
    ap.add_argument("--full-layers", type=int, default=40, help="the depth to extrapolate to (the real model: 40)")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--model", default=None, help="use this one file instead of the generated ones")
    ap.add_argument("--llama-bench", default=None, help="llama-bench binary (default: $LLAMA_BENCH, then PATH)")
    ap.add_argument("--llama-plain-bufts", action="store_true",
                    help="bindings only: plain CPU weight buffers instead of llama.cpp's repacked ones")
    ap.add_argument("--worker", choices=("clover", "llama"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        args.threads = args.threads[0]
        _worker(args)
        return
    bench_bin = _llama_bench_binary(args.llama_bench)
    llama = "llama-bench" if bench_bin else ("bindings" if _llama_installed() else None)
    if llama is None:
        print("llama.cpp not found: skipping it (build llama-bench and pass --llama-bench PATH, or "
              "pip install llama-cpp-python)\n")
    files: dict[tuple[str, int], Path] = {}
    for quant in args.quant:
        for layers in ([0] if args.model else args.layers):
            files[quant, layers] = _prepared(Path(args.model), llama) if args.model else _model_path(layers, quant)
    tg_name = f"tg{args.n}" + (f" @ d{args.d}" if args.d else "")
    where = f"llama-bench {bench_bin}" if bench_bin else (llama or "no llama.cpp")
    print(f"pp{args.p} / {tg_name}, threads {args.threads}, {args.rounds} rounds x {args.r} repetitions "
          f"(medians); llama.cpp: {where}\n")
    runs: dict[tuple[str, int, int, str], list[dict]] = {}
    for i in range(args.rounds):
        for (quant, layers), path in files.items():
            for threads in args.threads:
                engines = ["clover"] + ([llama] if llama else [])
                for engine in engines:
                    if engine == "llama-bench":
                        r = _llama_bench(bench_bin, args, path, threads)
                    else:
                        r = _run_worker("clover" if engine == "clover" else "llama", args, path, threads)
                    if r is not None:
                        r["round"] = i
                        runs.setdefault((quant, layers, threads, engine), []).append(r)
    _report(args, files, runs, llama, tg_name)


def _pool(rs: list[dict], key: str) -> list[float]:
    return [v for r in rs for v in r[key]]


def _report(args: argparse.Namespace, files: dict, runs: dict, llama: str | None, tg_name: str) -> None:
    print(f"| quant | layers | threads | clover pp{args.p} | llama.cpp pp{args.p} | ratio | clover {tg_name} | "
          f"llama.cpp {tg_name} | ratio | clover peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (quant, layers), path in files.items():
        for threads in args.threads:
            c, ll = runs.get((quant, layers, threads, "clover")), runs.get((quant, layers, threads, llama))
            if not c:
                print(f"| {quant} | {layers or path.name} | {threads} | failed | | | | | | |")
                continue
            cells = []
            for key in ("pp_ts", "tg_ts"):
                mine = statistics.median(_pool(c, key))
                theirs = statistics.median(_pool(ll, key)) if ll else None
                cells += [f"{mine:.2f}", "-", "-"] if theirs is None else [f"{mine:.2f}", f"{theirs:.2f}",
                                                                          f"**{mine / theirs:.2f}x**"]
            rss = max(r["peak_rss"] for r in c) / 2**20
            print(f"| {quant} | {layers or path.name} | {threads} | {' | '.join(cells)} | {rss:.0f} MiB |")
    depths = sorted({layers for _, layers in files})
    if len(depths) < 2 or llama is None:
        return
    full = args.full_layers
    print(f"\nper layer (from {depths[0]} and {depths[-1]} layers, within each round) and the {full}-layer model "
          f"extrapolated; medians over the rounds, the ratios' range in brackets:\n")
    print(f"| quant | threads | test | clover ms/layer | llama.cpp ms/layer | ratio | clover {full}L t/s | "
          f"llama.cpp {full}L t/s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for quant in args.quant:
        for threads in args.threads:
            for test, key in ((f"pp{args.p}", "pp_ts"), (tg_name, "tg_ts")):  # ms per (prompt) token
                per = {}
                for engine in ("clover", llama):
                    rs = {d: runs.get((quant, d, threads, engine)) for d in depths}
                    if all(rs.values()):
                        per[engine] = paired_rounds(rs, key, full)
                both = sorted(set(per.get("clover", {})) & set(per.get(llama, {})))
                if not both:
                    continue
                c, ll = per["clover"], per[llama]
                layer = [ll[i][0] / c[i][0] for i in both if c[i][0] > 0 and ll[i][0] > 0]
                whole = [ll[i][1] / c[i][1] for i in both]
                print(f"| {quant} | {threads} | {test} | {statistics.median(c[i][0] for i in both):.3f} | "
                      f"{statistics.median(ll[i][0] for i in both):.3f} | {_ratio(layer)} | "
                      f"{statistics.median(1e3 / c[i][1] for i in both):.2f} | "
                      f"{statistics.median(1e3 / ll[i][1] for i in both):.2f} | {_ratio(whole)} |")


def _ratio(rs: list[float]) -> str:
    """The median ratio in bold and, over several rounds, their range."""
    if not rs:
        return "no slope"
    spread = f" ({min(rs):.2f}-{max(rs):.2f})" if len(rs) > 1 else ""
    return f"**{statistics.median(rs):.2f}x**{spread}"


def _prepared(model: Path, llama: str | None) -> Path:
    """A given file, with the header keys llama.cpp's loader needs added in a copy when missing."""
    if llama is None:
        return model
    from clover_runtime.gguf_file import open_gguf

    meta = open_gguf(model).metadata
    if f"{meta['general.architecture']}.rope.dimension_sections" in meta:
        return model
    patched = model.with_name(model.stem + "-llama.gguf")
    if not patched.exists():
        for_llama_cpp(model, patched)
    return patched


if __name__ == "__main__":
    main()
