"""Lightning on backend gradcomp, compressed: the character-level GPT of examples/charlm.py trained
by a Lightning Trainer whose strategy names the backend. Lightning starts the ranks itself
(--devices, --num-nodes) or takes them from torchrun or srun:

    GRADCOMP_COMPRESSION=maxmin GRADCOMP_BITS=4 python examples/frameworks/lightning_charlm.py --devices 2
    GRADCOMP_COMPRESSION=maxmin torchrun --nproc_per_node 2 examples/frameworks/lightning_charlm.py --devices 2

--strategy picks how the ranks share the work:
  ddp       DDPStrategy(process_group_backend="gradcomp"): DDP's buckets are all-reduced by the
            runtime, compressed per the settings (GRADCOMP_COMPRESSION, _BITS, _MIN_SIZE), as CGX does;
  ddp_hook  DDP's model.register_comm_hook(hvd.DDPHookState(...), hvd.ddp_hook) in on_fit_start:
            layer by layer inside DDP's buckets, layers under 1024 elements exact (--bits), on
            any backend;
  fsdp2     ModelParallelStrategy (Lightning's FSDP2): fully_shard on each block and the model in
            configure_model, then hvd.compress_fsdp: each module's reduce-scatter and all-gather under
            its own name (error feedback per module with GRADCOMP_ERROR_FEEDBACK=1);
  fsdp      FSDPStrategy (FSDP1, one unit a block): FSDP's reduce-scatter of the gradients and
            all-gather of the weights, compressed per the settings (GRADCOMP_ALLGATHER_COMPRESSION
            for the weights).
--backend gloo runs the same training on gloo: the reference. Rank 0 prints the validation loss
(nats per character, over held-out windows) and the bytes gradcomp's codecs took in and sent.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist

try:
    import lightning as L
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy
except ImportError:
    sys.exit("lightning_charlm: needs Lightning (pip install lightning)")

import gradcomp.torch as hvd  # registers the "gradcomp" backend

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from charlm import Block, CharGPT, add_training_arguments, corpus, lr_factor, windows  # noqa: E402


class CpuFSDPStrategy(FSDPStrategy):
    """FSDPStrategy on a machine without a GPU. Lightning accepts FSDPStrategy only beside a GPU
    accelerator (it checks the exact class), and FSDP1 on the CPU needs device_id=cpu, which the
    strategy's own wrapping does not pass: CharLM.configure_model wraps the model itself, and the
    strategy keeps a model that is wrapped already. On GPUs the plain FSDPStrategy runs."""


class CharLM(L.LightningModule):
    def __init__(self, args, hook_state):
        super().__init__()
        self.args = args
        self.hook_state = hook_state
        self.net = CharGPT(args.layers, args.width, args.heads, args.context)

    def configure_model(self):
        """Shards the model (once: Lightning calls this again for validate)."""
        if self.args.strategy == "fsdp2":
            from torch.distributed.fsdp import FSDPModule, fully_shard
            if isinstance(self.net, FSDPModule):
                return
            mesh = self.device_mesh["data_parallel"]
            for block in self.net.blocks:
                fully_shard(block, mesh=mesh)
            fully_shard(self.net, mesh=mesh)
            if self.args.backend == "gradcomp":
                hvd.compress_fsdp(self.net)
        elif self.args.strategy == "fsdp" and isinstance(self.trainer.strategy, CpuFSDPStrategy):
            from torch.distributed.fsdp import FullyShardedDataParallel
            from torch.distributed.fsdp.wrap import ModuleWrapPolicy
            if not isinstance(self.net, FullyShardedDataParallel):
                self.net = FullyShardedDataParallel(self.net, device_id=torch.device("cpu"),
                                                    auto_wrap_policy=ModuleWrapPolicy({Block}))

    def on_fit_start(self):
        """ddp_hook: on DDP's model once the strategy has wrapped it (Lightning registers a
        DDPStrategy(ddp_comm_hook=...) on CUDA devices only)."""
        if self.args.strategy == "ddp_hook":
            self.trainer.strategy.model.register_comm_hook(self.hook_state, hvd.ddp_hook)

    def _loss(self, batch):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x).reshape(-1, 256), y.reshape(-1))

    def training_step(self, batch, _):
        loss = self._loss(batch)
        self.log("train_loss", loss, prog_bar=False)
        return loss

    def validation_step(self, batch, _):
        self.log("val_loss", self._loss(batch), sync_dist=True)

    def configure_optimizers(self):
        """Adam, warmed up over 20 steps, then a cosine to --steps (examples/charlm.py's schedule)."""
        opt = torch.optim.Adam(self.parameters(), lr=self.args.lr)
        steps = self.args.steps
        schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, steps))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


def strategy(args):
    if args.strategy in ("ddp", "ddp_hook"):
        return DDPStrategy(process_group_backend=args.backend)
    if args.strategy == "fsdp2":
        # Every rank a data-parallel shard: by default ("auto") the strategy makes the ranks of a
        # node one tensor-parallel group and shards only across nodes.
        return ModelParallelStrategy(data_parallel_size=args.devices * args.num_nodes, tensor_parallel_size=1,
                                     process_group_backend=args.backend)
    if torch.cuda.is_available():
        return FSDPStrategy(process_group_backend=args.backend, auto_wrap_policy={Block})
    return CpuFSDPStrategy(process_group_backend=args.backend)


def loaders(args, world):
    """Training windows (each rank takes its share through Lightning's DistributedSampler) and the
    held-out windows, both the same in every run."""
    text, held_out = corpus(args.corpus_mb)
    train = windows(text, args.steps * args.batch_size * world, args.context, torch.Generator().manual_seed(0))
    val = windows(held_out, args.val_batches * 64, args.context, torch.Generator().manual_seed(99))
    return (torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=args.batch_size),
            torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*val), batch_size=64))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--strategy", choices=["ddp", "ddp_hook", "fsdp2", "fsdp"], default="ddp")
    p.add_argument("--backend", choices=["gradcomp", "gloo"], default="gradcomp")
    p.add_argument("--devices", type=int, default=2, help="ranks on this node")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--bits", type=int, default=4, help="ddp_hook's bits")
    add_training_arguments(p)
    args = p.parse_args()
    L.seed_everything(0, verbose=False)  # the same initial weights on every rank
    hook_state = hvd.DDPHookState(layer_min_size=1024, compression_params={"bits": args.bits})
    model = CharLM(args, hook_state)
    trainer = L.Trainer(accelerator="gpu" if torch.cuda.is_available() else "cpu", devices=args.devices,
                        num_nodes=args.num_nodes, strategy=strategy(args), max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    train, val = loaders(args, args.devices * args.num_nodes)
    trainer.fit(model, train)
    train_loss = float(trainer.callback_metrics["train_loss"])
    val_loss = float(trainer.validate(model, val, verbose=False)[0]["val_loss"])
    if args.strategy == "ddp_hook":
        into, wire = hook_state.bytes_in, hook_state.bytes_on_wire
    elif args.backend == "gradcomp":
        stats = hvd.total_stats()
        into, wire = stats["compressed_bytes_in"], stats["compressed_bytes_on_wire"]
    else:
        into = wire = 0
    if trainer.global_rank == 0:
        params = sum(q.numel() for q in CharGPT(args.layers, args.width, args.heads, args.context).parameters())
        print(f"lightning {args.strategy} on {dist.get_backend()}, {trainer.world_size} ranks, "
              f"{params / 1e6:.2f}M parameters, {args.steps} steps of {args.batch_size} windows a rank")
        print(f"training loss: {train_loss:.6f}")
        print(f"validation loss: {val_loss:.6f}")
        print(f"compressed: {into} bytes in, {wire} bytes on the wire", flush=True)


if __name__ == "__main__":
    main()
