"""Byte-level text data: tokenizer, corpus loading, train/eval split, chunks, baseline.

A token is a byte of the UTF-8 encoding (ids 0..255), so any file is valid input and the
vocabulary is fixed. The corpus is a file or a directory (local path via `pathlib`, any
other URI via `fsspec`); a directory's files are those matching `spec.data.include`, read
in sorted relative-path order up to `max_bytes`.

Split: in a directory, whole documents go to evaluation, chosen by a hash of their relative
path (so the split does not move when files are added); a single file splits by position
(the last `eval_fraction` of its bytes). Each side is concatenated and cut into
non-overlapping chunks of `seq_len + 1` tokens: inputs are `chunk[:-1]`, targets `chunk[1:]`
(`trainer.rows.Rows.from_chunks`).
"""

from __future__ import annotations

import fnmatch
import functools
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import fsspec
import torch
from torch import Tensor

from trainer.errors import InvalidJobError
from trainer.model import VOCAB_SIZE
from trainer.spec import DataSpec


def encode(text: str) -> list[int]:
    """Text -> token ids: its UTF-8 bytes."""
    return list(text.encode("utf-8"))


def decode(ids: list[int] | Tensor) -> str:
    """Token ids -> text; byte sequences that are not valid UTF-8 become U+FFFD."""
    values = ids.tolist() if isinstance(ids, Tensor) else ids
    return bytes(values).decode("utf-8", errors="replace")


@dataclass(frozen=True)
class Corpus:
    """Token streams of the two sides of the split, each (N,) uint8."""

    train: Tensor
    eval: Tensor
    num_train_docs: int
    num_eval_docs: int


def is_uri(location: str) -> bool:
    return "://" in location


def load_corpus(location: str, spec: DataSpec) -> Corpus:
    """Read and split the corpus at `location` (file or directory, path or fsspec URI).

    Raises `InvalidJobError` when the location does not exist, selects no file, or is empty.
    """
    docs = _read_documents(location, spec)
    if sum(len(data) for _, data in docs) == 0:
        raise InvalidJobError(f"the corpus at {location!r} is empty")
    if len(docs) == 1:
        data = docs[0][1]
        n_eval = max(1, math.floor(len(data) * spec.eval_fraction))
        return Corpus(_tokens([data[:-n_eval]]), _tokens([data[-n_eval:]]), 1, 1)
    is_eval = [_eval_score(rel) < spec.eval_fraction for rel, _ in docs]
    if not any(is_eval):  # few documents: hold out the one the hash ranks first
        is_eval[min(range(len(docs)), key=lambda i: _eval_score(docs[i][0]))] = True
    if all(is_eval):
        is_eval[max(range(len(docs)), key=lambda i: _eval_score(docs[i][0]))] = False
    train = [data for (_, data), e in zip(docs, is_eval, strict=True) if not e]
    held = [data for (_, data), e in zip(docs, is_eval, strict=True) if e]
    return Corpus(_tokens(train), _tokens(held), len(train), len(held))


def _eval_score(rel_path: str) -> float:
    """A stable number in [0, 1) from a document's relative path; < eval_fraction -> eval."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _tokens(parts: list[bytes]) -> Tensor:
    return torch.frombuffer(bytearray(b"".join(parts)), dtype=torch.uint8)


def _read_documents(location: str, spec: DataSpec) -> list[tuple[str, bytes]]:
    """(relative path, bytes) of each selected document in sorted order, capped at max_bytes."""
    budget = spec.max_bytes if spec.max_bytes is not None else math.inf
    docs: list[tuple[str, bytes]] = []
    reader = _fsspec_documents if is_uri(location) else _local_documents
    documents = [
        (rel, read)
        for rel, read in reader(location, spec.include)
        if not any(fnmatch.fnmatchcase(rel, pattern) for pattern in spec.exclude)
    ]
    if not documents:
        raise InvalidJobError(f"every file under {location!r} matches data.exclude")
    for rel, read in documents:
        if budget <= 0:
            break
        data = read()
        if len(data) > budget:
            data = data[: int(budget)]
        budget -= len(data)
        docs.append((rel, data))
    return docs


def _local_documents(location: str, include: list[str]) -> list[tuple[str, Callable[[], bytes]]]:
    root = Path(location)
    if root.is_file():
        return [(root.name, root.read_bytes)]
    if not root.is_dir():
        raise InvalidJobError(f"data location {location!r} does not exist")
    files = {p for pattern in include for p in root.glob(pattern) if p.is_file()}
    if not files:
        raise InvalidJobError(f"no file under {location!r} matches {include}")
    found = sorted((p.relative_to(root).as_posix(), p) for p in files)
    return [(rel, p.read_bytes) for rel, p in found]


def _fsspec_documents(location: str, include: list[str]) -> list[tuple[str, Callable[[], bytes]]]:
    fs, root = fsspec.core.url_to_fs(location)
    if fs.isfile(root):
        return [(root.rsplit("/", 1)[-1], lambda: fs.cat_file(root))]
    if not fs.isdir(root):
        raise InvalidJobError(f"data location {location!r} does not exist")
    root = root.rstrip("/")
    files = {p for pattern in include for p in fs.glob(f"{root}/{pattern}") if fs.isfile(p)}
    if not files:
        raise InvalidJobError(f"no file under {location!r} matches {include}")
    return [(p[len(root) + 1 :], functools.partial(fs.cat_file, p)) for p in sorted(files)]


def make_chunks(tokens: Tensor, seq_len: int, *, what: str) -> Tensor:
    """(N,) uint8 -> (N // (seq_len + 1), seq_len + 1) uint8 view of non-overlapping chunks.

    Raises `InvalidJobError` when not even one chunk fits (`what` names the side).
    """
    n = tokens.numel() // (seq_len + 1)
    if n == 0:
        raise InvalidJobError(
            f"the {what} split has {tokens.numel()} bytes, fewer than one chunk of "
            f"seq_len + 1 = {seq_len + 1}; give more data or a shorter model.seq_len"
        )
    return tokens[: n * (seq_len + 1)].view(n, seq_len + 1)


def unigram_cross_entropy(
    train: Tensor, eval_tokens: Tensor, vocab_size: int = VOCAB_SIZE
) -> float:
    """Cross-entropy in nats/token of `eval_tokens` under the token frequencies of `train`.

    The baseline a model must beat to have learned more than byte frequencies. Counts get
    add-one (Laplace) smoothing so a token unseen in training costs log(N + vocab_size), not
    inf. Token ids must be below `vocab_size` (256 for bytes).
    """
    counts = torch.bincount(train.long(), minlength=vocab_size).double() + 1.0
    log_p = torch.log(counts / counts.sum())
    eval_counts = torch.bincount(eval_tokens.long(), minlength=vocab_size).double()
    return float(-(eval_counts * log_p).sum() / eval_counts.sum())
