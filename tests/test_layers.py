"""Data flows one way and only clover_cli prints: the runtime reports through a Reporter (no console
of its own), bench measures without parsing flags or drawing tables, one resolver decides what a
model name means, and `load_model` never touches the network."""

from __future__ import annotations

import ast
import socket
import time
from pathlib import Path

import pytest
from clover_runtime.errors import HubError, ModelFileError
from hub_server import HubServer
from synth_models import tiny_model_path

from clover_cli.advice import hint_for

ROOT = Path(__file__).resolve().parents[1]
TINY = "acme/Tiny-GGUF"


def _runtime_sources() -> list[Path]:
    # a module's own `python -m` entry point (the synth generator) is a command line of its own
    return [p for p in sorted((ROOT / "runtime").rglob("*.py")) if p.name != "__main__.py"]


def _names(path: Path) -> tuple[set[str], set[str]]:
    """(functions called by bare name, modules imported) in one source file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    mods = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return calls, mods


def test_the_runtime_has_no_console() -> None:
    offenders = []
    for path in _runtime_sources():
        calls, mods = _names(path)
        if "print" in calls or any(m == "rich" or m.startswith("rich.") for m in mods):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


def test_bench_in_the_runtime_only_measures() -> None:
    import clover_runtime.bench as bench

    _, mods = _names(ROOT / "runtime" / "bench.py")
    assert not {"csv", "json", "io", "re"} & mods
    assert not [n for n in dir(bench) if n.startswith(("parse_", "render", "_markdown"))]


def test_one_place_tells_a_path_from_a_hub_id() -> None:
    users = []
    for path in sorted(ROOT.glob("runtime/**/*.py")) + sorted(ROOT.glob("clover_cli/**/*.py")):
        text = path.read_text(encoding="utf-8")
        if "looks_like_path(" in text or "DEFAULT_MODEL, looks" in text:
            users.append(path.relative_to(ROOT).as_posix())
    assert users == ["runtime/hub/refs.py", "runtime/hub/resolve.py"]


def test_every_entry_names_a_missing_file_the_same_way(tmp_path: Path) -> None:
    from clover_runtime.hub import open_for_inspect, resolve_model
    from clover_runtime.loader import load_model

    from clover_cli.model_setup import resolve

    missing = str(tmp_path / "nope.gguf")
    for call in (resolve_model, load_model, open_for_inspect, resolve):
        with pytest.raises(ModelFileError) as err:
            call(missing)
        assert err.value.message == f"model file not found: {missing}", call
    assert resolve_model(str(tiny_model_path("Q8_0"))) == tiny_model_path("Q8_0")


class Recorder:
    """A Reporter that keeps what it is told."""

    def __init__(self) -> None:
        self.notes: list[str] = []
        self.warnings: list[str] = []
        self.files: list[tuple[str, int]] = []
        self.last: dict[str, int] = {}

    def note(self, text: str) -> None:
        self.notes.append(text)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def file(self, path: str, total: int, done: int = 0):  # noqa: ANN201
        self.files.append((path, total))
        return lambda n: self.last.__setitem__(path, n)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(monkeypatch: pytest.MonkeyPatch, endpoint: str, cache: Path) -> None:
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.setenv("CLOVER_CACHE", str(cache))
    for var in ("HF_HUB_OFFLINE", "CLOVER_OFFLINE", "HF_TOKEN"):
        monkeypatch.delenv(var, raising=False)


def test_downloads_report_to_the_caller_and_print_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          capfd: pytest.CaptureFixture[str]) -> None:
    from clover_runtime.hub import resolve_model

    with HubServer() as hub:
        hub.state.add(TINY, "Tiny-Q8_0.gguf", tiny_model_path("Q8_0"))
        _env(monkeypatch, hub.endpoint, tmp_path / "cache")
        seen = Recorder()
        path = resolve_model(f"{TINY}:Q8_0", reporter=seen)
    size = tiny_model_path("Q8_0").stat().st_size
    assert seen.files == [("Tiny-Q8_0.gguf", size)] and seen.last == {"Tiny-Q8_0.gguf": size}
    assert seen.notes[-1] == "Tiny-Q8_0.gguf: sha256 verified" and path.read_bytes()[:4] == b"GGUF"
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    again = Recorder()
    assert resolve_model(f"{TINY}:Q8_0", refresh=True, reporter=again) == path
    assert len(again.warnings) == 1 and again.warnings[0].startswith("cannot reach the Hub at http://127.0.0.1:")
    assert capfd.readouterr() == ("", "")


def test_load_model_never_touches_the_network(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub name that is not cached fails at once with one clear error; the Hub is never contacted."""
    from clover_runtime.loader import load_model

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.setblocking(False)
        _env(monkeypatch, f"http://127.0.0.1:{listener.getsockname()[1]}", tmp_path / "cache")
        start = time.monotonic()
        with pytest.raises(HubError) as err:
            load_model(f"{TINY}:Q8_0")
        assert time.monotonic() - start < 2
        assert (err.value.message, err.value.why) == (f"{TINY}:Q8_0 is not downloaded yet", "not_downloaded")
        assert f"download it first with: clover pull {TINY}:Q8_0" in hint_for(err.value)  # the CLI words the fact
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected


def test_download_progress_follows_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bars and warnings are drawn by the CLI's console, so `--no-color` reaches them."""
    from clover_cli import console
    from clover_cli.hub_progress import HubProgress

    monkeypatch.setitem(console._state, "no_color", False)
    assert not HubProgress().console.no_color
    console.set_options(verbose=False, no_color=True)
    assert HubProgress().console.no_color


def test_the_runtime_raises_facts_not_command_lines() -> None:
    """`clover pull`, `--decode ar`, `--device …`, `--file`, `--hf-token`, `-np`, `-c` and the agent-client
    note are the CLI's words (clover_cli/advice.py, doctor_cmd.py): the runtime's errors, fit advice and
    doctor report carry which model is missing and why, what the file, the request or the machine lacks,
    and the context that would fit. (`-ngl` stays in the messages that reject its value.)"""
    import ast

    words = ("clover pull", "--decode", "--device", "clover run", "--file", "--hf-token", "-np ", "-c ",
             "Hermes Agent")
    found = []
    for path in sorted((ROOT / "runtime").rglob("*.py")):
        if "synth" in path.parts:  # the synthetic-model generator's own command line
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{path.name}: {w}" for w in words if w in node.value]
    assert found == []


def _runtime_import_graph() -> dict[str, set[str]]:
    """runtime/'s modules and the runtime modules each imports (at the top or inside a function),
    leaving out a module's own parent packages."""
    import ast

    root = ROOT / "runtime"
    mods = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, path in mods.items():
        here = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        here = [p for p in here if p]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here[:len(here) - (node.level - 1)] if node.level > 1 else here
                mod = ".".join(base + ([node.module] if node.module else []))
            elif (node.module or "").startswith("clover_runtime"):
                mod = node.module[len("clover_runtime"):].lstrip(".")
            else:
                continue
            for alias in node.names:
                target = f"{mod}.{alias.name}".lstrip(".")
                target = target if target in mods else mod
                parents = {".".join(name.split(".")[:k]) for k in range(len(name.split(".")))}
                if target in mods and target != name and target not in parents:
                    graph[name].add(target)
    return graph


def test_the_runtime_has_no_import_cycles() -> None:
    """No two runtime modules import each other, directly or round a loop, not even from inside a
    function (the way cycles used to be held apart)."""
    graph = _runtime_import_graph()
    state: dict[str, int] = {}
    cycle: list[str] = []

    def visit(m: str, path: list[str]) -> bool:
        state[m] = 1
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                cycle.extend(path[path.index(d):] + [m, d] if d in path else [m, d])
                return True
            if d not in state and visit(d, path + [m]):
                return True
        state[m] = 2
        return False

    assert not any(visit(m, []) for m in sorted(graph) if m not in state), " -> ".join(cycle)
    assert "engine.model" in graph and "torch_backend.layers" not in graph["engine.model"]
