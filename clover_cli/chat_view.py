"""Showing a reply as it is generated: content, dimmed reasoning, tool calls, the live block in
`--visual` mode, and the stats line after each reply."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from clover_runtime.text.reply import (
    ContentDelta,
    Finished,
    Progress,
    ReasoningDelta,
    Reply,
    ReplyEvent,
    Timings,
    ToolCallArgs,
    ToolCallStart,
    ToolMarkup,
)
from rich.console import Console
from rich.live import Live
from rich.text import Text

from .console import safe


def markup_note(ev: ToolMarkup) -> str:
    """The one line a screen shows for tool-call markup (the terminal offers the model no tools)."""
    if ev.name:
        args = ", ".join(f"{safe(k)}={json.dumps(v, ensure_ascii=False)}" for k, v in ev.arguments)
        return f"the model tried to call {safe(ev.name)}({args}); no tools were given"
    return "the model wrote part of a tool call; no tools were given"


def _lead(text: str) -> str:
    return text[:len(text) - len(text.lstrip())]


def shown_content(reply: Reply) -> str:
    """The reply's content with each piece of tool-call markup replaced by its note, on a line of its own."""
    out, pos = [], 0
    for m in reply.markup:
        at = reply.content.find(m.text, pos)
        if at < 0:
            continue
        before = reply.content[pos:at] + _lead(m.text)
        out.append(before + ("\n" if before and not before.endswith("\n") else "") + markup_note(m))
        pos = at + len(m.text)
        if pos < len(reply.content) and not reply.content[pos].isspace():
            out.append("\n")
    out.append(reply.content[pos:])
    return "".join(out)


def reply_json(reply: Reply) -> dict[str, Any]:
    """`clover run --json`: the reply, its finish reason, usage, timings and decode mode; tool-call
    markup is a note in `content` and the model's own text in `tool_markup`."""
    stats = reply.stats
    return {
        "content": shown_content(reply), "reasoning": reply.reasoning or None, "tool_calls": reply.tool_calls,
        "tool_markup": [{"name": m.name, "arguments": dict(m.arguments), "text": m.text.strip()}
                        for m in reply.markup],
        "finish_reason": reply.finish_reason, "usage": reply.usage.to_json(), "timings": reply.timings.to_json(),
        "decode": getattr(stats, "decode_mode", None), "exact": getattr(stats, "exact", None),
        "auto": getattr(stats, "auto_note", "") or None,
        "errors": list(reply.errors),
    }


def stats_line(reply: Reply) -> str:
    """`[ prompt X t/s | generation Y t/s | tokens per forward Z | passes P | cached N ]` (llama.cpp's
    shape; `cached`: prompt tokens reused from the prompt cache, not prefilled again)."""
    t = reply.timings
    return (f"[ prompt {t.prompt_per_second:.1f} t/s | generation {t.predicted_per_second:.1f} t/s"
            f" | tokens per forward {t.tokens_per_forward:.2f} | passes {t.passes}"
            f" ({t.passes_per_block:.1f}/block){_modes(t)} | cached {t.cache_n} ]")


def _modes(t: Timings) -> str:
    """` | AR 40 at 9.5 t/s, diffusion 24 at 31.0 t/s` when both modes wrote part of the reply."""
    if not (t.ar_n and t.diffusion_n):
        return ""
    return (f" | AR {t.ar_n} at {t.ar_per_second:.1f} t/s, diffusion {t.diffusion_n}"
            f" at {t.diffusion_per_second:.1f} t/s")


def run_in_thread(make_events: Callable[[threading.Event], Iterator[Any]],
                  cancel: threading.Event) -> Iterator[Any]:
    """Generate in a worker thread so Ctrl-C in the main thread can stop it cleanly."""
    q: queue.Queue = queue.Queue()
    done = object()

    def work() -> None:
        try:
            for ev in make_events(cancel):
                q.put(ev)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            q.put(exc)
        finally:
            q.put(done)

    threading.Thread(target=work, daemon=True, name="clover-generate").start()
    while True:
        try:
            item = q.get(timeout=0.1)  # a timed wait, so Ctrl-C reaches the main thread on Windows too
        except queue.Empty:
            continue
        if item is done:
            return
        if isinstance(item, BaseException):
            raise item
        yield item


class ReplyPrinter:
    """Prints events to a console as they come; dims reasoning; `visual` shows the live block.

    The live block is drawn on lines of its own below the text, each cut to the terminal's width, so
    erasing it when the block is committed erases exactly those lines and never the reply above; the
    cursor then goes back to the end of the text, which carries on where it stopped."""

    def __init__(self, con: Console, *, show_reasoning: bool = True, visual: bool = False) -> None:
        self.con = con
        self.show_reasoning = show_reasoning
        self.visual = visual and con.is_terminal
        self._in_reasoning = False
        self._live: Live | None = None
        self._line = ""  # what is printed on the current screen line so far
        self._lifted = False  # the live block started on a new line below unfinished text

    def _print(self, text: Text | str, **kw: Any) -> None:
        self.con.print(text, end="", **kw)
        plain = text.plain if isinstance(text, Text) else text
        self._line = plain.rsplit("\n", 1)[-1] if "\n" in plain else self._line + plain

    def _live_text(self, ev: Progress) -> Text:
        preview = ev.tokens_preview.replace("\r", "").replace("\n", "⏎")
        text = Text.assemble(("block ", "dim"), (f"{ev.block + 1}", "bold"),
                             (f"  pass {ev.pass_index}  masked {ev.masked}\n", "dim"), (preview, "cyan"))
        text.no_wrap, text.overflow = True, "ellipsis"
        return text

    def feed(self, ev: ReplyEvent) -> None:
        if isinstance(ev, Progress):
            if self.visual:
                self._show_live(ev)
            return
        if isinstance(ev, (ContentDelta, ReasoningDelta, ToolCallStart, ToolCallArgs, Finished)):
            self._stop_live()
        if isinstance(ev, (ContentDelta, ToolCallStart)) and self._in_reasoning:
            self._print("\n")
            self._in_reasoning = False
        match ev:
            case ReasoningDelta(text=text) if self.show_reasoning:
                if not self._in_reasoning:
                    self._print(Text("thinking…\n", style="dim"))
                    self._in_reasoning = True
                self._print(Text(safe(text, lines=True), style="dim italic"))
            case ToolMarkup(text=text):
                self._print(Text(safe(_lead(text), lines=True)))
                self._print(Text(("\n" if self._line else "") + markup_note(ev) + "\n", style="dim italic"))
            case ContentDelta(text=text):
                self._print(Text(safe(text, lines=True)))
            case ToolCallStart(name=name):
                self._print(Text(f"\n[tool call {safe(name)}] ", style="magenta"))
            case ToolCallArgs(fragment=fragment):
                self._print(Text(safe(fragment, lines=True), style="magenta"))

    def _show_live(self, ev: Progress) -> None:
        text = self._live_text(ev)
        if self._live is None:
            self._lifted = bool(self._line)
            if self._lifted:
                self.con.print()
            self._live = Live(text, console=self.con, transient=True, refresh_per_second=12,
                              vertical_overflow="crop")
            self._live.start(refresh=True)  # draw the first pass at once, not at the next tick
        else:
            self._live.update(text)

    def _stop_live(self) -> None:
        if self._live is None:
            return
        self._live.stop()  # transient: erases its lines, the cursor at the start of the first one
        self._live = None
        if self._lifted:
            from rich.cells import cell_len
            from rich.control import Control

            used = cell_len(self._line)
            column = used % self.con.width
            if column:  # a line that filled the width exactly goes on below, where the cursor is
                self.con.control(Control.move_to_column(column, y=-1))
            self._lifted = False

    def close(self) -> None:
        self._stop_live()


class OneShotPrinter:
    """`clover run MODEL PROMPT`: the answer on stdout, everything else on stderr, each ending its
    line, so `clover run … | cat` gets only the answer and a terminal shows dim reasoning, the
    answer and the stats line each on lines of their own. The reasoning shows only on a terminal."""

    def __init__(self, out: Console, err: Console) -> None:
        self.out = out
        self.err = err
        self._err_open = False  # reasoning printed on stderr, its line not ended yet
        self._out_line = False  # text printed on stdout, its line not ended yet

    def _end_err_line(self) -> None:
        if self._err_open:
            self.err.print()
            self._err_open = False

    def _write(self, text: str, **kw: Any) -> None:
        if text:
            self.out.print(text, end="", markup=False, highlight=False, **kw)
            self._out_line = not text.endswith("\n")

    def feed(self, ev: ReplyEvent) -> None:
        if isinstance(ev, ReasoningDelta):
            if self.err.is_terminal and ev.text:
                self.err.print(safe(ev.text, lines=True), end="", style="dim", markup=False, highlight=False)
                self._err_open = True
            return
        if not isinstance(ev, (ContentDelta, ToolCallStart)):
            return
        self._end_err_line()
        if isinstance(ev, ToolMarkup):
            self._write(safe(_lead(ev.text), lines=True))
            self._write(("\n" if self._out_line else "") + markup_note(ev) + "\n", style="dim italic")
        elif isinstance(ev, ContentDelta):
            self._write(safe(ev.text, lines=True))

    def finish(self, reply: Reply, *, show_timings: bool) -> None:
        """End the answer's line (an empty answer prints an empty line, as before), then the
        warning for an answer that never came and the stats line on stderr."""
        self._end_err_line()
        if self._out_line or not reply.content:
            self.out.print()
        self._out_line = False
        if not reply.content and not reply.tool_calls and reply.reasoning:
            from .console import warn

            warn("the reply was all reasoning and never reached an answer "
                 "(raise -n, or use --no-think; --json shows the reasoning)")
        if show_timings and self.err.is_terminal:
            self.err.print(stats_line(reply), style="dim", markup=False, highlight=False)


def print_json(reply: Reply, con: Console) -> None:
    con.print_json(json.dumps(reply_json(reply), ensure_ascii=False))
