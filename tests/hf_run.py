"""A tiny GPT-2 trained by ``transformers.Trainer`` with bedside's callback, given the Trainer (a parameter checksum
every five steps): ``torchrun ... hf_run.py RUN STEPS``.

With ``--control OUT`` it trains for up to STEPS steps in the dataset's order, saves every ten steps, and each rank
writes ``OUT/rank-N.json``: the sample ids it read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from bedside.collectors.integrations.huggingface import BedsideCallback
from bedside.trainer.train import exit_without_teardown


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        self.read.append(int(i))
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(run_dir: str, steps: int, out: Path | None) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    control = {"save_steps": 10, "eval_strategy": "no", "train_sampling_strategy": "sequential"}
    timed = {"save_steps": steps // 2, "eval_strategy": "steps", "eval_steps": steps // 2}
    args = TrainingArguments(
        output_dir=f"{run_dir}/checkpoints",
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        include_num_input_tokens_seen=True,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
        **(control if out else timed),
    )
    data = Tokens(8 * steps if out else 256, 1)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=Tokens(16, 2))
    trainer.add_callback(BedsideCallback(run_dir, name="hf", trainer=trainer, checksum_every=5))
    trainer.train()
    if out:
        (out / f"rank-{args.process_index}.json").write_text(json.dumps({"read": data.read}))

    if torch.distributed.is_initialized():  # the framework leaves it; gloo may abort at exit with it alive
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[4]) if sys.argv[3:4] == ["--control"] else None)
    exit_without_teardown()  # torch's teardown has aborted a finished rank (terminate called without ...)
