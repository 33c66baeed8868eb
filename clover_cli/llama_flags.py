"""llama.cpp flags that clover does not have, and the argv pass that finds them before Typer does.

Without this pass, click reads `-ngl 99` as `-n gl` and answers "Invalid value for '-n'"; a user
coming from llama-cli or llama-server should read what clover does instead. The same pass lets the
global `-v` and `--no-color` follow the subcommand (`clover run -v …`), as llama.cpp users type them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

_GPU = "GPU offload is an option of run, serve and bench"
_TEMPLATE = "clover always renders the model's Jinja chat template (replace it with --chat-template-file)"

# flag -> what clover does instead (one short clause)
MISSING: dict[str, str] = {}


def _add(names: str, why: str) -> None:
    for name in names.split():
        MISSING[name] = why


_add("-ngl --gpu-layers --n-gpu-layers -cmoe --cpu-moe -ncmoe --n-cpu-moe -mg --main-gpu -dev --device", _GPU)
_add("-ts --tensor-split -sm --split-mode", "clover uses one GPU (--device, --main-gpu)")
_add("-ngld --gpu-layers-draft", "there is no draft model")
_add("-ot --override-tensor", "use --cpu-moe or --n-cpu-moe for the experts, -ngl for layers")
_add("-fa --flash-attn", "clover has its own attention kernels")
_add("-cnv --conversation", "`clover run` without a prompt is already a conversation")
_add("-no-cnv --no-conversation -st --single-turn",
     "give a prompt (argument, -p, -f or stdin) for one answer and exit")
_add("-i --interactive -if --interactive-first", "`clover run` without a prompt is already interactive")
_add("-mli --multiline-input", 'wrap multi-line input in """ … """ at the prompt')
_add("--jinja --no-jinja --chat-template", _TEMPLATE)
_add("--chat-template-kwargs",
     "use --think/--no-think or --reasoning-budget, or chat_template_kwargs in an API request")
_add("-rea --reasoning --reasoning-format", "use --think/--no-think or --reasoning-budget")
_add("-ctk --cache-type-k -ctv --cache-type-v",
     "the KV cache is float32 (clover inspect -ctk f16|q8_0 estimates llama.cpp's sizes)")
_add("-kvu --kv-unified -nkvo --no-kv-offload", "each sequence has its own float32 KV cache")
_add("-b --batch-size -ub --ubatch-size", "prompts are processed in chunks of 512 tokens")
_add("-tb --threads-batch", "-t sets the threads for prompt and generation alike")
_add("--mlock --numa", "clover does not lock pages or place them by NUMA node")
_add("-hf -hfr --hf-repo", "give the model as MODEL: owner/repo[:QUANT]")
_add("-hff --hf-file", "give the model as MODEL: owner/repo[:QUANT], or clover pull --file NAME")
_add("-hft --hf-token", "set HF_TOKEN (clover pull also takes --hf-token)")
_add("-sysf --system-prompt-file", 'use -sys "$(cat FILE)", or /system at the prompt')
_add("-r --reverse-prompt --in-prefix --in-suffix", "stop at the end of the model's turn")
_add("-co --color", "colour follows the terminal; turn it off with --no-color or NO_COLOR=1")
_add("--simple-io --log-disable --log-file -lv --verbosity", "logs go to stderr; -v shows more")
_add("--mmproj --image --audio", "Clover models are text only")
_add("--lora --lora-scaled --control-vector", "clover runs the model file as it is")
_add("-md --model-draft --spec-draft-n-max --draft-max --draft-min",
     "block diffusion already drafts many tokens per forward pass")
_add("--rope-scaling --rope-scale --rope-freq-base --rope-freq-scale --yarn-orig-ctx",
     "RoPE settings come from the model file")
_add("--grammar --grammar-file -j --json-schema", "constrained output is not supported")
_add("--mirostat --mirostat-lr --mirostat-ent --dry-multiplier --xtc-probability --typical "
     "--repeat-last-n --ignore-eos --samplers",
     "clover samples with temperature, top-k, top-p, min-p and the penalties")
_add("-cb --cont-batching --cache-prompt --no-cache-prompt", "the server batches its -np sequences itself")
_add("--metrics --slots --no-slots --props --slot-save-path", "clover serve's endpoints are always on")
_add("--fit -fit -fitt --fit-target -fitc --fit-ctx", "clover checks the memory fit itself (clover inspect --fit)")
_add("--diffusion-steps --diffusion-algorithm --diffusion-eps --diffusion-alg-temp",
     "clover reveals by confidence: see --threshold and --block-length")
_add("--diffusion-visual", "use --visual")

# llama.cpp flags that change nothing in clover: run, serve and bench warn in one line and go on, so
# a pasted llama-cli / llama-server / llama-bench command line runs. flag -> (its value, why)
# where the value is None (a switch), "required" (the next word) or a regex the next word may match.
IGNORED: dict[str, tuple[str | None, str]] = {}
RUNNERS = ("run", "serve", "bench")
_SWITCH = r"^(on|off|auto|enabled|disabled|true|false|[01](,[01])*)$"


def _ignore(names: str, value: str | None, why: str) -> None:
    for name in names.split():
        IGNORED[name] = (value, why)


_ignore("--jinja", None, _TEMPLATE)
_ignore("-fa --flash-attn", _SWITCH, "clover has its own attention kernels")
_ignore("--mlock", None, "clover does not lock pages (--no-mmap reads the weights into memory)")
_ignore("--numa", "required", "clover leaves NUMA placement to the operating system")
_ignore("-cnv --conversation", None, "`clover run` without a prompt is already a conversation")
_ignore("-b --batch-size -ub --ubatch-size", "required", "prompts are processed in chunks of 512 tokens")
_ignore("-cb --cont-batching", None, "the server batches its -np sequences itself")
_ignore("--metrics --slots", None, "clover serve's endpoints are always on")
_ignore("-kvu --kv-unified", None, "each sequence has its own KV cache")

GLOBAL_FLAGS = ("-v", "--verbose", "--no-color")


class MissingFlag(Exception):
    """A llama.cpp flag clover does not take, with the line that says what to do instead."""

    def __init__(self, command: str, flag: str) -> None:
        self.command = command
        self.message = f"clover {command} has no {flag} yet: {MISSING[flag]}"
        super().__init__(self.message)


def _takes_value(cmd: Any) -> dict[str, bool]:
    """Every option name of a click command, and whether it reads the next word as its value."""
    names: dict[str, bool] = {}
    for param in getattr(cmd, "params", []):
        if getattr(param, "param_type_name", "") != "option":
            continue
        value = not (param.is_flag or param.count)
        for name in (*param.opts, *param.secondary_opts):
            names[name] = value
    return names


def rewrite(args: Sequence[str], group: Any, warn: Callable[[str], None] | None = None) -> list[str]:
    """`args` with global flags given after a subcommand moved before it and the llama.cpp flags that
    change nothing here dropped (each said to `warn`, one line); raises MissingFlag for a llama.cpp
    flag the subcommand does not take."""
    args = list(args)
    root = _takes_value(group)
    i = 0
    while i < len(args) and args[i].startswith("-") and args[i] != "--":
        i += 1 + (1 if root.get(args[i]) else 0)
    if i >= len(args) or args[i] not in getattr(group, "commands", {}):
        return args
    name = args[i]
    own = _takes_value(group.commands[name])
    head, tail, moved = args[:i + 1], [], []
    j = i + 1
    while j < len(args):
        word = args[j]
        if word == "--":
            tail += args[j:]
            break
        flag = word.split("=", 1)[0] if word.startswith("--") else word
        if flag in own:
            tail.append(word)
            if own[flag] and "=" not in word and j + 1 < len(args):
                tail.append(args[j + 1])
                j += 1
        elif flag in GLOBAL_FLAGS:
            moved.append(word)
        elif flag in IGNORED and name in RUNNERS:
            j, shown = _skip_ignored(args, j, flag)
            if warn is not None:
                warn(f"clover {name} ignores {shown}: {IGNORED[flag][1]}")
        elif flag in MISSING:
            raise MissingFlag(name, flag)
        else:
            tail.append(word)
        j += 1
    return head[:i] + moved + head[i:] + tail


def _skip_ignored(args: list[str], j: int, flag: str) -> tuple[int, str]:
    """The index of the last word an ignored flag takes (itself, or its value too) and the flag as
    given, for the warning."""
    value, _ = IGNORED[flag]
    word = args[j]
    if value is None or "=" in word or j + 1 >= len(args):
        return j, word
    following = args[j + 1]
    if value == "required" or re.match(value, following, re.IGNORECASE):
        return j + 1, f"{word} {following}"
    return j, word
