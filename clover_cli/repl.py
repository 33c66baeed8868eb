"""The interactive chat of `clover run`: history, slash commands, Ctrl-C, multi-line input."""

from __future__ import annotations

import json
import os
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from clover_runtime.text.reply import Reply
from rich.console import Console

from .chat_view import ReplyPrinter, run_in_thread, stats_line
from .console import safe


def eof_key(os_name: str | None = None) -> str:
    """The keys that end input: Windows consoles read Ctrl-Z then Enter as end of file, not Ctrl-D."""
    return "Ctrl-Z then Enter" if (os.name if os_name is None else os_name) == "nt" else "Ctrl-D"


EOF_KEY = eof_key()

HELP = f"""commands:
  /help, /?              this help
  /exit, /bye            leave (also {EOF_KEY})
  /clear                 forget the conversation (and the cached prompt state)
  /regen                 answer the last message again
  /system TEXT           set the system prompt (empty: none)
  /set KEY VALUE         temperature, top_k, top_p, min_p, seed, max_tokens, threshold, block_length, decode
  /set think|nothink     let the model reason first, or answer at once
  /show info|params|template|system
  /read FILE             send a file's contents as your message
  /save FILE, /load FILE the conversation as JSON, its prompt state in FILE.state (resumes without a prefill)
  \"\"\" … \"\"\"            multi-line input; Ctrl-C stops a reply or clears the line
  ↑ ↓, Ctrl-R            earlier input, also from earlier sessions"""

EXIT_HINT = f"Use {EOF_KEY} or /bye to exit."


def state_path(conversation: Path) -> Path:
    """Where /save puts the prompt state of the conversation it writes to `conversation`."""
    return conversation.with_name(conversation.name + ".state")


@contextmanager
def stop_on_first_interrupt(cancel: threading.Event) -> Iterator[None]:
    """While a reply streams, SIGINT sets `cancel` instead of raising mid-print; a second one raises."""

    def on_sigint(signum: int, frame: Any) -> None:
        if cancel.is_set():
            raise KeyboardInterrupt
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


class Repl:
    def __init__(self, session: Any, params: Any, *, system: str | None, think: bool, visual: bool,
                 show_timings: bool, banner: str, con: Console, read_line: Any = None,
                 cache: Any = None) -> None:
        self.session = session
        self.params = params
        self.system = system
        self.think = think
        self.visual = visual
        self.show_timings = show_timings
        self.banner = banner
        self.con = con
        if read_line is None:
            from .line_input import LineReader

            read_line = LineReader()
        self.read_line = read_line
        self.history: list[dict[str, Any]] = []
        self.cache = cache  # the prompt cache: each turn prefills only what is new

    # -- input ------------------------------------------------------------------------------------
    def _read(self) -> str:
        line = self.read_line(">>> ")
        if line.strip().startswith('"""'):
            parts = [line.strip()[3:]]
            while not parts[-1].endswith('"""'):
                parts.append(self.read_line("... "))
            parts[-1] = parts[-1][:-3]
            return "\n".join(parts).strip("\n")
        return line

    def messages(self) -> list[dict[str, Any]]:
        head = [{"role": "system", "content": self.system}] if self.system else []
        return head + self.history

    # -- commands ---------------------------------------------------------------------------------
    def command(self, line: str) -> bool:
        """Run a slash command; False means leave."""
        cmd, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        if cmd in ("/exit", "/bye"):
            return False
        if cmd in ("/help", "/?"):
            self.con.print(HELP, markup=False)
        elif cmd == "/clear":
            self.history.clear()
            if self.cache is not None:
                self.cache.clear()
            self.con.print("Chat history cleared.")
        elif cmd == "/regen":
            if not self.history or self.history[-1]["role"] != "assistant":
                self.con.print("No message to regenerate.")
            else:
                self.history.pop()
                self.reply()
        elif cmd == "/system":
            self.system = arg or None
            self.con.print("System prompt set." if arg else "System prompt cleared.")
        elif cmd == "/set":
            self._set(arg)
        elif cmd == "/show":
            self._show(arg)
        elif cmd in ("/read", "/save", "/load") and not arg:
            self.con.print(f"usage: {safe(cmd)} FILE", markup=False)
        elif cmd == "/read":
            from clover_runtime.text_files import read_text

            try:
                text = read_text(Path(arg).expanduser())
            except OSError as exc:
                self.con.print(f"cannot read {safe(arg)}: {exc.strerror}", markup=False)
                return True
            except UnicodeDecodeError:
                self.con.print(f"cannot read {safe(arg)}: it is not UTF-8 or UTF-16 text", markup=False)
                return True
            self.ask(f"--- File: {Path(arg).name} ---\n{text}")
        elif cmd == "/save":
            self._save(Path(arg).expanduser())
        elif cmd == "/load":
            self._load(Path(arg).expanduser())
        else:
            self.con.print(f"unknown command {safe(cmd)} (/help lists them)", markup=False)
        return True

    def _save(self, path: Path) -> None:
        """The conversation as JSON, and beside it (FILE.state) the prompt state it leaves."""
        from clover_runtime import atomic_write, state_file

        conversation = {"system": self.system, "messages": self.history}
        held = ""
        try:  # replaced whole or not at all: a full disk keeps the previous save
            atomic_write.write_text(path, json.dumps(conversation, ensure_ascii=False, indent=2))
            if self.cache is not None and self.cache.n_cached:
                state_file.save(self.cache, state_path(path))
                held = f" and {self.cache.n_cached} tokens of state"
        except OSError as exc:
            self.con.print(f"cannot save {path}: {exc.strerror or exc}", markup=False)
            return
        except state_file.StateFileError as exc:
            self.con.print(f"cannot save the state: {exc.message}", markup=False)
        self.con.print(f"Saved {len(self.history)} messages{held} to {path}.", markup=False)

    def _load(self, path: Path) -> None:
        """A JSON conversation, and its saved state when FILE.state is there and is this model's."""
        from clover_runtime import state_file

        shown = safe(path)
        not_saved = (f"cannot load {shown}: it is not a conversation saved with /save "
                     "(to chat with another model, start clover run with it)")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            system, history = data.get("system"), list(data["messages"])
            if not all(isinstance(m, dict) and "role" in m for m in history):
                raise ValueError("every message needs a role")
        except RecursionError:
            self.con.print(f"cannot load {shown}: its JSON is nested too deeply", markup=False)
            return
        except OSError as exc:
            self.con.print(f"cannot load {shown}: {exc.strerror or exc}", markup=False)
            return
        except UnicodeDecodeError:  # a GGUF or other binary file: Ollama's /load takes a model
            self.con.print(not_saved, markup=False)
            return
        except json.JSONDecodeError:
            self.con.print(not_saved, markup=False)
            return
        except (ValueError, KeyError, AttributeError, TypeError) as exc:
            self.con.print(f"cannot load {shown}: {safe(exc)}", markup=False)
            return
        self.system, self.history = system, history
        held = ""
        if self.cache is not None:
            self.cache.clear()
            if state_path(path).exists():
                try:
                    state_file.load(self.cache, state_path(path))
                    held = f" and {self.cache.n_cached} tokens of state"
                except state_file.StateFileError as exc:
                    self.con.print(f"state not loaded (the next reply prefills it): {exc.message}", markup=False)
        self.con.print(f"Loaded {len(self.history)} messages{held}.", markup=False)

    def _set(self, arg: str) -> None:
        from .repl_params import set_param

        key, _, value = arg.partition(" ")
        key, value = key.strip(), value.strip()
        if key == "parameter":  # Ollama's spelling: /set parameter temperature 0.7
            key, _, value = value.partition(" ")
            key, value = key.strip(), value.strip()
        if key in ("think", "nothink"):
            self.think = key == "think"
            self.con.print("Set 'think' mode." if self.think else "Set 'nothink' mode.")
            return
        if key == "system":
            self.command(f"/system {value}")
            return
        try:
            self.params, key = set_param(self.params, key, value)
        except ValueError as exc:
            self.con.print(str(exc), markup=False)
            return
        self.con.print(f"Set parameter '{key}' to '{value}'", markup=False)

    def _show(self, what: str) -> None:
        """What Ollama's /show prints: the model (info), the sampling (params), the chat template
        and the system prompt; /show alone, the banner."""
        from .repl_params import show_rows

        if what == "template":
            self.con.print(safe(self.session.template.source, lines=True), markup=False)
        elif what in ("params", "parameters"):
            for k, v in show_rows(self.params, self.think):
                self.con.print(f"  {k:<20} {v}", markup=False)
        elif what == "info":
            for k, v in self._info():
                self.con.print(f"  {k:<16} {safe(v)}", markup=False)
        elif what == "system":
            self.con.print(safe(self.system, lines=True) if self.system else "No system prompt set.", markup=False)
        elif what:
            self.con.print(f"unknown /show {safe(what)} (one of info, params, template, system)", markup=False)
        else:
            self.con.print(safe(self.banner, lines=True), markup=False)

    def _info(self) -> list[tuple[str, str]]:
        """The model's summary, as `clover inspect` shows it, and the context this chat has."""
        from clover_runtime.model_summary import summarize

        from .inspect_cmd import summary_pairs

        model = self.session.model
        rows = summary_pairs(summarize(model.file, filename=Path(str(model.file.path)).name))
        keep = ("model", "architecture", "file", "parameters", "layers", "experts", "context", "block diffusion")
        rows = [(k, v) for k, v in rows if k in keep]
        return rows + [("this chat", f"{self.session.n_ctx:,} tokens of context")]

    # -- generation -------------------------------------------------------------------------------
    def ask(self, text: str) -> None:
        self.history.append({"role": "user", "content": text})
        self.reply()

    def reply(self) -> None:
        """Stream one answer. The first Ctrl-C only asks the generation to stop (a flag the worker
        checks between passes), so the reply ends cleanly and the session goes on; a second one exits."""
        cancel = threading.Event()
        printer = ReplyPrinter(self.con, visual=self.visual)
        out = Reply()
        kwargs = {} if self.think else {"enable_thinking": False}
        messages = self.messages()
        with stop_on_first_interrupt(cancel):
            for ev in run_in_thread(lambda c: self.session.stream(messages, params=self.params,
                                                                  chat_template_kwargs=kwargs, cancel=c,
                                                                  cache=self.cache), cancel):
                out.add(ev)
                printer.feed(ev)
        printer.close()
        if cancel.is_set():
            self.con.print("\n[interrupted]", markup=False)
        self.con.print()
        if out.content or out.tool_calls:
            self.history.append(out.message())
        if self.show_timings and out.finished is not None:
            self.con.print(stats_line(out), style="dim", markup=False)

    def _interrupted_at_prompt(self) -> None:
        """Ctrl-C at the prompt never leaves (as in Ollama): a half-typed line is dropped, an empty
        prompt says how to exit."""
        pending = getattr(self.read_line, "pending", lambda: None)()
        self.con.print()
        if not pending:
            self.con.print(EXIT_HINT, style="dim")

    def loop(self) -> int:
        self.con.print(safe(self.banner, lines=True), markup=False)
        self.con.print('Type a message, /help for commands, """ for multi-line input.', style="dim")
        try:
            return self._loop()
        finally:
            close = getattr(self.read_line, "close", None)
            if close is not None:
                close()

    def _loop(self) -> int:
        while True:
            try:
                line = self._read()
            except EOFError:
                self.con.print()
                return 0
            except KeyboardInterrupt:
                self._interrupted_at_prompt()
                continue
            if not line.strip():
                continue
            if line.strip().startswith("/"):
                if not self.command(line):
                    return 0
                continue
            self.ask(line)
