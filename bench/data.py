"""The data pipeline against the trainer: loader speed, memory vs corpus size, loop overhead.

    python -m bench.data [--mib 4] [--scale 10] [--steps 30] [--rounds 3] [--chunk 20]

Real text only (no hub): the corpus is the standard library's `.py` sources (with its
site-packages) concatenated (1x: `--mib` MiB, `--scale`x: `--scale` times as much, distinct
files); the chat set is
stdlib functions as ChatML messages (user: a function without its docstring; assistant: the
docstring); the BPE tokenizer is trained here with `tokenizers`. Model: the quickstart GPT
(4 layers, d_model 128, seq_len 128, micro-batch 16, fp32) and a small Llama built from a
config (`transformers`, byte vocabulary). One OpenMP thread everywhere.

1. `prepare`: tokens/s of `trainer.data.prep.prepare_rows` (cold cache) for raw text and the
   chat set, with bytes and with the BPE tokenizer. `loader`: tokens/s `Rows.batch` delivers
   (the sampler's order over the memory-mapped `--scale`x rows, to the CPU device, page cache
   warm) against the tokens/s the trainer consumes (`trainer.loop.train_loop`, one process).
2. `memory`: the real trainer (`torchrun --nproc-per-node 2 -m trainer`, DDP, `--steps`
   steps) on the 1x and the `--scale`x corpus, cold (rank 0 builds the rows) and warm (the
   next attempt finds them in the cache); every rank's /proc status
   is sampled every 20 ms: peak RSS (VmHWM: anonymous and file-backed pages, the latter
   mostly torch's libraries; rows are read with `os.preadv`, so none of the corpus stays
   mapped), and the peaks of RssAnon (heap) and RssFile.
3. `parity`: in one process, the trainer's `train_loop` and a nanoGPT-style loop (same GPT,
   same seed, same memmapped rows in the same order, `torch.optim.AdamW` with the same
   groups, constant lr, clip 1.0) alternate `--rounds` times for `--chunk` steps each;
   per-step wall time is the gap between consecutive steps' ends (everything the loop does),
   the first `--warmup` steps of each chunk are dropped, and the medians are compared.

Prints one JSON document; progress goes to stderr. Not a test: figures move with the load
of a shared host (`load_average` is recorded at start and end).
"""

from __future__ import annotations

import argparse
import ast
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bench import smoke
from bench._common import REPO_ROOT, emit, note
from dataformat.chat import CHATML, CHATML_SPECIAL_TOKENS
from jobspec.job import JobSpec
from trainer.data.prep import prepare_rows
from trainer.data.rows import Rows
from trainer.data.sampler import GlobalBatchSampler
from trainer.distributed import DistInfo
from trainer.events import NullReporter
from trainer.loop import train_loop
from trainer.optim import build_optimizer
from trainer.train import build_run
from workers.launcher import free_port

MODEL = {"n_layers": 4, "n_heads": 4, "d_model": 128, "seq_len": 128}  # quickstart's GPT
LLAMA = {
    "model_type": "llama",
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "hidden_size": 128,
    "intermediate_size": 512,
    "vocab_size": 256,
    "max_position_embeddings": 128,
}
MICRO_BATCH = 16
CPU = torch.device("cpu")
CHAT_SEQ_LEN = 512  # the chat set's rows: functions + docstrings of at most CHAT_MAX_CHARS
CHAT_MAX_CHARS = 400


# -- data -------------------------------------------------------------------------------------


def stdlib_sources() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(root.rglob("*.py"))  # with its site-packages: ~160 MB of Python


def write_corpus(path: Path, sources: list[Path], start: int, num_bytes: int) -> int:
    """Concatenate `sources[start:]` into `path` until `num_bytes`; the next source index."""
    written, index = 0, start
    with path.open("wb") as out:
        while written < num_bytes and index < len(sources):
            data = sources[index].read_bytes()[: num_bytes - written]
            out.write(data)
            written, index = written + len(data), index + 1
    return index


def chat_records(sources: list[Path], limit: int) -> list[dict[str, Any]]:
    """Documented stdlib functions as ChatML-ready messages (assistant: the docstring)."""
    out: list[dict[str, Any]] = []
    for path in sources:
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            doc = ast.get_docstring(node)
            if not doc or len(node.body) < 2:
                continue
            node.body = node.body[1:]
            user = ast.unparse(node)
            if len(user) + len(doc) > CHAT_MAX_CHARS:
                continue
            messages = [{"role": "user", "content": user}, {"role": "assistant", "content": doc}]
            out.append({"messages": messages})
            if len(out) >= limit:
                return out
    return out


def bpe_tokenizer(corpus: Path, vocab_size: int = 4096) -> Any:
    """A byte-level BPE trained on `corpus` (`tokenizers`), ChatML specials and template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", *CHATML_SPECIAL_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train([str(corpus)], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHATML,
    )


def spec_dict(data: dict[str, Any], max_steps: int = 10**5) -> dict[str, Any]:
    return {
        "name": "bench-data",
        "seed": 0,
        "model": dict(MODEL),
        "data": {"uri": "/unused", "eval_fraction": 0.05, **data},
        "optim": {"lr": 0.002, "warmup_steps": 0, "schedule": "constant"},
        "train": {"micro_batch_size": MICRO_BATCH, "max_steps": max_steps, "precision": "fp32"},
        "eval": {"interval_steps": max_steps, "num_batches": 4},
        "checkpoint": {"interval_steps": max_steps, "keep_last": 1},
        "sample": {"max_new_tokens": 1},
        "resources": {"procs_per_node": 1, "device": "cpu"},
        "parallelism": {"strategy": "single"},
    }


TEXT = {"format": "text"}
CHAT = {"format": "messages", "chat_template": "chatml", "packing": True}


def prepare(spec: dict[str, Any], location: Path, tokenizer: Any, cache: Path) -> dict[str, Any]:
    """Cold `prepare_rows`: seconds and input tokens/s (tokens of both sides)."""
    started = time.perf_counter()
    prepared = prepare_rows(
        JobSpec.model_validate(spec), str(location), tokenizer,
        cache_dir=cache, dist=None, reporter=NullReporter(),
    )  # fmt: skip
    seconds = time.perf_counter() - started
    report = prepared.report
    tokens = sum(int(report[side].get("tokens", 0)) for side in ("train", "eval"))
    train_rows = len(prepared.train)
    return {
        "seconds": round(seconds, 2),
        "tokens": tokens,
        "tokens_per_second": round(tokens / seconds),
        "train_rows": train_rows,
        "input_mb": round(location.stat().st_size / 1e6, 1),
    }


# -- 1. loader --------------------------------------------------------------------------------


def loader_rate(rows: Rows, seconds: float = 4.0) -> dict[str, Any]:
    """Tokens/s of `Rows.batch` over the sampler's order (micro-batches of `MICRO_BATCH`)."""
    sampler = GlobalBatchSampler(
        num_chunks=len(rows), seed=0, micro_batch_size=MICRO_BATCH, grad_accum_steps=1,
        rank=0, world_size=1,
    )  # fmt: skip
    batches, started = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - started) < seconds:
        for indices in sampler.next_step():
            rows.batch(indices, CPU)
            batches += 1
    tokens = batches * MICRO_BATCH * rows.seq_len
    return {"batches": batches, "tokens_per_second": round(tokens / elapsed), "rows": len(rows)}


# -- 3. trainer loop vs a minimal loop ----------------------------------------------------------


class StepClock(NullReporter):
    """Records the wall time of every `metric` call that carries a training loss."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def metric(self, step: int, values: dict[str, float]) -> None:
        if "loss" in values:
            self.times.append(time.perf_counter())


def trainer_run(spec: dict[str, Any], rows: tuple[Rows, Rows], ckpt: Path) -> tuple[Any, StepClock]:
    clock = StepClock()
    dist = DistInfo(rank=0, local_rank=0, world_size=1, device=CPU)
    job = JobSpec.model_validate(spec | {"train": spec["train"] | {"log_interval_steps": 1}})
    run = build_run(job, rows[0], rows[1], str(ckpt), dist, clock)
    run.max_steps = 0
    return run, clock


def trainer_chunk(run: Any, clock: StepClock, steps: int) -> list[float]:
    """`steps` steps of the real `train_loop` (its end-of-run eval/checkpoint excluded)."""
    clock.times.clear()
    run.max_steps += steps
    train_loop(run)
    return [b - a for a, b in itertools.pairwise(clock.times)]


class MinimalLoop:
    """nanoGPT's loop: x, y from the memmap, forward, cross-entropy, backward, clip, step."""

    def __init__(self, spec: dict[str, Any], rows: Rows) -> None:
        from trainer.models.gpt import GPT, GPTConfig

        job = JobSpec.model_validate(spec)
        torch.manual_seed(job.seed)
        m = job.model
        self.model = GPT(GPTConfig.from_spec(m))
        self.optimizer = build_optimizer(self.model, job.optim)
        self.rows = rows
        self.sampler = GlobalBatchSampler(
            num_chunks=len(rows), seed=job.seed, micro_batch_size=MICRO_BATCH,
            grad_accum_steps=1, rank=0, world_size=1,
        )  # fmt: skip

    def chunk(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            (indices,) = self.sampler.next_step()
            x = torch.from_numpy(np.ascontiguousarray(self.rows.input_ids[indices])).long()
            y = torch.from_numpy(np.ascontiguousarray(self.rows.labels[indices])).long()
            logits = self.model(x)
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss.item()  # nanoGPT logs every step at log_interval 1
            times.append(time.perf_counter())
        return [b - a for a, b in itertools.pairwise(times)]


def parity(
    spec: dict[str, Any], rows: tuple[Rows, Rows], args: argparse.Namespace, tmp: Path
) -> dict[str, Any]:
    run, clock = trainer_run(spec, rows, tmp / "ckpt-parity")
    minimal = MinimalLoop(spec, rows[0])
    ours: list[float] = []
    theirs: list[float] = []
    for round_ in range(args.rounds):
        note(f"parity round {round_ + 1}/{args.rounds}")
        ours += trainer_chunk(run, clock, args.chunk)[args.warmup :]
        theirs += minimal.chunk(args.chunk)[args.warmup :]
    tokens = MICRO_BATCH * spec["model"]["seq_len"]
    t_ours, t_theirs = statistics.median(ours), statistics.median(theirs)
    return {
        "steps_measured_each": len(ours),
        "trainer_step_ms": round(t_ours * 1000, 2),
        "minimal_step_ms": round(t_theirs * 1000, 2),
        "trainer_tokens_per_second": round(tokens / t_ours),
        "minimal_tokens_per_second": round(tokens / t_theirs),
        "ratio": round(t_theirs / t_ours, 3),
    }


def consumption(spec: dict[str, Any], rows: tuple[Rows, Rows], steps: int, tmp: Path) -> float:
    """Median tokens/s the trainer consumes (`steps` steps, the first 3 dropped)."""
    run, clock = trainer_run(spec, rows, tmp / f"ckpt-{time.monotonic_ns()}")
    gaps = trainer_chunk(run, clock, steps)[3:]
    return MICRO_BATCH * spec["model"]["seq_len"] / statistics.median(gaps)


# -- 2. memory per rank -----------------------------------------------------------------------


def _status(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                out[key] = int(value.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def _trainer_pids(root: int) -> list[int]:
    """Descendants of `root` whose command line runs `-m trainer` (the ranks, not torchrun)."""
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except FileNotFoundError:
            continue
        for child in map(int, children):
            stack.append(child)
            try:
                argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
            except FileNotFoundError:
                continue
            if b"trainer" in argv and b"torch.distributed.run" not in argv[:3] and child != root:
                found.append(child)
    return found


def trainer_memory(spec_path: Path, corpus: Path, cache: Path, tmp: Path) -> dict[str, Any]:
    """Peak VmHWM and peak RssAnon (bytes) per rank of a 2-process torchrun trainer."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
        "--master-port", str(free_port()), "-m", "trainer", "--spec", str(spec_path),
        "--run-dir", str(tmp / "run"), "--checkpoint-dir", str(tmp / "ckpt"),
        "--data", str(corpus), "--cache-dir", str(cache),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    peaks: dict[int, dict[str, int]] = {}
    log = (tmp / "trainer.log").open("wb")
    proc = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    started = time.perf_counter()
    while proc.poll() is None:
        for pid in _trainer_pids(proc.pid):
            status = _status(pid)
            peak = peaks.setdefault(pid, {})
            for key, value in status.items():
                peak[key] = max(peak.get(key, 0), value)
        time.sleep(0.02)
    seconds = time.perf_counter() - started
    log.close()
    if proc.returncode != 0:
        raise RuntimeError((tmp / "trainer.log").read_text()[-3000:])
    ranks = [peaks[pid] for pid in sorted(peaks)]
    mib = 1 << 20
    return {
        "seconds": round(seconds, 1),
        "peak_rss_mib": [round(r.get("VmHWM", 0) / mib, 1) for r in ranks],
        "peak_rss_anon_mib": [round(r.get("RssAnon", 0) / mib, 1) for r in ranks],
        "peak_rss_file_mib": [round(r.get("RssFile", 0) / mib, 1) for r in ranks],
    }


# -- main -------------------------------------------------------------------------------------


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.data", description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=float, default=4.0, help="size of the 1x corpus (MiB)")
    p.add_argument("--scale", type=int, default=10, help="the large corpus is this many times")
    p.add_argument("--steps", type=int, default=30, help="trainer steps of the memory runs")
    p.add_argument("--rounds", type=int, default=3, help="interleaved parity rounds")
    p.add_argument("--chunk", type=int, default=25, help="steps per loop per parity round")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped per parity chunk")
    p.add_argument("--chat", type=int, default=2000, help="records of the chat set")
    p.add_argument("--skip", nargs="*", default=[], choices=["prepare", "memory", "parity"])
    p.add_argument(
        "--cache-states", nargs="+", default=["cold", "warm"], choices=["cold", "warm"],
        help="memory runs with the row cache cold (rank 0 builds the rows) and/or warm",
    )  # fmt: skip
    p.add_argument("--rate-steps", type=int, default=20, help="steps of the GPT rate run")
    args = smoke.parse(
        p, mib=0.05, scale=3, steps=2, rounds=1, chunk=3, warmup=1, chat=20,
        cache_states=["cold"], rate_steps=6,
    )  # fmt: skip
    torch.set_num_threads(1)
    out: dict[str, Any] = {
        "load_average_start": load(),
        "config": vars(args)
        | {"model": MODEL, "micro_batch_size": MICRO_BATCH, "torch": torch.__version__},
    }
    tmp = Path(tempfile.mkdtemp(prefix="bench-data-"))
    try:
        out |= run_all(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["load_average_end"] = load()
    emit(out)


def run_all(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    sources = stdlib_sources()
    small, large = tmp / "corpus_1x.txt", tmp / "corpus_big.txt"
    size = int(args.mib * (1 << 20))
    next_index = write_corpus(small, sources, 0, size)
    write_corpus(large, sources, next_index, size * args.scale)
    note(f"corpora {small.stat().st_size} and {large.stat().st_size} bytes")
    cache = tmp / "cache"
    out: dict[str, Any] = {}
    prep: dict[str, Any] = {}
    text_spec = spec_dict(TEXT)
    prep["text_bytes_1x"] = prepare(text_spec, small, None, cache)
    prep[f"text_bytes_{args.scale}x"] = prepare(text_spec, large, None, cache)
    if "prepare" not in args.skip:
        note("training the BPE tokenizer")
        tok = bpe_tokenizer(small)
        prep["text_bpe_1x"] = prepare(text_spec, small, tok, cache)
        chat, chat_spec = tmp / "chat.jsonl", spec_dict(CHAT)
        chat_spec["model"]["seq_len"] = CHAT_SEQ_LEN
        records = chat_records(sources, args.chat)
        chat.write_text("".join(json.dumps(r) + "\n" for r in records))
        prep["chat_bytes"] = prepare(chat_spec, chat, None, cache) | {"records": len(records)}
        prep["chat_bpe"] = prepare(chat_spec, chat, tok, cache) | {"records": len(records)}
    out["prepare"] = prep
    big_dir = next(
        d
        for d in cache.iterdir()
        if (d / "data.json").is_file()
        and json.loads((d / "data.json").read_text())["train"]["tokens"] > size * 2
    )
    big = (Rows.open(big_dir / "train"), Rows.open(big_dir / "eval"))
    note("loader")
    loader = loader_rate(big[0])
    gpt_rate = consumption(text_spec, big, args.rate_steps, tmp)
    llama_spec = spec_dict(TEXT) | {
        "model": {"kind": "hf", "seq_len": 128, "hf": {"from_config": LLAMA}}
    }
    llama_rate = consumption(llama_spec, big, max(5, args.rate_steps * 3 // 5), tmp)
    out["loader"] = loader | {
        "trainer_tokens_per_second_gpt": round(gpt_rate),
        "trainer_tokens_per_second_llama": round(llama_rate),
        "ratio_gpt": round(loader["tokens_per_second"] / gpt_rate, 1),
        "ratio_llama": round(loader["tokens_per_second"] / llama_rate, 1),
    }
    if "memory" not in args.skip:
        out["memory"] = memory(args, small, large, cache, tmp)
    if "parity" not in args.skip:
        out["parity"] = parity(text_spec, big, args, tmp)
    return out


def memory(
    args: argparse.Namespace, small: Path, large: Path, cache: Path, tmp: Path
) -> dict[str, Any]:
    spec = spec_dict(TEXT, args.steps)
    spec["resources"]["procs_per_node"] = 2
    spec["parallelism"]["strategy"] = "ddp"
    spec_path = tmp / "spec.json"
    spec_path.write_text(json.dumps(spec))
    result: dict[str, Any] = {"steps": args.steps, "procs": 2}
    for name, corpus in (("1x", small), (f"{args.scale}x", large)):
        fresh = tmp / f"cache-{name}"  # cold: rank 0 builds the rows; warm: a later attempt
        for state in args.cache_states:
            note(f"memory run {name} {state}")
            work = tmp / f"mem-{name}-{state}"
            work.mkdir()
            result[f"{name}_{state}"] = trainer_memory(spec_path, corpus, fresh, work)
    for state in args.cache_states:
        a, b = result[f"1x_{state}"], result[f"{args.scale}x_{state}"]
        result[f"ratio_peak_rss_{state}"] = round(
            max(b["peak_rss_mib"]) / max(a["peak_rss_mib"]), 3
        )
        result[f"ratio_peak_rss_anon_{state}"] = round(
            max(b["peak_rss_anon_mib"]) / max(a["peak_rss_anon_mib"]), 3
        )
    return result


if __name__ == "__main__":
    main()
