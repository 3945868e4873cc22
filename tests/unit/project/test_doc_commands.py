"""Every `torchyard ...` command the docs show is one the CLI accepts (issue 46: the README
documented `torchyard submit eval.yaml --wait`, a flag `submit` never had).

Each command line of a code block of README.md and docs/**/*.md (a shell line, a `$ ` console
line, a comment naming a command) is parsed by the real typer app without running it: the
group path must name a command, and that command's click parser (`make_context`) must accept
the arguments and options as written. Placeholders a reader replaces (`<job>`, `ID`, `ds_...`)
are given a sample value of the parameter's type. Inline `torchyard ...` spans of the prose are
held to the same, except that they may leave out required arguments (`torchyard submit --code
DIR` names an option, not a whole command).
"""

from __future__ import annotations

import re
import shlex
import typing
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

import pytest
import typer.main
from typer._click.exceptions import MissingParameter, UsageError
from typer.core import TyperArgument, TyperOption

from torchyard.cli import app

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```([\w-]*)[^\n]*\n(.*?)^```", re.S | re.M)
# Blocks that hold no shell: code, and the usage synopses of the generated CLI reference.
NOT_SHELL = {"python", "py", "text", "json"}
INLINE = re.compile(r"(?<!`)`(torchyard [^`\n]+)`")
# `torchyard` as a command word (not `torchyard.train`, `torchyard/cli`, `from torchyard import`).
COMMAND = re.compile(r"(?<![\w./$-])torchyard(?=[ \t]+[a-z\[<-])")
SHELL_STOPS = {";", "|", "||", "&", "&&", ">", ">>", "<", "(", ")"}
ROOT_OPTIONS = {"--url", "--api-key"}
ALTERNATIVE = "\x00"


@dataclass(frozen=True)
class DocCommand:
    where: str  # file:line
    text: str  # as written, from `torchyard` to the end of the command
    whole: bool  # a code block's line (all required arguments given), not an inline mention


def doc_commands(path: Path) -> list[DocCommand]:
    """The `torchyard` commands of `path`: each in a code block line, then each inline span."""
    text = path.read_text()
    found = []
    where = str(path.relative_to(ROOT))
    for block in FENCE.finditer(text):
        if block.group(1) in NOT_SHELL:
            continue
        first = text[: block.start(2)].count("\n") + 1
        for offset, line in enumerate(block.group(2).splitlines()):
            for match in COMMAND.finditer(line):
                command = line[match.start() :].split("`")[0]  # a comment's inline span ends
                found.append(DocCommand(f"{where}:{first + offset}", command, True))
    for span in INLINE.finditer(text):
        line = text[: span.start()].count("\n") + 1
        found.append(DocCommand(f"{where}:{line}", span.group(1), False))
    return found


def words(command: str) -> list[str]:
    """The words of `command` after `torchyard`, up to the first shell operator or comment;
    `<name>` placeholders as NAME, optional `[--flag]` brackets dropped."""
    command = re.sub(r"<([\w-]+)>", lambda m: m.group(1).upper(), command)
    # `submit|list`, `DIR|FILE`: alternatives, one word (a pipe is spaced: `... | head`)
    command = re.sub(r"(?<=[\w-])\|(?=[\w-])", ALTERNATIVE, command)
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    out: list[str] = []
    for token in list(lexer)[1:]:
        if token in SHELL_STOPS:
            break
        token = token.replace(ALTERNATIVE, "|")
        out.append(token[1:-1] if token.startswith("[") and token.endswith("]") else token)
    return [word for word in out if word != "--help"]


def is_placeholder(word: str) -> bool:
    """A value the reader fills in: `ID`, `JOB_ID`, `DIR|FILE`, `ds_...`, `mem_...`."""
    return bool(re.fullmatch(r"[A-Z][A-Z0-9_]*(\|[A-Z][A-Z0-9_]*)*", word)) or "..." in word


def sample(param: Any, word: str) -> str:
    """`word`, or for a placeholder a value of `param`'s type (an id is an int). A path that
    must exist is given one of the kind it takes: the docs' `./my_trainer` is on the reader's
    disk, not on this one."""
    descriptor = param.type_descriptor
    info = descriptor.parameter_info
    if getattr(info, "exists", False):
        return str(ROOT / "README.md") if info.file_okay else str(ROOT)
    if not is_placeholder(word):
        return word
    if descriptor.is_choice and descriptor.choices:
        return str(descriptor.choices[0])
    kind = descriptor.annotation
    while typing.get_args(kind):  # `int | None`, `list[int]`: the value's own type
        kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
    if isinstance(kind, type) and issubclass(kind, Enum):
        return str(next(iter(kind)).value)
    return {int: "1", float: "1.0"}.get(kind, word)


def with_samples(command: Any, args: list[str]) -> list[str]:
    """`args` with each placeholder replaced by a sample for the parameter it binds to."""
    options = {
        name: param
        for param in command.params
        if isinstance(param, TyperOption)
        for name in (*param.opts, *param.secondary_opts)
    }
    positional = [param for param in command.params if isinstance(param, TyperArgument)]
    out, index, takes = [], 0, None
    for word in args:
        if takes is not None:
            out.append(sample(takes, word))
            takes = None
        elif word.startswith("-") and word != "-":
            param = options.get(word.split("=", 1)[0])
            if param is not None and not param.is_flag and "=" not in word:
                takes = param
            out.append(word)
        elif index < len(positional):
            out.append(sample(positional[index], word))
            index += positional[index].nargs == 1
        else:
            out.append(word)
    return out


def problem(doc: DocCommand) -> str | None:
    """Why the CLI would refuse `doc`, or None when it accepts it."""
    args = words(doc.text)
    command: Any = typer.main.get_command(app)
    path = ["torchyard"]
    while args and args[0] in ROOT_OPTIONS:
        args = args[2:]
    while getattr(command, "commands", None):
        if not args:
            return f"'{' '.join(path)}' needs a command" if doc.whole else None
        names = args.pop(0).split("|")  # `sweep submit|list|show`: each must exist
        if is_placeholder(names[0]) and not doc.whole:
            return None  # `torchyard COMMAND --help`
        missing = [name for name in names if name not in command.commands]
        if missing:
            return f"'{' '.join(path)}' has no command {missing[0]!r}"
        if len(names) > 1:
            return None
        command = command.commands[names[0]]
        path.append(names[0])
    prompted = [p.opts[0] for p in command.params if getattr(p, "prompt", None)]
    if not doc.whole and any(option not in args for option in prompted):
        return None  # `torchyard login` asks for what it was not given: nothing to parse
    try:
        command.make_context(" ".join(path), with_samples(command, args))
    except MissingParameter as exc:
        return None if not doc.whole else f"'{' '.join(path)}': {exc.format_message()}"
    except UsageError as exc:
        return f"'{' '.join(path)}': {exc.format_message()}"
    return None


COMMANDS = [doc for path in DOCS for doc in doc_commands(path)]


def test_the_extraction_finds_the_docs_commands() -> None:
    """The check below runs over these: the README's tour, the guides and the CLI reference."""
    texts = [doc.text for doc in COMMANDS if doc.whole]
    assert len(texts) > 50
    assert any(text.startswith("torchyard sweep submit sweep.yaml --wait") for text in texts)
    assert any(doc.where.startswith("docs/reference/cli.md") for doc in COMMANDS)
    assert any(doc.where.startswith("README.md") and doc.whole for doc in COMMANDS)


@pytest.mark.parametrize("doc", COMMANDS, ids=[f"{d.where} {d.text[:60]}" for d in COMMANDS])
def test_every_command_in_the_docs_is_accepted_by_the_cli(doc: DocCommand) -> None:
    assert problem(doc) is None, f"{doc.where}: {doc.text!r}: {problem(doc)}"


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        ("torchyard submit eval.yaml --wait", "No such option: --wait"),
        ("torchyard sweep submit sweep.yaml --wait", None),
        ("torchyard evals <job> [--answers]", None),
        ("torchyard export JOB_ID CHECKPOINT_ID --out m.safetensors", None),
        ("torchyard show abc", "Invalid value"),
        ("torchyard up", "has no command 'up'"),
        ("torchyard datasets frobnicate x", "has no command 'frobnicate'"),
        ("torchyard logs 1 --grep 'loss|Error' --since 10m | head", None),
        ("torchyard pause 7; torchyard resume 7", None),
        ("torchyard cancel", "Missing argument"),
    ],
)
def test_the_check_refuses_what_the_cli_refuses(line: str, refused: str | None) -> None:
    found = problem(DocCommand("sample", line, whole=True))
    if refused is None:
        assert found is None
    else:
        assert found is not None and refused in found


def test_an_inline_mention_may_leave_out_required_arguments_but_not_invent_options() -> None:
    assert problem(DocCommand("sample", "torchyard submit --code DIR", whole=False)) is None
    assert problem(DocCommand("sample", "torchyard submit --wait", whole=False)) is not None
    assert problem(DocCommand("sample", "torchyard sweep submit|list|best", whole=False)) is None
    assert problem(DocCommand("sample", "torchyard sweep submit|wait", whole=False)) is not None
