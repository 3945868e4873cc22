"""Packed rows: attention confined to each example, positions restarting, and the loss of a
packed batch equal to the token-weighted mean over the same examples run one by one.

Tolerances: fp32 (eps = 2^-23 ~ 1.2e-7). Packed and unpacked runs compute each token's
logits with the same weights but reduce attention over another number of keys (masked keys
add exact zeros; only the summation order and the softmax's row maximum can differ), so
each logit moves by a few eps relative; a mean of N per-token losses of magnitude ~log(V)
then differs by at most ~N x eps x log(V) even if every error had the same sign. We allow
(N + 16) x eps x the loss, well below the effect of one example attending to another
(asserted alongside, so each test can fail).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainer.data.batches import lm_loss
from trainer.data.rows import IGNORE_INDEX, Batch
from trainer.models.gpt import GPTConfig, block_causal_mask, build_model
from trainer.models.hf import HFCausalLM

EPS = torch.finfo(torch.float32).eps
SEQ_LEN = 48
LENGTHS = (5, 17, 3, 12)  # examples of unequal lengths, 37 tokens packed into 48 slots
VOCAB = 256


def _examples(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, VOCAB, (n,), generator=gen) for n in LENGTHS]


def pack(examples: list[torch.Tensor], seq_len: int) -> Batch:
    """One row holding `examples` back to back, then padding (segment -1, never supervised):
    labels are each example's next tokens, -100 on its last token (docs/ARCHITECTURE.md, 'What a
    row is')."""
    ids = torch.zeros(seq_len, dtype=torch.long)
    labels = torch.full((seq_len,), IGNORE_INDEX, dtype=torch.long)
    positions = torch.zeros(seq_len, dtype=torch.long)
    segments = torch.full((seq_len,), -1, dtype=torch.long)
    start = 0
    for s, ex in enumerate(examples):
        n = len(ex)
        ids[start : start + n] = ex
        labels[start : start + n - 1] = ex[1:]
        positions[start : start + n] = torch.arange(n)
        segments[start : start + n] = s
        start += n
    positions[start:] = torch.arange(seq_len - start)  # padding continues counting
    return Batch(*(t.unsqueeze(0) for t in (ids, labels, positions, segments)))


def unpacked_token_mean(model: torch.nn.Module, examples: list[torch.Tensor]) -> float:
    """Sum of next-token losses of each example run alone (plain causal), over all tokens."""
    total, count = 0.0, 0
    for ex in examples:
        logits = model(ex.unsqueeze(0))
        total += float(lm_loss(logits[:, :-1], ex[1:].unsqueeze(0), reduction="sum"))
        count += len(ex) - 1
    return total / count


def _tolerance(loss: float) -> float:
    supervised = sum(n - 1 for n in LENGTHS)
    return (supervised + 16) * EPS * loss


def _gpt() -> torch.nn.Module:
    cfg = GPTConfig(n_layers=2, n_heads=4, d_model=64, d_ff=128, seq_len=SEQ_LEN)
    return build_model(cfg, device=torch.device("cpu"), seed=0).eval()


def _llama() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ_LEN,
    )  # fmt: skip
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    return HFCausalLM(lm, seq_len=SEQ_LEN).eval()


MODELS = {"gpt": _gpt, "hf_llama": _llama}


@pytest.mark.parametrize("kind", list(MODELS))
@torch.no_grad()
def test_packed_loss_equals_the_token_weighted_mean_of_the_examples_alone(kind: str) -> None:
    model, examples = MODELS[kind](), _examples()
    batch = pack(examples, SEQ_LEN)
    packed = model(batch.input_ids, position_ids=batch.position_ids, segment_ids=batch.segment_ids)
    packed_loss = float(lm_loss(packed, batch.labels))
    expected = unpacked_token_mean(model, examples)
    assert packed_loss == pytest.approx(expected, abs=_tolerance(expected))
    # The same row without the example boundaries: examples 2-4 see the ones before them
    # (a random init attends almost uniformly, so the effect is small: ~85x the tolerance
    # for the Llama, more for the GPT).
    leaky = float(lm_loss(model(batch.input_ids), batch.labels))
    assert abs(leaky - expected) > 10 * _tolerance(expected)


@pytest.mark.parametrize("kind", list(MODELS))
@torch.no_grad()
def test_each_packed_example_gets_the_logits_it_gets_alone(kind: str) -> None:
    model, examples = MODELS[kind](), _examples(1)
    batch = pack(examples, SEQ_LEN)
    packed = model(batch.input_ids, position_ids=batch.position_ids, segment_ids=batch.segment_ids)
    start = 0
    for ex in examples:
        alone = model(ex.unsqueeze(0))[0]
        got = packed[0, start : start + len(ex)]
        # logits ~ N(0, 1): a few eps per reduction step of the d_model-wide matmuls
        torch.testing.assert_close(got, alone, rtol=0, atol=64 * 64 * EPS)
        start += len(ex)


def test_segment_ids_all_zero_give_exactly_the_plain_causal_output() -> None:
    model = _gpt()
    x = torch.randint(0, VOCAB, (3, SEQ_LEN), generator=torch.Generator().manual_seed(2))
    positions = torch.arange(SEQ_LEN).expand(3, -1)
    with torch.no_grad():
        plain = model(x)
        zeros = model(x, position_ids=positions, segment_ids=torch.zeros_like(x))
    assert torch.equal(zeros, plain)


def test_block_causal_mask_is_causal_within_segments_only() -> None:
    segments = torch.tensor([[0, 0, 1, 1, 1, -1]])
    mask = block_causal_mask(segments)[0, 0].int().numpy()
    assert mask.tolist() == [
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [0, 0, 1, 0, 0, 0],
        [0, 0, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert np.all(mask.diagonal() == 1)  # no empty row: padding attends to itself
