"""Real instruction and preference data built offline from the Python standard library.

Each documented function of a few stdlib modules (read as source with `ast`, never imported)
becomes one example: the prompt is the function's signature and body without its docstring,
the completion is its real docstring. From those:

- `messages_records`: chat examples (system, user = code, assistant = docstring), the
  `messages` format (the OpenAI chat fine-tuning shape);
- `prompt_completion_records`: the same as `prompt_completion` records;
- `preference_records`: TRL's `{prompt, chosen, rejected}` with chosen = the real docstring and
  rejected = the docstring of another function (the next one, cyclically).

Standard library only (the client's quickstart imports it, and the client stays light):
``python -m demos.docstrings OUT_DIR`` writes the three JSONL files.
"""

from __future__ import annotations

import argparse
import ast
import json
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Modules whose functions make the examples: small, well documented, pure Python.
MODULES = (
    "textwrap", "shlex", "string", "fnmatch", "posixpath", "difflib", "calendar", "base64",
    "glob", "ntpath", "statistics", "heapq", "bisect", "colorsys", "html/__init__",
    "json/decoder", "json/encoder", "urllib/parse", "email/utils", "gettext", "locale",
    "quopri", "uu", "webbrowser", "zipfile/__init__", "tarfile", "shutil", "inspect",
)  # fmt: skip
SYSTEM = "You write the docstring of a Python function."
STDLIB = Path(sysconfig.get_paths()["stdlib"])


@dataclass(frozen=True)
class Function:
    """One documented function: its code without the docstring, and the docstring."""

    module: str
    code: str
    docstring: str


def stdlib_sources(modules: Sequence[str] = MODULES) -> list[Path]:
    """The source files of `modules` that this Python has (``name.py`` under the stdlib)."""
    return [p for p in (STDLIB / f"{m}.py" for m in modules) if p.is_file()]


def stdlib_functions(
    modules: Sequence[str] = MODULES,
    *,
    limit: int = 400,
    max_code_chars: int = 700,
    max_doc_chars: int = 300,
) -> list[Function]:
    """Documented functions of `modules`, in source order, at most `limit`; only those whose
    code (without docstring) and docstring fit `max_code_chars` / `max_doc_chars` (so an
    example fits a short context), whose body is more than the docstring, and whose
    docstring no earlier one has (an override often repeats its parent's)."""
    out: list[Function] = []
    seen: set[str] = set()
    for path in stdlib_sources(modules):
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2 or len(doc) > max_doc_chars or doc in seen:
                continue
            node.body = node.body[1:]
            code = ast.unparse(node)
            if len(code) > max_code_chars:
                continue
            seen.add(doc)
            out.append(Function(path.stem, code, doc))
            if len(out) >= limit:
                return out
    return out


def messages_records(functions: Sequence[Function]) -> list[dict[str, Any]]:
    """`messages` records: system instruction, user = the code, assistant = the docstring."""
    return [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": f.code},
                {"role": "assistant", "content": f.docstring},
            ]
        }
        for f in functions
    ]


def prompt_completion_records(functions: Sequence[Function]) -> list[dict[str, Any]]:
    """`prompt_completion` records: prompt = the code, completion = the docstring."""
    return [{"prompt": f.code + "\n", "completion": f.docstring} for f in functions]


def preference_records(functions: Sequence[Function]) -> list[dict[str, Any]]:
    """`preference` records (TRL's conversational shape): chosen = a function's real
    docstring, rejected = the docstring of a function of another module.

    The functions alternate between the two roles (even positions give prompt and chosen, odd
    ones the rejected answers, each used once), so no docstring is both preferred and
    rejected, and both roles come from the same modules: nothing but the code in the prompt
    tells a model which answer is the right one. A function left without a partner (of
    another module, with another docstring) is left out.
    """
    chosen_side, pool = functions[0::2], list(functions[1::2])
    used = [False] * len(pool)
    out = []
    for k, f in enumerate(chosen_side):
        order = [(k + len(pool) // 2 + i) % len(pool) for i in range(len(pool))]
        match = next(
            (
                j
                for j in order
                if not used[j] and pool[j].module != f.module and pool[j].docstring != f.docstring
            ),
            None,
        )
        if match is None:
            continue
        used[match] = True
        out.append(
            {
                "prompt": [
                    {"role": "system", "content": SYSTEM},
                    {"role": "user", "content": f.code},
                ],
                "chosen": [{"role": "assistant", "content": f.docstring}],
                "rejected": [{"role": "assistant", "content": pool[match].docstring}],
            }
        )
    return out


def write_jsonl(path: Path, records: Sequence[dict[str, Any]]) -> Path:
    """`records` as JSON Lines at `path` (UTF-8, one object a line); returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path


@dataclass(frozen=True)
class ExampleData:
    """The files `write_example_data` wrote."""

    messages: Path
    prompt_completion: Path
    preference: Path
    num_examples: int  # messages and prompt_completion records


def write_example_data(
    out_dir: Path, *, limit: int = 400, preference_functions: int = 96
) -> ExampleData:
    """Write ``docstrings.messages.jsonl``, ``docstrings.prompt_completion.jsonl`` (up to
    `limit` functions) and ``docstrings.preference.jsonl`` (pairs from the first
    `preference_functions` of them: a set the example's small model learns in minutes)."""
    functions = stdlib_functions(limit=limit)
    return ExampleData(
        messages=write_jsonl(out_dir / "docstrings.messages.jsonl", messages_records(functions)),
        prompt_completion=write_jsonl(
            out_dir / "docstrings.prompt_completion.jsonl", prompt_completion_records(functions)
        ),
        preference=write_jsonl(
            out_dir / "docstrings.preference.jsonl",
            preference_records(functions[:preference_functions]),
        ),
        num_examples=len(functions),
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir", type=Path, help="directory for the three JSONL files")
    parser.add_argument("--limit", type=int, default=400, help="functions at most")
    args = parser.parse_args(argv)
    data = write_example_data(args.out_dir, limit=args.limit)
    for path in (data.messages, data.prompt_completion, data.preference):
        print(path)


if __name__ == "__main__":
    main()
