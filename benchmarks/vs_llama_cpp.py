"""clover and llama.cpp side by side on one real-shape file: pp512 and tg128 (optionally at a depth), and their ratio.

The file (hidden 2048, 256 experts x 512, top-8, the real GDN/attention layout, a few layers,
architecture `qwen35moe` so both engines read it) is written by the synthetic generator on first
use. Each engine runs in its own subprocess (so peak RSS is its own), one after the other, within
one invocation: compare the ratio, not absolute times, on a shared machine. llama.cpp comes from
`pip install llama-cpp-python`; without it that half is skipped with a message.

    python benchmarks/vs_llama_cpp.py [--threads 2] [--layers 4] [-p 512] [-n 128] [-r 3] [-d 4096]

`-d N` decodes after N tokens already in context (llama-bench's `-d`: `tg128 @ d4096`), prefilled
outside the timing: clover prefills once and rolls its state back before each repetition, llama.cpp
prefills again (its recurrent GDN memory cannot be cut back to a position).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _tokens(n: int, seed: int) -> list[int]:
    import numpy as np

    return np.random.default_rng(seed).integers(1000, 100_000, size=n).tolist()


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
    n_ctx = depth + max(n_prompt, n_gen) + 8
    deep = model.new_state(n_ctx)
    if depth:
        model.forward(_tokens(depth, 4), deep, last_only=True)
    snapshot = deep.copy()

    def pp() -> float:
        state = model.new_state(n_ctx)
        t0 = time.perf_counter()
        model.forward(_tokens(n_prompt, 1), state, last_only=True)
        return time.perf_counter() - t0

    def tg() -> float:
        model.restore(deep, snapshot)
        toks = _tokens(n_gen, 2)
        t0 = time.perf_counter()
        for tok in toks:
            model.forward([tok], deep, last_only=True)
        return time.perf_counter() - t0

    def warm() -> None:
        model.forward(_tokens(32, 3), model.new_state(40), last_only=True)

    return _measure(pp, tg, n_prompt, n_gen, reps, warm)


def _llama(path: str, threads: int, n_prompt: int, n_gen: int, reps: int, extra_bufts: bool,
           depth: int = 0) -> dict:
    import llama_cpp
    import llama_cpp.llama as llama_module
    from llama_cpp import Llama

    if not extra_bufts:  # llama.cpp's AMX/repacked weight buffers crash in some VMs: plain CPU buffers
        default = llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_module.llama_cpp.llama_model_default_params = params
    llm = Llama(model_path=path, n_ctx=depth + max(n_prompt, n_gen) + 8, n_batch=n_prompt, n_ubatch=n_prompt,
                n_threads=threads, n_threads_batch=threads, verbose=False)

    def pp() -> float:
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(_tokens(n_prompt, 1))
        return time.perf_counter() - t0

    def tg() -> float:
        llm.reset()
        if depth:
            llm.eval(_tokens(depth, 4))
        toks = _tokens(n_gen, 2)
        t0 = time.perf_counter()
        for tok in toks:
            llm.eval([tok])
        return time.perf_counter() - t0

    def warm() -> None:
        llm.reset()
        llm.eval(_tokens(32, 3))

    return _measure(pp, tg, n_prompt, n_gen, reps, warm)


def _measure(pp, tg, n_prompt: int, n_gen: int, reps: int, warm) -> dict:
    warm()
    pp_s = [pp() for _ in range(reps)]
    with _PeakRss() as rss:
        tg_s = [tg() for _ in range(reps)]
    return {"pp_ts": [n_prompt / s for s in pp_s], "tg_ts": [n_gen / s for s in tg_s], "peak_rss": rss.peak}


def _worker(args: argparse.Namespace) -> None:
    if args.worker in ("clover", "clover-exact"):
        out = _clover(args.model, args.threads, args.p, args.n, args.r, args.backend, args.worker == "clover-exact",
                      args.d)
    else:
        out = _llama(args.model, args.threads, args.p, args.n, args.r, args.llama_extra_bufts, args.d)
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


def _run_worker(kind: str, args: argparse.Namespace, model: Path) -> dict | None:
    cmd = [sys.executable, __file__, "--worker", kind, "--model", str(model), "--threads", str(args.threads),
           "-p", str(args.p), "-n", str(args.n), "-r", str(args.r), "-d", str(args.d), "--backend", args.backend]
    if args.llama_extra_bufts:
        cmd.append("--llama-extra-bufts")
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))  # keep the caller's too
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path})
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    print(f"{kind} failed:\n{proc.stderr[-3000:]}", file=sys.stderr)
    return None


def _llama_installed() -> bool:
    try:
        import llama_cpp  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means: not usable here
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", "-t", type=int, default=2)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--quant", default="Q4_K")
    ap.add_argument("-p", type=int, default=512)
    ap.add_argument("-n", type=int, default=128)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-d", type=int, default=0, help="tokens already in context for the tg test (llama-bench -d)")
    ap.add_argument("--backend", default="numba")
    ap.add_argument("--model", default=None, help="use this file instead of the generated one")
    ap.add_argument("--llama-extra-bufts", action="store_true",
                    help="let llama.cpp use its AMX/repacked weight buffers (they crash in some VMs)")
    ap.add_argument("--with-exact", action="store_true",
                    help="also run clover with --exact-kernels (the float kernels) in the same invocation")
    ap.add_argument("--worker", choices=("clover", "clover-exact", "llama"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return
    model = Path(args.model) if args.model else _model_path(args.layers, args.quant)
    if args.model and _llama_installed():
        from clover_runtime.gguf_file import open_gguf

        meta = open_gguf(model).metadata
        if f"{meta['general.architecture']}.rope.dimension_sections" not in meta:
            patched = model.with_name(model.stem + "-llama.gguf")
            if not patched.exists():
                for_llama_cpp(model, patched)
            model = patched
    size = model.stat().st_size
    tg_name = f"tg{args.n}" + (f" @ d{args.d}" if args.d else "")
    print(f"model {model.name} ({size / 2**30:.2f} GiB), threads {args.threads}, "
          f"pp{args.p} / {tg_name}, {args.r} repetitions (medians)\n")
    rows = {"clover": _run_worker("clover", args, model)}
    if args.with_exact:
        rows["clover (exact kernels)"] = _run_worker("clover-exact", args, model)
    if _llama_installed():
        rows["llama.cpp"] = _run_worker("llama", args, model)
    else:
        print("llama-cpp-python is not installed: skipping llama.cpp (pip install llama-cpp-python)\n")
    print(f"| engine | pp{args.p} t/s | {tg_name} t/s | peak RSS while decoding |")
    print("|---|---|---|---|")
    for name, r in rows.items():
        if r is None:
            print(f"| {name} | failed | failed | |")
            continue
        print(f"| {name} | {statistics.median(r['pp_ts']):.2f} | {statistics.median(r['tg_ts']):.2f} | "
              f"{r['peak_rss'] / 2**20:.0f} MiB |")
    c, ll = rows.get("clover"), rows.get("llama.cpp")
    for name, r in rows.items():
        if r and ll and name != "llama.cpp":
            pp = statistics.median(r["pp_ts"]) / statistics.median(ll["pp_ts"])
            tg = statistics.median(r["tg_ts"]) / statistics.median(ll["tg_ts"])
            print(f"\nratio {name} / llama.cpp: pp{args.p} {pp:.2f}x, {tg_name} {tg:.2f}x")
    if c:
        over = (c["peak_rss"] - size) / 2**20
        print(f"clover peak RSS - mapped file size: {over:.0f} MiB (target: KV/state + 300 MiB)")


if __name__ == "__main__":
    main()
