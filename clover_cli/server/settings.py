"""What a running server was asked to be: one immutable record handed to `create_app`."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

# Browsers on this machine only: any port on localhost, 127.0.0.1 or [::1], http or https.
LOCAL_ORIGIN_REGEX = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"
# Host names a loopback server answers to: anything else is a page whose name was rebound (DNS rebinding).
LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]")
LOOPBACK_ADDRESSES = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class ServerSettings:
    """Settings of one `clover serve` process (the CLI fills them from flags and env)."""

    model_id: str = "clover"
    model_path: str = ""
    n_ctx_slot: int | None = None  # -c as the CLI's fit check settled it, shown until the model has loaded
    n_parallel: int = 1
    max_queue: int = 16
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    host: str = "127.0.0.1"  # the address listened on: a loopback one turns the Host check on
    allowed_hosts: tuple[str, ...] = ()  # extra Host names accepted ('*': any)
    webui: bool = True
    timeout_s: float = 3600.0
    max_body_bytes: int = 16 * 1024 * 1024
    header_timeout_s: float = 15.0  # a request's headers must arrive within this (slow-loris clients)
    body_timeout_s: float = 120.0  # ... and its body within this once the route starts reading it
    max_connections: int = 256  # open connections at once; beyond it a new one gets 503 and is closed
    sse_ping_s: float = 30.0
    decode: str | None = None
    threshold: float | None = None
    block_length: int | None = None
    verify: bool | None = None
    reasoning_budget: int = -1  # a chat request's default: -1 thinks freely, 0 not at all, N tokens at most
    ctx_checkpoints: int = 8  # prompt-cache checkpoints per slot (--ctx-checkpoints)
    checkpoint_every: int = 2048  # and one every N tokens of a long prefill (--checkpoint-every)
    slot_save_path: str | None = None  # folder for POST /slots/{id}?action=save|restore (--slot-save-path)
    shutdown_timeout_s: float = 5.0  # seconds running replies may finish in once shutdown begins
    slots_verbose: bool = False  # GET /slots shows each slot's prompt text (--slots-verbose)
    shutdown_token: str | None = None
    build: str = "clover"
    extra_props: dict = field(default_factory=dict)

    @property
    def allows_any_origin(self) -> bool:
        return "*" in self.cors_origins

    def host_names(self) -> frozenset[str] | None:
        """Host header names accepted (lower case, port stripped), or None when any Host is.

        A loopback server answers only to local names (plus --allowed-hosts); a server open to the
        network is reached under names we cannot know, so it checks only when --allowed-hosts is set.
        """
        if "*" in self.allowed_hosts:
            return None
        loopback = self.host in LOOPBACK_ADDRESSES or self.host.startswith("127.")
        if not loopback and not self.allowed_hosts:
            return None
        return frozenset(LOCAL_HOSTS) | {h.strip().lower().rstrip(".") for h in self.allowed_hosts if h.strip()}

    def origin_regex(self) -> str:
        """One regex for the allowed origins: localhost always, plus the listed ones exactly."""
        extra = [re.escape(o.rstrip("/")) for o in self.cors_origins if o and o != "*"]
        if not extra:
            return LOCAL_ORIGIN_REGEX
        return f"(?:{LOCAL_ORIGIN_REGEX})|(?:^(?:{'|'.join(extra)})$)"

    def private_folders(self) -> tuple[str, ...]:
        """This machine's folders an error body must not show (longest first): the model's and
        --slot-save-path, as given and resolved, clover's and the model cache's, and the home and
        temporary folders around them."""
        from clover_runtime import paths

        given = [Path(self.model_path).parent if self.model_path else None,
                 Path(self.slot_save_path) if self.slot_save_path else None,
                 paths.hf_cache_dir(), paths.cache_dir(), paths.data_dir(), Path.home(),
                 Path(tempfile.gettempdir())]
        forms: set[str] = set()
        for folder in filter(None, given):
            for form in (folder, folder.resolve()):
                if form.is_absolute() and len(form.parts) > 1:
                    forms.add(str(form))
        return tuple(sorted(forms, key=len, reverse=True))
