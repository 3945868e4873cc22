"""The offline example data and model: stdlib docstring sets that pass the upload validator, a
locally trained tokenizer with ChatML special tokens, and a Llama directory that `trainer.models.hf`
loads with its tokenizer."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from core.datasets.formats import check
from demos.docstrings import (
    SYSTEM,
    messages_records,
    preference_records,
    stdlib_functions,
    write_example_data,
)


def test_examples_pair_each_function_body_with_its_own_docstring() -> None:
    functions = stdlib_functions(limit=50)
    assert len(functions) == 50
    for f in functions:
        tree = ast.parse(f.code)
        node = tree.body[0]
        assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        assert ast.get_docstring(node) is None  # the docstring was taken out of the prompt
        assert f.docstring and f.docstring not in f.code
    first = messages_records(functions[:1])[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user", "assistant"]
    assert first[0]["content"] == SYSTEM
    assert (first[1]["content"], first[2]["content"]) == (functions[0].code, functions[0].docstring)


def test_preference_pairs_prefer_the_real_docstring_over_another_modules() -> None:
    functions = stdlib_functions(limit=96)
    pairs = preference_records(functions)
    assert len(pairs) == 48  # every other function gives a prompt, the rest the rejected
    by_doc = {f.docstring: f for f in functions}
    chosen = [p["chosen"][0]["content"] for p in pairs]
    rejected = [p["rejected"][0]["content"] for p in pairs]
    assert not set(chosen) & set(rejected)  # no answer is preferred in one pair, refused in another
    assert len(set(rejected)) == len(rejected)
    for pair, f in zip(pairs, functions[0::2], strict=True):
        assert pair["prompt"][-1]["content"] == f.code
        assert pair["chosen"][0]["content"] == f.docstring
        assert by_doc[pair["rejected"][0]["content"]].module != f.module


@pytest.mark.parametrize("fmt", ["messages", "prompt_completion", "preference"])
def test_written_files_pass_the_upload_validation_as_their_format(tmp_path: Path, fmt: str) -> None:
    data = write_example_data(tmp_path, limit=60)
    path = getattr(data, fmt)
    checked = check(
        str(path), declared=None, token_dtype=None, max_record_bytes=1 << 20, where=("file",)
    )
    assert checked.format == fmt
    records = len(path.read_text().splitlines())
    assert data.num_examples == 60
    assert records == (30 if fmt == "preference" else 60)


def test_offline_model_dir_loads_as_an_hf_model_with_a_chatml_tokenizer(tmp_path: Path) -> None:
    from dataformat.chat import CHATML_SPECIAL_TOKENS
    from demos.offline_llama import ModelShape, build_model_dir, stdlib_texts
    from jobspec.job import ModelSpec
    from trainer.models.hf import build_hf_model, load_tokenizer

    shape = ModelShape(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=128)  # fmt: skip
    out = build_model_dir(tmp_path / "m", vocab_size=400, shape=shape, texts=stdlib_texts()[:3])
    spec = ModelSpec(kind="hf", hf={"path_or_id": str(out)}, seq_len=128)
    tokenizer = load_tokenizer(spec)
    assert tokenizer is not None and len(tokenizer) == 400
    for special in CHATML_SPECIAL_TOKENS:  # one id each, never split by BPE
        assert len(tokenizer.encode(special, add_special_tokens=False)) == 1
    messages = [{"role": "user", "content": "def f(): x"}, {"role": "assistant", "content": "F."}]
    text = tokenizer.apply_chat_template(messages, tokenize=False)
    assert text == "<|im_start|>user\ndef f(): x<|im_end|>\n<|im_start|>assistant\nF.<|im_end|>\n"

    model = build_hf_model(spec, device=torch.device("cpu"), seed=0)
    assert model.config.vocab_size == 400 and model.config.model_type == "llama"
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 1
