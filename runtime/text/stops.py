"""Stop strings over a reply's raw text, matched in the answer only, never inside the reasoning.

A thinking reply reads `<think>…</think>\n\nanswer`: a stop such as "\n\n" must not end it at the
blank line after `</think>` (lm-evaluation-harness's chat tasks send exactly that stop). Text up to
the answer's first character passes unmatched; from there the stop strings apply. Offsets count
characters of the raw text, so the chat session can cut token logprobs where the text was cut.
"""

from __future__ import annotations

from collections.abc import Sequence

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class StopStrings:
    """Holds back text that could be the start of a stop string; cuts at the first full match.
    `released` counts the characters let through; after a match `cut_at` is where it began."""

    def __init__(self, stops: Sequence[str]) -> None:
        self.stops = [s for s in stops if s]
        self.buf = ""
        self.hit = False
        self.released = 0
        self.cut_at: int | None = None
        self.word: str | None = None  # the stop string that matched (APIs report which)

    def feed(self, text: str) -> str:
        if not self.stops:
            self.released += len(text)
            return text
        self.buf += text
        found = [(i, s) for s in self.stops if (i := self.buf.find(s)) >= 0]
        if found:
            cut, self.word = min(found, key=lambda f: f[0])
            out, self.buf, self.hit = self.buf[:cut], "", True
            self.cut_at = self.released + cut
            self.released += cut
            return out
        hold = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(self.buf)), 0, -1):
                if self.buf.endswith(s[:k]):
                    hold = max(hold, k)
                    break
        out = self.buf[: len(self.buf) - hold]
        self.buf = self.buf[len(self.buf) - hold:]
        self.released += len(out)
        return out

    def flush(self) -> str:
        out, self.buf = self.buf, ""
        self.released += len(out)
        return out


class AnswerStops:
    """`StopStrings` that start matching at the answer: after the reasoning's `</think>` and the
    whitespace that follows it (a reply that starts in reasoning, or opens `<think>` itself), or
    from the first character of a reply without reasoning."""

    def __init__(self, stops: Sequence[str], *, starts_in_reasoning: bool = False) -> None:
        self.inner = StopStrings(stops)
        self.reasoning = starts_in_reasoning
        self.text = ""
        self.done = 0  # raw characters handed on, passed or given to the matcher
        self.passed = 0  # of those, passed unmatched (everything before the answer)
        self.answer_from: int | None = None if self.inner.stops else 0
        self._scan = 0  # where to look for `</think>` next

    @property
    def hit(self) -> bool:
        return self.inner.hit

    @property
    def released(self) -> int:
        return self.passed + self.inner.released

    @property
    def word(self) -> str | None:
        return self.inner.word

    @property
    def cut_at(self) -> int | None:
        return None if self.inner.cut_at is None else self.passed + self.inner.cut_at

    def _boundary(self) -> int | None:
        """Where the answer starts in the raw text, or None while that is not known yet."""
        t = self.text
        if not self.reasoning:
            stripped = t.lstrip()
            if stripped.startswith(THINK_OPEN):
                self.reasoning = True
            elif THINK_OPEN.startswith(stripped):  # nothing yet, or `<thi…`
                return None
            else:
                return 0
        close = t.find(THINK_CLOSE, self._scan)
        if close < 0:
            self._scan = max(0, len(t) - len(THINK_CLOSE))
            return None
        rest = t[close + len(THINK_CLOSE):].lstrip()
        return len(t) - len(rest) if rest else None

    def feed(self, text: str) -> str:
        self.text += text
        if self.answer_from is None:
            b = self._boundary()
            if b is not None:
                self.answer_from = max(b, self.done)
        if self.answer_from is None:
            out = self.text[self.done:]
            self.done = len(self.text)
            self.passed += len(out)
            return out
        head = self.text[self.done:self.answer_from] if self.done < self.answer_from else ""
        self.passed += len(head)
        new = self.text[max(self.done, self.answer_from):]
        self.done = len(self.text)
        return head + self.inner.feed(new)

    def flush(self) -> str:
        return self.inner.flush()
