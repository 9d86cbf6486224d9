"""One-process runs of each framework (no torchrun) take requests filed while they train; what an integration
cannot apply is rejected with the reason, never left unanswered. A Hugging Face Trainer on one process skips
exactly the batches asked, without the Trainer given to the callback rejects a rewind, and after a rewind loads
no checkpoint of the branch it abandoned; a Lightning fit on one process skips exactly the batches asked, with
and without loader worker processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
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


def test_a_one_process_trainer_skips_exactly_the_batches_asked_and_without_the_trainer_rejects_a_rewind(
    tmp_path,
) -> None:
    run = tmp_path / "run"
    requests = {1: {"skip": ("skip", {"first_batch": 3, "last_batch": 3}), "rewind": ("rewind", {"to_step": 0})}}
    trainer, filing, data = one_process_trainer(tmp_path, requests, max_steps=4)
    trainer.add_callback(huggingface.BedsideCallback(run, name="one"))
    trainer.train()
    answers = {name: acks(run, request_id)[-1] for name, request_id in filing.ids.items()}
    assert (answers["skip"]["status"], answers["skip"]["args"]["sample_ids"]) == ("applied", [12, 13, 14, 15])
    assert data.read[:16] == [*range(12), *range(16, 20)] and not {12, 13, 14, 15} & set(data.read)  # read ahead
    assert (answers["rewind"]["status"], answers["rewind"]["step"]) == ("rejected", 1)
    assert answers["rewind"]["message"] == (
        "rewind needs the Trainer: make the callback with BedsideCallback(run_dir, trainer=trainer)"
    )


def test_a_second_rewind_loads_no_checkpoint_of_the_branch_the_first_abandoned(tmp_path) -> None:
    run = tmp_path / "run"
    requests = {
        5: {"save": ("checkpoint", {})},  # checkpoint-5, on the branch the next rewind abandons
        6: {"first": ("rewind", {"to_step": 3})},  # to checkpoint-2
        7: {"second": ("rewind", {"to_step": 5})},  # after step 7 of the new branch: to checkpoint-4, saved again
    }
    trainer, filing, _ = one_process_trainer(tmp_path, requests, max_steps=9, save_steps=2)
    trainer.add_callback(huggingface.BedsideCallback(run, name="one", trainer=trainer))
    trainer.train()
    answers = {name: acks(run, request_id)[-1] for name, request_id in filing.ids.items()}
    assert answers["save"]["message"].endswith("checkpoint-5")
    assert [(answers[n]["status"], answers[n]["step"], answers[n]["timeline"]) for n in ("first", "second")] == [
        ("applied", 2, 1),
        ("applied", 4, 2),
    ]
    assert (
        answers["second"]["message"] == "rewound to the checkpoint of step 4 (checkpoint-4); continuing on timeline 2"
    )


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


@pytest.mark.parametrize("workers", [0, 1])
def test_a_one_process_fit_skips_exactly_the_batches_asked_with_or_without_loader_workers(tmp_path, workers) -> None:
    seen = fit(tmp_path / "run", workers)
    assert (seen["skip"]["status"], seen["skip"]["args"]["sample_ids"]) == ("applied", list(range(12, 20)))
    if not workers:  # a worker process reads the samples in its own copy of the dataset
        assert seen["read"] == [*range(12), *range(20, 32)]
