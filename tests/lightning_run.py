"""A tiny GPT-2 fitted by ``lightning.pytorch.Trainer`` with bedside's callback (a parameter checksum every five
steps): ``torchrun ... lightning_run.py RUN STEPS``.

With ``--control OUT`` it fits for up to STEPS steps without validation, Lightning's ``ModelCheckpoint`` saving
every ten steps, and each rank writes ``OUT/rank-N.json``: the sample ids it read."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from bedside.collectors.integrations.lightning import BedsideCallback
from bedside.trainer.train import exit_without_teardown


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


class Tokens(torch.utils.data.TensorDataset):
    """Random token ids that remember which were read."""

    def __init__(self, count: int, seed: int) -> None:
        super().__init__(torch.randint(0, 64, (count, 16), generator=torch.Generator().manual_seed(seed)))
        self.read: list[int] = []

    def __getitem__(self, i: int) -> tuple[torch.Tensor, ...]:
        self.read.append(int(i))
        return super().__getitem__(i)


def main(run_dir: str, steps: int, out: Path | None) -> None:
    torch.manual_seed(0)
    saving = pl.callbacks.ModelCheckpoint(f"{run_dir}/checkpoints", every_n_train_steps=10, save_top_k=-1)
    bedside = BedsideCallback(run_dir, name="lightning", checksum_every=5)
    control = {"limit_val_batches": 0, "callbacks": [bedside, saving]}
    timed = {"val_check_interval": steps // 2, "callbacks": [bedside]}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_steps=steps,
        num_sanity_val_steps=0,
        default_root_dir=f"{run_dir}/checkpoints",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **(control if out else timed),
    )
    data = Tokens(8 * steps if out else 256, 1)
    loader = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True)
    trainer.fit(TinyGPT(), loader, torch.utils.data.DataLoader(Tokens(16, 2), batch_size=4))
    if out:
        (out / f"rank-{trainer.global_rank}.json").write_text(json.dumps({"read": data.read}))

    if torch.distributed.is_initialized():  # the framework leaves it; gloo may abort at exit with it alive
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), Path(sys.argv[4]) if sys.argv[3:4] == ["--control"] else None)
    exit_without_teardown()  # torch's teardown has aborted a finished rank (terminate called without ...)
