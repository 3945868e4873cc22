"""lm-evaluation-harness on Torchyard's models: the `lm_eval` evaluation of an eval job.

`harness_model` picks the harness's model for a rebuilt network: lm-eval's own Hugging Face
backend (`lm_eval.models.huggingface.HFLM`, given the `transformers` model instance, or the
peft model around it, unmerged) for a Hugging Face model with a tokenizer; `TorchyardLM`, an
`lm_eval.api.model.TemplateLM`, for the built-in GPT and byte-level models. `run_tasks` runs
`lm_eval.simple_evaluate` on the tasks and flattens its results into metrics.

Inline tasks read a dataset of the project: `task_configs` maps its `dataset` to lm-eval's
`json` (or `parquet`) loader over that one file, as split `test`. The harness runs on rank 0;
`datasets` is told to stay offline (workers reach no hub).

Imports lm_eval (and with it `datasets`): `trainer.evaluate` imports this module only for an
`lm_eval` evaluation, after `offline`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from torch import Tensor, nn

from trainer.models.gpt import generate, shape_of

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from jobspec.evaluate import LmEvalEval
    from trainer.models.network import Network

BYTE_PREFIX_ID = 10  # "\n": the conditioning token of an empty context, for byte-level models


def task_configs(evaluation: LmEvalEval, datasets: dict[str, dict[str, Any]]) -> list[Any]:
    """The `tasks` argument of `simple_evaluate`: names as given; each inline config with its
    `dataset` replaced by lm-eval's loader of that file (`datasets`: {id: {uri, ...}}), read as
    split `test` unless the config names its splits."""
    configs: list[Any] = []
    for task in evaluation.tasks:
        if isinstance(task, str):
            configs.append(task)
            continue
        config = {k: v for k, v in task.items() if k != "dataset"}
        uri = str(datasets[str(task["dataset"])]["uri"]).removeprefix("file://")
        loader = "parquet" if uri.endswith(".parquet") else "json"
        config["dataset_path"] = loader
        config["dataset_kwargs"] = {"data_files": {"test": uri}}
        if not any(k in config for k in ("test_split", "validation_split", "training_split")):
            config["test_split"] = "test"
        configs.append(config)
    return configs


def harness_model(network: Network, *, device: torch.device, batch_size: int) -> Any:
    """An lm-eval model of `network` (eval mode): `HFLM` around its `transformers` (or peft)
    model for a Hugging Face model with a tokenizer, else `TorchyardLM`."""
    from lm_eval.models.huggingface import HFLM

    lm = getattr(network.model, "lm", None)
    if lm is not None and network.tokenizer is not None:
        return HFLM(
            pretrained=lm,
            tokenizer=network.tokenizer,
            batch_size=batch_size,
            max_length=shape_of(network.model).seq_len,
            device=str(device),
        )
    return TorchyardLM(
        network.model, network.tokenizer, device=device, batch_size=batch_size,
        vocab_size=network.vocab_size,
    )  # fmt: skip


def run_tasks(
    evaluation: LmEvalEval,
    network: Network,
    datasets: dict[str, dict[str, Any]],
    *,
    task_dirs: list[str],
    device: torch.device,
    seed: int,
) -> dict[str, float]:
    """`lm_eval.simple_evaluate` of `evaluation`'s tasks on `network` (named tasks from
    `task_dirs` only: lm-eval's own index is not built); returns its results flattened as
    `{<task>/<metric>: value}` (`<metric>@<filter>` for a filter other than `none`; stderrs
    included, non-finite ones left out) plus `<task>/samples`."""
    import lm_eval
    from lm_eval.tasks import TaskManager

    results = lm_eval.simple_evaluate(
        model=harness_model(network, device=device, batch_size=evaluation.batch_size),
        tasks=task_configs(evaluation, datasets),
        task_manager=TaskManager(include_path=task_dirs or None, include_defaults=False),
        num_fewshot=evaluation.num_fewshot,
        limit=evaluation.limit,
        apply_chat_template=evaluation.apply_chat_template,
        log_samples=False,
        bootstrap_iters=0,
        random_seed=seed,
        numpy_random_seed=seed,
        torch_random_seed=seed,
        fewshot_random_seed=seed,
    )
    return flatten(results)


def flatten(results: dict[str, Any] | None) -> dict[str, float]:
    """`simple_evaluate`'s `results` and `n-samples` as flat metrics (see `run_tasks`)."""
    flat: dict[str, float] = {}
    if not results:
        return flat
    for task, values in results.get("results", {}).items():
        for key, value in values.items():
            if isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not math.isfinite(float(value)):
                continue
            metric, _, kept = key.partition(",")
            label = metric if kept in ("", "none") else f"{metric}@{kept}"
            flat[f"{task}/{label}"] = float(value)
    for task, counts in results.get("n-samples", {}).items():
        flat[f"{task}/samples"] = float(counts.get("effective", counts.get("original", 0)))
    return flat


class TorchyardLM(TemplateLM):
    """lm-eval's model interface over a Torchyard model (ids (B, T) int64 -> logits (B, T, V);
    the built-in GPT, or any model of `trainer.models`): token ids from the tokenizer, or byte
    values without one.

    `loglikelihood`: the sum of log-softmax probabilities (nats) of the continuation's tokens
    given the context, cropped on the left to the model's `seq_len`, and whether each is the
    argmax; `loglikelihood_rolling`: a document's total over lm-eval's disjoint rolling
    windows (`lm_eval.utils.get_rolling_token_windows`); `generate_until`: `generate` (greedy
    at temperature 0, lm-eval's default) until a stop string or `max_gen_toks`.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: PreTrainedTokenizerBase | None,
        *,
        device: torch.device,
        batch_size: int,
        vocab_size: int,
    ) -> None:
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self._device = device
        self.batch_size = batch_size
        self.vocab_size = vocab_size
        self.seq_len = shape_of(model).seq_len

    @property
    def eot_token_id(self) -> int:
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            return int(self.tokenizer.eos_token_id)
        return BYTE_PREFIX_ID

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, **_: Any
    ) -> list[int]:
        if self.tokenizer is None:
            return list(string.encode("utf-8"))
        return list(self.tokenizer.encode(string, add_special_tokens=bool(add_special_tokens)))

    def tok_decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return str(self.tokenizer.decode(ids))

    @torch.no_grad()
    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], **options: Any
    ) -> list[tuple[float, bool]]:
        del options  # lm-eval's (`disable_tqdm`): no progress bar here
        answers: list[tuple[float, bool]] = []
        for start in range(0, len(requests), self.batch_size):
            batch = requests[start : start + self.batch_size]
            rows = [(ctx + cont)[-(self.seq_len + 1) :][:-1] for _, ctx, cont in batch]
            width = max(len(r) for r in rows)
            ids = torch.zeros(len(rows), width, dtype=torch.long)
            for i, row in enumerate(rows):  # right padding: a causal model's earlier logits
                ids[i, : len(row)] = torch.tensor(row)  # do not see what follows them
            logits = self.model(ids.to(self._device)).float()
            for i, (_, _, cont) in enumerate(batch):
                end = len(rows[i])
                scores = F.log_softmax(logits[i, end - len(cont) : end], dim=-1)
                target = torch.tensor(cont, device=scores.device)
                picked = scores.gather(-1, target[:, None]).squeeze(-1)
                greedy = bool((scores.argmax(-1) == target).all())
                answers.append((float(picked.sum()), greedy))
        return answers

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

        totals: list[float] = []
        for request in requests:
            (text,) = request.args
            windows = [
                make_disjoint_window(w)
                for w in get_rolling_token_windows(
                    token_list=self.tok_encode(text),
                    prefix_token=self.prefix_token_id,
                    max_seq_len=self.seq_len,
                    context_len=1,
                )
            ]
            scored = self._loglikelihood_tokens([(None, ctx, cont) for ctx, cont in windows])
            totals.append(sum(score for score, _ in scored))
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        answers: list[str] = []
        generator = torch.Generator(device=self._device).manual_seed(0)
        for request in requests:
            context, kwargs = request.args
            kwargs = dict(kwargs or {})
            until = kwargs.get("until") or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = int(kwargs.get("max_gen_toks", 256))
            temperature = float(kwargs.get("temperature", 0.0))
            if not kwargs.get("do_sample", temperature > 0):
                temperature = 0.0

            def stop(ids: Tensor, until: list[str] = until) -> bool:
                text = self.tok_decode(ids.tolist())
                return any(marker in text for marker in until)

            prompt = self.tok_encode(context) or [self.prefix_token_id]
            ids = generate(
                self.model,
                torch.tensor(prompt[-self.seq_len :]),
                max_new,
                temperature,
                generator,
                vocab_size=self.vocab_size,
                stop=stop,
            )
            text = self.tok_decode(ids.tolist())
            for marker in until:
                text = text.split(marker)[0]
            answers.append(text)
        return answers
