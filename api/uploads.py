"""Streaming multipart upload of one file, straight to a directory, with a size limit.

Starlette's form parser spools a whole upload to a temporary file before the route sees it; this
parser (python-multipart, as Starlette uses) writes each chunk to `<root>/<sanitised filename>`
as it arrives (a dataset: `<storage>/datasets/<dataset id>/`; a code archive: a local temporary
directory), hashes it on the way, and stops with 413 (removing what it wrote) as soon as the
file passes the limit. The form's text fields are the caller's to name and validate.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import IO, Any, TypeVar

import fsspec
from anyio import to_thread
from fastapi import Request
from pydantic import BaseModel, ValidationError
from python_multipart.multipart import MultipartParser, parse_options_header
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from api import openai_examples, openapi_examples, schemas
from api.limits import content_length
from core.platform import storage
from core.platform.errors import InvalidInput, TooLarge

# Room for the multipart framing and the `name` field on top of the file itself.
MULTIPART_OVERHEAD = 64 * 1024
_MAX_NAME_BYTES = 1024
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

FormT = TypeVar("FormT", bound=BaseModel)


def form_body(form: type[BaseModel], *, file: str, example: Any) -> dict[str, Any]:
    """The `openapi_extra` of a route that parses its multipart body itself: `form`'s fields
    as its JSON schema states them (an optional field is left out, never null: a form has no
    null) beside one required `file` part described by `file`. `parse_form` validates by the
    same model, so the document and the validation cannot drift."""
    schema = form.model_json_schema()
    properties: dict[str, Any] = {}
    for key, prop in schema["properties"].items():
        prop = {k: v for k, v in prop.items() if k not in ("title", "default")}
        branches = [b for b in prop.pop("anyOf", []) if b != {"type": "null"}]
        properties[key] = {**(branches[0] if branches else {}), **prop}
    properties["file"] = {
        "type": "string",
        "format": "binary",
        "minLength": 1,
        "description": file,
    }
    body = {
        "type": "object",
        "required": [*schema.get("required", []), "file"],
        "properties": properties,
        "additionalProperties": False,
    }
    content = {"multipart/form-data": {"schema": body, "example": example}}
    return {"requestBody": {"required": True, "content": content}}


def parse_form(form: type[FormT], fields: dict[str, bytes]) -> FormT:
    """The text fields of an upload validated by `form`. Raises InvalidInput listing every
    field that is not UTF-8 or not valid (`loc` `["body", field, ...]`), all at once."""
    details: list[dict[str, Any]] = []
    text: dict[str, str] = {}
    for key, raw in fields.items():
        try:
            text[key] = raw.decode("utf-8")
        except UnicodeDecodeError:
            details.append(
                {"loc": ["body", key], "msg": "not valid UTF-8", "type": "string_unicode"}
            )
    try:
        parsed = form.model_validate(text)
    except ValidationError as exc:
        details += [
            {"loc": ["body", *e["loc"]], "msg": _message(e), "type": e["type"]}
            for e in exc.errors()
            if e["loc"] and e["loc"][0] not in {d["loc"][1] for d in details}
        ]
    if details:
        first = details[0]
        where = ".".join(map(str, first["loc"][1:]))
        more = f" (and {len(details) - 1} more)" if len(details) > 1 else ""
        raise InvalidInput(f"{where}: {first['msg']}{more}", details=details)
    return parsed


def _message(error: Any) -> str:
    """A pydantic error's message; a choice lists what it may be (`must be one of a, b or c`)."""
    if error["type"] == "literal_error":
        allowed = str(error["ctx"]["expected"]).replace("'", "")
        return f"must be one of {allowed} (got {error['input']!r})"
    return str(error["msg"])


DATASET_FIELDS = tuple(schemas.DatasetUploadForm.model_fields)
OPENAPI_BODY = form_body(
    schemas.DatasetUploadForm,
    file="The dataset file (JSONL, Parquet, .npy, .bin, UTF-8 text).",
    example=openapi_examples.DATASET_UPLOAD,
)

# `POST /openai/v1/files`: OpenAI's upload form.
OPENAI_FILE_BODY: dict[str, Any] = {
    "requestBody": {
        "required": True,
        "content": {
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "required": ["file", "purpose"],
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "minLength": 1,
                            "description": "JSONL: one example per line (messages, "
                            "prompt/completion or preference pairs).",
                        },
                        "purpose": {
                            "type": "string",
                            "enum": ["fine-tune"],
                            "description": "What the file is for; only `fine-tune`.",
                        },
                    },
                    "additionalProperties": False,
                },
                "example": openai_examples.FILE_UPLOAD,
            }
        },
    }
}


def safe_filename(raw: str) -> str:
    """The last path component of `raw`, reduced to `[A-Za-z0-9._-]`, no leading dots.

    `../../x` becomes `x`, `..` becomes `data`: the result never leaves its directory.
    """
    base = re.split(r"[\\/]", raw)[-1]
    base = _UNSAFE.sub("_", base).lstrip(".")[:200]
    return base or "data"


def _invalid(loc: list[str | int], msg: str, type_: str = "value_error") -> InvalidInput:
    return InvalidInput(
        f"{'.'.join(map(str, loc))}: {msg}", details=[{"loc": loc, "msg": msg, "type": type_}]
    )


@dataclass
class Upload:
    """A file written under the upload's root: its URI, size in bytes, sha256, the client's
    raw `filename`, and the text fields given (raw bytes, validated by the caller)."""

    uri: str
    filename: str
    size_bytes: int
    sha256: str
    fields: dict[str, bytes] = field(default_factory=dict)


@dataclass
class _Part:
    field_name: str = ""
    filename: str | None = None
    disposition: bytes = b""
    header_name: bytes = b""
    header_value: bytes = b""


@dataclass
class _Events:
    """Collects python-multipart callbacks; the async loop acts on them between writes."""

    part: _Part = field(default_factory=_Part)
    queue: list[tuple[str, Any]] = field(default_factory=list)
    ended: bool = False

    def callbacks(self) -> dict[str, Any]:
        return {
            "on_part_begin": self._begin,
            "on_header_field": self._header_field,
            "on_header_value": self._header_value,
            "on_header_end": self._header_end,
            "on_headers_finished": self._headers_finished,
            "on_part_data": self._data,
            "on_part_end": lambda: self.queue.append(("end", None)),
            "on_end": self._end,
        }

    def _begin(self) -> None:
        self.part = _Part()

    def _header_field(self, data: bytes, start: int, end: int) -> None:
        self.part.header_name += data[start:end]

    def _header_value(self, data: bytes, start: int, end: int) -> None:
        self.part.header_value += data[start:end]

    def _header_end(self) -> None:
        if self.part.header_name.lower() == b"content-disposition":
            self.part.disposition = self.part.header_value
        self.part.header_name, self.part.header_value = b"", b""

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self.part.disposition)
        if b"name" not in options:
            raise _invalid(["body"], "a multipart part has no field name")
        self.part.field_name = options[b"name"].decode("utf-8", "replace")
        if b"filename" in options:
            self.part.filename = options[b"filename"].decode("utf-8", "replace")
        self.queue.append(("begin", self.part))

    def _data(self, data: bytes, start: int, end: int) -> None:
        self.queue.append(("data", bytes(data[start:end])))

    def _end(self) -> None:
        self.ended = True


class _Receiver:
    """State of one upload: the open file, its digest, and the text fields (`text_fields`)."""

    def __init__(self, *, root_uri: str, max_bytes: int, text_fields: tuple[str, ...]) -> None:
        self.root_uri = root_uri
        self.max_bytes = max_bytes
        self.text_fields = text_fields
        self.filename = ""
        self.fs, self.root_path = fsspec.core.url_to_fs(root_uri)
        self.current: str | None = None  # "file" | one of text_fields
        self.out: IO[bytes] | None = None
        self.uri: str | None = None
        self.size = 0
        self.hash = hashlib.sha256()
        self.fields: dict[str, bytes] = {}

    async def handle(self, kind: str, value: Any) -> None:
        if kind == "begin":
            await self._begin(value)
        elif kind == "data":
            await self._data(value)
        elif kind == "end":
            if self.current == "file" and self.out is not None:
                await to_thread.run_sync(self.out.close)
                self.out = None
            self.current = None

    async def _begin(self, part: _Part) -> None:
        if part.field_name == "file":
            if part.filename is None:
                raise _invalid(["body", "file"], "expected a file, got a text field")
            if self.uri is not None:
                raise _invalid(["body", "file"], "only one file per upload")
            self.current, self.filename = "file", part.filename
            filename = safe_filename(part.filename)
            self.uri = storage.join(self.root_uri, filename)
            path = storage.join(self.root_path, filename)
            await to_thread.run_sync(self._open, path)
        elif part.field_name in self.text_fields:
            name = part.field_name
            if part.filename is not None:
                raise _invalid(["body", name], "expected a text field, got a file")
            if name in self.fields:
                raise _invalid(["body", name], "given more than once")
            self.current, self.fields[name] = name, b""
        else:
            raise _invalid(["body", part.field_name], "unexpected field", "extra_forbidden")

    def _open(self, path: str) -> None:
        self.fs.makedirs(self.root_path, exist_ok=True)
        self.out = self.fs.open(path, "wb")

    async def _data(self, data: bytes) -> None:
        if self.current in self.text_fields:
            value = self.fields[self.current] + data
            if len(value) > _MAX_NAME_BYTES:
                raise _invalid(["body", self.current], "too long", "string_too_long")
            self.fields[self.current] = value
        elif self.current == "file" and self.out is not None:
            self.size += len(data)
            if self.size > self.max_bytes:
                raise TooLarge(
                    f"upload exceeds the limit of {self.max_bytes} bytes",
                    details=[{"loc": ["body", "file"], "msg": "too large", "type": "too_large"}],
                )
            self.hash.update(data)
            await to_thread.run_sync(self.out.write, data)

    def remove(self) -> None:
        """Close and delete whatever was written."""
        if self.out is not None:
            self.out.close()
            self.out = None
        if self.fs.exists(self.root_path):
            self.fs.rm(self.root_path, recursive=True)


async def receive(
    request: Request,
    *,
    root_uri: str,
    max_bytes: int,
    text_fields: tuple[str, ...] = DATASET_FIELDS,
    required: tuple[str, ...] = ("name",),
) -> Upload:
    """Stream the multipart body of `request` (one `file` part and the text fields named in
    `text_fields`, each at most 1 KiB) into the directory `root_uri`. Removes the directory on
    error.

    Raises InvalidInput (not multipart, malformed, a field of `required` missing,
    unexpected/duplicate fields, empty file) and TooLarge (file over `max_bytes`, or body over
    it plus `MULTIPART_OVERHEAD`).
    """
    content_type, params = parse_options_header(request.headers.get("content-type", ""))
    if content_type != b"multipart/form-data" or not params.get(b"boundary"):
        raise _invalid(["header", "Content-Type"], "expected multipart/form-data with a boundary")
    events = _Events()
    receiver = _Receiver(root_uri=root_uri, max_bytes=max_bytes, text_fields=text_fields)
    received = 0
    try:
        parser = MultipartParser(params[b"boundary"], events.callbacks())  # type: ignore[arg-type]
        async for chunk in request.stream():
            received += len(chunk)
            if received > max_bytes + MULTIPART_OVERHEAD:
                raise TooLarge(f"request body exceeds the upload limit of {max_bytes} bytes")
            try:
                parser.write(chunk)
            except ValueError as exc:  # python-multipart's parse errors
                raise _invalid(["body"], f"malformed multipart body: {exc}") from None
            for kind, value in events.queue:
                await receiver.handle(kind, value)
            events.queue.clear()
        if not events.ended:
            raise _invalid(["body"], "multipart body ended before its closing boundary")
        for name in required:
            if name not in receiver.fields:
                raise _invalid(["body", name], "field required", "missing")
        if receiver.uri is None:
            raise _invalid(["body", "file"], "field required", "missing")
        if receiver.size == 0:
            raise _invalid(["body", "file"], "the file is empty")
    except BaseException:
        await to_thread.run_sync(receiver.remove)
        raise
    return Upload(
        uri=receiver.uri,
        filename=receiver.filename,
        size_bytes=receiver.size,
        sha256=receiver.hash.hexdigest(),
        fields=dict(receiver.fields),
    )


async def remove(root_uri: str) -> None:
    """Delete an upload's directory (when its row could not be created)."""

    def _rm() -> None:
        fs, path = fsspec.core.url_to_fs(root_uri)
        if fs.exists(path):
            fs.rm(path, recursive=True)

    await to_thread.run_sync(_rm)


@asynccontextmanager
async def streamed(
    request: Request,
    session: Session,
    *,
    root_uri: str,
    max_bytes: int,
    limit: str = "the limit",
    text_fields: tuple[str, ...] = DATASET_FIELDS,
    required: tuple[str, ...] = ("name",),
) -> AsyncIterator[Upload]:
    """The one sequence of every upload route (datasets, OpenAI files, code archives): refuse a
    declared `Content-Length` over `max_bytes` before reading (TooLarge, naming `limit`), give
    the request's database connection back to the pool while the body streams in (the caller
    is already authenticated), `receive` the body into `root_uri`, and yield it; if the block
    raises, the stored upload is removed and the error goes on. Raises what `receive` raises.
    """
    declared = content_length(request.headers)
    if declared is not None and declared > max_bytes + MULTIPART_OVERHEAD:
        raise TooLarge(
            f"upload of {declared} bytes exceeds {limit} of {max_bytes} bytes",
            details=[
                {"loc": ["header", "Content-Length"], "msg": "too large", "type": "too_large"}
            ],
        )
    await run_in_threadpool(session.rollback)
    upload = await receive(
        request, root_uri=root_uri, max_bytes=max_bytes, text_fields=text_fields, required=required
    )
    try:
        yield upload
    except BaseException:
        await remove(root_uri)
        raise
