"""Shell completion: the checked-in scripts in `completions/` and model-name completion.

The scripts are Typer's dynamic ones (the shell asks `clover` for candidates), so they stay
valid as commands change. The PowerShell script is Typer's without its key-binding change: it
only registers an argument completer and never touches the user's settings or execution policy.
Model arguments complete from the local Hugging Face cache (`repo:QUANT`) and `*.gguf` files,
scanned with the standard library only so completion never imports numpy or the Hub client.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from clover_runtime.paths import hf_cache_dir

SHELL_FILES = {"bash": "clover.bash", "zsh": "_clover", "fish": "clover.fish", "powershell": "clover.ps1"}
_QUANT_RE = re.compile(
    r"[-.](?P<q>(?:UD-)?(?:I?Q[0-9]_[A-Z0-9_]+|Q[0-9]_[0-9K]|BF16|F16|F32))(?:-\d{5}-of-\d{5})?$",
    re.IGNORECASE,
)


def render(shell: str) -> str:
    """The completion script for one shell, as shipped in `completions/`."""
    from typer._completion_shared import get_completion_script

    script = get_completion_script(prog_name="clover", complete_var="_CLOVER_COMPLETE", shell=shell)
    if shell == "powershell":
        script = "\n".join(
            line for line in script.splitlines() if not line.startswith("Set-PSReadLineKeyHandler")
        ) + "\n"
    return script


def write_all(folder: Path) -> list[Path]:
    """Regenerate every script into `folder` (run: python -m clover_cli.completion)."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for shell, name in SHELL_FILES.items():
        path = folder / name
        path.write_text(render(shell), encoding="utf-8", newline="\n")
        written.append(path)
    return written


def cached_model_names() -> list[str]:
    """`owner/repo:QUANT` for every GGUF in the cache (first shards only)."""
    names: set[str] = set()
    root = hf_cache_dir()
    if not root.is_dir():
        return []
    for repo_dir in root.glob("models--*"):
        repo = repo_dir.name[len("models--"):].replace("--", "/", 1)
        for path in (repo_dir / "snapshots").glob("*/**/*.gguf"):
            stem = path.name[: -len(".gguf")]
            if re.search(r"-\d{5}-of-\d{5}$", stem) and not re.search(r"-00001-of-\d{5}$", stem):
                continue
            if any(skip in path.name.lower() for skip in ("mmproj", "imatrix", "mtp-")):
                continue
            m = _QUANT_RE.search(stem)
            names.add(f"{repo}:{m.group('q').upper()}" if m else repo)
    return sorted(names)


def complete_model(incomplete: str) -> list[str]:
    """Candidates for a MODEL argument: `demo` (shipped), cached models, then `.gguf` files and folders."""
    from clover_runtime.demo import DEMO_NAME

    names = [DEMO_NAME, *cached_model_names()]
    out = [n for n in names if n.lower().startswith(incomplete.lower())]
    base = Path(incomplete).expanduser()
    folder = base if incomplete.endswith(("/", os.sep)) else base.parent
    prefix = "" if incomplete.endswith(("/", os.sep)) else base.name
    try:
        entries = sorted(folder.iterdir()) if str(folder) else sorted(Path(".").iterdir())
    except OSError:
        entries = []
    for entry in entries:
        if not entry.name.startswith(prefix):
            continue
        relative = str(folder) in ("", ".") and not incomplete.startswith("./")
        shown = entry.name if relative else str(entry)
        if entry.is_dir():
            out.append(shown + os.sep)
        elif entry.name.lower().endswith(".gguf"):
            out.append(shown)
    return out


if __name__ == "__main__":
    default = Path(__file__).resolve().parent.parent / "completions"
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else default
    for p in write_all(target):
        print(p)
