"""A tiny Hugging Face Trainer job as a user writes it for torchrun: a model built from a
config (no download), synthetic data, a checkpoint every few steps, and a restart that
resumes from the newest one (``resume_from_checkpoint``).

Usage: hf_tiny.py OUTPUT_DIR MAX_STEPS [--last-words | --restartable] [--timing=DIR]
``--last-words`` adds recovery.hf.LastWordsCallback to the trainer's callbacks, the one
change the group restart's way asks of a script; ``--restartable`` also decorates the
entry point ``@recovery.restartable`` (the survivors keep their processes). Prints
``start step=<k>`` when training begins (k > 0: resumed), ``step=<n>`` after each step,
and ``done step=<n> loss=<x>`` at the end (the trained model's loss on a fixed batch),
and saves its parameters, flat, to ``OUTPUT_DIR/final_params_<rank>.pt``.
"""

import os
import sys
import time

import torch
from timing import record
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Synthetic(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 1024

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        generator = torch.Generator().manual_seed(index)
        return {"input_ids": torch.randint(0, 64, (16,), generator=generator),
                "labels": torch.tensor(index % 2)}


class Report(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        print(f"start step={state.global_step}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(0.05)  # a step long enough to be killed in
        print(f"step={state.global_step}", flush=True)
        record(f"{state.global_step} {time.time()} {os.getpid()}")


def main() -> None:
    output_dir, max_steps = sys.argv[1], int(sys.argv[2])
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1,
                        num_attention_heads=2, intermediate_size=32, num_labels=2)
    args = TrainingArguments(
        output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=4,
        save_strategy="steps", save_steps=10, save_total_limit=2, report_to=[],
        use_cpu=True, ddp_backend="gloo", logging_strategy="no", disable_tqdm=True)
    callbacks = [Report()]
    if {"--last-words", "--restartable"} & set(sys.argv[3:]):
        from recovery.hf import LastWordsCallback

        callbacks.append(LastWordsCallback())
    torch.manual_seed(0)
    model = BertForSequenceClassification(config)
    trainer = Trainer(model=model, args=args, train_dataset=Synthetic(), callbacks=callbacks)
    last = get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None
    trainer.train(resume_from_checkpoint=last)
    data = Synthetic()
    batch = {key: torch.stack([data[i][key] for i in range(64)]) for key in ("input_ids", "labels")}
    model.eval()
    with torch.no_grad():
        loss = model(**batch).loss.item()
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    torch.save(params, os.path.join(output_dir, f"final_params_{os.environ['RANK']}.pt"))
    print(f"done step={trainer.state.global_step} loss={loss!r}", flush=True)
    record(repr(loss), "loss")


if __name__ == "__main__":
    if "--restartable" in sys.argv[3:]:
        import recovery

        main = recovery.restartable(main)
    main()
