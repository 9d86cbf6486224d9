"""A tiny GPT-2 fitted by ``lightning.pytorch.Trainer`` with bedside's callback: ``torchrun ... lightning_run.py RUN
STEPS``."""

from __future__ import annotations

import sys

import lightning.pytorch as pl
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bedside.collectors.integrations.lightning import BedsideCallback


class TinyGPT(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64, n_positions=32))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        return self.model(input_ids=batch[0], labels=batch[0]).loss

    def validation_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        self.log("val_loss", self.model(input_ids=batch[0], labels=batch[0]).loss, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def tokens(count: int, seed: int) -> torch.utils.data.DataLoader:
    ids = torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed))
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=4)


def main(run_dir: str, steps: int) -> None:
    torch.manual_seed(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        val_check_interval=steps // 2,
        num_sanity_val_steps=0,
        default_root_dir=f"{run_dir}/checkpoints",
        callbacks=[BedsideCallback(run_dir, name="lightning")],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(TinyGPT(), tokens(256, 1), tokens(16, 2))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
