"""A Hugging Face ``Trainer`` script, unmodified for Unicron: ``torchrun --nproc-per-node 2
train.py``

Unicron runs it as an entrypoint job (``job.yaml``) with the environment torchrun gives, so the
Trainer (through Accelerate) joins the process group from it, on gloo. The model is a tiny GPT-2
built from a config and the data are synthetic: nothing is downloaded. Checkpoints go under
``$UNICRON_CHECKPOINT_DIR`` (``checkpoint-N`` folders), and a restarted run resumes from the
newest one. ``--fail-at-step N`` plants a bug (a ``ValueError`` in the training step).
"""

import argparse
import os
import time
from typing import Any

import torch
from torch.utils.data import Dataset
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainerControl,
    TrainerState,
    TrainingArguments,
)
from transformers.trainer_utils import get_last_checkpoint

VOCAB, SEQ = 64, 32


class Counting(Dataset[dict[str, torch.Tensor]]):
    """Sequences that count up from a random start, modulo the vocabulary: easy to learn."""

    def __len__(self) -> int:
        return 4096

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        start = torch.randint(VOCAB, (1,), generator=torch.Generator().manual_seed(index))
        ids = (start + torch.arange(SEQ)) % VOCAB
        return {"input_ids": ids, "labels": ids}


class Pace(TrainerCallback):
    """Says where training starts, on rank 0, and slows the toy model's steps to a real pace."""

    def __init__(self, step_delay: float) -> None:
        self.step_delay = step_delay

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        if state.is_world_process_zero:
            print(f"training from step {state.global_step} on {args.world_size} ranks", flush=True)

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: Any
    ) -> None:
        time.sleep(self.step_delay)


class PlantedBug(Trainer):
    """The Trainer with a bug in its training step at ``fail_at_step``."""

    fail_at_step = -1

    def training_step(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        if self.state.global_step == self.fail_at_step:
            raise ValueError(f"planted bug in training_step at step {self.state.global_step}")
        return super().training_step(*args, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--checkpoint-every", type=int, default=10)
    parser.add_argument("--step-delay", type=float, default=0.1)
    parser.add_argument("--fail-at-step", type=int, default=-1)
    args = parser.parse_args()
    torch.set_num_threads(1)  # ranks on one machine share its cores
    output = os.environ.get("UNICRON_CHECKPOINT_DIR", "checkpoints")
    training = TrainingArguments(
        output_dir=output,
        max_steps=args.max_steps,
        per_device_train_batch_size=8,
        learning_rate=1e-3,
        save_steps=args.checkpoint_every,
        save_total_limit=2,
        logging_steps=10,
        ddp_backend="gloo",
        ddp_find_unused_parameters=False,
        use_cpu=True,
        seed=0,
        report_to="none",
        disable_tqdm=True,  # carriage returns make a log file unreadable
        dataloader_num_workers=0,
    )
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    trainer = PlantedBug(
        model=GPT2LMHeadModel(config),
        args=training,
        train_dataset=Counting(),
        callbacks=[Pace(args.step_delay)],
    )
    trainer.fail_at_step = args.fail_at_step
    last = get_last_checkpoint(output) if os.path.isdir(output) else None
    if last is not None and training.process_index == 0:
        print(f"resuming from {last}", flush=True)
    trainer.train(resume_from_checkpoint=last)


if __name__ == "__main__":
    main()
