"""Real, offline SFT data for the tests: an instruction set built from the standard library
(prompt: a function's signature and body; completion: its real docstring), the same as chat
messages, and a byte-level BPE tokenizer trained on it (`tokenizers`) with a ChatML template;
and `prepare`, which runs `trainer.data.prep.prepare_rows` on a spec as a job would."""

from __future__ import annotations

import ast
import functools
import inspect
import json
from pathlib import Path
from typing import Any

from jobspec.job import JobSpec
from trainer.data.prep import PreparedRows, prepare_rows
from trainer.events import EventWriter

STDLIB_MODULES = (
    "textwrap",
    "shlex",
    "string",
    "fnmatch",
    "posixpath",
    "difflib",
    "calendar",
    "base64",
)
SYSTEM = "You write the docstring of a Python function."


def data_spec(location: Path, **data: Any) -> JobSpec:
    """A job spec whose data is `location`; `seq_len` goes to the model, the rest to `data`."""
    return JobSpec.model_validate(
        {"name": "sft", "model": {"seq_len": data.pop("seq_len", 2048)},
         "data": {"uri": str(location), "max_truncated_share": 0.5, **data}}
    )  # fmt: skip


def prepare(root: Path, spec: JobSpec, tokenizer: Any = None, **kw: Any) -> PreparedRows:
    """`prepare_rows` for `spec` with its cache in `root/cache` and its events in
    `root/run/events.jsonl`; `kw` goes to `prepare_rows` (e.g. `eval_location`)."""
    reporter = EventWriter(root / "run", attempt=1)
    try:
        return prepare_rows(
            spec, str(spec.data.uri), tokenizer, cache_dir=root / "cache", dist=None,
            reporter=reporter, **kw,
        )  # fmt: skip
    finally:
        reporter.close()


def stdlib_functions(limit: int = 200) -> list[tuple[str, str]]:
    """(code without its docstring, docstring) of documented stdlib functions, in order."""
    import importlib

    out: list[tuple[str, str]] = []
    for name in STDLIB_MODULES:
        tree = ast.parse(inspect.getsource(importlib.import_module(name)))
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2:
                continue
            node.body = node.body[1:]
            out.append((ast.unparse(node), doc))
            if len(out) >= limit:
                return out
    return out


def prompt_completion_records(limit: int = 200) -> list[dict[str, Any]]:
    return [{"prompt": code + "\n", "completion": doc} for code, doc in stdlib_functions(limit)]


def messages_records(limit: int = 200) -> list[dict[str, Any]]:
    return [
        {
            "messages": [
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": code},
                {"role": "assistant", "content": doc},
            ]
        }
        for code, doc in stdlib_functions(limit)
    ]


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@functools.cache
def bpe_tokenizer(vocab_size: int = 600) -> Any:
    """A byte-level BPE trained on the stdlib set, as a `PreTrainedTokenizerFast` whose
    `<|im_start|>`/`<|im_end|>` are special tokens and whose template is ChatML."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from dataformat.chat import CHATML, CHATML_SPECIAL_TOKENS

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", *CHATML_SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    texts = [code + doc for code, doc in stdlib_functions()]
    tok.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )


def preference_records(limit: int = 200) -> list[dict[str, Any]]:
    """Chosen: the function's real docstring; rejected: the next function's."""
    functions = stdlib_functions(limit)
    return [
        {
            "prompt": [{"role": "user", "content": code}],
            "chosen": [{"role": "assistant", "content": doc}],
            "rejected": [{"role": "assistant", "content": functions[(i + 1) % len(functions)][1]}],
        }
        for i, (code, doc) in enumerate(functions)
    ]
