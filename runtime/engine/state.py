"""The sequence state: K/V caches of the attention layers and the Gated DeltaNet states.

`copy()` is O(1): a snapshot shares its arrays with the state it came from, and arrays are
copied only when a write would change something another live state still reads (copy on write):

- K/V caches are append-only, so the state that owns them keeps writing in place as long as it
  writes at or past the length every other live sharer reads; anything else clones the rows
  below its own write position (a state that branches away from a live snapshot).
- GDN conv rings and recurrent states change in place, so a write clones them whenever another
  live state still shares them.

Liveness is tracked with weak references: a snapshot that is dropped stops costing copies.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from ..errors import ContextLengthError

_ids = itertools.count()


def host_array(a: Any) -> np.ndarray:
    """A state array as numpy: layers on a torch device (`-ngl`) keep torch tensors here."""
    return a if isinstance(a, np.ndarray) else a.detach().cpu().numpy()


def write_array(dst: Any, index: Any, src: np.ndarray) -> None:
    """dst[index] = src for a numpy array or a device tensor (same dtype and device as dst)."""
    if isinstance(dst, np.ndarray):
        dst[index] = src
    else:
        dst[index] = dst.new_tensor(np.asarray(src))


def _zeros_like(a: Any) -> Any:
    return np.zeros_like(a) if isinstance(a, np.ndarray) else a.new_zeros(a.shape)


def _copy(a: Any) -> Any:
    return a.copy() if isinstance(a, np.ndarray) else a.clone()


class _Shared:
    """Arrays that several states may share, with who may write them in place."""

    __slots__ = ("arrays", "users", "owner", "__weakref__")

    def __init__(self, arrays: dict[int, tuple[np.ndarray, ...]]) -> None:
        self.arrays = arrays
        self.users: weakref.WeakSet[SequenceState] = weakref.WeakSet()
        self.owner: weakref.ref | None = None

    def others(self, me: SequenceState) -> list[SequenceState]:
        return [s for s in list(self.users) if s is not me]


class SequenceState:
    """Everything a sequence carries between forward calls; `n_past` tokens are cached.

    Arrays per attention layer: K (kv_heads, n_ctx, head_dim), V (kv_heads, n_ctx, v_dim).
    Per GDN layer: conv ring (kernel - 1, conv_dim) and S (v_heads, k_dim, v_dim), float32.
    A layer that runs on a torch device (`-ngl`) holds torch tensors of the same shapes.
    """

    def __init__(self, n_ctx: int, kv: _Shared, gdn: _Shared, n_past: int = 0) -> None:
        self.n_ctx = int(n_ctx)
        self.n_past = int(n_past)
        self.id = next(_ids)
        self._kv = kv
        self._gdn = gdn
        self.mixer_inputs: dict[int, list[tuple[np.ndarray, ...]]] | None = None  # `Model.forward_rows(cuttable=)`
        kv.users.add(self)
        gdn.users.add(self)

    @classmethod
    def empty(cls, n_ctx: int, attention: dict[int, tuple[tuple[int, ...], tuple[int, ...]]],
              gdn: dict[int, tuple[tuple[int, ...], tuple[int, ...]]]) -> SequenceState:
        """Zeroed caches: `attention` maps layer -> ((kv_heads, head_dim), (kv_heads, v_dim)),
        `gdn` maps layer -> (ring shape, S shape)."""
        kv = _Shared({i: (np.zeros((ks[0], n_ctx, ks[1]), np.float32),
                          np.zeros((vs[0], n_ctx, vs[1]), np.float32)) for i, (ks, vs) in attention.items()})
        g = _Shared({i: (np.zeros(rs, np.float32), np.zeros(ss, np.float32)) for i, (rs, ss) in gdn.items()})
        state = cls(n_ctx, kv, g)
        kv.owner = weakref.ref(state)
        return state

    def relocate(self, layers: Iterable[int], move: Callable[[np.ndarray], Any]) -> None:
        """Replace the arrays of `layers` with `move(array)` (a fresh state's layers going to a
        torch device); states sharing them see the moved arrays too."""
        for shared in (self._kv, self._gdn):
            for i in set(layers) & set(shared.arrays):
                shared.arrays[i] = tuple(move(a) for a in shared.arrays[i])

    @property
    def remaining(self) -> int:
        """Tokens that still fit before the context is full."""
        return self.n_ctx - self.n_past

    def copy(self) -> SequenceState:
        """A snapshot: continue either one (or restore with `restore`) without disturbing the other."""
        return SequenceState(self.n_ctx, self._kv, self._gdn, self.n_past)

    def restore(self, snapshot: SequenceState) -> None:
        """Return this state to `snapshot` (which stays usable for further restores)."""
        if snapshot.n_ctx != self.n_ctx:
            raise ValueError("cannot restore a snapshot of a state with a different n_ctx")
        for shared, new in ((self._kv, snapshot._kv), (self._gdn, snapshot._gdn)):
            if shared is not new:
                shared.users.discard(self)
                new.users.add(self)
        self._kv, self._gdn = snapshot._kv, snapshot._gdn
        self.n_past = snapshot.n_past

    # -- reading (engine side) ------------------------------------------------------------------
    def kv(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self._kv.arrays[layer]

    def gdn(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        return self._gdn.arrays[layer]

    # -- writing (engine side) ------------------------------------------------------------------
    def check_room(self, n_new: int) -> None:
        """Raise ContextLengthError if `n_new` more tokens would not fit."""
        if self.n_past + n_new > self.n_ctx:
            raise ContextLengthError(self.n_past + n_new, self.n_ctx)

    def prepare_write(self) -> None:
        """Make the arrays this state is about to change its own (see the module docstring)."""
        start = self.n_past
        kv = self._kv
        owner = kv.owner() if kv.owner is not None else None
        others = kv.others(self)
        limit = max((s.n_past for s in others), default=0)
        if (owner is self or owner is None or owner not in others) and start >= limit:
            kv.owner = weakref.ref(self)
        else:
            self._kv = self._clone_kv(start)
        if self._gdn.others(self):
            old = self._gdn
            old.users.discard(self)
            self._gdn = _Shared({i: (_copy(r), _copy(s)) for i, (r, s) in old.arrays.items()})
            self._gdn.users.add(self)

    def _clone_kv(self, rows: int) -> _Shared:
        old = self._kv
        arrays = {}
        for i, (k, v) in old.arrays.items():
            k2, v2 = _zeros_like(k), _zeros_like(v)
            k2[:, :rows] = k[:, :rows]
            v2[:, :rows] = v[:, :rows]
            arrays[i] = (k2, v2)
        old.users.discard(self)
        new = _Shared(arrays)
        new.users.add(self)
        new.owner = weakref.ref(self)
        return new

    def __repr__(self) -> str:
        return f"SequenceState(n_past={self.n_past}, n_ctx={self.n_ctx})"
