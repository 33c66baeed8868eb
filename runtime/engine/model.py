"""The Clover trunk from a GGUF file: causal forward (prefill, decode, commit) and the preview pass.

Every hyper-parameter comes from the file's metadata (`clover_runtime.model_config`), so tiny test
models and the 35B model run through the same code. Activations are float32 throughout.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import CloverError, ContextLengthError
from ..gguf_file import GGUFModelFile
from ..model_config import ModelConfig
from . import attention, gdn, steps
from .align import chunk_bounds
from .layers import AttentionLayer, DeltaNetLayer, Head, Layer, MoE, bind_head, bind_layers
from .moe import moe
from .ops import rms_norm
from .state import SequenceState
from .weights import Weights

PREFILL_CHUNK = 256
HEAD_ROWS = 8  # rows of lazily read logits computed together (the integer kernels' widest pass)
GDN_PREVIEW_MODES = ("auto", "causal", "clover")


@dataclass
class PreviewResult:
    """Logits of one preview pass and what it cost."""

    logits: np.ndarray  # (len(rows), n_vocab) float32
    experts_per_layer: list[int] = field(default_factory=list)  # distinct experts used, per layer
    rows: np.ndarray | None = None  # block rows the logits belong to
    gdn_preview: str = "causal"  # the GDN operator that ran ("causal" or "clover")


class LazyLogits:
    """The rows of a causal pass, their logits computed on first read (`Model.forward_rows`)."""

    def __init__(self, model: Model, pieces: list[tuple[int, int, Any]]) -> None:
        self._model = model
        self._pieces = pieces
        self._done: dict[int, np.ndarray] = {}
        self.mixer_inputs: dict[int, list[tuple[np.ndarray, ...]]] | None = None  # `Model.cut`
        self.computed = 0  # rows whose logits were computed

    def __len__(self) -> int:
        return self._pieces[-1][1]

    def __getitem__(self, i: int) -> np.ndarray:
        """Row i's logits (n_vocab,); a negative i counts from the end."""
        n = len(self)
        i = i + n if i < 0 else i
        if not 0 <= i < n:
            raise IndexError(f"row {i} of {n}")
        c0, c1, x = next(p for p in self._pieces if p[0] <= i < p[1])
        first = i - (i - c0) % HEAD_ROWS
        if first not in self._done:
            end = min(c1, first + HEAD_ROWS)
            self._done[first] = self._model.head_logits(x[first - c0:end - c0])
            self.computed += end - first
        return self._done[first][i - first]


def _one_pass_at_a_time(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` under the model's pass lock when it has one: numba's `workqueue` threading layer aborts
    when two threads run parallel kernels at once (`kernels.jit.pass_lock`)."""

    @functools.wraps(fn)
    def run(self: Model, *args: Any, **kwargs: Any) -> Any:
        lock = self._pass_lock
        if lock is None:
            return fn(self, *args, **kwargs)
        with lock:
            return fn(self, *args, **kwargs)

    return run


def _pass_lock() -> Any:
    """The numba kernels' pass lock (both backends call the compiled activations), None without numba."""
    try:
        from ..kernels.jit import pass_lock
    except ImportError:
        return None
    return pass_lock()


class Model:
    """A loaded model: weights stay memory-mapped; all state lives in `SequenceState` objects."""

    def __init__(self, file: GGUFModelFile, config: ModelConfig, weights: Weights) -> None:
        self.file = file
        self.config = config
        self.weights = weights
        self.prefill_chunk = PREFILL_CHUNK
        self._pass_lock = _pass_lock()
        self.layers: dict[int, Layer] = bind_layers(weights, config)
        self.head: Head = bind_head(weights)
        self.ops = HostOps(weights, config)
        self.has_clover_tensors = bool(config.gdn_layers) and all(
            self.layers[i].clover is not None for i in config.gdn_layers)
        # layers (and the head) whose maths and state live on a torch device (`-ngl`), or None:
        # a `torch_backend.DeviceLayers` the loader (`clover_runtime.loader`) attaches
        self.device_layers: Any = None

    # -- properties -----------------------------------------------------------------------------
    @property
    def backend(self) -> str:
        return self.weights.backend

    @property
    def n_vocab(self) -> int:
        return self.config.n_vocab

    @property
    def tied_output(self) -> bool:
        return self.head.tied

    # -- state ----------------------------------------------------------------------------------
    def new_state(self, n_ctx: int | None = None) -> SequenceState:
        """An empty sequence with room for `n_ctx` tokens (default: the model's context length)."""
        cfg = self.config
        n_ctx = cfg.context_length if n_ctx is None else int(n_ctx)
        if n_ctx > cfg.context_length:
            raise ContextLengthError(n_ctx, cfg.context_length)
        if n_ctx < 1:
            raise CloverError(f"n_ctx must be at least 1, got {n_ctx}")
        kv = ((cfg.n_head_kv, cfg.head_dim), (cfg.n_head_kv, cfg.head_dim_v))
        attn = {i: kv for i in cfg.attention_layers}
        ring = (max(cfg.ssm_conv_kernel - 1, 0), cfg.ssm_conv_dim)
        s = (cfg.ssm_v_heads, cfg.ssm_state, cfg.ssm_v_dim)
        state = SequenceState.empty(n_ctx, attn, {i: (ring, s) for i in cfg.gdn_layers})
        if self.device_layers is not None:
            self.device_layers.adopt(state)
        return state

    def restore(self, state: SequenceState, snapshot: SequenceState) -> None:
        """Return `state` to a snapshot taken with `state.copy()`; the snapshot stays reusable."""
        state.restore(snapshot)

    # -- passes ---------------------------------------------------------------------------------
    @_one_pass_at_a_time
    def forward(self, token_ids: Any, state: SequenceState | None = None, *,
                last_only: bool = False) -> np.ndarray:
        """Causal logits (n, n_vocab) float32 for `token_ids`, continuing `state` (appending to it).

        With `state=None` the sequence starts empty. `last_only` returns only the last row (1, n_vocab).
        Rows of padded vocabulary entries (ids past the tokenizer's tokens) are -inf.
        """
        ids = self._ids(token_ids)
        n = len(ids)
        if state is None:
            if n > self.config.context_length:
                raise ContextLengthError(n, self.config.context_length)
            state = self.new_state(max(1, n))
        out = np.empty((min(n, 1) if last_only else n, self.n_vocab), dtype=np.float32)
        for c0, c1, x in self._trunk(ids, state):
            if not last_only:
                out[c0:c1] = self._logits(x)
            elif c1 == n:
                out[0] = self._logits(x[-1:])[0]
        return out

    @_one_pass_at_a_time
    def forward_rows(self, token_ids: Any, state: SequenceState, *, cuttable: bool = False) -> LazyLogits:
        """`forward` whose logits are computed when first read, `HEAD_ROWS` rows at a time.

        A verified commit reads its rows in order and stops at AR's first refusal; on a file whose
        LM head dominates (248K rows), most of a 32-row commit was logits nobody read. Each row's
        logits equal `forward`'s bit for bit (the head rounds a row alike in any batch).
        `cuttable` records what `cut` needs to keep only the rows before a refusal."""
        ids = self._ids(token_ids)
        if len(ids) == 0:
            raise CloverError("forward_rows needs at least one token")
        state.mixer_inputs = {} if cuttable else None
        try:
            rows = LazyLogits(self, [(c0, c1, x) for c0, c1, x in self._trunk(ids, state)])
        finally:
            rows.mixer_inputs, state.mixer_inputs = state.mixer_inputs, None
        return rows

    @_one_pass_at_a_time
    def cut(self, state: SequenceState, start: SequenceState, rows: LazyLogits, n: int) -> bool:
        """Leave `state` holding only the first `n` tokens of the pass `rows` (from `forward_rows(...,
        cuttable=True)`, begun at the snapshot `start`): K/V past them are dropped and each GDN
        layer's state is replayed from `start` through those rows' recorded mixer inputs, so the
        next pass need not run them again. False, with `state` unchanged, where a GDN layer's mixer
        was not recorded (a device layer, or no compiled kernels): restore `start` then."""
        gdn_layers = [self.layers[i] for i in self.config.gdn_layers]
        record = rows.mixer_inputs
        if record is None or any(L.index not in record for L in gdn_layers) or not 0 <= n <= len(rows):
            return False
        for L in gdn_layers:
            gdn.replay(self.weights, self.config, L, record[L.index], n, start, state)
        state.n_past = start.n_past + n
        return True

    def _trunk(self, ids: np.ndarray, state: SequenceState) -> Iterator[tuple[int, int, Any]]:
        """The causal layers over `ids` in aligned chunks, advancing `state`: (start, end, rows)."""
        n = len(ids)
        state.check_room(n)
        if n == 0:
            return
        state.prepare_write()
        self.weights.enter()
        for c0, c1 in chunk_bounds(state.n_past, n, self.prefill_chunk):
            x = self._embed(ids[c0:c1])
            for i in range(self.config.n_layer):
                x = self._causal_layer(i, x, state)
            state.n_past += c1 - c0
            yield c0, c1, x

    @_one_pass_at_a_time
    def head_logits(self, x: Any) -> np.ndarray:
        """The LM head (final norm, output matrix) over rows from `forward_rows`."""
        return self._logits(x)

    def commit(self, token_ids: Any, state: SequenceState) -> np.ndarray:
        """Append a resolved block to `state` (a causal forward); returns the last row's logits (n_vocab,)."""
        ids = self._ids(token_ids)
        if len(ids) == 0:
            raise CloverError("commit needs at least one token")
        return self.forward(ids, state, last_only=True)[0]

    @_one_pass_at_a_time
    def preview(self, token_ids: Any, state: SequenceState, *, logit_rows: Any = None,
                expert_coreset: int | None = None, gdn_preview: str = "auto") -> PreviewResult:
        """The block-diffusion preview pass over a block continuing `state`; `state` is not changed.

        Attention layers see the cached prefix and the whole block (bidirectional inside it).
        GDN layers use `gdn_preview`: "causal" (the causal layer from the committed state, no
        write-back), "clover" (our reading of the vendor operator; needs the Clover-only tensors)
        or "auto" (clover when the file has those tensors). MoE routes per row, or within an
        expert coreset of `expert_coreset` experts shared by the block. `logit_rows` limits the
        LM head to those rows.
        """
        ids = self._ids(token_ids)
        n = len(ids)
        if n == 0:
            raise CloverError("preview needs at least one token")
        state.check_room(n)
        mode = self._gdn_mode(gdn_preview)
        if expert_coreset is not None and int(expert_coreset) < 1:
            raise CloverError(f"expert_coreset must be at least 1, got {expert_coreset}")
        cfg = self.config
        self.weights.enter()
        x = self._embed(ids)
        used: list[int] = []
        dev = self.device_layers
        for i in range(cfg.n_layer):
            if dev is not None and dev.runs(i):
                x, experts = steps.preview_layer(dev, dev.records[i], dev.put(x), state, mode, expert_coreset)
            else:
                x, experts = steps.preview_layer(self.ops, self.layers[i], self._host(x), state, mode, expert_coreset)
            used.append(len(experts))
        rows = np.arange(n) if logit_rows is None else np.asarray(logit_rows, dtype=np.int64).reshape(-1)
        if rows.size and (rows.min() < 0 or rows.max() >= n):
            raise CloverError(f"logit_rows must lie in 0..{n - 1}")
        return PreviewResult(self._logits(x[rows]), used, rows, mode)

    # -- pieces ---------------------------------------------------------------------------------
    def _gdn_mode(self, requested: str) -> str:
        if requested not in GDN_PREVIEW_MODES:
            choices = ", ".join(GDN_PREVIEW_MODES)
            raise CloverError(f"unknown gdn_preview '{requested}' (choose from {choices})")
        if requested == "auto":
            return "clover" if self.has_clover_tensors else "causal"
        if requested == "clover" and not self.has_clover_tensors:
            raise CloverError("gdn_preview 'clover' needs the Clover-only GDN tensors, which this file lacks")
        return requested

    def _ids(self, token_ids: Any) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.n_vocab):
            bad = int(ids[(ids < 0) | (ids >= self.n_vocab)][0])
            raise CloverError(f"token id {bad} is outside the vocabulary (0..{self.n_vocab - 1})")
        return ids

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        return np.array(self.weights.rows("token_embd.weight", ids), dtype=np.float32)

    def _host(self, x: Any) -> np.ndarray:
        """Rows on the host (they come back from a device layer as a torch tensor)."""
        return x if isinstance(x, np.ndarray) else self.device_layers.host(x)

    def _causal_layer(self, i: int, x: Any, state: SequenceState) -> Any:
        dev = self.device_layers
        if dev is not None and dev.runs(i):
            return steps.causal_layer(dev, dev.records[i], dev.put(x), state)
        x = self._host(x)
        L = self.layers[i]
        if x.shape[0] == 1 and state.mixer_inputs is None:  # the same steps in one compiled call
            if isinstance(L, DeltaNetLayer):
                step = self.weights.gdn_step(L, self.config)  # `kernels.gdn_step`
                if step is not None:
                    return step.run(x, *state.gdn(L.index))
            else:
                step = self.weights.attention_step(L, self.config)  # `kernels.attention_step`
                if step is not None:
                    return step.run(x, state.n_past, *state.kv(L.index))
        return steps.causal_layer(self.ops, L, x, state)

    def _logits(self, x: Any) -> np.ndarray:
        dev = self.device_layers
        if dev is not None and dev.head_here:
            logits = dev.logits(dev.put(x))
        else:
            h = rms_norm(self._host(x), self.head.norm, self.config.rms_eps)
            logits = self.head.matrix.matmul(h)
        real = self.config.n_tokens
        if 0 < real < logits.shape[1]:
            logits[:, real:] = -np.inf
        return logits

    # -- lifetime -------------------------------------------------------------------------------
    def close(self) -> None:
        self.weights.clear_cache()
        self.file.close()

    def __enter__(self) -> Model:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        c = self.config
        return (f"Model({c.arch}, {c.n_layer} layers, hidden {c.n_embd}, {c.n_expert} experts, "
                f"backend={self.backend})")


class HostOps:
    """The layer's ops on the host (`engine.steps`): numpy, and the compiled kernels through `Weights`."""

    def __init__(self, weights: Weights, config: ModelConfig) -> None:
        self.w, self.cfg = weights, config

    def norm(self, x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return rms_norm(x, weight, self.cfg.rms_eps)

    def attention(self, L: AttentionLayer, h: np.ndarray, state: SequenceState, write: bool) -> np.ndarray:
        return (attention.causal if write else attention.preview)(self.w, self.cfg, L, h, state)

    def deltanet(self, L: DeltaNetLayer, h: np.ndarray, state: SequenceState, preview: str | None) -> np.ndarray:
        if preview is None:
            return gdn.causal(self.w, self.cfg, L, h, state)
        return gdn.preview(self.w, self.cfg, L, h, state, preview)

    def moe(self, m: MoE, h: np.ndarray, coreset: int | None) -> tuple[np.ndarray, np.ndarray]:
        return moe(self.w, self.cfg, m, h, coreset)
