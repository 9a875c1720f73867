"""transformers.Trainer on backend gradcomp, compressed: a GPT-2 built from a small config (no
download) trained on the characters of the Python standard library's sources (examples/charlm.py's
corpus, one token a byte) by the Trainer, under torchrun or `accelerate launch`:

    GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 torchrun --nproc_per_node 2 examples/frameworks/trainer_gpt2.py

The way in is the process group: `dist.init_process_group("gradcomp")` before the
TrainingArguments. The Trainer (through Accelerate) keeps a group that is up and wraps the model in
DDP over it, so DDP's buckets are all-reduced by the runtime, compressed per the settings
(GRADCOMP_COMPRESSION, _BITS, _MIN_SIZE). `ddp_backend` lists the backends it knows, and on the CPU
Accelerate allows gloo and mpi only. --backend gloo runs the same training on gloo: the reference.
Rank 0 prints the evaluation loss (nats per character, over held-out windows) and the bytes
gradcomp's codecs took in and sent.
"""
import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist

try:
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
except ImportError:
    sys.exit("trainer_gpt2: needs transformers and accelerate (pip install transformers accelerate)")

import gradcomp.torch as hvd  # registers the "gradcomp" backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import add_training_arguments, corpus, windows  # noqa: E402


class Windows(torch.utils.data.Dataset):
    """Windows of bytes as a causal LM's examples (the model shifts the labels itself)."""

    def __init__(self, text, count, context, seed):
        self.ids = windows(text, count, context, torch.Generator().manual_seed(seed))[0]

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", choices=["gradcomp", "gloo"], default="gradcomp")
    p.add_argument("--steps", type=int, default=60)
    add_training_arguments(p)
    p.set_defaults(layers=4, width=256, lr=1e-3)  # a GPT-2 of 3.2M parameters; charlm's defaults otherwise
    args = p.parse_args()
    dist.init_process_group(args.backend)  # RANK, WORLD_SIZE, MASTER_ADDR from the launcher
    world = dist.get_world_size()
    text, held_out = corpus(args.corpus_mb)
    train = Windows(text, args.steps * args.batch_size * world, args.context, 0)
    held = Windows(held_out, args.val_batches * 64, args.context, 99)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=args.context, n_embd=args.width,
                                       n_layer=args.layers, n_head=args.heads))
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(output_dir=out, use_cpu=not torch.cuda.is_available(), max_steps=args.steps,
                                     per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=64,
                                     learning_rate=args.lr, warmup_steps=20, lr_scheduler_type="cosine",
                                     logging_steps=args.steps, report_to=[], save_strategy="no", seed=0,
                                     disable_tqdm=True, ddp_find_unused_parameters=False)
        trainer = Trainer(model=model, args=training, train_dataset=train, eval_dataset=held)
        result = trainer.train()
        evaluation = trainer.evaluate()
    stats = hvd.total_stats() if args.backend == "gradcomp" else {"compressed_bytes_in": 0,
                                                                  "compressed_bytes_on_wire": 0}
    if dist.get_rank() == 0:
        params = sum(q.numel() for q in model.parameters())
        print(f"transformers.Trainer on {dist.get_backend()} ({type(trainer.model_wrapped).__name__}), {world} ranks, "
              f"GPT-2 of {params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch_size} windows a rank")
        print(f"training loss: {result.training_loss:.6f}")
        print(f"validation loss: {evaluation['eval_loss']:.6f}")
        print(f"compressed: {stats['compressed_bytes_in']} bytes in, {stats['compressed_bytes_on_wire']} bytes on "
              "the wire", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
