"""``torchyard datasets upload/register/show`` and the SDK's `client.datasets` against a real API
server: formats declared or detected, stats shown, refusals listed by line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from rich.console import Console

from dataformat.records import FORMATS
from tests.integration.conftest import UNSERVED_POOL, cli_invoker
from torchyard import Client, ValidationFailed
from torchyard.render import SUPERVISED_STYLE, preview_tokens
from torchyard.types import DATASET_FORMATS

CHAT = [
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
    {"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]},
]


def _jsonl(path: Path, records: list[Any]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def test_the_client_knows_the_servers_formats() -> None:
    assert DATASET_FORMATS == FORMATS


def test_upload_with_a_format_then_show_its_stats(cli: Any, tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "chat.txt", CHAT)  # a .txt name: only --format makes it messages
    uploaded = cli("datasets", "upload", "chat", str(path), "--format", "messages", "--json")
    assert uploaded.exit_code == 0, uploaded.output
    dataset = json.loads(uploaded.stdout)
    assert (dataset["format"], dataset["stats"]["records"]) == ("messages", 2)

    shown = cli("datasets", "show", dataset["id"])
    assert shown.exit_code == 0, shown.output
    assert "messages" in shown.stdout
    assert "chars (supervised)" in shown.stdout
    assert "p50 1 / p90 5 / p99 5 / max 5" in shown.stdout  # "4" and "hello"
    assert "assistant 2, user 2" in shown.stdout
    by_name = cli("datasets", "show", "chat", "--json")  # its name works as its id does
    assert by_name.exit_code == 0, by_name.output
    assert json.loads(by_name.stdout)["id"] == dataset["id"]

    detected = cli("datasets", "upload", "auto", str(_jsonl(tmp_path / "a.jsonl", CHAT)))
    assert detected.exit_code == 0, detected.output
    assert " messages " in detected.stdout


def test_a_refused_upload_prints_each_bad_line(cli: Any, tmp_path: Path) -> None:
    bad = [CHAT[0], {"messages": [{"role": "robot", "content": "x"}]}, {"text": "t"}]
    result = cli("datasets", "upload", "bad", str(_jsonl(tmp_path / "bad.jsonl", bad)))
    assert result.exit_code != 0
    assert "  line 2: messages[0].role: must be one of system, user, assistant, tool" in (
        result.output
    )
    assert "  line 3: mixed formats: this record is jsonl_text, the dataset is messages" in (
        result.output
    )
    unknown = cli("datasets", "upload", "x", str(tmp_path / "bad.jsonl"), "--format", "chat")
    assert unknown.exit_code != 0
    assert "format: must be one of text, jsonl_text, messages" in unknown.output
    assert "bad" not in cli("datasets", "list").stdout


def test_sdk_upload_refusal_is_validation_failed_with_line_details(
    live_api: str, api_key: str, tmp_path: Path
) -> None:
    path = _jsonl(tmp_path / "p.jsonl", [{"prompt": "p", "chosen": "a", "rejected": "a"}])
    with Client(live_api, api_key) as client, pytest.raises(ValidationFailed) as caught:
        client.datasets.upload("pref", path)
    assert [d.msg for d in caught.value.details] == ["line 1: chosen: equals rejected"]
    assert caught.value.details[0].loc == ("body", "file", "line", 1, "chosen")


def test_preview_highlights_the_supervised_tokens_and_prints_shares(
    cli: Any, tmp_path: Path, live_api: str, api_key: str
) -> None:
    path = _jsonl(tmp_path / "chat.jsonl", CHAT)
    dataset = json.loads(cli("datasets", "upload", "chat", str(path), "--json").stdout)
    shown = cli("datasets", "preview", dataset["id"], "--template", "chatml", "-n", "2")
    assert shown.exit_code == 0, shown.output
    assert "chat.jsonl:1  kept" in shown.stdout and "chat.jsonl:2  kept" in shown.stdout
    assert "verdict: ok" in shown.stdout
    assert "assistant" in shown.stdout and "100.0%" in shown.stdout

    with Client(live_api, api_key) as client:
        preview = client.datasets.preview(dataset["id"], chat_template="chatml", num_examples=1)
    text = preview_tokens(preview.examples[0])
    green = "".join(text.plain[s.start : s.end] for s in text.spans if s.style == SUPERVISED_STYLE)
    assert green == "hello<|im_end|>"
    console = Console(color_system="truecolor", force_terminal=True, width=200)
    with console.capture() as captured:
        console.print(text)
    assert "\x1b[30;42m" in captured.get()  # black on green reaches the terminal

    refused = cli("datasets", "preview", dataset["id"], "--seq-len", "8")
    assert refused.exit_code == 1
    assert "verdict: refused: data sample: 2 of 2 examples" in refused.stdout


def test_files_sample_and_the_jobs_that_used_a_dataset_by_its_name(
    cli: Any, tmp_path: Path, live_api: str, api_key: str
) -> None:
    """Issue 28, item 2, from the terminal: what a dataset holds and who trained on it."""
    path = _jsonl(tmp_path / "chat.jsonl", CHAT)
    dataset = json.loads(cli("datasets", "upload", "support", str(path), "--json").stdout)

    files = cli("datasets", "files", "support")
    assert files.exit_code == 0, files.output
    assert "chat.jsonl" in files.stdout and f"{path.stat().st_size} B" in files.stdout

    sample = cli("datasets", "sample", "support", "-n", "1")
    assert sample.exit_code == 0, sample.output
    assert sample.stdout.startswith("chat.jsonl:1\n")
    assert json.loads(sample.stdout.split("\n", 1)[1]) == CHAT[0]
    as_json = json.loads(cli("datasets", "sample", "support", "--json").stdout)
    assert [i["record"] for i in as_json["items"]] == CHAT

    spec = {"name": "on-support", "data": {"dataset": "support"},
            "resources": {"pool": UNSERVED_POOL}}  # fmt: skip
    with Client(live_api, api_key) as client:
        job = client.jobs.create(spec)
        try:  # cancelled after: a queued job of the shared pool moves others' queue positions
            assert [j.id for j in client.jobs.list(dataset=dataset["id"]).items] == [job.id]
            listed = cli("jobs", "--dataset", "support", "--json")
            assert listed.exit_code == 0, listed.output
            assert [j["id"] for j in json.loads(listed.stdout)] == [job.id]
        finally:
            client.jobs.cancel(job.id)
    unknown = cli("jobs", "--dataset", "nope")
    assert unknown.exit_code != 0
    assert "no dataset 'nope'" in unknown.output


def test_register_a_directory_with_a_filter_shows_it_and_what_is_not_text(
    live_api: str, api_key: str, tmp_path: Path
) -> None:
    """Issue 45, item 1: the filter given at registration is the dataset's, and `show` says
    which of the directory's files are not text (the wheels of `ensurepip`)."""
    import sysconfig

    cli = cli_invoker(live_api, api_key, tmp_path, COLUMNS="80")
    ensurepip = Path(sysconfig.get_paths()["stdlib"]) / "ensurepip"
    result = cli(
        "datasets", "register", "pip", str(ensurepip),
        "--include", "**/*", "--exclude", "*__pycache__/*", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    dataset = json.loads(result.stdout)
    assert (dataset["include"], dataset["exclude"]) == (["**/*"], ["*__pycache__/*"])
    wheels = sorted(p.relative_to(ensurepip).as_posix() for p in ensurepip.rglob("*.whl"))
    assert [e["path"] for e in dataset["left_out"]["examples"]] == wheels and wheels

    shown = cli("datasets", "show", "pip")
    assert shown.exit_code == 0, shown.output
    assert "files: include **/*" in shown.stdout
    assert "exclude *__pycache__/*" in shown.stdout
    left = dataset["left_out"]
    share = left["bytes"] / left["of_bytes"]
    assert f"not UTF-8 text, not read: {len(wheels)} of {left['of_files']} files, {share:.0%}" in (
        shown.stdout
    )
    lines = [line.strip() for line in shown.stdout.splitlines()]
    for wheel in wheels:  # each named whole, once, at the start of a line, at 80 columns
        assert sum(line.startswith(f"{wheel}: byte ") for line in lines) == 1, shown.stdout
        assert shown.stdout.count(wheel) == 1
