"""``torchyard quickstart``: the embedded default, end to end, with no servers to install.

SQLite under ``TORCHYARD_HOME``, Celery over kombu's ``filesystem://`` transport and a local
storage directory. It migrates, bootstraps a project key, starts the API and one worker as
child processes, registers a real corpus (the Python standard library's ``*.py`` files, or
``--data``), submits `examples/quickstart.yaml`, follows the run live and prints the result.
The children are stopped (SIGTERM, then SIGKILL) on the way out, on success, error or Ctrl-C,
unless ``--keep-running``.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.text import Text

from torchyard import launch, quickstart_examples
from torchyard.client import Client
from torchyard.errors import TorchyardError
from torchyard.examples import load_example
from torchyard.follow import follow_job, heartbeat_silence_s
from torchyard.specs import apply_overrides
from torchyard.summary import render_summary
from torchyard.types import Dataset, Job

STDLIB = Path(sysconfig.get_paths()["stdlib"]).resolve()
#: The quickstart gives up itself on a job its worker stopped heartbeating: with one worker,
#: the controller's requeue would leave it queued with nobody to run it.
LOST_JOB_S = 120.0
# Next to this module rather than importlib.resources: an editable install made before the
# package had an __init__.py maps it as a namespace package, which resources cannot read.
EXAMPLE_SPEC = Path(__file__).resolve().parent / "examples" / "quickstart.yaml"


class QuickstartError(TorchyardError):
    """A step of the quickstart failed; the message says which and shows the log tail."""


@dataclass
class Options:
    """What the user chose; None means the example spec's value."""

    home: Path | None = None
    data: Path | None = None
    include: list[str] = field(default_factory=list)
    steps: int | None = None
    procs: int | None = None
    port: int = 0
    keep_running: bool = False
    overrides: list[str] = field(default_factory=list)
    ready_timeout_s: float = 60.0
    project: str = "quickstart"
    example: str = "gpt"  # quickstart_examples.EXAMPLES


def example_spec() -> dict[str, Any]:
    """`torchyard/examples/quickstart.yaml` as a dict (its `data.dataset` is empty)."""
    spec: dict[str, Any] = yaml.safe_load(EXAMPLE_SPEC.read_text())
    return spec


def embedded_env(home: Path, environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` with ``TORCHYARD_HOME`` = `home` and the embedded default's database, broker
    and storage under it, keeping any of those three the user set already."""
    env = dict(environ)
    env["TORCHYARD_HOME"] = str(home)
    env.setdefault("TORCHYARD_DATABASE_URL", f"sqlite:///{home / 'torchyard.db'}")
    env.setdefault("TORCHYARD_BROKER_URL", "filesystem://")
    env.setdefault("TORCHYARD_STORAGE_URL", str(home / "storage"))
    env["PYTHONUNBUFFERED"] = "1"  # so a log tail shows the last thing a child said
    return env


def with_data_root(env: dict[str, str], path: Path) -> dict[str, str]:
    """`env` with `path` added to ``TORCHYARD_DATA_ROOTS`` (a JSON list) so the API lets
    the quickstart register it; left alone when the user's value is not a JSON list."""
    try:
        roots = json.loads(env.get("TORCHYARD_DATA_ROOTS") or "[]")
    except json.JSONDecodeError:
        return env
    if isinstance(roots, list) and str(path) not in roots:
        env = {**env, "TORCHYARD_DATA_ROOTS": json.dumps([*roots, str(path)])}
    return env


def build_spec(base: dict[str, Any], opts: Options) -> dict[str, Any]:
    """The spec to submit: the example with the options and ``--set`` overrides applied.
    Which files of a directory it reads is the dataset's (`corpus_include`), not the spec's.

    `--steps` also caps the eval and checkpoint intervals and the warmup (an eval interval or
    a warmup beyond `max_steps` is a spec error); `--procs 1` switches the strategy to
    ``single``.
    """
    spec = copy.deepcopy(base)
    if opts.steps is not None:
        spec["train"]["max_steps"] = opts.steps
        for section in ("eval", "checkpoint"):
            spec[section]["interval_steps"] = min(spec[section]["interval_steps"], opts.steps)
        optim = spec.get("optim", {})
        if "warmup_steps" in optim:
            optim["warmup_steps"] = min(optim["warmup_steps"], opts.steps)
    if opts.procs is not None:
        spec["resources"]["procs_per_node"] = opts.procs
        spec["parallelism"]["strategy"] = "single" if opts.procs == 1 else "ddp"
    return apply_overrides(spec, opts.overrides)


def dataset_name(path: Path) -> str:
    """A stable dataset name for a corpus path: same path, same name (so reruns reuse it)."""
    if path == STDLIB:
        return f"python{sys.version_info.major}.{sys.version_info.minor}-stdlib"
    digest = hashlib.sha256(str(path).encode()).hexdigest()[:8]
    return f"{path.name or 'data'}-{digest}"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_admin(args: list[str], env: Mapping[str, str], log_path: Path) -> str:
    """Run ``core.admin ARGS``; return its stdout. Raises `QuickstartError` on failure."""
    result = subprocess.run(
        launch.admin_argv(*args), capture_output=True, text=True, env=dict(env), check=False
    )
    with log_path.open("a") as log:
        log.write(f"$ torchyard admin {' '.join(args)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        raise QuickstartError(
            f"`torchyard admin {' '.join(args)}` failed (exit {result.returncode}):\n"
            + _tail(result.stderr or result.stdout)
        )
    return result.stdout


class Servers:
    """The API, the worker, the controller and an exporter as child processes, with their
    logs under ``HOME/logs``."""

    def __init__(self, env: Mapping[str, str], logs: Path, port: int) -> None:
        self.env = env
        self.logs = logs
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self.children: list[launch.Child] = []

    def start(self, pool: str) -> None:
        """Start the API, a worker serving `pool`, the controller (the reconcile loop, so
        `/readyz` and the dashboard do not report it missing) and an exporter (the dashboard's
        Export button and `torchyard export`); stop them with `stop`, even if this raised
        half-way."""
        api = launch.api_argv("127.0.0.1", self.port)
        self.children.append(launch.Child("api", api, self.logs / "api.log", self.env))
        worker = launch.worker_argv(pool, hostname=f"quickstart-{os.getpid()}@%h")
        self.children.append(launch.Child("worker", worker, self.logs / "worker.log", self.env))
        controller = launch.controller_argv()
        self.children.append(
            launch.Child("controller", controller, self.logs / "controller.log", self.env)
        )
        exporter = launch.exporter_argv(hostname=f"quickstart-exporter-{os.getpid()}@%h")
        self.children.append(
            launch.Child("exporter", exporter, self.logs / "exporter.log", self.env)
        )

    def check(self) -> None:
        """Raise `QuickstartError` with the log tail if a child has exited."""
        for child in self.children:
            code = child.process.poll()
            if code is not None:
                raise QuickstartError(
                    f"the {child.name} exited (code {code}); {child.log_path} ends with:\n"
                    + child.log_tail()
                )

    def check_job(self, job: Job) -> None:
        """`check`, and raise when the worker stopped heartbeating the job it runs."""
        self.check()
        silence = heartbeat_silence_s(job, datetime.now(UTC))
        if silence is not None and silence > LOST_JOB_S:
            worker = self.children[1]
            raise QuickstartError(
                f"the worker stopped reporting on job {job.id} ({job.state}) {silence:.0f} s "
                f"ago; {worker.log_path} ends with:\n{worker.log_tail()}"
            )

    def wait_ready(self, timeout_s: float) -> None:
        """Poll ``/readyz`` until it answers 200. Raises `QuickstartError` when a child dies
        or after `timeout_s` seconds, showing the API log's tail."""
        deadline = time.monotonic() + timeout_s
        with Client(self.url, "", timeout=2.0) as probe:
            while not probe.ready():
                self.check()
                if time.monotonic() > deadline:
                    api = self.children[0]
                    raise QuickstartError(
                        f"the API at {self.url} was not ready after {timeout_s:.0f} s; "
                        f"{api.log_path} ends with:\n{api.log_tail()}"
                    )
                time.sleep(0.25)

    def stop(self) -> None:
        """Stop the exporter, the controller and the worker (it stops its run) at once (each
        warm shutdown takes seconds: one after another they took 10 s), then the API. A
        second Ctrl-C meanwhile is ignored: breaking off here would leave the children
        running."""
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            rest = self.children[1:]
            for child in rest:
                child.terminate()
            for child in rest:
                child.reap()
            for api in self.children[:1]:
                api.stop()
        finally:
            signal.signal(signal.SIGINT, previous)


def corpus_include(path: Path, include: list[str]) -> list[str] | None:
    """The files of the corpus directory `path` the dataset holds: `--include`, else the
    standard library's Python sources, else every file (None: the server's default). The
    server leaves out what is not UTF-8 text in any case. None for a file."""
    if path.is_file():
        return None
    return list(include) or (["**/*.py"] if path == STDLIB else None)


def register_corpus(client: Client, path: Path, include: list[str] | None = None) -> Dataset:
    """The dataset for `path` (file or directory) and its `include`: the one a previous run
    registered under the same name with the same filter, else a new registration (which
    makes the server read every file). A dataset of that name with another filter (or one
    registered before filters were kept with datasets) is left alone: the new one's name
    ends in the filter's digest."""
    found = {d.name: d for d in client.datasets.list()}

    def fits(dataset: Dataset) -> bool:
        return path.is_file() or dataset.include == (include or ["**/*"])

    name = dataset_name(path)
    if name in found and not fits(found[name]):
        name = f"{name}-{hashlib.sha256(repr(include).encode()).hexdigest()[:8]}"
    if name in found and fits(found[name]):
        return found[name]
    return client.datasets.register(name, str(path), include=include)


@contextlib.contextmanager
def _interrupts() -> Iterator[threading.Event]:
    """Ctrl-C and SIGTERM both unwind as KeyboardInterrupt, so the children are stopped either
    way; the event yielded stays set once one came, for the follow loop to raise again if a
    library swallowed the first (`follow_job`'s `check` runs at every job message)."""
    interrupted = threading.Event()

    def handler(signum: int, frame: object) -> None:
        interrupted.set()
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interrupted
    finally:
        for sig, action in previous.items():
            signal.signal(sig, action)


def run(opts: Options, console: Console) -> int:
    """The whole quickstart. Returns the exit status: 0 when the job succeeded, 1 when it
    did not, 130 after Ctrl-C or SIGTERM. Raises `QuickstartError` when a step fails."""
    home = (opts.home or Path(os.environ.get("TORCHYARD_HOME", ".torchyard"))).expanduser()
    home, data = home.resolve(), (opts.data or STDLIB).expanduser().resolve()
    if not data.exists():
        raise QuickstartError(f"--data {data}: no such file or directory")
    if opts.example != "gpt" and (opts.data is not None or opts.include):
        raise QuickstartError(f"--data and --include are for the gpt example, not {opts.example}")
    env = embedded_env(home, os.environ)
    if data != STDLIB:
        env = with_data_root(env, data)
    spec = build_spec(example_spec(), opts)
    logs = home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    console.print(Text(f"home {home} (logs in {logs})", style="dim"))
    inputs = None
    if opts.example != "gpt":
        inputs = quickstart_examples.prepare(home, console)
        env = with_data_root(env, quickstart_examples.examples_root(home))
        spec = build_spec(load_example(quickstart_examples.STAGES[opts.example][0].spec), opts)
    api_key = bootstrap(env, logs / "admin.log", opts.project)

    servers = Servers(env, logs, opts.port or free_port())
    job_id: int | None = None
    with _interrupts() as interrupted:

        def check(job: Job) -> None:
            if interrupted.is_set():
                raise KeyboardInterrupt
            servers.check_job(job)

        try:
            console.print(Text(f"starting the API at {servers.url} and a worker ...", style="dim"))
            servers.start(spec["resources"]["pool"])
            servers.wait_ready(opts.ready_timeout_s)
            with Client(servers.url, api_key) as client:
                if inputs is not None:
                    jobs: list[int] = []
                    summary = quickstart_examples.submit(
                        client,
                        opts.example,
                        inputs,
                        prepare_spec=lambda base: build_spec(base, opts),
                        follow=lambda c, i: follow_job(c, i, console, check=check),
                        console=console,
                        on_job=lambda job: jobs.append(job.id),
                    )
                    job_id = jobs[-1]
                else:
                    dataset = register_corpus(client, data, corpus_include(data, opts.include))
                    console.print(Text(f"dataset {dataset.id}: {dataset.uri}", style="dim"))
                    spec["data"]["dataset"] = dataset.id
                    job_id = client.jobs.create(spec).id
                    summary = follow_job(client, job_id, console, check=check)
            console.print(render_summary(summary))
            _print_access(console, servers.url, api_key, home, opts.keep_running)
            if opts.keep_running:
                _wait_for_interrupt(servers)
            return 0 if summary.succeeded else 1
        except BaseException as exc:
            if job_id is not None:  # leave no job running without a worker
                _cancel_quietly(servers.url, api_key, job_id)
            if isinstance(exc, KeyboardInterrupt):
                console.print(Text("interrupted; stopping", style="yellow"))
                return 130
            raise
        finally:
            servers.stop()


def bootstrap(env: Mapping[str, str], log_path: Path, project: str) -> str:
    """Migrate the database and create an API key for `project` (created if absent). The key
    replaces the one an earlier run made (`--replace`): a never-expiring organisation admin
    key piled up in the home's database at every run."""
    run_admin(["migrate"], env, log_path)
    answer = run_admin(["bootstrap", "--project", project, "--replace"], env, log_path)
    api_key = launch.parse_api_key(answer)
    if api_key is None:
        raise QuickstartError("`torchyard admin bootstrap` printed no TORCHYARD_API_KEY=... line")
    return api_key


def _cancel_quietly(url: str, api_key: str, job_id: int) -> None:
    """Cancel the job unless it already ended; errors are ignored (the API may be gone)."""
    with contextlib.suppress(TorchyardError), Client(url, api_key, timeout=5.0) as client:
        if not client.jobs.get(job_id).is_terminal:
            client.jobs.cancel(job_id)


def _wait_for_interrupt(servers: Servers) -> None:
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            servers.check()
            time.sleep(1.0)


def _print_access(console: Console, url: str, api_key: str, home: Path, keep: bool) -> None:
    console.print(Text.assemble(("dashboard ", "bold"), f"{url}/ui/  (sign in with the API key)"))
    console.print(Text.assemble(("API       ", "bold"), f"{url}  (docs {url}/docs)"))
    console.print(Text.assemble(("API key   ", "bold"), api_key))
    console.print(Text.assemble(("home      ", "bold"), str(home)))
    if keep:
        console.print(
            Text(
                f"The API and worker keep running; Ctrl-C stops them. In another shell:\n"
                f"  export TORCHYARD_URL={url} TORCHYARD_API_KEY={api_key}\n"
                f"  torchyard jobs",
                style="dim",
            )
        )
    else:
        console.print(Text("Stopping the servers (--keep-running leaves them up).", style="dim"))


def quickstart_command(
    data: Annotated[
        Path | None,
        typer.Option(help="Corpus file or directory (default: the Python standard library)."),
    ] = None,
    include: Annotated[
        list[str] | None,
        typer.Option(
            help="Glob of files to read in a directory corpus (repeatable) "
            "(default: **/*.py for the stdlib, **/* for --data)."
        ),
    ] = None,
    steps: Annotated[
        int | None, typer.Option(min=1, help="Optimizer steps (default: 600).")
    ] = None,
    procs: Annotated[
        int, typer.Option(min=1, help="Processes (DDP ranks); 1 trains a single process.")
    ] = min(2, os.cpu_count() or 1),
    home: Annotated[
        Path | None,
        typer.Option(help="State directory (default: $TORCHYARD_HOME or ./.torchyard)."),
    ] = None,
    port: Annotated[int, typer.Option(help="API port; 0 picks a free one.")] = 0,
    keep_running: Annotated[
        bool, typer.Option("--keep-running", help="Leave the API and worker up until Ctrl-C.")
    ] = False,
    overrides: Annotated[
        list[str] | None, typer.Option("--set", help="Spec override KEY.PATH=VALUE.")
    ] = None,
    ready_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for the API to become ready.")
    ] = 60.0,
    example: Annotated[
        quickstart_examples.Example,
        typer.Option(
            help="gpt: a small GPT on real text (the default). chat-sft: LoRA chat SFT of a "
            "small Llama (local ChatML tokenizer, packing) on stdlib docstrings. dpo: that "
            "SFT, then DPO from its checkpoint on docstring preference pairs. grpo: SFT of "
            "that Llama on noisily labelled sums of two numbers, then GRPO with LoRA from its "
            "checkpoint, rewarded by a string_check of the true sum.",
        ),
    ] = quickstart_examples.Example.gpt,
) -> None:
    """Train a small GPT on real text end to end: API, worker and job, all local.

    Example: `torchyard quickstart --steps 300`
    """
    opts = Options(
        home=home,
        data=data,
        include=include or [],
        steps=steps,
        procs=procs,
        port=port,
        keep_running=keep_running,
        overrides=overrides or [],
        ready_timeout_s=ready_timeout,
        example=example.value,
    )
    raise typer.Exit(run(opts, Console(soft_wrap=True)))
