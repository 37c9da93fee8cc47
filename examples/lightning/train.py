"""A PyTorch Lightning script, unmodified for Unicron: ``torchrun --nproc-per-node 2 train.py``

Unicron runs it as an entrypoint job (``job.yaml``) with the environment torchrun gives, so
Lightning's ``TorchElasticEnvironment`` takes the ranks, the world size and the master store from
it. Nothing here imports Unicron: the process layout comes from torchrun's variables and the
checkpoints go under ``$UNICRON_CHECKPOINT_DIR``, from where ``fit(ckpt_path="last")`` resumes
after a restart. ``--fail-at-step N`` plants a bug (a ``ValueError`` in ``training_step``).
"""

import argparse
import os
import time

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.strategies import DDPStrategy
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def dataset() -> TensorDataset:
    """Points in 32-d labelled by the sign of the sum of their first four coordinates."""
    inputs = torch.randn(4096, 32, generator=torch.Generator().manual_seed(0))
    return TensorDataset(inputs, (inputs[:, :4].sum(dim=1) > 0).long())


class Classifier(L.LightningModule):
    def __init__(self, fail_at_step: int, step_delay: float) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2))
        self.fail_at_step = fail_at_step
        self.step_delay = step_delay

    def on_train_start(self) -> None:
        if self.trainer.is_global_zero:
            world = self.trainer.world_size
            print(f"training from step {self.global_step} on {world} ranks", flush=True)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_step == self.fail_at_step:
            raise ValueError(f"planted bug in training_step at step {self.global_step}")
        x, y = batch
        loss = F.cross_entropy(self.net(x), y)
        if self.trainer.is_global_zero and self.global_step % 10 == 0:
            print(f"step {self.global_step} loss {loss.item():.4f}", flush=True)
        time.sleep(self.step_delay)  # a toy model steps in a millisecond; a real one does not
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-delay", type=float, default=0.1)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)  # ranks on one machine share its cores
    L.seed_everything(0, verbose=False)
    checkpoints = os.environ.get("UNICRON_CHECKPOINT_DIR", "checkpoints")
    # torchrun's variables: this node's ranks and the number of nodes (1 outside torchrun)
    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=int(os.environ.get("WORLD_SIZE", "1")) // devices,
        strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=args.max_steps,
        callbacks=[
            ModelCheckpoint(
                dirpath=checkpoints,
                every_n_train_steps=args.checkpoint_every,
                save_top_k=0,
                save_last=True,
            )
        ],
        default_root_dir=checkpoints,
        logger=False,
        enable_progress_bar=False,  # carriage returns make a log file unreadable
    )
    loader = DataLoader(dataset(), batch_size=16, shuffle=True)  # Lightning adds the sampler
    trainer.fit(Classifier(args.fail_at_step, args.step_delay), loader, ckpt_path="last")


if __name__ == "__main__":
    main()
