"""The one line a job's events show for its trainer's `data` report: how the data became rows
(format, mask, rows per side, files left out), or for a GRPO run which prompts it read."""

from __future__ import annotations

from typing import Any

from dataformat.units import format_bytes


def data_message(data: dict[str, Any]) -> str:
    """One line for the trainer's `data` event (how the data became rows, or for GRPO which
    prompts it read)."""
    if data.get("method") == "grpo":
        line = (
            f"data: {data.get('train_prompts')} training and {data.get('eval_prompts')} "
            f"evaluation prompts ({data.get('format')} records, up to "
            f"{data.get('max_prompt_tokens')} tokens)"
        )
        too_long = data.get("too_long")
        return line + (f"; {too_long} too long for model.seq_len, left out" if too_long else "")
    sides = [data.get(name) for name in ("train", "eval")]
    train, held = (side if isinstance(side, dict) else {} for side in sides)
    source = "from cache" if data.get("cached") else "tokenized"
    line = (
        f"data {source}: {data.get('format')}, loss on {data.get('loss_on')}; "
        f"{train.get('rows', train.get('pairs'))} training and "
        f"{held.get('rows', held.get('pairs'))} evaluation rows"
    )
    left_out = data.get("left_out")
    if isinstance(left_out, dict) and left_out.get("files"):
        size = format_bytes(left_out.get("bytes") or 0)
        line += f"; {left_out['files']} files not UTF-8 text, not read ({size})"
    if isinstance(left_out, dict) and left_out.get("repaired_files"):
        line += f"; stray bytes dropped from {left_out['repaired_files']} text files"
    return line
