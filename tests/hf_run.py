"""A tiny GPT-2 trained by ``transformers.Trainer`` with bedside's callback: ``torchrun ... hf_run.py RUN STEPS``."""

from __future__ import annotations

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from bedside.collectors.integrations.huggingface import BedsideCallback


class Tokens(torch.utils.data.Dataset):
    def __init__(self, count: int, seed: int) -> None:
        self.ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main(run_dir: str, steps: int) -> None:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))
    args = TrainingArguments(
        output_dir=f"{run_dir}/checkpoints",
        max_steps=steps,
        per_device_train_batch_size=4,
        logging_steps=1,
        eval_strategy="steps",
        eval_steps=steps // 2,
        save_steps=steps // 2,
        include_num_input_tokens_seen=True,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        disable_tqdm=True,
    )
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=Tokens(256, 1),
        eval_dataset=Tokens(16, 2),
        callbacks=[BedsideCallback(run_dir, name="hf")],
    )
    trainer.train()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
