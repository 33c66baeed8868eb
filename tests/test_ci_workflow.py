"""The GitHub Actions workflow (issue 41): valid YAML with the keys Actions reads, a matrix of
Windows, macOS (Apple silicon) and Linux on Python 3.12, a pip install, and the smoke steps
(`clover run demo`, serve + one request, `serve --detach` + `clover stop`)."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
WORKFLOW = ROOT / ".github" / "workflows" / "ci.yml"


def _load() -> dict:
    doc = yaml.safe_load(WORKFLOW.read_text(encoding="utf-8"))
    if True in doc:  # YAML 1.1 reads the key `on` as true; Actions reads it as "on"
        doc["on"] = doc.pop(True)
    return doc


def test_the_workflow_has_the_keys_actions_reads() -> None:
    doc = _load()
    assert set(doc) <= {"name", "on", "permissions", "env", "jobs", "concurrency", "defaults"}
    assert {"push", "pull_request"} <= set(doc["on"])
    for job in doc["jobs"].values():
        assert {"runs-on", "steps"} <= set(job)
        assert set(job) <= {"name", "runs-on", "timeout-minutes", "strategy", "env", "steps", "defaults", "needs"}
        for step in job["steps"]:
            assert ("uses" in step) != ("run" in step), step  # each step runs a command or an action, not both
            assert set(step) <= {"name", "uses", "with", "run", "shell", "env", "if", "working-directory"}, step


def test_the_matrix_is_windows_macos_and_linux_on_python_312() -> None:
    job = _load()["jobs"]["smoke"]
    matrix = job["strategy"]["matrix"]
    assert matrix["os"] == ["windows-latest", "macos-14", "ubuntu-latest"]
    assert matrix["python-version"] == ["3.12"]
    assert job["runs-on"] == "${{ matrix.os }}"
    assert job["strategy"]["fail-fast"] is False  # one OS failing still shows the others


def test_the_smoke_steps_install_with_pip_and_exercise_run_serve_and_detach() -> None:
    steps = _load()["jobs"]["smoke"]["steps"]
    uses = [s["uses"].split("@")[0] for s in steps if "uses" in s]
    assert uses[:2] == ["actions/checkout", "actions/setup-python"]
    setup = next(s for s in steps if s.get("uses", "").startswith("actions/setup-python"))
    assert setup["with"]["python-version"] == "${{ matrix.python-version }}"
    script = "\n".join(s.get("run", "") for s in steps)
    assert "python -m pip install ." in script
    assert 'clover run demo "What is 2 + 2?" --no-think' in script
    assert "clover serve demo --port 8765" in script and "/v1/chat/completions" in script
    assert "clover serve demo --port 8766 -c 2048 --detach" in script and "clover stop 8766" in script
    bash_steps = [s for s in steps if "&" in s.get("run", "") or "<<" in s.get("run", "")]
    assert all(s.get("shell") == "bash" for s in bash_steps)  # Windows' default shell is PowerShell
