"""`clover inspect MODEL`: what a GGUF holds and whether it fits this machine.

Reads the header only (metadata and tensor list), so it answers in well under a second even for
a 23 GB file, and works the same on a header fetched from the Hub. Module top imports only
typer and the standard library; the runtime is imported inside the command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import typer

from .completion import complete_model
from .options import CTX_HELP, ctx_option


def command(
    model: str = typer.Argument(..., metavar="MODEL", autocompletion=complete_model,
                                help="demo, a .gguf path (any shard of a split set), or owner/repo[:QUANT] or a "
                                     "Hub URL as in pull (a model not downloaded yet has only its header read)."),
    metadata: bool = typer.Option(False, "--metadata", help="Show every metadata key (gguf_dump style)."),
    tensors: bool = typer.Option(False, "--tensors", help="Show every tensor: elements, shape, type, bytes."),
    template: bool = typer.Option(False, "--template",
                                  help="Print only the chat template stored in the file (to pipe to a file)."),
    as_json: bool = typer.Option(False, "--json", help="Print everything as one JSON document."),
    json_array: bool = typer.Option(False, "--json-array", help="With --json, include array values in full."),
    ctx_size: int | None = ctx_option(CTX_HELP + " The memory estimate is for this context."),
    parallel: int = typer.Option(1, "-np", "--parallel", min=1,
                                 help="Parallel sequences, each with its own -c tokens of KV cache and state "
                                      "(as clover serve -np)."),
    cache_type: str = typer.Option(
        "f32", "--cache-type", "-ctk",
        help="KV cache type to estimate: f32 (what clover allocates), or f16 / q8_0 (llama.cpp's, to compare)."),
    ubatch: int = typer.Option(512, "-ub", "--ubatch-size", min=1, help="Prefill chunk size in tokens."),
    fit: bool = typer.Option(False, "--fit", help="Exit with code 1 when the model does not fit in memory."),
) -> None:
    """Show what a GGUF model holds (parameters, layers, quants, diffusion support) and whether it fits.

    Example:

        clover inspect demo -c 4096 --fit
    """
    from clover_runtime.memory_fit import CACHE_TYPES, NO_FIT, context_for, fit_report
    from clover_runtime.model_summary import summarize

    from . import console
    from .usage import UsageError

    if cache_type not in CACHE_TYPES:
        raise UsageError(f"unknown --cache-type '{cache_type}' (use one of: {', '.join(CACHE_TYPES)})")
    opened = open_for_inspect(model)
    try:
        summary = summarize(opened, filename=Path(model).name if Path(model).exists() else model)
        if template and not as_json:
            _print_template(opened)
            return
        cfg = summary.config
        n_ctx = context_for(ctx_size, cfg, summary.tensor_bytes, parallel)
        too_long = n_ctx > cfg.context_length
        if too_long and fit:  # clover run and serve refuse it, so --fit does too, before any "fits"
            console.print_error(f"{summary.filename}: -c {n_ctx} is larger than the model's context length "
                                f"{cfg.context_length}")
            raise typer.Exit(1)
        if too_long:
            console.warn(f"-c {n_ctx} is larger than the model's context length {cfg.context_length}")
        report = fit_report(cfg, summary.tensor_bytes, n_ctx, parallel, cache_type, ubatch=ubatch,
                            tensors=tensor_map(opened))
        if as_json:
            doc = json_document(model, opened, summary, report, json_array=json_array)
            sys.stdout.write(json_text(doc) + "\n")
        else:
            _render(opened, summary, report, metadata=metadata, tensors=tensors)
    finally:
        close = getattr(opened, "close", None)
        if close is not None:
            close()
    if fit and report.verdict.verdict == NO_FIT:
        console.print_error(f"{summary.filename}: {report.verdict.message}")
        raise typer.Exit(1)


def _print_template(opened: Any) -> None:
    """The chat template alone on stdout, as the file holds it, so `--template > t.jinja` saves it."""
    from clover_runtime.errors import CloverError

    from . import console

    text = opened.metadata.get("tokenizer.chat_template")
    if not text:
        raise CloverError("this file has no chat template (tokenizer.chat_template)")
    out = console.out()
    out.print(console.safe(str(text), lines=True), end="" if str(text).endswith("\n") else "\n",
              markup=False, highlight=False, emoji=False, soft_wrap=True)


def json_text(doc: Any) -> str:
    """JSON for a terminal or a pipe: UTF-8 kept, but the C1 controls json.dumps lets through (0x9b is
    a one-byte CSI) and bidi overrides escaped like C0 ones; they only occur inside strings."""
    import re

    text = json.dumps(doc, ensure_ascii=False)
    return re.sub("[\x7f-\x9f\u202a-\u202e\u2066-\u2069\ud800-\udfff]", lambda m: f"\\u{ord(m.group()):04x}", text)


def open_for_inspect(model: str) -> Any:
    """The Hub layer's choice (a local or cached file, else only the header read over HTTP), saying
    how little was read when it came from the Hub."""
    from clover_runtime.hub import RemoteModel, open_for_inspect, parse_model_ref
    from clover_runtime.hub.remote import endpoint

    from . import console

    opened = open_for_inspect(model)
    if isinstance(opened, RemoteModel):
        console.info(f"read the header of {parse_model_ref(model)} from {endpoint()}: {opened.bytes_read:,} of "
                     f"{opened.file_size:,} bytes, nothing downloaded")
    return opened


def tensor_map(opened: Any) -> dict[str, Any]:
    """Tensors by name, for a GGUFModelFile (a dict already) or a bare GGUFHeader (a list)."""
    tensors = opened.tensors
    return tensors if isinstance(tensors, dict) else {t.name: t for t in tensors}


def _jsonable(value: Any) -> Any:
    tolist = getattr(value, "tolist", None)
    if tolist is not None:
        return tolist()
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    return value


def metadata_rows(opened: Any) -> list[tuple[str, str | None, int, str, Any]]:
    """(key, value type, element type or None, count, value) like gguf_dump, with its 3 pseudo keys first."""
    from clover_runtime.gguf_header import VALUE_TYPE_NAMES

    header = opened.headers[0] if getattr(opened, "headers", None) else opened
    n_tensors = len(header.tensors)
    rows: list[tuple[str, str | None, int, str, Any]] = [
        ("UINT32", None, 1, "GGUF.version", int(opened.version)),
        ("UINT64", None, 1, "GGUF.tensor_count", n_tensors),
        ("UINT64", None, 1, "GGUF.kv_count", len(opened.metadata)),
    ]
    types = opened.value_types
    for key, value in opened.metadata.items():
        vtype, etype = types.get(key, (None, None))
        tname = VALUE_TYPE_NAMES.get(vtype, "UNKNOWN") if vtype is not None else "UNKNOWN"
        ename = VALUE_TYPE_NAMES.get(etype, "UNKNOWN") if etype is not None else None
        count = len(value) if ename is not None else 1
        rows.append((tname, ename, count, key, value))
    return rows


def _dump_value(tname: str, ename: str | None, value: Any) -> str:
    if ename is not None:
        head = _jsonable(value[:6])
        text = repr(head)
        return text[:-1] + ", ...]" if len(value) > 6 else text
    if tname == "STRING":
        text = str(value)
        return repr(text[:57] + "..." if len(text) > 60 else text)
    if tname == "FLOAT32":
        import numpy as np

        return str(np.float32(value))
    return str(value)


def json_document(model: str, opened: Any, summary: Any, report: Any, *, json_array: bool = False) -> dict:
    """gguf_dump's JSON shape (filename, endian, metadata, tensors) plus our summary and memory fit."""
    from clover_runtime.model_summary import to_json

    meta: dict[str, Any] = {}
    for i, (tname, ename, count, key, value) in enumerate(metadata_rows(opened)):
        entry: dict[str, Any] = {"index": i, "type": tname}
        if ename is not None:
            entry["array_types"] = [ename]
            entry["count"] = count
            if json_array:
                entry["value"] = _jsonable(value)
        else:
            entry["value"] = _jsonable(value)
        meta[key] = entry
    tens = {}
    for i, t in enumerate(tensor_map(opened).values()):
        tens[t.name] = {"index": i, "shape": list(t.ne), "type": t.type_name, "offset": t.offset,
                        "n_bytes": t.n_bytes, "shard": t.shard}
    return {"filename": model, "endian": "LITTLE", "shards": summary.shards, "metadata": meta,
            "tensors": tens, "summary": to_json(summary), "memory": report.to_json()}


def format_params(n: int) -> str:
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def _number(x: float) -> str:
    return f"{int(x):,}" if float(x).is_integer() else f"{x:g}"


def summary_pairs(s: Any) -> list[tuple[str, str]]:
    """The summary as label/value lines (also reused by commands that show a model briefly)."""
    from .fit_table import human_bytes

    size = human_bytes(s.file_size) if s.file_size is not None else "size unknown"
    kinds = s.layers_by_kind
    every = f" (every {_ordinal(s.full_attention_interval)})" if s.full_attention_interval else ""
    d = s.diffusion
    if s.diffusion_supported:
        diffusion = (f"exact: block {d['block_length']}, threshold {d['threshold']:g}, "
                     f"mask token {d['mask_token_id']}")
    else:
        missing = [name for ok, name in ((s.clover_tensors, "Clover-only tensors"),
                                         (d["mask_token_id"] is not None, "mask token id"),
                                         (any(k.endswith("block_length") for k in d["keys_present"]),
                                          "diffusion keys")) if not ok]
        diffusion = f"not exact (missing: {', '.join(missing)})"
    n_gdn = kinds["gated_deltanet"]
    if s.clover_tensors:
        clover = f"present in all {n_gdn} GDN layers ({s.clover_tensor_count} tensors)"
    elif s.clover_tensor_count:
        clover = f"partial ({s.clover_tensor_count} of {4 * n_gdn} tensors)"
    else:
        clover = "absent"
    ftype = s.file_type or "file type not set"
    return [
        ("model", s.name or s.filename),
        ("architecture", f"{s.architecture} (GGUF v{s.gguf_version})"),
        ("file", f"{s.filename}, {size}, {ftype}, {s.bits_per_weight:.2f} bits per weight"),
        ("parameters", f"{format_params(s.n_params)} total, {format_params(s.n_params_active)} active "
                       f"per token ({s.n_params:,} / {s.n_params_active:,})"),
        ("layers", f"{s.n_layer}: {n_gdn} Gated DeltaNet + {kinds['full_attention']} full attention{every}"),
        ("attention", f"{s.n_head} heads, {s.n_head_kv} KV heads, head dim {s.head_dim}, "
                      f"RoPE on {s.rope_dim} dims, base {_number(s.rope_base)}"),
        ("Gated DeltaNet", f"{s.ssm_k_heads} key heads, {s.ssm_v_heads} value heads, dim {s.ssm_state}, "
                           f"conv kernel {s.ssm_conv_kernel}"),
        ("experts", f"{s.n_expert} routed, {s.n_expert_used} used per token, FFN {s.expert_ff}"
                    + (f"; shared expert FFN {s.shared_ff}" if s.shared_ff else "")),
        ("hidden size", f"{s.n_embd:,}"),
        ("context", f"{s.context_length:,} tokens"),
        ("vocabulary", f"{s.n_tokens:,} tokens, {s.n_vocab:,} embedding rows, "
                       + ("output tied to the embedding" if s.tied_output else "own output matrix")),
        ("block diffusion", diffusion),
        ("Clover tensors", clover),
        ("chat template", "yes" if s.chat_template else "no"),
        ("shards", ", ".join(s.shards) if s.shards else "remote header"),
    ]


def _render(opened: Any, s: Any, report: Any, *, metadata: bool, tensors: bool) -> None:
    from . import console
    from .fit_table import human_bytes, is_plain, lit, print_pairs, print_table, render_fit

    con = console.out()
    plain = is_plain(con)
    print_pairs(con, summary_pairs(s), plain=plain)
    lit(con)
    rows = [[q.type, f"{q.n_tensors:,}", human_bytes(q.n_bytes),
             f"{100 * q.n_bytes / max(s.tensor_bytes, 1):.1f}%", f"{q.bits_per_weight:.2f}"]
            for q in s.quant_mix]
    print_table(con, [("type", "left"), ("tensors", "right"), ("bytes", "right"), ("share", "right"),
                      ("bits/weight", "right")], rows, title="quant mix", plain=plain)
    lit(con)
    render_fit(report, con, plain=plain)
    if metadata:
        lit(con)
        mrows = metadata_rows(opened)
        cells = []
        for i, (tname, ename, count, key, value) in enumerate(mrows, 1):
            shown = f"[{ename}]" if ename is not None else tname
            cells.append([str(i), shown, str(count), key, _dump_value(tname, ename, value)])
        if plain:
            lit(con, f"* Dumping {len(mrows)} key/value pair(s)")
            for i, shown, count, key, value in cells:
                lit(con, f"  {int(i):5}: {shown:10} | {int(count):8} | {key} = {value}")
        else:
            print_table(con, [("#", "right"), ("type", "left"), ("count", "right"), ("key", "left"),
                              ("value", "left")], cells, title=f"{len(mrows)} key/value pairs")
    if tensors:
        lit(con)
        split = len(s.shards) > 1
        trows = []
        for i, t in enumerate(tensor_map(opened).values(), 1):
            dims = ", ".join(f"{d:5}" for d in list(t.ne) + [1] * (4 - len(t.ne)))
            trows.append([str(i), str(t.n_elements), dims, t.type_name, str(t.n_bytes), str(t.offset),
                          str(t.shard + 1), t.name])
        if plain:
            lit(con, f"* Dumping {len(trows)} tensor(s)")
            for i, n, dims, ty, nb, off, shard, name in trows:
                where = f" | shard {shard}" if split else ""
                lit(con, f"  {int(i):5}: {int(n):10} | {dims} | {ty:7} | {int(nb):12} | {int(off):12}"
                         f"{where} | {name}")
        else:
            cols = [("#", "right"), ("elements", "right"), ("shape (ne)", "left"), ("type", "left"),
                    ("bytes", "right"), ("offset", "right"), ("shard", "right"), ("name", "left")]
            if not split:
                cols.pop(6)
                trows = [r[:6] + r[7:] for r in trows]
            print_table(con, cols, trows, title=f"{len(trows)} tensors")
