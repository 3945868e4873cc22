"""A small Hugging Face model and tokenizer built offline, for the chat SFT and DPO examples.

No hub is needed: a byte-level BPE tokenizer (GPT-2's pre-tokenization, Sennrich et al. 2016)
is trained with `tokenizers` on Python standard-library sources, wrapped as a
`transformers.PreTrainedTokenizerFast` whose ChatML markers (`<|im_start|>`, `<|im_end|>`) are
special tokens and whose `chat_template` is ChatML (`dataformat.chat.CHATML`); a small Llama
(`LlamaConfig`, Touvron et al. 2023) with random weights drawn from `seed` is built from a
config. Both are written with `save_pretrained` into one directory, so a job spec's
``model: {kind: hf, hf: {path_or_id: DIR}}`` loads the model and its tokenizer.

    python -m demos.offline_llama DIR [--vocab-size 1024] [--hidden-size 64] ...

Not in the trainer (what jobs run) nor in the client (`torchyard`, which must not import torch,
`tokenizers` or `transformers`): ``torchyard quickstart --example`` runs it as a process.
"""

from __future__ import annotations

import argparse
import sysconfig
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from dataformat.chat import CHATML, CHATML_SPECIAL_TOKENS

PAD_TOKEN = "<|endoftext|>"
#: Standard-library modules (as ``name.py`` paths) the tokenizer learns its merges from.
TOKENIZER_MODULES = (
    "textwrap", "shlex", "string", "fnmatch", "posixpath", "difflib", "calendar", "base64",
    "glob", "ntpath", "statistics", "heapq", "inspect", "tarfile", "shutil", "locale",
    "urllib/parse", "email/utils", "json/encoder", "json/decoder",
)  # fmt: skip


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The Llama's size (`LlamaConfig` fields)."""

    hidden_size: int = 64
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 128
    max_position_embeddings: int = 512


def stdlib_texts(modules: Sequence[str] = TOKENIZER_MODULES) -> list[str]:
    """The source text of each of `modules` this Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    paths = [root / f"{m}.py" for m in modules]
    return [p.read_text(encoding="utf-8") for p in paths if p.is_file()]


def train_tokenizer(texts: Iterable[str], *, vocab_size: int) -> Any:
    """A byte-level BPE of `vocab_size` ids (special tokens included) trained on `texts`, as
    a `PreTrainedTokenizerFast`: eos `<|im_end|>` (ends each ChatML turn), pad
    `<|endoftext|>`, `chat_template` ChatML. Deterministic for the same texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[PAD_TOKEN, *CHATML_SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(list(texts), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=CHATML_SPECIAL_TOKENS[1],
        pad_token=PAD_TOKEN,
        chat_template=CHATML,
    )


def build_llama(tokenizer: Any, shape: ModelShape, *, seed: int) -> Any:
    """A `LlamaForCausalLM` of `shape` over `tokenizer`'s ids, fp32, weights from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_attention_heads,
        max_position_embeddings=shape.max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return LlamaForCausalLM(config)


def build_model_dir(
    out: Path,
    *,
    vocab_size: int = 1024,
    shape: ModelShape | None = None,
    seed: int = 0,
    texts: Iterable[str] | None = None,
) -> Path:
    """Write the tokenizer (`train_tokenizer` on `texts`, default `stdlib_texts()`) and a
    Llama of `shape` (`build_llama`) into `out` with `save_pretrained`; returns `out`."""
    tokenizer = train_tokenizer(stdlib_texts() if texts is None else texts, vocab_size=vocab_size)
    model = build_llama(tokenizer, shape or ModelShape(), seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out


def main(argv: list[str] | None = None) -> None:
    defaults = ModelShape()
    parser = argparse.ArgumentParser(
        prog="python -m demos.offline_llama", description=__doc__.split("\n")[0]
    )
    parser.add_argument("out", type=Path, help="directory to write the model and tokenizer to")
    parser.add_argument("--vocab-size", type=int, default=1024)
    parser.add_argument("--hidden-size", type=int, default=defaults.hidden_size)
    parser.add_argument("--layers", type=int, default=defaults.num_hidden_layers)
    parser.add_argument("--heads", type=int, default=defaults.num_attention_heads)
    parser.add_argument("--intermediate-size", type=int, default=defaults.intermediate_size)
    parser.add_argument("--max-positions", type=int, default=defaults.max_position_embeddings)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    shape = ModelShape(
        hidden_size=args.hidden_size,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_positions,
    )
    out = build_model_dir(args.out, vocab_size=args.vocab_size, shape=shape, seed=args.seed)
    print(out)


if __name__ == "__main__":
    main()
