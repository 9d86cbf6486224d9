"""Hugging Face's Trainer and a Lightning fit on one process, filing control requests as they train
(``tests/test_integration_one_process.py``). The frameworks take seconds to import: a worker imports this module
when it runs one of those tests, not when it collects the suite."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from hf_run import Tokens
from lightning_run import TinyGPT
from lightning_run import Tokens as TensorTokens
from torchrun_runs import acks
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from bedside.collectors.control import request_action
from bedside.collectors.integrations import huggingface, lightning
from bedside.collectors.layout import RunLayout


def file(run: Path, action: str, **args: Any) -> str:
    return request_action(RunLayout(run), action, args, operator="tester", reason="test")


class FileAtSteps(TrainerCallback):
    """Files each request the first time the Trainer ends its step, before bedside's callback reads them at the
    same boundary: ``{step: {name: (action, args)}}``."""

    def __init__(self, run: Path, requests: dict[int, dict[str, tuple[str, dict[str, Any]]]]) -> None:
        self.run, self.requests, self.ids = run, requests, {}

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        for name, (action, a) in self.requests.pop(state.global_step, {}).items():
            self.ids[name] = file(self.run, action, **a)


def bedside_callback(run: Path, trainer: Trainer | None = None) -> TrainerCallback:
    """bedside's callback for a Trainer writing ``run``: given the Trainer, it can rewind."""
    return huggingface.BedsideCallback(run, name="one", trainer=trainer)


def one_process_trainer(tmp_path: Path, requests: dict, **options: Any) -> tuple[Trainer, FileAtSteps, Tokens]:
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        report_to=[],
        use_cpu=True,
        train_sampling_strategy="sequential",
        **options,
    )
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    data = Tokens(64, 1)
    trainer = Trainer(model=model, args=args, train_dataset=data)
    filing = FileAtSteps(tmp_path / "run", requests)
    trainer.add_callback(filing)
    return trainer, filing, data


class FileAtBatchOne(pl.Callback):
    def __init__(self, run: Path, requests: dict[str, tuple[str, dict[str, Any]]]) -> None:
        self.run, self.requests, self.ids = run, requests, {}

    def on_train_batch_end(self, trainer: pl.Trainer, *rest: Any) -> None:
        if trainer.global_step == 1:
            self.ids = {name: file(self.run, action, **a) for name, (action, a) in self.requests.items()}


def fit(run: Path, workers: int) -> dict[str, dict]:
    """A six-step fit on one process over 48 samples in order, a skip of batches 3 and 4 filed at step 1."""
    filing = FileAtBatchOne(run, {"skip": ("skip", {"first_batch": 3, "last_batch": 4})})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=6,
        callbacks=[filing, lightning.BedsideCallback(run, name="one")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    data = TensorTokens(48, 1)
    loader = torch.utils.data.DataLoader(data, batch_size=4, num_workers=workers)
    trainer.fit(TinyGPT(), loader)
    return {"skip": acks(run, filing.ids["skip"])[-1], "read": data.read}
