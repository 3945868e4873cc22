"""The Tinker client's protobuf schema, as the installed `tinker` package ships it (issue 47).

The official client (`tinker==0.38.0`) sends `forward_backward` as a protobuf
`ForwardBackwardRequest` and reads its result as a `ForwardBackwardOutput`
(docs/TINKER-WIRE.md). The schema is the client's own generated module,
`tinker/proto/tinker_public_pb2.py`, loaded here by its path: importing the `tinker` package
would import its whole client (httpx, transformers), and a copy of the schema would drift from
it. Only `google.protobuf` is needed to load it. Both sides use it: the API reads a call's
`model_id` and `seq_id` (`api.routes.tinker_api.calls`), the session program decodes the data
and encodes
its answer (`trainer.session`).

A body the client compressed (`proto_compress_fwdbwd`; zstd, `Content-Encoding: zstd`) is
recognised by the zstd frame's magic bytes and decompressed first (`decompress`).
"""

from __future__ import annotations

import functools
import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import zstandard

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
SCHEMA_FILE = ("proto", "tinker_public_pb2.py")
MAX_BODY_BYTES = 512 * 2**20  # what a decompressed call may hold at most


class WireError(ValueError):
    """A body that is not the message it should be (the client's mistake: Tinker's `user`)."""


@functools.cache
def schema() -> ModuleType:
    """The `tinker_public_pb2` module of the installed `tinker` package, loaded by path.
    Raises `ModuleNotFoundError` when `tinker` is not installed."""
    found = importlib.util.find_spec("tinker")
    if found is None or not found.submodule_search_locations:
        raise ModuleNotFoundError("the tinker package (its protobuf schema) is not installed")
    path = Path(next(iter(found.submodule_search_locations)), *SCHEMA_FILE)
    spec = importlib.util.spec_from_file_location("tinker_public_pb2", path)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no protobuf schema at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decompress(body: bytes) -> bytes:
    """`body` itself, or its content when it is a zstd frame (the client's compressed
    `forward_backward`). Raises `WireError` for a broken frame or one over `MAX_BODY_BYTES`."""
    if not body.startswith(ZSTD_MAGIC):
        return body
    try:
        return zstandard.ZstdDecompressor().decompress(body, max_output_size=MAX_BODY_BYTES)
    except zstandard.ZstdError as exc:
        raise WireError(f"the zstd body cannot be decompressed: {exc}") from exc


def forward_backward_request(body: bytes) -> Any:
    """The `ForwardBackwardRequest` of a `forward_backward` body (zstd or not). Raises
    `WireError` when it does not parse."""
    message = schema().ForwardBackwardRequest()
    try:
        message.ParseFromString(decompress(body))
    except Exception as exc:  # protobuf's DecodeError, or a C++ parse error as RuntimeError
        raise WireError(f"not a ForwardBackwardRequest: {exc}") from exc
    return message
