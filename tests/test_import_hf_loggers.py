"""A tiny transformers Trainer run that reports to W&B (offline) and TensorBoard, as its users set it up, imports
from both into the same steps, losses and evals: the default names and W&B's train/global_step at work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bedside.collectors.importers import import_tensorboard, import_wandb

pytestmark = pytest.mark.slow(reason="a transformers Trainer run that reports to W&B and TensorBoard")

STEPS = 10
TRAIN = """
import sys, torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __init__(self, count, seed):
        self.ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}

out, steps = sys.argv[1], int(sys.argv[2])
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
args = TrainingArguments(
    output_dir=f"{out}/trainer", max_steps=steps, per_device_train_batch_size=4, logging_steps=1,
    eval_strategy="steps", eval_steps=steps // 2, save_strategy="no", report_to=["wandb", "tensorboard"],
    use_cpu=True, disable_tqdm=True, run_name="hf-tiny",
)
Trainer(model=model, args=args, train_dataset=Tokens(64, 0), eval_dataset=Tokens(8, 1)).train()
"""


@pytest.fixture(scope="module")
def logged(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hf")
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true"}
    env |= {"WANDB_DIR": str(root), "WANDB_CONFIG_DIR": str(root / "config"), "WANDB_CACHE_DIR": str(root / "cache")}
    done = subprocess.run([sys.executable, "-c", TRAIN, str(root), str(STEPS)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def records(run: Path, kind: str) -> list[dict]:
    lines = (run / "telemetry" / "rank-00000.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == kind]


def test_wandb_and_tensorboard_give_the_same_steps_losses_and_evals(logged, tmp_path):
    (from_wandb,) = import_wandb(logged / "wandb", tmp_path / "wandb")
    (from_tensorboard,) = import_tensorboard(logged / "trainer" / "runs", tmp_path / "tensorboard")
    assert json.loads((tmp_path / "wandb" / "run.json").read_text())["name"] == "hf-tiny"
    steps = {name: records(tmp_path / name, "step") for name in ("wandb", "tensorboard")}
    for name, found in steps.items():
        assert [r["step"] for r in found] == list(range(1, STEPS + 1)), name
        assert {"loss", "grad_norm", "lr"} <= set(found[0]["metrics"]), name
    assert [r["metrics"]["loss"] for r in steps["wandb"]] == pytest.approx(
        [r["metrics"]["loss"] for r in steps["tensorboard"]], rel=1e-6
    )
    evals = {name: records(tmp_path / name, "eval") for name in ("wandb", "tensorboard")}
    assert [r["step"] for r in evals["wandb"]] == [r["step"] for r in evals["tensorboard"]] == [STEPS // 2, STEPS]
    assert from_wandb.records == from_tensorboard.records
