"""The eval job's program (`jobspec.job.EvalJobSpec`): rebuild a checkpoint's model, run each
evaluation, report the scores.

    torchrun ... -m trainer.evaluate --spec RUN_DIR/spec.json --run-dir RUN_DIR \\
        --inputs RUN_DIR/inputs.json [--cache-dir DIR]

`inputs.json` holds the locations the worker resolved (`core.jobs.evaluations.launch_inputs`).
The model is the source job's, rebuilt from the spec saved with the checkpoint
(`trainer.models.network.build_network`: the same seeded base, quantization and adapters) and
given the checkpoint's weights (`load_model_only`; a LoRA checkpoint's adapters on their
frozen base, not merged).

- `perplexity`: the rows are built by the source's own data pipeline (`trainer.data.prep`:
  tokenizer, chat template, `loss_on` mask, packing, `seq_len`), and scored by the function
  the trainer's evaluation uses (`trainer.methods.sft.token_loss_sums`); on the source's own
  split, over exactly the rows its `eval_loss` used (`eval.num_batches` x
  `micro_batch_size` x its data-parallel size). The rows are dealt to this job's ranks and the
  sums reduced, so the loss equals the trainer's for any world size.
- `generate` (rank 0): each record is encoded as the trainer encodes it
  (`dataformat.masks.encode_at`); its prompt is what precedes its last supervised span, its
  reference that span's own text (the completion, or the last assistant message) without the
  template's closing marker, which also ends the answer. Scores: exact match (after
  stripping whitespace), chrF (Popovic 2015, `sacrebleu.corpus_chrf`, 0-100) and ROUGE-L F1
  (Lin 2004, `rouge_score`, 0-1).
- `reward` (rank 0): held-out prompts answered and scored by graders (`trainer.eval_reward`:
  a GRPO source's own held-out prompts and graders by default); metrics `reward`,
  `reward_std`, `reward/<grader>`, each completion stored with its reward.
- `lm_eval` (rank 0): EleutherAI's lm-evaluation-harness (Gao et al., `lm_eval.simple_evaluate`)
  on the model (`trainer.lm_eval_model`: its Hugging Face backend for a Hugging Face model
  with a tokenizer, an adapter of the built-in GPT otherwise); metrics `<task>/<metric>`.
- With no checkpoint (`source.initial`), the model is the source's starting weights, built as
  its trainer builds them before the first step (`load_initial_model`), reported at step 0.

Each evaluation is reported as an `evaluation` event (scores, answers) and as metrics
`<name>.<metric>` at the checkpoint's step. Exit codes as the trainer's: 0 done, 2 invalid
input (`user_error`, not retried), 1 any other failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import ValidationError
from torch import Tensor
from torch.distributed.elastic.multiprocessing.errors import record
from transformers import PreTrainedTokenizerBase

from dataformat.errors import InvalidJobError
from dataformat.masks import Tokenizer
from dataformat.readers import iter_records, list_files
from dataformat.records import MessagesRecord, PromptCompletionRecord, parse_record
from jobspec.data import DataSpec
from jobspec.evaluate import GenerateEval, LmEvalEval, PerplexityEval, RewardEval
from jobspec.job import STORED, EvalJobSpec, JobSpec
from trainer import eval_reward
from trainer.checkpoint.checkpointer import checkpoint_spec, load_model_only
from trainer.data.byte_tokenizer import decode
from trainer.data.prep import cache_root, encode_one, prepare_rows, row_recipe
from trainer.data.rows import Rows
from trainer.data.sampler import eval_batches
from trainer.distributed import DistInfo, all_reduce_sum, env_rank, init_distributed, shutdown
from trainer.events import EventWriter, NullReporter, Reporter
from trainer.logs import log_to_stdout
from trainer.methods.sft import token_loss_sums
from trainer.models.gpt import generate
from trainer.models.network import Network, build_network, lora_settings, trainable_names
from trainer.parallel.dims import ParallelDims
from trainer.train import report_failure

log = logging.getLogger("trainer.evaluate")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trainer.evaluate", description=__doc__.split("\n")[0]
    )
    p.add_argument("--spec", required=True, help="EvalJobSpec JSON file")
    p.add_argument("--run-dir", required=True, type=Path, help="directory for events.jsonl")
    p.add_argument("--inputs", required=True, type=Path, help="the resolved locations (JSON)")
    p.add_argument("--cache-dir", help="local directory of the row cache")
    p.add_argument(
        "--code-dir", type=Path, help="the GRPO source's code archive, unpacked (its graders')"
    )
    return p.parse_args(argv)


@record
def main(argv: list[str] | None = None) -> None:
    """Run one attempt of an eval job; raises SystemExit(2) for invalid input."""
    args = parse_args(argv)
    # lm-eval's `datasets` reads only the project's files: no hub (workers reach none), and
    # its cache in the run directory (the sandbox's writable place)
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_CACHE", str(args.run_dir / "hf_datasets"))
    rank = env_rank()
    log_to_stdout(rank)
    reporter: Reporter = EventWriter(args.run_dir) if rank == 0 else NullReporter()
    dist_info: DistInfo | None = None
    try:
        try:
            spec = EvalJobSpec.model_validate_json(Path(args.spec).read_text())
            inputs = json.loads(args.inputs.read_text())
        except (OSError, ValueError, ValidationError) as exc:
            raise InvalidJobError(f"invalid eval job {args.spec}: {exc}") from exc
        dist_info = init_distributed(spec.resources.device)
        inputs["code_dir"] = str(args.code_dir) if args.code_dir else None  # source's graders
        run_evaluations(spec, inputs, cache_root(args.cache_dir), dist_info, reporter)
        shutdown(dist_info, clean=True)
    except InvalidJobError as exc:
        report_failure(exc, 2, reporter, dist_info)
        raise SystemExit(2) from None
    except Exception as exc:
        report_failure(exc, 1, reporter, dist_info)
        raise
    finally:
        reporter.close()


def run_evaluations(
    spec: EvalJobSpec,
    inputs: dict[str, Any],
    cache_dir: Path,
    dist_info: DistInfo,
    reporter: Reporter,
) -> dict[str, dict[str, float]]:
    """Every evaluation of `spec` on the checkpoint `inputs` names; returns {name: metrics}
    (every rank: perplexities; rank 0: generations too). Raises `InvalidJobError` when the
    checkpoint has no spec this trainer reads, or the data does not fit."""
    checkpoint = inputs["checkpoint"]
    if checkpoint is None:  # `source.initial`: the job's starting weights
        source = JobSpec.model_validate(inputs["source_spec"], context=STORED)
        step, what = 0, "starting weights"
    else:
        source = source_spec(checkpoint["uri"])
        step, what = int(checkpoint["step"]), f"checkpoint at step {checkpoint['step']}"
    names = spec.evaluate.names()
    reporter.status(
        "running",
        f"evaluating job {inputs['source_job']}'s {what} on "
        f"{dist_info.world_size} process(es): {', '.join(names)}",
        {"world_size": dist_info.world_size, "source_job": inputs["source_job"], "step": step},
    )
    if checkpoint is None:
        network = load_initial_model(source, inputs, dist_info)
    else:
        network = load_checkpoint_model(source, checkpoint["uri"], inputs, dist_info)
    results: dict[str, dict[str, float]] = {}
    for evaluation in spec.evaluate.evaluations:
        name = evaluation.name or evaluation.kind
        dataset = inputs["datasets"].get(name)
        samples: list[dict[str, Any]] = []
        if isinstance(evaluation, PerplexityEval):
            metrics = perplexity(evaluation, source, inputs, dataset, network, cache_dir, dist_info)
        elif dist_info.rank != 0:  # generation and the harness run on rank 0
            continue
        elif isinstance(evaluation, LmEvalEval):
            metrics = harness(evaluation, network, inputs, dist_info, spec.seed)
        elif isinstance(evaluation, RewardEval):
            metrics, samples = eval_reward.reward(
                evaluation, source, inputs, dataset, network, dist_info, spec.seed
            )
        else:
            assert dataset is not None  # `generate` names a dataset (the spec requires it)
            metrics, samples = answer(evaluation, source, dataset, network, dist_info, spec.seed)
        results[name] = metrics
        log.info("%s: %s", name, metrics)
        reporter.emit(
            "evaluation",
            name=name,
            kind=evaluation.kind,
            dataset=dataset["id"] if dataset else None,
            step=step,
            checkpoint_id=None if checkpoint is None else checkpoint["id"],
            metrics=metrics,
            samples=samples,
        )
        reporter.metric(step, {f"{name}.{metric}": value for metric, value in metrics.items()})
    reporter.status("completed", f"{len(names)} evaluation(s) done", {"evaluations": results})
    return results


def harness(
    evaluation: LmEvalEval,
    network: Network,
    inputs: dict[str, Any],
    dist_info: DistInfo,
    seed: int,
) -> dict[str, float]:
    """lm-evaluation-harness's tasks on `network` (`trainer.lm_eval_model`), offline. Raises
    `InvalidJobError` for a task lm-eval cannot load (an unknown name, a bad config)."""
    from trainer import lm_eval_model

    try:
        return lm_eval_model.run_tasks(
            evaluation,
            network,
            inputs["task_datasets"],
            task_dirs=inputs["lm_eval_task_dirs"],
            device=dist_info.device,
            seed=seed,
        )
    except (KeyError, ValueError, TypeError, FileNotFoundError) as exc:
        if isinstance(exc, KeyError) or "task" in str(exc).lower():
            raise InvalidJobError(f"{evaluation.name}: lm-eval refused the tasks: {exc}") from exc
        raise


def source_spec(uri: str) -> JobSpec:
    """The spec saved with the checkpoint at `uri`. Raises `InvalidJobError` without one."""
    try:
        return checkpoint_spec(uri)
    except (OSError, ValueError) as exc:
        raise InvalidJobError(f"checkpoint {uri} holds no spec this trainer reads: {exc}") from exc


def load_checkpoint_model(
    source: JobSpec, uri: str, inputs: dict[str, Any], dist_info: DistInfo
) -> Network:
    """The source's network (one whole copy per rank) with the checkpoint's weights, in eval
    mode: a LoRA run's adapters on the frozen base its `init_from` gave it, not merged."""
    lora = lora_settings(source) is not None
    base_from = inputs.get("source_init_from") if lora else None
    network = build_network(
        source, device=dist_info.device, init_from=base_from, dist_info=dist_info
    )
    names = trainable_names(network.model) if lora else None
    load_model_only(network.model, uri, dist_info=dist_info, names=names)
    network.model.eval()
    return network


def load_initial_model(source: JobSpec, inputs: dict[str, Any], dist_info: DistInfo) -> Network:
    """The source's network as its trainer builds it before the first step (one whole copy per
    rank, eval mode): weights from its `init_from` checkpoint, its Hugging Face files, or drawn
    from its seed; LoRA adapters fresh (B = 0: they change no output)."""
    network = build_network(
        source, device=dist_info.device, init_from=inputs.get("source_init_from"),
        dist_info=dist_info,
    )  # fmt: skip
    network.model.eval()
    return network


def on_dataset(source: JobSpec, dataset: dict[str, Any]) -> JobSpec:
    """`source` reading `dataset` (whole, as its evaluation side) instead of its own data:
    same tokenizer, template, packing and `seq_len`; its `loss_on` where the format matches."""
    same_format = dataset["format"] == source.data.format
    data = DataSpec(
        uri=dataset["uri"],
        eval_uri=dataset["uri"],
        format=dataset["format"],
        loss_on=source.data.loss_on if same_format else None,
        chat_template=source.data.chat_template,
        packing=source.data.packing,
        truncation=source.data.truncation,
    )
    return source.model_copy(update={"data": data})


def perplexity(
    evaluation: PerplexityEval,
    source: JobSpec,
    inputs: dict[str, Any],
    dataset: dict[str, Any] | None,
    network: Network,
    cache_dir: Path,
    dist_info: DistInfo,
) -> dict[str, float]:
    """{loss (nats per supervised token), perplexity, tokens, rows}: the source's own
    evaluation split over the rows its trainer scored, or `dataset` whole (up to `max_rows`)."""
    quiet = NullReporter()
    if dataset is None:
        prepared = prepare_rows(
            source, inputs["source_data"], network.tokenizer, cache_dir=cache_dir,
            dist=dist_info, reporter=quiet, eval_location=inputs["source_eval_data"],
        )  # fmt: skip
        rows = _plain(prepared.eval)
        total = trainer_eval_rows(source, len(rows))
    else:
        reading = on_dataset(source, dataset)
        prepared = prepare_rows(
            reading, dataset["uri"], network.tokenizer, cache_dir=cache_dir,
            dist=dist_info, reporter=quiet, eval_location=dataset["uri"],
        )  # fmt: skip
        rows = _plain(prepared.eval)
        total = len(rows)
    if evaluation.max_rows is not None:
        total = min(total, evaluation.max_rows)
    batches = eval_batches(
        num_chunks=total,
        num_batches=total,
        micro_batch_size=source.train.micro_batch_size,
        rank=dist_info.rank,
        world_size=dist_info.world_size,
    )
    sums = token_loss_sums(
        network.model,
        rows,
        batches,
        device=dist_info.device,
        precision=source.train.precision,
    )
    loss_sum, count = all_reduce_sum(sums, dist_info).tolist()
    if count == 0:
        raise InvalidJobError(f"{evaluation.name}: no supervised token in {total} row(s)")
    loss = loss_sum / count
    return {"loss": loss, "perplexity": math.exp(loss), "tokens": count, "rows": float(total)}


def trainer_eval_rows(source: JobSpec, available: int) -> int:
    """How many eval rows the source's trainer scored in each evaluation
    (`trainer.data.sampler.eval_batches` with its batch size and data-parallel size)."""
    dims = ParallelDims.from_spec(source, source.world_size)
    per_round = source.train.micro_batch_size * dims.dp_size
    total = min(available, source.eval.num_batches * per_round)
    if dims.collective_forward or dims.pp > 1:
        total -= total % per_round
    return total


def _plain(rows: Any) -> Rows:
    if not isinstance(rows, Rows):
        raise InvalidJobError("perplexity scores token rows, not preference pairs")
    return rows


def answer(
    evaluation: GenerateEval,
    source: JobSpec,
    dataset: dict[str, Any],
    network: Network,
    dist_info: DistInfo,
    seed: int,
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Answers to the first `max_prompts` records of `dataset`, scored against their
    references: ({exact_match, chrf, rouge_l, answers}, one sample per record)."""
    tok = Tokenizer(network.tokenizer)
    reading = on_dataset(source, dataset)
    files = list_files(dataset["uri"], reading.data.include, reading.data.exclude)
    recipe = row_recipe(reading, files, None, tok)
    generator = torch.Generator(device=dist_info.device).manual_seed(seed)
    eos_id = tok.eos_id if evaluation.stop_at_eos else None
    samples: list[dict[str, Any]] = []
    for where, _, obj in iter_records(files):
        if len(samples) >= evaluation.max_prompts:
            break
        example = encode_one(where, obj, recipe, tok)
        span = last_supervised_span(example.supervised)
        if span is None or span[0] == 0:
            continue  # nothing to answer, or no prompt before it
        start, end = span
        reference = reference_text(recipe.format, obj)
        closing = closing_marker(_text(network.tokenizer, example.input_ids[start:end]), reference)
        prompt = torch.as_tensor(example.input_ids[:start].astype(np.int64))
        ids = generate(
            network.model,
            prompt,
            evaluation.max_new_tokens,
            evaluation.temperature,
            generator,
            vocab_size=network.vocab_size,
            top_k=evaluation.top_k,
            stop=_stopper(network.tokenizer, eos_id, closing),
        )
        text = _text(network.tokenizer, ids, skip_special=True)
        if closing:
            text = text.split(closing, 1)[0]
        samples.append(
            {
                "prompt": _text(network.tokenizer, example.input_ids[:start]),
                "reference": reference.strip(),
                "answer": text.strip(),
            }
        )
    if not samples:
        raise InvalidJobError(f"{evaluation.name}: no record of {dataset['id']} has a prompt")
    return score(samples), samples


def last_supervised_span(supervised: np.ndarray) -> tuple[int, int] | None:
    """[start, end) of the last run of supervised positions, None without one."""
    found = np.flatnonzero(supervised)
    if found.size == 0:
        return None
    end = int(found[-1]) + 1
    start = end - 1
    while start > 0 and supervised[start - 1]:
        start -= 1
    return start, end


def reference_text(format: str, obj: Any) -> str:
    """The reference answer of a record: its completion, or its last assistant message."""
    parsed = parse_record(format, obj)
    if isinstance(parsed, PromptCompletionRecord):
        if isinstance(parsed.completion, str):
            return parsed.completion
        messages = parsed.completion
    elif isinstance(parsed, MessagesRecord):
        messages = parsed.messages
    else:
        return ""
    assistant = [m for m in messages if m.role == "assistant" and m.content]
    return assistant[-1].content or "" if assistant else ""


def closing_marker(span_text: str, reference: str) -> str:
    """What the template adds after the reference in its supervised span (`<|im_end|>`,
    `</s>`): the end of an answer. Empty when the span is the reference alone."""
    at = span_text.rfind(reference.strip()) if reference.strip() else -1
    return span_text[at + len(reference.strip()) :].strip() if at >= 0 else ""


def _text(
    tokenizer: PreTrainedTokenizerBase | None, ids: Tensor | np.ndarray, skip_special: bool = False
) -> str:
    flat = [int(i) for i in ids.tolist()]
    if tokenizer is None:
        return decode(flat)
    return str(tokenizer.decode(flat, skip_special_tokens=skip_special))


def _stopper(tokenizer: PreTrainedTokenizerBase | None, eos_id: int | None, closing: str) -> Any:
    def stop(ids: Tensor) -> bool:
        if eos_id is not None and int(ids[-1]) == eos_id:
            return True
        return bool(closing) and closing in _text(tokenizer, ids[-64:])

    return stop


def score(samples: list[dict[str, Any]]) -> dict[str, float]:
    """Exact match, chrF and ROUGE-L over `samples` (each gets its own three, in place)."""
    import sacrebleu
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rougeL"])
    for sample in samples:
        reference, text = sample["reference"], sample["answer"]
        sample["exact_match"] = float(text == reference)
        sample["chrf"] = sacrebleu.sentence_chrf(text, [reference]).score
        sample["rouge_l"] = scorer.score(reference, text)["rougeL"].fmeasure
    answers = [s["answer"] for s in samples]
    references = [s["reference"] for s in samples]
    return {
        "exact_match": float(np.mean([s["exact_match"] for s in samples])),
        "chrf": sacrebleu.corpus_chrf(answers, [references]).score,
        "rouge_l": float(np.mean([s["rouge_l"] for s in samples])),
        "answers": float(len(samples)),
    }


if __name__ == "__main__":
    main()
