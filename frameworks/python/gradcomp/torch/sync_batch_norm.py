"""SyncBatchNorm: batch normalization whose statistics cover the whole global batch.

Works on CPU (and on any device through the host-staged runtime): the per-channel count,
sum and sum of squares are allreduced in one float64 tensor in forward, the two per-channel
gradient sums in backward. Outside training, or on one rank, it is plain BatchNorm.
"""
import torch
from torch.nn.modules.batchnorm import _BatchNorm

from gradcomp import basics as _b
from gradcomp.basics import Sum, synchronize
from gradcomp.torch.mpi_ops import allreduce_async_


def _allreduce_sum(t, name):
    return synchronize(allreduce_async_(t, name=name, op=Sum))


class _SyncBatchNormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, eps, momentum, name):
        c = x.shape[1]
        dims = [d for d in range(x.dim()) if d != 1]
        x64 = x.detach().to(torch.float64)
        n_local = torch.tensor([x.numel() / c], dtype=torch.float64, device=x.device)
        local = torch.cat([n_local, x64.sum(dims), (x64 * x64).sum(dims)])
        stats = _allreduce_sum(local, f"{name}.stats")
        count = stats[0]
        if count <= 1:
            raise ValueError(f"SyncBatchNorm '{name}': expected more than 1 value per channel over all ranks when "
                             f"training, got input size {list(x.shape)}")
        mean = stats[1:1 + c] / count
        var = (stats[1 + c:] / count - mean * mean).clamp_min(0)
        invstd = torch.rsqrt(var + eps)
        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1 - momentum).add_((var * count / (count - 1)).to(running_var.dtype),
                                                    alpha=momentum)
        shape = [1, c] + [1] * (x.dim() - 2)
        xhat = (x64 - mean.view(shape)) * invstd.view(shape)
        y = xhat
        if weight is not None:
            y = y * weight.detach().to(torch.float64).view(shape) + bias.detach().to(torch.float64).view(shape)
        ctx.save_for_backward(xhat, invstd, weight)
        ctx.count, ctx.dims, ctx.shape, ctx.name = count, dims, shape, name
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        xhat, invstd, weight = ctx.saved_tensors
        dy64 = dy.to(torch.float64)
        c = xhat.shape[1]
        local = torch.cat([dy64.sum(ctx.dims), (dy64 * xhat).sum(ctx.dims)])
        grad_bias_local, grad_weight_local = local[:c].clone(), local[c:].clone()
        total = _allreduce_sum(local, f"{ctx.name}.grad")
        sum_dy, sum_dy_xhat = total[:c], total[c:]
        scale = invstd if weight is None else invstd * weight.detach().to(torch.float64)
        dx = scale.view(ctx.shape) * (dy64 - (sum_dy / ctx.count).view(ctx.shape)
                                      - xhat * (sum_dy_xhat / ctx.count).view(ctx.shape))
        gw = gb = None
        if weight is not None:  # local parts: the optimizer's allreduce sums them, as for any parameter
            gw, gb = grad_weight_local.to(weight.dtype), grad_bias_local.to(weight.dtype)
        return dx.to(dy.dtype), gw, gb, None, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Drop-in for torch.nn.BatchNorm1d/2d/3d whose training statistics span every rank's batch."""

    _instances = 0

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self._gradcomp_name = f"sync_batch_norm.{SyncBatchNorm._instances}"
        SyncBatchNorm._instances += 1

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        if not self.training or not _b.is_initialized() or _b.size() == 1:
            return super().forward(input)
        momentum = self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked)
        running = (self.running_mean, self.running_var) if self.track_running_stats else (None, None)
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running[0], running[1], self.eps,
                                            momentum if momentum is not None else 0.0, self._gradcomp_name)

    @classmethod
    def convert_sync_batchnorm(cls, module):
        """A copy of `module` with every BatchNorm*d replaced by SyncBatchNorm (state kept)."""
        out = module
        if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats)
            if module.affine:
                with torch.no_grad():
                    out.weight.copy_(module.weight)
                    out.bias.copy_(module.bias)
            if module.track_running_stats:
                out.running_mean, out.running_var = module.running_mean, module.running_var
                out.num_batches_tracked = module.num_batches_tracked
            out.train(module.training)
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child))
        return out
