"""What a running server was asked to be: one immutable record handed to `create_app`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Browsers on this machine only: any port on localhost, 127.0.0.1 or [::1], http or https.
LOCAL_ORIGIN_REGEX = r"^https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?$"


@dataclass(frozen=True)
class ServerSettings:
    """Settings of one `clover serve` process (the CLI fills them from flags and env)."""

    model_id: str = "clover"
    model_path: str = ""
    n_ctx: int = 4096
    n_parallel: int = 1
    max_queue: int = 16
    api_keys: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    webui: bool = True
    timeout_s: float = 3600.0
    max_body_bytes: int = 16 * 1024 * 1024
    sse_ping_s: float = 30.0
    decode: str | None = None
    threshold: float | None = None
    block_length: int | None = None
    ctx_checkpoints: int = 8  # prompt-cache checkpoints per slot (--ctx-checkpoints)
    checkpoint_every: int = 2048  # and one every N tokens of a long prefill (--checkpoint-every)
    slot_save_path: str | None = None  # folder for POST /slots/{id}?action=save|restore (--slot-save-path)
    shutdown_token: str | None = None
    build: str = "clover"
    extra_props: dict = field(default_factory=dict)

    @property
    def n_ctx_slot(self) -> int:
        """Context of each parallel sequence: the total divided evenly (stated at start-up)."""
        return max(1, self.n_ctx // max(1, self.n_parallel))

    @property
    def allows_any_origin(self) -> bool:
        return "*" in self.cors_origins

    def origin_regex(self) -> str:
        """One regex for the allowed origins: localhost always, plus the listed ones exactly."""
        extra = [re.escape(o.rstrip("/")) for o in self.cors_origins if o and o != "*"]
        if not extra:
            return LOCAL_ORIGIN_REGEX
        return f"(?:{LOCAL_ORIGIN_REGEX})|(?:^(?:{'|'.join(extra)})$)"
