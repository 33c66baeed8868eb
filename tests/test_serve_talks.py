"""A server that talks (issue 39, item 6): `clover serve` says `listening on …` only once the model
has loaded, and logs one line per request on stderr at the default verbosity, as llama-server and
Ollama do: method, route, status, time, and for a generation the prompt and cached tokens, the
tokens generated, their speed and the decode mode."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from serve_helpers import clover_env, clover_serve

LINE = re.compile(r"^\d\d:\d\d:\d\d (?P<method>[A-Z]+) (?P<path>\S+) (?P<status>\d{3}) (?P<ms>\d+) ms"
                  r"(?: · prompt (?P<prompt>\d+) tokens \((?P<cached>\d+) cached\) · (?P<gen>\d+) generated at "
                  r"(?P<tps>[\d.]+) t/s · (?P<mode>[^·\n]+?))?(?: · (?P<reason>[a-z_, ]+))?$")


def _logged(err: list[str], n: int, timeout: float = 10.0) -> list[re.Match]:
    """The request lines among the server's stderr lines, once there are `n` of them."""
    deadline = time.monotonic() + timeout
    while True:
        found = [m for m in (LINE.match(line.rstrip("\n")) for line in list(err)) if m]
        if len(found) >= n or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_listening_only_once_loaded_and_one_line_per_request(tmp_path: Path) -> None:
    with clover_serve(["demo", "-c", "512"], clover_env(tmp_path / "home")) as (url, err):
        with httpx.Client(base_url=url, timeout=120) as c:
            assert c.get("/health").status_code == 200  # the line came after the load: ready at once
            long = "You answer sums with worked digits, one step per line, and nothing else. " * 8  # > 64 tokens
            body = {"messages": [{"role": "system", "content": long}, {"role": "user", "content": "What is 48 + 36?"}],
                    "max_tokens": 24,
                    "temperature": 0, "chat_template_kwargs": {"enable_thinking": False}, "decode": "ar"}
            first = c.post("/v1/chat/completions", json=body).json()
            again = c.post("/v1/chat/completions", json=body).json()  # the same prompt: from the cache
            assert c.get("/v1/nope").status_code == 404
            assert c.post("/v1/chat/completions", json={"messages": []}).status_code == 400
        lines = _logged(err, 5)
    assert "loading the model…\n" in err and any(line.startswith("model loaded in ") for line in err)
    assert [(m["method"], m["path"], m["status"]) for m in lines] == [
        ("GET", "/health", "200"), ("POST", "/v1/chat/completions", "200"), ("POST", "/v1/chat/completions", "200"),
        ("GET", "/v1/nope", "404"), ("POST", "/v1/chat/completions", "400")], err
    assert lines[0]["prompt"] is None and lines[3]["prompt"] is None and lines[4]["prompt"] is None
    for m, reply in ((lines[1], first), (lines[2], again)):
        usage = reply["usage"]
        assert int(m["prompt"]) == usage["prompt_tokens"] and int(m["gen"]) == usage["completion_tokens"] > 0
        assert float(m["tps"]) > 0 and m["mode"] == "AR", m.group(0)
        assert int(m["cached"]) == usage["prompt_tokens_details"]["cached_tokens"], m.group(0)
    assert int(lines[1]["cached"]) == 0 < int(lines[2]["cached"])  # the second prefilled only what was new
    assert (lines[1]["reason"] == "length") == (first["choices"][0]["finish_reason"] == "length")
