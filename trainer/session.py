"""Entrypoint of a session job (issue 47): serve one Tinker training client's calls, in
`seq_id` order, on the built-in model stack (`trainer.session_calls`).

    torchrun ... -m trainer.session --spec RUN_DIR/spec.json --run-dir RUN_DIR

The worker relays the calls (docs/CONTRACTS.md, "The session program"): each queued call is a
file `RUN_DIR/session/in/<seq_id:012d>.<request_id>.<kind>` holding the body as the client
sent it (`forward_backward`'s protobuf; `optim_step`'s and `save_weights`' JSON;
`load_weights`' as the worker rewrote it, naming the checkpoint it copied in), written
atomically. The program runs call `seq_id` n only after n - 1 (the first is `next_seq` of
`RUN_DIR/session/start.json`, 1 for a new client) and answers each in
`RUN_DIR/session/out/<request_id>`: one JSON header line (`{"type": media type}` or
`{"error", "category"}`), a newline, then the answer's bytes, written atomically; then it
removes the call's file. A call is run once: a file of a request already answered in this life
is removed unread, and one whose `seq_id` is below the next is refused (a user error), never
run again.

One process (the session's model lives in one rank); SIGTERM (the session ended, or the job was
cancelled or preempted) stops it between calls with exit code 0, after saving the weights
changed since the last save (an unnamed checkpoint of the job). A new attempt of the job (after
a preemption, or its worker's loss) resumes from the job's latest checkpoint: the client's last
`save_state` or that kept state, whichever is later; the base model's fresh adapters when there
is none. Exit codes as the trainer's:
2 for a spec it cannot serve, 1 for any other failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from pydantic import ValidationError
from torch.distributed.elastic.multiprocessing.errors import record

from dataformat.errors import InvalidJobError
from dataformat.tinker_wire import WireError, forward_backward_request
from jobspec.job import SessionJobSpec
from trainer.distributed import env_world_size
from trainer.events import EventWriter
from trainer.logs import log_to_stdout
from trainer.session_calls import CallError, SessionModel, encode_output
from trainer.session_sampling import Sampler

log = logging.getLogger("trainer.session")

# How often the program looks for the next call when it has none: every BUSY_POLL_S within
# BUSY_S of its last call (a client at work sends the next one within milliseconds; a look is
# one listing of a local directory, ~20 us), else every POLL_S.
POLL_S = 0.005
BUSY_POLL_S = 0.001
BUSY_S = 2.0
SEQ_GAP_S = 60.0  # a missing seq_id waited for this long is skipped (a call the API refused)
JSON_TYPE = "application/json"
PROTOBUF_TYPE = "application/x-protobuf"
SAMPLE = "sample"  # the sampler lane's calls: run as they come, outside the seq_id order


@dataclass(frozen=True, order=True)
class Call:
    """One relayed call: its file `path`, named `<seq_id>.<request_id>.<kind>`."""

    seq_id: int
    request_id: str
    kind: str
    path: Path

    @classmethod
    def parse(cls, path: Path) -> Call | None:
        parts = path.name.split(".")
        if len(parts) != 3 or not parts[0].isdigit():
            return None  # a temporary file of the worker's, or not a call
        return cls(int(parts[0]), parts[1], parts[2], path)


class Stop:
    def __init__(self) -> None:
        self.requested = False
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        log.info("signal %d: stopping after the current call", signum)
        self.requested = True


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trainer.session", description=__doc__.split("\n")[0]
    )
    p.add_argument("--spec", required=True, help="SessionJobSpec JSON file")
    p.add_argument("--run-dir", required=True, type=Path, help="the run dir (session/ in it)")
    p.add_argument("--checkpoint-dir", help="the job's checkpoint directory (save_state)")
    return p.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Serve the session's calls until SIGTERM; SystemExit(2) for a spec it cannot serve."""
    args = parse_args(argv)
    log_to_stdout(0)
    reporter = EventWriter(args.run_dir)
    try:
        spec = _load_spec(args.spec)
        device = torch.device("cuda" if spec.resources.device == "cuda" else "cpu")
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK") or 0))
        model = SessionModel(spec, device)
        # an earlier attempt's state (preempted, or its worker lost): the latest it saved
        resumed = model.resume(args.checkpoint_dir, reporter) if args.checkpoint_dir else None
        since = "" if resumed is None else f", resumed from its checkpoint at step {resumed}"
        reporter.status(
            "running",
            f"serving training client {spec.session.model_id}{since}",
            {
                "model_id": spec.session.model_id,
                "trainable_params": model.network.trainable_params,
                "resumed_step": resumed,
            },
        )
        server = Server(
            args.run_dir,
            model,
            reporter,
            model_id=spec.session.model_id,
            checkpoint_dir=args.checkpoint_dir,
        )
        server.serve(Stop())
    except InvalidJobError as exc:
        _report(reporter, exc, 2)
        print(f"trainer.session: cannot serve this session: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None
    except Exception as exc:
        _report(reporter, exc, 1)
        raise
    finally:
        reporter.close()


def _load_spec(path: str) -> SessionJobSpec:
    try:
        spec = SessionJobSpec.model_validate_json(Path(path).read_text())
    except (OSError, ValueError, ValidationError) as exc:
        raise InvalidJobError(f"invalid session spec {path}: {exc}") from exc
    if env_world_size() != 1:
        raise InvalidJobError(f"a session runs in one process, launched with {env_world_size()}")
    return spec


def _report(reporter: EventWriter, exc: BaseException, exit_code: int) -> None:
    reporter.error(
        message=f"{type(exc).__name__}: {exc}",
        traceback="".join(traceback.format_exception(exc)),
        exit_code=exit_code,
        failure_class="user_error" if exit_code == 2 else "infra",
        rank=0,
    )


class Server:
    """The call loop over `run_dir/session/` (see the module docstring)."""

    def __init__(
        self,
        run_dir: Path,
        model: SessionModel,
        reporter: EventWriter,
        *,
        model_id: str = "",
        checkpoint_dir: str | None = None,
    ) -> None:
        root = run_dir / "session"
        self.inbox, self.outbox = root / "in", root / "out"
        self.inbox.mkdir(parents=True, exist_ok=True)
        self.outbox.mkdir(parents=True, exist_ok=True)
        start = root / "start.json"
        self.next_seq = json.loads(start.read_text())["next_seq"] if start.exists() else 1
        self.model = model
        self.sampler = Sampler(model)
        self.reporter = reporter
        self.model_id = model_id
        self.checkpoint_dir = checkpoint_dir
        self.answered: set[str] = set()
        self.waiting_since: float | None = None

    def serve(self, stop: Stop) -> None:
        """Run calls as they come, in `seq_id` order, until `stop` is requested."""
        last_call = time.monotonic()
        while not stop.requested:
            if self.run_ready():
                last_call = time.monotonic()
            else:
                time.sleep(BUSY_POLL_S if time.monotonic() - last_call < BUSY_S else POLL_S)
        if self.model.unsaved and self.checkpoint_dir is not None:
            # preempted, paused or ended: the weights since the last save are kept (unnamed),
            # the state the job's next attempt resumes from and its last exportable checkpoint
            step = self.model.save(
                self.checkpoint_dir, None, overwrite=False, reporter=self.reporter
            )
            log.info("stopped: state kept at step %d", step)

    def run_ready(self) -> bool:
        """Run every sample call handed over (oldest first: their lane), then every training
        call that is next in `seq_id` order; whether any ran."""
        found = sorted(c for p in self.inbox.iterdir() if (c := Call.parse(p)) is not None)
        samples = [c for c in found if c.kind == SAMPLE]
        for call in samples:
            if call.request_id in self.answered:
                call.path.unlink(missing_ok=True)
            else:
                self._run(call)
        calls = [c for c in found if c.kind != SAMPLE]
        ran = False
        for call in calls:
            if call.request_id in self.answered:
                call.path.unlink(missing_ok=True)
            elif call.seq_id < self.next_seq:
                self._answer(call, error=f"seq_id {call.seq_id} has already run", category="user")
            elif call.seq_id == self.next_seq or self._gap_expired(call):
                self.next_seq = call.seq_id + 1
                self._run(call)
                ran = True
            else:
                break  # the next call in order has not come yet
        self.waiting_since = None if ran or not calls else self.waiting_since or time.monotonic()
        return ran or bool(samples)

    def _gap_expired(self, call: Call) -> bool:
        """Whether the calls before `call` have been missing for `SEQ_GAP_S` (refused by the
        API, so never coming)."""
        if self.waiting_since is None or time.monotonic() - self.waiting_since < SEQ_GAP_S:
            return False
        log.warning("seq_id %d never came; running %d", self.next_seq, call.seq_id)
        return True

    def _run(self, call: Call) -> None:
        body = call.path.read_bytes()
        try:
            media_type, answer = self._compute(call.kind, body)
        except (CallError, WireError, KeyError, TypeError, ValueError) as exc:
            self._answer(call, error=_words(exc), category="user")
        except Exception as exc:  # the model's failure, not the client's: the next may run
            log.exception("call %s (%s) failed", call.request_id, call.kind)
            self._answer(call, error=_words(exc), category="server")
        else:
            self._answer(call, media_type=media_type, body=answer)

    def _compute(self, kind: str, body: bytes) -> tuple[str, bytes]:
        if kind in ("forward_backward", "forward"):
            request = forward_backward_request(body)
            only = kind == "forward" or bool(request.forward_only)
            output = self.model.forward_backward(request, forward_only=only)
            return PROTOBUF_TYPE, encode_output(output)
        if kind == "optim_step":
            adam: dict[str, Any] = json.loads(body)["adam_params"]
            metrics = self.model.optim_step(adam)
            self.reporter.metric(
                self.model.step,
                {
                    "loss": metrics["loss:sum"],
                    "grad_norm": metrics["grad_norm:mean"],
                    "lr": metrics["learning_rate:mean"],
                },
            )
            return JSON_TYPE, json.dumps({"metrics": metrics}).encode()
        if kind == "save_weights":
            save = json.loads(body)
            if self.checkpoint_dir is None:
                raise CallError("this session has no checkpoint directory")
            self.model.save(
                self.checkpoint_dir,
                save["name"],
                overwrite=bool(save.get("overwrite")),
                reporter=self.reporter,
            )
            path = f"tinker://{self.model_id}/weights/{save['name']}"
            return JSON_TYPE, json.dumps({"path": path, "type": "save_weights"}).encode()
        if kind == "save_weights_for_sampler":
            save = json.loads(body)
            self.sampler.save(save["name"])
            answer = {"type": "save_weights_for_sampler"}
            if "sampling_session_id" in save:  # unnamed: a sampling session of it
                answer["sampling_session_id"] = save["sampling_session_id"]
            else:
                answer["path"] = f"tinker://{self.model_id}/sampler_weights/{save['name']}"
            return JSON_TYPE, json.dumps(answer).encode()
        if kind == SAMPLE:
            return PROTOBUF_TYPE, self.sampler.sample(body)
        if kind == "load_weights":
            load = json.loads(body)
            if "error" in load:  # the worker could not place the checkpoint
                raise CallError(str(load["error"]))
            self.model.load(load["checkpoint"], optimizer=bool(load["optimizer"]))
            return JSON_TYPE, json.dumps({"path": load["path"], "type": "load_weights"}).encode()
        raise CallError(f"{kind} is not served by this session yet")

    def _answer(
        self,
        call: Call,
        *,
        media_type: str = JSON_TYPE,
        body: bytes = b"",
        error: str | None = None,
        category: str = "user",
    ) -> None:
        header = {"type": media_type} if error is None else {"error": error, "category": category}
        temporary = self.outbox / f".{call.request_id}.tmp"
        temporary.write_bytes(json.dumps(header).encode() + b"\n" + body)
        os.replace(temporary, self.outbox / call.request_id)
        self.answered.add(call.request_id)
        call.path.unlink(missing_ok=True)


def _words(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text if isinstance(exc, CallError | WireError) else f"{type(exc).__name__}: {text}"


if __name__ == "__main__":
    main()
