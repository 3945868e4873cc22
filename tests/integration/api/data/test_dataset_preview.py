"""`POST /v1/datasets/{id}/preview`: tokens with mask bits, per-role shares and the mask
verifier's verdict for a dataset's first records, without a job (issue 11, mask verifier)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from fastapi.testclient import TestClient

from api.main import create_app
from core.platform.settings import Settings
from tests.conftest import ProjectKey
from tests.integration.api.conftest import assert_error
from tests.support.sft_data import bpe_tokenizer

SYSTEM = "You document Python."
CHAT = [
    {
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"def f{i}(x): return x + {i}"},
            {"role": "assistant", "content": f"Return x plus {i}."},
        ]
    }
    for i in range(5)
]
WEIGHTED = {
    "messages": [
        {"role": "user", "content": "first?"},
        {"role": "assistant", "content": "not this one", "weight": 0},
        {"role": "user", "content": "second?"},
        {"role": "assistant", "content": "this one", "weight": 1},
    ]
}
PAIRS = [{"prompt": f"def g{i}():", "completion": f" Docstring {i}."} for i in range(3)]


def jsonl(*records: Any) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


def upload(client: TestClient, project: ProjectKey, filename: str, data: bytes) -> str:
    answer = client.post(
        "/v1/datasets/upload",
        data={"name": filename},
        files={"file": (filename, data, "application/octet-stream")},
        headers=project.headers,
    )
    assert answer.status_code == 201, answer.text
    return str(answer.json()["id"])


def preview(client: TestClient, project: ProjectKey, dataset_id: str, **body: Any) -> Any:
    return client.post(f"/v1/datasets/{dataset_id}/preview", json=body, headers=project.headers)


def ok(client: TestClient, project: ProjectKey, dataset_id: str, **body: Any) -> dict[str, Any]:
    answer = preview(client, project, dataset_id, **body)
    assert answer.status_code == 200, answer.text
    return dict(answer.json())


def text_of(example: dict[str, Any], *, supervised: bool, role: str | None = None) -> str:
    """The concatenated display text of the tokens with that mask bit (and role)."""
    return "".join(
        t
        for t, s, r in zip(example["tokens"], example["supervised"], example["roles"], strict=True)
        if s == supervised and role in (None, r)
    )


@pytest.fixture(scope="module")
def model_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data root holding a model directory with a locally trained BPE tokenizer (ChatML)."""
    root = tmp_path_factory.mktemp("models")
    bpe_tokenizer().save_pretrained(root / "bpe")
    (root / "no-tokenizer").mkdir()
    (root / "no-tokenizer" / "config.json").write_text("{}")
    return root


@pytest.fixture(scope="module")
def models_client(settings: Settings, model_root: Path) -> Iterator[TestClient]:
    """The app with `model_root` as one more allowed data root."""
    roots = settings.model_copy(update={"data_roots": [*settings.data_roots, str(model_root)]})
    with TestClient(create_app(roots), raise_server_exceptions=True) as client:
        yield client


def test_byte_gpt_chatml_supervises_assistant_content_and_im_end_only(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    shown = ok(client, project, ds, chat_template="chatml", num_examples=3, seq_len=512)
    assert shown["verdict"] == "ok" and shown["refused"] is None
    assert shown["loss_on"] == "assistant" and shown["tokenizer"] == "bytes"
    assert [e["where"] for e in shown["examples"]] == [
        "chat.jsonl:1",
        "chat.jsonl:2",
        "chat.jsonl:3",
    ]
    for i, example in enumerate(shown["examples"]):
        assert example["status"] == "kept"
        assert example["num_tokens"] == len(example["input_ids"]) == len(example["tokens"])
        assert len(example["tokens"]) == len(example["supervised"]) == len(example["roles"])
        assert text_of(example, supervised=True) == f"Return x plus {i}.<|im_end|>"
        assert {r for r, s in zip(example["roles"], example["supervised"], strict=True) if s} == {
            "assistant"
        }
        assert SYSTEM in text_of(example, supervised=False, role="system")
        assert f"def f{i}(x)" in text_of(example, supervised=False, role="user")
        assert text_of(example, supervised=True, role="user") == ""
        assert "".join(example["tokens"]).startswith("<|im_start|>system\n")
    report = shown["report"]
    assert report["examples"] == 3 and report["dropped"] == report["truncated"] == 0
    assert report["supervised_share_by_role"] == {"assistant": 1.0, "system": 0.0, "user": 0.0}
    assert report["supervised_by_role"]["user"] == report["supervised_by_role"]["system"] == 0
    assert report["supervised_tokens"] == sum(
        len(f"Return x plus {i}.<|im_end|>") for i in range(3)
    )


def test_an_assistant_message_of_weight_0_is_not_supervised(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "weighted.jsonl", jsonl(WEIGHTED))
    (example,) = ok(client, project, ds, chat_template="chatml")["examples"]
    assert text_of(example, supervised=True) == "this one<|im_end|>"
    assert "not this one" in text_of(example, supervised=False, role="assistant")


def test_prompt_completion_with_loss_on_completion_supervises_the_completion(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "pc.jsonl", jsonl(*PAIRS))
    shown = ok(client, project, ds, loss_on="completion")
    assert shown["verdict"] == "ok" and shown["loss_on"] == "completion"
    for i, example in enumerate(shown["examples"]):
        assert text_of(example, supervised=True) == f" Docstring {i}."
        assert text_of(example, supervised=False) == f"def g{i}():"
        assert set(example["roles"]) == {"prompt", "completion"}
    assert shown["report"]["supervised_share_by_role"] == {"completion": 1.0, "prompt": 0.0}
    everything = ok(client, project, ds, loss_on="all")["examples"][0]
    assert all(everything["supervised"])


def test_jsonl_text_previews_every_token_as_supervised(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "plain.jsonl", jsonl({"text": "héllo"}, {"text": "world"}))
    shown = ok(client, project, ds)
    assert shown["loss_on"] == "all" and shown["verdict"] == "ok"
    first = shown["examples"][0]
    assert all(first["supervised"]) and "".join(first["tokens"]) == "héllo"
    assert first["tokens"][1:3] == ["é", ""]  # a two-byte character shown once


def test_a_hugging_face_tokenizer_from_a_model_directory_marks_im_end_as_supervised(
    models_client: TestClient, project: ProjectKey, model_root: Path
) -> None:
    ds = upload(models_client, project, "chat.jsonl", jsonl(*CHAT))
    model = {"kind": "hf", "hf": {"path_or_id": str(model_root / "bpe")}}
    shown = ok(models_client, project, ds, model=model, num_examples=2)
    assert shown["verdict"] == "ok" and shown["tokenizer"].endswith(str(model_root / "bpe"))
    for i, example in enumerate(shown["examples"]):
        trained = [t for t, s in zip(example["tokens"], example["supervised"], strict=True) if s]
        assert trained[-1] == "<|im_end|>"
        assert "".join(trained) == f"Return x plus {i}.<|im_end|>"
        assert "<|im_start|>" in example["tokens"]  # a special token is one token
    no_tokenizer = {"kind": "hf", "hf": {"path_or_id": str(model_root / "no-tokenizer")}}
    assert ok(models_client, project, ds, model=no_tokenizer)["tokenizer"] == "bytes"


def test_examples_truncated_away_refuse_with_the_jobs_reason(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    shown = ok(client, project, ds, seq_len=16, truncation="truncate_right", num_examples=4)
    assert shown["verdict"] == "refused"
    assert shown["refused"].startswith("data sample: 4 of 4 examples (100.0%) lose every")
    assert [e["status"] for e in shown["examples"]] == ["truncated"] * 4
    assert (
        shown["report"]["lost_all_supervision"] == 4 and shown["report"]["supervised_tokens"] == 0
    )
    dropped = ok(client, project, ds, seq_len=16, num_examples=2)
    assert dropped["verdict"] == "refused" and dropped["report"]["dropped"] == 2


def test_a_template_that_cannot_mark_the_assistant_refuses_naming_the_record(
    client: TestClient, project: ProjectKey
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    upper = "{% for m in messages %}{{ m.role }}: {{ m.content | upper }}\n{% endfor %}"
    shown = ok(client, project, ds, chat_template=upper)
    assert shown["verdict"] == "refused" and shown["examples"] == []
    assert shown["refused"] == (
        "chat.jsonl:1: data.chat_template does not render messages[2].content verbatim "
        "inside its turn; the loss mask cannot be located"
    )
    silent = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}"
    silent += "{% endfor %}"
    dropped = ok(client, project, ds, chat_template=silent, seq_len=512)["refused"]
    assert dropped.startswith("chat.jsonl:1: data.chat_template does not render messages[2]")


def test_another_projects_dataset_is_404_like_an_unknown_one(
    client: TestClient, project: ProjectKey, other_project: ProjectKey
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    theirs = assert_error(preview(client, other_project, ds), 404, "not_found")
    unknown = assert_error(preview(client, other_project, "ds_0000000000000000"), 404, "not_found")
    assert theirs["message"].replace(ds, "X") == unknown["message"].replace(
        "ds_0000000000000000", "X"
    )


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"chat_template": "{% for m in messages %}"}, ["body", "chat_template"]),
        ({"loss_on": "completion"}, ["body", "loss_on"]),
        ({"num_examples": 65}, ["body", "num_examples"]),
        ({"seq_len": 4}, ["body", "seq_len"]),
        ({"model": {"kind": "hf"}}, ["body", "model", "hf"]),
        ({"model": {"kind": "hf", "hf": {"path_or_id": "/nowhere/x"}}}, None),
        ({"model": {"kind": "gpt", "vocab": 3}}, ["body", "model", "vocab"]),
        ({"model": {"kind": "hf", "hf": {"path_or_id": "org/not-cached"}}}, None),
    ],
    ids=[
        "template_syntax",
        "loss_on",
        "num_examples",
        "seq_len",
        "hf_missing",
        "outside",
        "extra_field",
        "hub_id",
    ],
)
def test_bad_options_are_422_403_or_409_with_the_field_path(
    client: TestClient, project: ProjectKey, body: dict[str, Any], loc: list[str] | None
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    answer = preview(client, project, ds, **body)
    if body.get("loss_on"):  # well formed, but not for this dataset's format (the fuzzer's)
        assert_error(answer, 409, "conflict", loc)
    elif loc is None:  # a model path: outside the roots is 403, a hub id not cached is 422
        status = 403 if body["model"]["hf"]["path_or_id"].startswith("/") else 422
        code = "forbidden" if status == 403 else "validation_error"
        assert_error(answer, status, code, ["body", "model", "hf", "path_or_id"])
    else:
        assert_error(answer, 422, "validation_error", loc)


def test_a_missing_model_directory_under_a_root_is_422(
    models_client: TestClient, project: ProjectKey, model_root: Path
) -> None:
    ds = upload(models_client, project, "chat.jsonl", jsonl(*CHAT))
    model = {"kind": "hf", "hf": {"path_or_id": str(model_root / "absent")}}
    error = assert_error(
        preview(models_client, project, ds, model=model),
        422,
        "validation_error",
        ["body", "model", "hf", "path_or_id"],
    )
    assert "does not exist" in error["message"]


def test_text_and_preference_datasets_are_409(
    client: TestClient, project: ProjectKey, dataset: dict[str, Any]
) -> None:
    assert_error(preview(client, project, dataset["id"]), 409, "conflict")
    pairs = [{"prompt": "p", "chosen": "a", "rejected": "b"}]
    ds = upload(client, project, "pref.jsonl", jsonl(*pairs))
    assert_error(preview(client, project, ds), 409, "conflict")


def test_only_the_first_records_are_read(
    client: TestClient, project: ProjectKey, settings: Settings
) -> None:
    ds = upload(client, project, "chat.jsonl", jsonl(*CHAT))
    stored = next((Path(settings.storage_url) / "datasets" / ds).glob("*.jsonl"))
    with stored.open("ab") as f:  # a line past the sample that no reader could parse
        f.write(b"{not json\n")
    shown = ok(client, project, ds, chat_template="chatml", num_examples=5, seq_len=512)
    assert shown["verdict"] == "ok" and len(shown["examples"]) == 5
    beyond = ok(client, project, ds, chat_template="chatml", num_examples=6, seq_len=512)
    assert beyond["verdict"] == "refused" and beyond["refused"].startswith(
        "chat.jsonl:6: malformed"
    )
