"""`python -m trainer.exports.safetensors`: a DCP checkpoint to one consolidated
`model.safetensors`."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from tests.support.training import build_local_run, tiny_spec
from trainer.exports import safetensors as export
from trainer.loop import train_step


def test_export_writes_one_safetensors_whose_weights_reproduce_the_models_logits(
    corpus_dir: Path, tmp_path: Path
) -> None:
    spec = tiny_spec(corpus_dir, train={"max_steps": 2}, eval={"interval_steps": 2})
    run = build_local_run(spec, tmp_path / "ckpt")
    for _ in range(2):
        train_step(run)
    run.checkpointer.save(2, force=True)
    out = tmp_path / "export"

    assert (
        export.main(["--checkpoint", str(tmp_path / "ckpt/step_00000002"), "--out", str(out)]) == 0
    )

    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    with safe_open(str(out / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
    assert names == set(run.model.state_dict())  # weights only: no optimizer state
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["n_layers"], config["step"]) == ("torchyard-gpt", 2, 2)
    exported = export.load_exported(out)
    x = torch.randint(0, 256, (3, spec.model.seq_len), generator=torch.Generator().manual_seed(0))
    run.model.eval()
    with torch.no_grad():
        assert torch.equal(exported(x), run.model(x))


def test_exporting_an_incomplete_checkpoint_exits_2(tmp_path: Path) -> None:
    (tmp_path / "step_00000001").mkdir()  # no .metadata: DCP never finished it
    args = ["--checkpoint", str(tmp_path / "step_00000001"), "--out", str(tmp_path / "out")]
    assert export.main(args) == 2
    assert not (tmp_path / "out").exists()
