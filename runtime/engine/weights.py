"""Weight access: tensors stay memory-mapped and quantized; every weight product goes through here.

Two backends compute the products. "numpy" (the reference path) dequantizes with
`clover_runtime.quants` and multiplies with BLAS, keeping dequantized matrices in a cache bounded by
`cache_bytes` (least recently used first out; a matrix larger than the budget is streamed in row
blocks and never held whole). "numba" multiplies straight from the quantized bytes with the fused
kernels of `clover_runtime.kernels`: integer dot products with 8-bit activations for Q4_0, Q8_0
and the K-quants (llama.cpp's method; ~1e-3 of the summed magnitudes from the exact product), or,
with `exact_kernels`, the float kernels that equal the numpy path to float32 round-off. Expert
tensors are only ever touched one expert at a time.

Everything a product needs besides its activations is done once at load: each weight matrix is
checked and wrapped (`kernels.prepare`) into a table keyed by tensor name, and the thread settings
are applied only when they differ from the calling thread's (a BLAS reload per call cost ~4 ms).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ..errors import CloverError
from ..gguf_file import GGUFModelFile
from ..gguf_header import TensorInfo
from ..quants import dequantize, dequantize_rows
from ..quants.formats import F32
from .ops import inverse_frequencies

if TYPE_CHECKING:
    from ..model_config import ModelConfig
    from ..torch_backend.group import DeviceGroup
    from .layers import AttentionLayer, DeltaNetLayer, MoE

BACKENDS = ("auto", "numpy", "numba")
DEFAULT_CACHE_BYTES = 512 << 20  # numpy backend: dequantized dense matrices kept between calls
_STREAM_BYTES = 64 << 20  # a matrix over the budget is dequantized this many float32 bytes at a time


def numba_available() -> bool:
    """True when the compiled kernels can be imported (numba installed and working)."""
    try:
        from .. import kernels  # noqa: F401
    except Exception:  # any import-time failure of numba means: use the numpy path
        return False
    return True


def resolve_backend(backend: str) -> str:
    """"auto" means the compiled kernels when they import, else the numpy reference path."""
    if backend not in BACKENDS:
        raise CloverError(f"unknown backend '{backend}' (choose from {', '.join(BACKENDS)})")
    if backend == "auto":
        return "numba" if numba_available() else "numpy"
    if backend == "numba" and not numba_available():
        raise CloverError("the numba backend is not available (numba failed to import)")
    return backend


def host_matrices(file: GGUFModelFile, device_group: DeviceGroup | None = None) -> set[str]:
    """The 2-D and 3-D tensors the host's products read: every one but those on a GPU and the
    token embedding when the model has its own output head (a lookup reads a few rows)."""
    on_device = device_group.matrices if device_group is not None else {}
    names = {n for n, i in file.tensors.items() if len(i.shape) in (2, 3) and n not in on_device}
    if "output.weight" in names:
        names.discard("token_embd.weight")
    return names


class Weights:
    """The tensors of one opened GGUF file, with the single entry point for weight products."""

    def __init__(self, file: GGUFModelFile, backend: str = "auto", cache_bytes: int | None = None,
                 n_threads: int | None = None, exact_kernels: bool = False,
                 device_group: DeviceGroup | None = None, in_memory: bool = False,
                 fuse: Iterable[Sequence[str]] = ()) -> None:
        self.file = file
        # products of the tensors placed on a GPU (torch_backend.DeviceGroup), or None; the host's
        # matrices are read into memory (`resident`) when `in_memory`, else used from the mapped file
        self.device_group = device_group
        self.backend = resolve_backend(backend)
        self._read_in = host_matrices(file, device_group) if in_memory and self.backend == "numba" else set()
        self.n_threads = n_threads
        self.exact_kernels = exact_kernels
        on_device = device_group.matrices if device_group is not None else {}
        self.gdn_kernel = None  # compiled chunked Gated DeltaNet (numba), same contract as gdn.chunked
        self.gdn_step_kernel = None  # its token-by-token form for a few rows (kernels.gdn_recurrent)
        self.gdn_mixer_kernel = None  # a few rows' whole mixer between the projections (kernels.gdn_mixer)
        self.attention_kernel = None  # a few rows' attention over the KV cache (kernels.attend_cache)
        self.conv_kernel = None  # a block preview's GDN conv, SiLU and q/k norms (kernels.conv_heads)
        self._bound: dict[str, object] = {}  # tensor name -> kernels.Matrices (numba backend)
        self._fused: dict[tuple[str, ...], object] = {}  # names -> kernels.Matrices of their rows together
        self._members: set[str] = set()  # the names in `_fused`'s groups
        if self.backend == "numba":
            from .. import kernels

            self._kernels = kernels
            self.gdn_kernel = kernels.gdn_chunked
            self.gdn_step_kernel = kernels.gdn_recurrent
            self.gdn_mixer_kernel = kernels.gdn_mixer
            self.attention_kernel = kernels.attend_cache
            self.conv_kernel = kernels.conv_heads
            self.enter()
            for names in fuse:
                self._fuse(tuple(names))
            for name, info in file.tensors.items():
                if len(info.shape) in (2, 3) and name not in on_device and name not in self._members:
                    self._bind(name, info)
        if cache_bytes is None:
            cache_bytes = DEFAULT_CACHE_BYTES if self.backend == "numpy" else 0
        limit = cache_bytes
        self.cache_limit = max(0, int(limit))
        self.cache_used = 0
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # forwards of different sequences may run on different threads
        self._small: dict[str, np.ndarray] = {}
        self._steps: dict[int, tuple[Any, Any]] = {}  # id(record) -> (record, its kernels.*_step.Plan or None)

    def enter(self) -> None:
        """Apply the thread count in the calling thread (numba's setting is per thread); cheap
        when it is already in force, so every forward and preview calls it."""
        if self.backend == "numba":
            self._kernels.set_threads(self.n_threads)

    @property
    def in_memory(self) -> bool:
        """Whether the host's matrices were read into memory (`resident`) rather than mapped."""
        return bool(self._read_in)

    @property
    def prepared(self) -> frozenset[str]:
        """Names of the weight tensors whose kernel views are ready (numba backend), alone or fused."""
        return frozenset(self._bound) | self._members

    @property
    def integer_tensors(self) -> frozenset[str]:
        """Names of the weight tensors multiplied by the integer kernels (8-bit activations)."""
        fused = (n for names, m in self._fused.items() if m.integer for n in names)
        return frozenset(n for n, m in self._bound.items() if m.integer) | frozenset(fused)

    @property
    def resident_bytes(self) -> int:
        """Bytes of weights read into this process's memory (0 where they are used mapped)."""
        read = [m for n, m in self._bound.items() if n in self._read_in] + list(self._fused.values())
        return sum(m.raw.nbytes for m in read)  # type: ignore[attr-defined]

    @property
    def fused_groups(self) -> tuple[tuple[str, ...], ...]:
        """The groups of tensors read into one matrix at load (`fuse`)."""
        return tuple(self._fused)

    def _fuse(self, names: tuple[str, ...]) -> None:
        """Read tensors that multiply the same input (gate and up, a GDN layer's input projections)
        into one matrix of their rows together, expert by expert, so one product replaces several:
        one kernel launch, one set of work items, better-balanced threads for the small ones. Only
        for weights read into memory (the rows are copied there anyway; a mapped file would need a
        second copy), of one type, row length and expert count. The products equal the separate
        ones bit for bit: each output row is computed alone. A tensor joins one group at most."""
        if len(names) < 2 or not all(n in self._read_in and n not in self._members for n in names):
            return
        infos = [self.info(n) for n in names]
        first = infos[0]
        count = first.shape[0] if len(first.shape) == 3 else 1
        if any(i.ggml_type != first.ggml_type or len(i.shape) != len(first.shape) or i.shape[-1] != first.shape[-1]
               or (len(i.shape) == 3 and i.shape[0] != count) for i in infos):
            return
        n_out = sum(i.shape[-2] for i in infos)
        raw = self.file.read_interleaved(names, count)
        self._fused[names] = self._kernels.prepare(raw, first.ggml_type, n_out, first.shape[-1], count,
                                                   exact=self.exact_kernels)
        self._members.update(names)

    def fused(self, names: Sequence[str]) -> Matrix | None:
        """The product handle of `names` read into one matrix at load (`fuse`), or None where they
        were not (the records then hold each one's handle)."""
        return self._fused.get(tuple(names))  # type: ignore[return-value]

    def _bind(self, name: str, info: TensorInfo) -> object:
        """The prepared kernel view of a 2-D matrix or 3-D expert stack, built once."""
        m = self._bound.get(name)
        if m is None:
            n_out, n_in = info.shape[-2], info.shape[-1]
            count = info.shape[0] if len(info.shape) == 3 else 1
            raw = self.file.read(name) if name in self._read_in else self.file.raw(name)
            m = self._kernels.prepare(raw, info.ggml_type, n_out, n_in, count, exact=self.exact_kernels)
            self._bound[name] = m
        return m

    # -- lookup ---------------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self.file.tensors

    def info(self, name: str) -> TensorInfo:
        return self.file.tensors[name]

    def tensor(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """A small tensor (norm, bias, conv taps, scalars) dequantized once and kept as float32."""
        arr = self._small.get(name)
        if arr is None:
            info = self.info(name)
            arr = np.array(dequantize(self.file.raw(name), info.ggml_type, info.shape), dtype=np.float32)
            if shape is not None:
                arr = arr.reshape(shape)
            self._small[name] = arr
        return arr

    def vector(self, name: str) -> np.ndarray:
        """A small tensor flattened (norm weights, biases, per-head scalars): a layer record's field."""
        return self.tensor(name).reshape(-1)

    def table(self, name: str) -> np.ndarray:
        """A small tensor in its stored shape (the conv taps)."""
        return self.tensor(name)

    def per_head(self, name: str, n_heads: int) -> np.ndarray:
        """A per-head parameter stored as one value or one per head, as (n_heads,) float32."""
        return np.broadcast_to(self.tensor(name).reshape(-1), (n_heads,)).astype(np.float32)

    def rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Selected rows of a 2-D tensor (the embedding lookup), reading only those rows' bytes."""
        info = self.info(name)
        return dequantize_rows(self.file.raw(name), info.ggml_type, info.shape[-1], np.asarray(ids))

    def matrix(self, name: str) -> Matrix:
        """The product handle of a 2-D matrix or 3-D expert stack, bound once: what the layer
        records (`engine.layers`) hold, so a forward looks nothing up by name."""
        if self.device_group is not None and name in self.device_group:
            return _OnDevice(self.device_group, name, self.info(name))
        if self.backend == "numba":
            return self._bound.get(name) or self._bind(name, self.info(name))
        return _Dense(self, name, self.info(name))

    def products(self, mats: Sequence[Matrix], x: np.ndarray) -> list[np.ndarray]:
        """x times several matrices that share it: x is put in 8-bit blocks once per block size
        instead of once per product (a decode step's GDN, attention and shared-expert
        projections share their input)."""
        q8: dict[int, Any] = {}
        out = []
        for m in mats:
            if not m.integer:
                out.append(m.matmul(x))
                continue
            if m.act_block not in q8:
                q8[m.act_block] = self._kernels.quantize_rows(np.ascontiguousarray(x, np.float32), m.act_block)
            out.append(m.matmul(x, q8[m.act_block]))
        return out

    def expert_products(self, mats: Sequence[Matrix], x: np.ndarray, ids: np.ndarray,
                        routes: Any = None) -> list[np.ndarray]:
        """Per-row expert products (n, k, out) of one input with several expert stacks (gate and
        up), the ids grouped once (`routes`) and x quantized once."""
        q8: dict[int, Any] = {}
        out = []
        for m in mats:
            r = routes if routes is not None and routes.count == m.count else None
            if not m.integer or len(mats) == 1:  # one product: the kernel quantizes its own input
                out.append(m.moe(x, ids, r))
                continue
            if m.act_block not in q8:
                q8[m.act_block] = self._kernels.quantize_rows(np.ascontiguousarray(x, np.float32), m.act_block)
            out.append(m.moe(x, ids, r, q8[m.act_block]))
        return out

    # -- products by name (tests and tools; the layers use bound handles) -------------------------
    def matmul(self, name: str, x: np.ndarray) -> np.ndarray:
        """x (n, in) times the (out, in) weight `name` transposed: (n, out) float32."""
        _matrix_shape(self.info(name))
        return self.matrix(name).matmul(x)

    def matmuls(self, names: Sequence[str], x: np.ndarray) -> list[np.ndarray]:
        """`products` by tensor name."""
        return self.products([self.matrix(n) for n in names], x)

    def moe_step(self, m: MoE, k: int) -> Any:
        """A decode row's whole MoE after its router in one compiled call (`kernels.moe_step`),
        planned once per layer record; None where it does not apply (the numpy path, weights on
        a device or not all with integer kernels, gate and up apart)."""
        got = self._steps.get(id(m))
        if got is None:
            plan = None
            if self.backend == "numba" and m.gate_up is not None:
                plan = self._kernels.moe_step.Plan.build(k, m.gate_up, m.down, m.shared_gate_up, m.shared_down,
                                                         m.shared_gate_inp)
            got = self._steps[id(m)] = (m, plan)  # the record kept, so its id is not reused
        return got[1]

    def gdn_step(self, L: DeltaNetLayer, cfg: ModelConfig) -> Any:
        """A decode row's whole GDN layer in one compiled call (`kernels.gdn_step`), planned once
        per layer record; None where it does not apply (see `moe_step`; the input projections
        apart, a router that is not float32)."""
        got = self._steps.get(id(L))
        if got is None:
            plan = None
            moe_plan = self.moe_step(L.moe, cfg.n_expert_used)
            if moe_plan is not None:
                widths = (cfg.ssm_conv_dim, cfg.ssm_v_heads * cfg.ssm_v_dim, cfg.ssm_v_heads, cfg.ssm_v_heads)
                plan = self._kernels.gdn_step.Plan.build(
                    L.norm, cfg.rms_eps, L.inputs, widths, L.conv, L.dt_bias, L.a, L.ssm_norm, cfg.ssm_k_heads,
                    cfg.ssm_state, L.out, L.moe.norm, L.moe.router, moe_plan)
            got = self._steps[id(L)] = (L, plan)
        return got[1]

    def attention_step(self, L: AttentionLayer, cfg: ModelConfig) -> Any:
        """A decode row's whole attention layer in one compiled call (`kernels.attention_step`),
        planned once per layer record; None where it does not apply (see `gdn_step`; q, k, v
        fused in the file)."""
        got = self._steps.get(id(L))
        if got is None:
            plan = None
            moe_plan = self.moe_step(L.moe, cfg.n_expert_used)
            if moe_plan is not None and L.qkv is None:
                plan = self._kernels.attention_step.Plan.build(
                    L.norm, cfg.rms_eps, L.q, L.k, L.v, cfg.n_head, cfg.n_head_kv, cfg.head_dim, cfg.head_dim_v,
                    L.q_norm, L.k_norm, inverse_frequencies(cfg.rope_dim, cfg.rope_base), L.output, L.moe.norm,
                    L.moe.router, moe_plan)
            got = self._steps[id(L)] = (L, plan)
        return got[1]

    def routes(self, ids: np.ndarray, n_expert: int) -> Any:
        """The grouping of expert ids (n, k) shared by one layer's expert products (numba backend;
        None elsewhere, where the products group the ids themselves)."""
        return self._kernels.Routes(ids, n_expert) if self.backend == "numba" else None

    def moe_matmul(self, name: str, x: np.ndarray, ids: np.ndarray, routes: Any = None) -> np.ndarray:
        """Per-row expert products with the 3-D tensor `name` (n_expert, out, in).

        `ids` (n, k) are the experts of each row; `x` is (n, in) (shared by a row's experts) or
        (n, k, in) (one input per routed slot). Returns (n, k, out): y[i, j] = W[ids[i, j]] · x.
        """
        return self.expert_products([self.matrix(name)], x, ids, routes)[0]

    # -- numpy path -----------------------------------------------------------------------------
    def _numpy_matmul(self, name: str, info: TensorInfo, expert: int, n_out: int, n_in: int,
                      x: np.ndarray) -> np.ndarray:
        w = self._dense(name, info, expert, n_out, n_in)
        if w is not None:
            return x @ w.T
        out = np.empty((x.shape[0], n_out), dtype=np.float32)
        step = max(1, _STREAM_BYTES // (4 * n_in))
        for r0 in range(0, n_out, step):
            r1 = min(n_out, r0 + step)
            block = self._rows_of(name, info, expert, n_out, n_in, slice(r0, r1))
            out[:, r0:r1] = x @ block.T
        return out

    def _rows_of(self, name: str, info: TensorInfo, expert: int, n_out: int, n_in: int,
                 rows: slice) -> np.ndarray:
        base = expert * n_out
        return dequantize_rows(self.file.raw(name), info.ggml_type, n_in,
                               slice(base + rows.start, base + rows.stop))

    def _dense(self, name: str, info: TensorInfo, expert: int, n_out: int, n_in: int) -> np.ndarray | None:
        """The dequantized matrix from the cache, decoding it if it fits; None when it never fits."""
        if info.ggml_type == F32:  # already float: a view of the mapped bytes costs nothing
            return self._rows_of(name, info, expert, n_out, n_in, slice(0, n_out))
        key = (name, expert)
        with self._lock:
            w = self._cache.get(key)
            if w is not None:
                self._cache.move_to_end(key)
                return w
        size = 4 * n_out * n_in
        if size > self.cache_limit:
            return None
        w = self._rows_of(name, info, expert, n_out, n_in, slice(0, n_out))
        with self._lock:
            if key not in self._cache:
                while self._cache and self.cache_used + size > self.cache_limit:
                    _, old = self._cache.popitem(last=False)
                    self.cache_used -= old.nbytes
                self._cache[key] = w
                self.cache_used += size
        return w

    def clear_cache(self) -> None:
        """Drop dequantized matrices and the prepared views (those bound alone are rebuilt on next
        use; fused ones are not: the model closes)."""
        with self._lock:
            self._cache.clear()
            self.cache_used = 0
            self._bound.clear()
            self._fused.clear()
            self._steps.clear()
            self._members.clear()

    def names(self) -> Iterable[str]:
        return self.file.tensors.keys()


class Matrix(Protocol):
    """A weight product bound at load: the compiled kernels' `Matrices`, or `_Dense`/`_OnDevice`."""

    integer: bool
    count: int

    def matmul(self, x: np.ndarray, q8: Any = None) -> np.ndarray: ...

    def moe(self, x: np.ndarray, ids: np.ndarray, routes: Any = None, q8: Any = None) -> np.ndarray: ...


class _Dense:
    """A matrix of the numpy reference path: dequantized through the owner's bounded cache."""

    integer = False

    def __init__(self, owner: Weights, name: str, info: TensorInfo) -> None:
        self.owner, self.name, self.info = owner, name, info
        self.n_out, self.n_in = info.shape[-2], info.shape[-1]
        self.count = info.shape[0] if len(info.shape) == 3 else 1

    def matmul(self, x: np.ndarray, q8: Any = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        return self.owner._numpy_matmul(self.name, self.info, 0, self.n_out, self.n_in, x)

    def moe(self, x: np.ndarray, ids: np.ndarray, routes: Any = None, q8: Any = None) -> np.ndarray:
        ids = np.asarray(ids, dtype=np.int64)
        x = np.ascontiguousarray(x, dtype=np.float32)
        n, k = ids.shape
        xs = np.broadcast_to(x[:, None, :], (n, k, self.n_in)) if x.ndim == 2 else x
        out = np.empty((n, k, self.n_out), dtype=np.float32)
        flat_ids = ids.reshape(-1)
        flat_x = xs.reshape(n * k, self.n_in)
        flat_out = out.reshape(n * k, self.n_out)
        for e in np.unique(flat_ids):
            sel = np.flatnonzero(flat_ids == e)
            flat_out[sel] = self.owner._numpy_matmul(self.name, self.info, int(e), self.n_out, self.n_in,
                                                     flat_x[sel])
        return out


class _OnDevice:
    """A matrix a `DeviceGroup` holds, multiplied there for host rows (a layer not wholly on it)."""

    integer = False

    def __init__(self, group: DeviceGroup, name: str, info: TensorInfo) -> None:
        self.group, self.name = group, name
        self.count = info.shape[0] if len(info.shape) == 3 else 1

    def matmul(self, x: np.ndarray, q8: Any = None) -> np.ndarray:
        return self.group.matmul(self.name, x)

    def moe(self, x: np.ndarray, ids: np.ndarray, routes: Any = None, q8: Any = None) -> np.ndarray:
        return self.group.moe(self.name, x, ids)


def _matrix_shape(info: TensorInfo) -> tuple[int, int]:
    if len(info.shape) != 2:
        raise CloverError(f"tensor '{info.name}' is not a matrix (shape {list(info.shape)})")
    return info.shape[0], info.shape[1]
