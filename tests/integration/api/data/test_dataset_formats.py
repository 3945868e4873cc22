"""Dataset formats: declared or detected at upload/registration, every record checked (streamed),
refusals naming line and field path, nothing half-stored, stats on the dataset."""

from __future__ import annotations

import ast
import gzip
import io
import itertools
import struct
import sysconfig
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from api.main import create_app
from core.datasets.problems import MAX_LISTED
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error, counts

USER = {"role": "user", "content": "What does len do?"}
ASSISTANT = {"role": "assistant", "content": "It returns the number of items."}
GOOD = {"messages": [USER, ASSISTANT]}
DPO = {
    "input": {"messages": [USER]},
    "preferred_output": [ASSISTANT],
    "non_preferred_output": [{"role": "assistant", "content": "No."}],
}


def jsonl(*records: Any) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def _stored(settings: Settings) -> set[Path]:
    root = Path(settings.storage_url) / "datasets"
    return set(root.rglob("*")) if root.exists() else set()


def upload(client: TestClient, project: ProjectKey, filename: str, data: bytes, **form: str) -> Any:
    return client.post(
        "/v1/datasets/upload",
        data={"name": form.pop("name", filename), **form},
        files={"file": (filename, data, "application/octet-stream")},
        headers=project.headers,
    )


def uploaded(
    client: TestClient, project: ProjectKey, filename: str, data: bytes, **form: str
) -> dict[str, Any]:
    answer = upload(client, project, filename, data, **form)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def refused(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    filename: str,
    data: bytes,
    **form: str,
) -> dict[str, Any]:
    """Upload `data`, expect a 422, and prove that no row and no stored byte stayed behind."""
    before, files = counts(engine, project.project_id), _stored(settings)
    error = assert_error(upload(client, project, filename, data, **form), 422, "validation_error")
    assert counts(engine, project.project_id) == before
    assert _stored(settings) == files
    return error


def _sixteen_good_then(bad: Any) -> bytes:
    return jsonl(*[GOOD] * 16, bad)


@pytest.mark.parametrize(
    ("data", "msg", "loc"),
    [
        pytest.param(
            _sixteen_good_then({"messages": [USER, ASSISTANT, {"role": "robot", "content": "x"}]}),
            "line 17: messages[2].role: must be one of system, user, assistant, tool",
            ["line", 17, "messages", 2, "role"],
            id="unknown_role",
        ),
        pytest.param(
            jsonl(GOOD) + b'{"messages": [\n',
            "line 2: malformed JSON: ",
            ["line", 2],
            id="malformed_json",
        ),
        pytest.param(
            jsonl(GOOD) + b'{"text": "caf\xe9"}\n',
            "line 2: not valid UTF-8 (byte 14",
            ["line", 2],
            id="not_utf8",
        ),
        pytest.param(
            jsonl(GOOD, GOOD, {"messages": [USER, {"role": "system", "content": "be brief"}]}),
            "line 3: messages: no assistant message",
            ["line", 3, "messages"],
            id="no_assistant",
        ),
        pytest.param(
            jsonl(GOOD, {"messages": [{"role": "user", "content": ""}, ASSISTANT]}),
            "line 2: messages[0].content: must not be empty",
            ["line", 2, "messages", 0, "content"],
            id="empty_content",
        ),
        pytest.param(
            jsonl({"messages": [USER, {**ASSISTANT, "weight": 0}]}),
            "line 1: messages: every assistant message has weight 0",
            ["line", 1, "messages"],
            id="all_weights_zero",
        ),
        pytest.param(
            jsonl(
                {"prompt": "p", "chosen": "a", "rejected": "b"},
                {"prompt": "p", "chosen": "same", "rejected": "same"},
            ),
            "line 2: chosen: equals rejected",
            ["line", 2, "chosen"],
            id="chosen_equals_rejected",
        ),
        pytest.param(
            jsonl(GOOD, GOOD, {"text": "a document"}),
            "line 3: mixed formats: this record is jsonl_text, the dataset is messages",
            ["line", 3],
            id="mixed_formats",
        ),
        pytest.param(
            jsonl(GOOD, [1, 2]),
            "line 2: a record is a JSON object, not list",
            ["line", 2],
            id="not_an_object",
        ),
        pytest.param(
            jsonl({"id": 1, "body": "?"}),
            "line 1: cannot tell the format",
            ["line", 1],
            id="undetectable",
        ),
    ],
)
def test_an_invalid_record_refuses_the_upload_naming_line_and_path(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    data: bytes,
    msg: str,
    loc: list[Any],
) -> None:
    error = refused(client, project, settings, engine, "chat.jsonl", data)
    detail = error["details"][0]
    assert detail["msg"].startswith(msg), detail
    assert detail["loc"] == ["body", "file", *loc]
    assert detail["line"] == loc[1]
    assert error["message"].startswith(f"dataset refused: {msg}")
    assert len(error["details"]) == 1


@pytest.fixture(scope="module")
def small_record_client(settings: Settings) -> Iterator[TestClient]:
    """The app with a 200-byte record limit."""
    small = settings.model_copy(update={"max_record_bytes": 200})
    with TestClient(create_app(small), raise_server_exceptions=True) as client:
        yield client


def test_a_record_over_the_size_limit_is_refused(
    small_record_client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    big = {"messages": [USER, {"role": "assistant", "content": "x" * 300}]}
    data = jsonl(GOOD, big, GOOD)
    error = refused(small_record_client, project, settings, engine, "c.jsonl", data)
    size = len(orjson.dumps(big))
    assert [d["msg"] for d in error["details"]] == [
        f"line 2: record of {size} bytes is over the limit of 200 bytes"
    ]


def test_at_most_100_problems_are_listed_and_all_are_counted(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    bad = {"messages": [USER, {"role": "robot", "content": "x"}]}
    error = refused(client, project, settings, engine, "c.jsonl", jsonl(GOOD, *[bad] * 250))
    assert len(error["details"]) == MAX_LISTED
    assert [d["line"] for d in error["details"]] == list(range(2, 2 + MAX_LISTED))
    assert error["message"] == (
        "dataset refused, 250 problems (the first 100 listed in details), the first: "
        + error["details"][0]["msg"]
    )


@pytest.mark.parametrize(
    "compress",
    [pytest.param(gzip.compress, id="gzip"), pytest.param(zstandard.compress, id="zstd")],
)
def test_compressed_jsonl_is_checked_after_decompression(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    compress: Any,
) -> None:
    data = jsonl(*[GOOD] * 30)
    ds = uploaded(client, project, "chat.jsonl.gz", compress(data))
    assert ds["format"] == "messages"
    assert ds["stats"]["records"] == 30
    assert ds["stats"]["bytes"] == len(data) - 30  # newlines are not part of a record
    bad = jsonl(GOOD, {"messages": [USER]})
    error = refused(client, project, settings, engine, "bad.jsonl.zst", compress(bad))
    assert error["details"][0]["msg"] == "line 2: messages: no assistant message"


def test_a_corrupt_compressed_file_is_422(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    data = gzip.compress(jsonl(*[GOOD] * 50))
    error = refused(client, project, settings, engine, "c.jsonl.gz", data[: len(data) // 2])
    assert "cannot decompress" in error["details"][0]["msg"]


def test_stats_of_a_hand_built_file(client: TestClient, project: ProjectKey) -> None:
    system = {"role": "system", "content": "be brief"}  # 8 characters
    first = {
        "messages": [
            system,
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
        ]
    }
    second = {
        "messages": [
            {"role": "user", "content": "2+2?"},
            {"role": "assistant", "content": "4", "weight": 0},
            {"role": "user", "content": "sure?"},
            {"role": "assistant", "content": "yes, 4"},
        ]
    }
    late_system = {
        "messages": [
            {"role": "user", "content": "a"},
            {"role": "system", "content": "late"},
            {"role": "assistant", "content": "b" * 40},
        ]
    }
    lines = [orjson.dumps(r) for r in (first, second, first, late_system)]
    ds = uploaded(client, project, "chat.jsonl", b"\n".join(lines) + b"\n")
    stats = ds["stats"]
    # example chars: 15, 16, 15, 45; supervised: 5, 6 (the weight-0 "4" is not), 5, 40.
    # Nearest-rank percentiles of 4 values: p50 is the 2nd smallest, p90 and p99 the 4th.
    assert stats["chars"] == {
        "example": {"p50": 15, "p90": 45, "p99": 45, "max": 45},
        "supervised": {"p50": 5, "p90": 40, "p99": 40, "max": 40},
    }
    assert stats["records"] == 4
    assert stats["bytes"] == sum(len(line) for line in lines)
    assert stats["roles"] == {"assistant": 5, "system": 3, "user": 5}
    assert stats["duplicates"] == 1
    assert {w["type"]: (w["count"], w["first"]) for w in stats["warnings"]} == {
        "duplicates": (1, "line 3"),
        "system_not_first": (1, "line 4"),
        "repeated_text": (1, "line 4"),  # "b" * 40
    }
    assert client.get(f"/v1/datasets/{ds['id']}", headers=project.headers).json() == ds
    assert client.get("/v1/datasets", headers=project.headers).json()["items"] == [ds]


def test_chat_data_is_warned_about_missing_user_turns_and_degenerate_answers(
    client: TestClient, project: ProjectKey
) -> None:
    system = {"role": "system", "content": "You are terse."}
    no_user = {"messages": [system, ASSISTANT]}
    looping = {"role": "assistant", "content": "Let me check. " + "I'm not sure. " * 12}
    rule = {"role": "assistant", "content": "A rule:\n" + "-" * 80 + "\nand 1" + "0" * 40}
    data = jsonl(GOOD, no_user, {"messages": [USER, looping]}, {"messages": [USER, rule]})
    data += jsonl({"messages": [system, {**ASSISTANT, "content": "ha" * 20}]}, GOOD)
    ds = uploaded(client, project, "chat.jsonl", data)  # warnings never refuse
    warnings = {w["type"]: w for w in ds["stats"]["warnings"]}
    assert {t: (w["count"], w["first"]) for t, w in warnings.items()} == {
        "no_user_message": (2, "line 2"),
        "repeated_text": (2, "line 3"),
        "duplicates": (1, "line 6"),
    }
    assert warnings["no_user_message"]["message"] == "conversations without a user message"
    assert warnings["repeated_text"]["message"].startswith(
        "conversations with an assistant message that ends in one short string repeated 8+"
    )
    assert client.get(f"/v1/datasets/{ds['id']}", headers=project.headers).json() == ds


@pytest.mark.parametrize(
    ("filename", "data", "expected"),
    [
        ("notes.txt", b'{"text": "json in a .txt stays text"}\n', "text"),
        ("code.py", b"def f():\n    return 1\n", "text"),
        ("docs.jsonl", jsonl({"text": "a document"}), "jsonl_text"),
        ("chat.ndjson", jsonl(GOOD), "messages"),
        ("pc.json", jsonl({"prompt": "p", "completion": "c"}), "prompt_completion"),
        ("pref.jsonl", jsonl({"prompt": "p", "chosen": "a", "rejected": "b"}), "preference"),
        ("dpo.jsonl", jsonl(DPO), "preference"),
        ("blank-lines.jsonl", b"\n" + jsonl(GOOD) + b"\n\n", "messages"),
        ("bom.jsonl", b"\xef\xbb\xbf" + jsonl(GOOD), "messages"),
    ],
)
def test_the_format_is_detected_from_file_type_and_first_record(
    client: TestClient, project: ProjectKey, filename: str, data: bytes, expected: str
) -> None:
    assert uploaded(client, project, filename, data)["format"] == expected


def test_a_declared_format_is_enforced_whatever_the_file_name(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    ds = uploaded(client, project, "chat.txt", jsonl(GOOD), format="messages")
    assert (ds["format"], ds["stats"]["records"]) == ("messages", 1)
    error = refused(
        client, project, settings, engine, "x.jsonl", jsonl({"text": "t"}), format="messages"
    )
    assert error["details"][0]["msg"].startswith("line 1: mixed formats")
    error = refused(client, project, settings, engine, "x.jsonl", jsonl(GOOD), format="chat")
    assert error["details"][0]["loc"] == ["body", "format"]


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink, row_group_size=3)
    return sink.getvalue()


def test_parquet_records_are_checked_row_by_row(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    rows = [GOOD] * 5
    ds = uploaded(client, project, "chat.parquet", _parquet(pa.Table.from_pylist(rows)))
    assert (ds["format"], ds["stats"]["records"]) == ("messages", 5)
    assert ds["stats"]["roles"] == {"assistant": 5, "user": 5}
    pc_rows = [{"prompt": "p", "completion": "c"}, {"prompt": "p", "completion": ""}]
    error = refused(
        client, project, settings, engine, "pc.parquet", _parquet(pa.Table.from_pylist(pc_rows))
    )
    assert [d["msg"] for d in error["details"]] == ["row 2: completion: must not be empty"]
    assert error["details"][0]["loc"] == ["body", "file", "row", 2, "completion"]


def test_parquet_tokens_with_loss_mask(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    ids = [[1, 2, 3], [4, 5], [6, 7, 8, 9]]
    mask = [[0, 1, 1], [0, 1], [0, 0, 1, 1]]
    table = pa.table({"input_ids": ids, "loss_mask": mask})
    ds = uploaded(client, project, "tok.parquet", _parquet(table))
    stats = ds["stats"]
    assert ds["format"] == "tokens"
    assert (stats["records"], stats["num_tokens"], stats["supervised_tokens"]) == (3, 9, 5)
    assert stats["max_token_id"] == 9
    assert stats["tokens"] == {"p50": 3, "p90": 4, "p99": 4, "max": 4}
    labelled = pa.table({"input_ids": [[1, 2, 3]], "labels": [[-100, 2, 3]]})
    ds = uploaded(client, project, "labels.parquet", _parquet(labelled))
    assert (ds["stats"]["num_tokens"], ds["stats"]["supervised_tokens"]) == (3, 2)
    bad = pa.table({"input_ids": [[1, 2], [3, 4], []], "labels": [[1, 2], [3], [5]]})
    error = refused(client, project, settings, engine, "bad.parquet", _parquet(bad))
    assert [d["msg"] for d in error["details"]] == [
        "row 3: input_ids: must not be empty",
        "row 2: labels: has 1 tokens, input_ids has 2",
    ]


def test_npy_and_bin_token_arrays(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    tokens = np.arange(1000, dtype=np.uint16) * 7
    buf = io.BytesIO()
    np.save(buf, tokens)
    ds = uploaded(client, project, "train.npy", buf.getvalue())
    assert ds["format"] == "tokens"
    assert ds["stats"]["num_tokens"] == 1000
    assert ds["stats"]["max_token_id"] == 999 * 7
    assert ds["stats"]["token_dtype"] == "uint16"

    big = np.array([70_000, 1, 2], dtype=np.uint32)
    ds = uploaded(client, project, "train.bin", big.tobytes(), token_dtype="uint32")
    assert (ds["stats"]["num_tokens"], ds["stats"]["max_token_id"]) == (3, 70_000)
    ds = uploaded(client, project, "u16.bin", big.tobytes())  # read as uint16: 6 tokens
    assert (ds["stats"]["num_tokens"], ds["stats"]["token_dtype"]) == (6, "uint16")

    error = refused(client, project, settings, engine, "odd.bin", b"\x01\x02\x03")
    assert error["details"][0]["msg"] == "3 bytes are not a whole number of uint16 tokens"
    buf = io.BytesIO()
    np.save(buf, np.ones(4, dtype=np.float32))
    error = refused(client, project, settings, engine, "f.npy", buf.getvalue())
    assert error["details"][0]["msg"] == "dtype: must be uint16 or uint32 (got float32)"
    error = refused(client, project, settings, engine, "t.jsonl", jsonl(GOOD), format="tokens")
    assert error["details"][0]["msg"] == "tokens datasets are Parquet, .npy or .bin"


@pytest.mark.parametrize(
    ("filename", "data"),
    [
        ("g.jsonl", bytes(range(256)) * 4),
        ("g.parquet", b"PAR1" + b"\x00" * 100),
        ("g.npy", b"\x93NUMPY\x01\x00garbage"),
        ("g.jsonl.zst", b"\x28\xb5\x2f\xfd" + b"\xff" * 64),
        ("g.jsonl.gz", b"\x1f\x8b" + b"\x00" * 64),
        ("g.jsonl", b"null\n"),
        ("g.jsonl", b"\n\n\n"),
    ],
)
def test_garbage_is_a_422_never_a_500(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    filename: str,
    data: bytes,
) -> None:
    refused(client, project, settings, engine, filename, data)


def test_another_projects_key_gets_404(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    ds = uploaded(client, project, "chat.jsonl", jsonl(GOOD))
    answer = client.get(f"/v1/datasets/{ds['id']}", headers=other_project.headers)
    assert_error(answer, 404, "not_found")
    assert client.get("/v1/datasets", headers=other_project.headers).json() == {"items": []}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("data_root")


@pytest.fixture(scope="module")
def root_client(settings: Settings, data_root: Path) -> Iterator[TestClient]:
    """The app with `data_root` as one more allowed data root."""
    wider = settings.model_copy(update={"data_roots": [*settings.data_roots, str(data_root)]})
    with TestClient(create_app(wider), raise_server_exceptions=True) as client:
        yield client


def test_registered_server_files_are_checked_too(
    root_client: TestClient, project: ProjectKey, engine: Engine, data_root: Path
) -> None:
    good, bad = data_root / "good.jsonl", data_root / "bad.jsonl"
    good.write_bytes(jsonl(GOOD, GOOD))
    bad.write_bytes(jsonl(GOOD, {"messages": [USER, {"role": "robot", "content": "x"}]}))
    answer = root_client.post(
        "/v1/datasets", json={"name": "good", "uri": str(good)}, headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    assert (answer.json()["format"], answer.json()["stats"]["duplicates"]) == ("messages", 1)
    before = counts(engine, project.project_id)
    answer = root_client.post(
        "/v1/datasets", json={"name": "bad", "uri": str(bad)}, headers=project.headers
    )
    error = assert_error(
        answer, 422, "validation_error", ["body", "uri", "line", 2, "messages", 1, "role"]
    )
    assert error["details"][0]["msg"].startswith("line 2: messages[1].role: must be one of")
    answer = root_client.post(
        "/v1/datasets",
        json={"name": "dir", "uri": str(data_root), "format": "messages"},
        headers=project.headers,
    )
    assert_error(answer, 422, "validation_error", ["body", "format"])
    assert counts(engine, project.project_id) == before


def png() -> bytes:
    """A real 1x1 grey PNG: the signature, then IHDR, IDAT and IEND chunks with their CRCs."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return (
            struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
        )

    header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\x80"))
        + chunk(b"IEND", b"")
    )


NOT_TEXT = [
    pytest.param(
        "a.png", png(), "a.png: byte 1 (line 1) is not UTF-8 (invalid start byte)", id="png"
    ),
    pytest.param(
        "latin1.txt",
        "caf\u00e9\nna\u00efve\n".encode("latin-1"),
        "latin1.txt: byte 4 (line 1) is not UTF-8 (invalid continuation byte)",
        id="latin1",
    ),
    pytest.param(
        "nul.txt",
        b"two lines\nof te\x00xt\n",
        "nul.txt: byte 16 (line 2) is a NUL byte (binary data)",
        id="nul",
    ),
    pytest.param(
        "utf16.txt",
        "text".encode("utf-16-le"),
        "utf16.txt: byte 2 (line 1) is a NUL byte (binary data)",
        id="utf16",
    ),
]


@pytest.mark.parametrize("declared", [{"format": "text"}, {}], ids=["declared", "detected"])
@pytest.mark.parametrize(("filename", "data", "msg"), NOT_TEXT)
def test_a_text_dataset_that_is_not_utf8_text_is_refused_naming_the_file(
    client: TestClient,
    project: ProjectKey,
    settings: Settings,
    engine: Engine,
    filename: str,
    data: bytes,
    msg: str,
    declared: dict[str, str],
) -> None:
    error = refused(client, project, settings, engine, filename, data, **declared)
    assert [(d["loc"], d["msg"], d["type"]) for d in error["details"]] == [
        (["body", "file"], f"{msg}; a text dataset is UTF-8 text", error["details"][0]["type"])
    ]
    assert error["details"][0]["type"] in ("unicode", "nul_byte")


def test_utf8_text_split_across_read_blocks_is_text(
    client: TestClient, project: ProjectKey
) -> None:
    # A 3-byte character straddles the 1 MiB block boundary the check reads by.
    data = b"a" * ((1 << 20) - 1) + "\u20ac and more\n".encode()
    ds = uploaded(client, project, "euro.txt", data)
    assert (ds["format"], ds["size_bytes"]) == ("text", len(data))


def test_a_registered_text_file_must_be_utf8_text_a_directory_may_hold_other_files(
    root_client: TestClient, project: ProjectKey, engine: Engine, data_root: Path
) -> None:
    """A `text` file is refused when it is not UTF-8 text; a directory is registered whole
    (each job picks its files with `data.include` / `exclude`), binary files beside included."""
    corpus = data_root / "corpus"
    (corpus / "sub").mkdir(parents=True)
    (corpus / "ok.txt").write_text("plain text\n")
    (corpus / "sub" / "logo.png").write_bytes(png())
    before = counts(engine, project.project_id)
    answer = root_client.post(
        "/v1/datasets",
        json={"name": "one", "uri": str(corpus / "sub" / "logo.png"), "format": "text"},
        headers=project.headers,
    )
    error = assert_error(answer, 422, "validation_error", ["body", "uri"])
    msgs = [d["msg"].split(";")[0] for d in error["details"]]
    assert msgs == ["logo.png: byte 1 (line 1) is not UTF-8 (invalid start byte)"]
    assert counts(engine, project.project_id) == before
    answer = root_client.post(
        "/v1/datasets", json={"name": "dir", "uri": str(corpus)}, headers=project.headers
    )
    assert answer.status_code == 201, answer.text
    assert (answer.json()["format"], answer.json()["num_files"]) == ("text", 2)


def stdlib_instructions(limit: int) -> list[dict[str, str]]:
    """A real instruction set: prompt = a stdlib function's source without its docstring,
    completion = that docstring (`ast.get_docstring`)."""
    out: list[dict[str, str]] = []
    for src in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        for node in ast.walk(ast.parse(src.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc:
                continue
            node.body = node.body[1:] or [ast.Pass()]
            out.append({"prompt": ast.unparse(node), "completion": doc})
            if len(out) == limit:
                return out
    return out


def test_a_real_instruction_and_preference_set_from_the_stdlib(
    client: TestClient, project: ProjectKey
) -> None:
    records = stdlib_instructions(400)
    assert len(records) == 400
    ds = uploaded(client, project, "stdlib.jsonl", jsonl(*records))
    stats = ds["stats"]
    assert (ds["format"], stats["records"]) == ("prompt_completion", 400)
    examples = [len(r["prompt"]) + len(r["completion"]) for r in records]
    assert stats["chars"]["example"]["max"] == max(examples)
    assert stats["chars"]["supervised"]["max"] == max(len(r["completion"]) for r in records)
    canonical = {orjson.dumps(r, option=orjson.OPT_SORT_KEYS) for r in records}
    assert stats["duplicates"] == len(records) - len(canonical)

    # chosen: the function's own docstring; rejected: the next function's (when it differs).
    pairs = [
        {"prompt": a["prompt"], "chosen": a["completion"], "rejected": b["completion"]}
        for a, b in itertools.pairwise(records)
        if a["completion"] != b["completion"]
    ]
    ds = uploaded(client, project, "stdlib-pref.jsonl.gz", gzip.compress(jsonl(*pairs)))
    assert (ds["format"], ds["stats"]["records"]) == ("preference", len(pairs))


def test_a_wrong_type_in_a_union_field_names_the_field_without_pydantic_branches(
    client: TestClient, project: ProjectKey, settings: Settings, engine: Engine
) -> None:
    data = jsonl({"prompt": "p", "completion": "c"}, {"prompt": 5, "completion": "c"})
    error = refused(client, project, settings, engine, "pc.jsonl", data)
    assert {tuple(d["loc"]) for d in error["details"]} == {("body", "file", "line", 2, "prompt")}
    assert [d["msg"] for d in error["details"]] == [
        "line 2: prompt: Input should be a valid string",
        "line 2: prompt: Input should be a valid list",
    ]
