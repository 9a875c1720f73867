"""PowerSGD (Vogels, Karimireddy, Jaggi 2019) on gradcomp's allreduce.

A gradient reshaped to M (n x m) is approximated by P Q^T with rank r: P = M Q is averaged
over ranks and orthonormalized, Q = M^T P is averaged, and every rank applies P Q^T (the
projection of the averaged gradient onto span(P)). What the approximation misses stays in a
per-tensor error buffer and is added to the next step's gradient; Q is kept between steps
(warm start), so one power iteration per step tracks the dominant subspace.
"""
import torch

from gradcomp.basics import Average, synchronize
from gradcomp.torch.compression import Compression
from gradcomp.torch.mpi_ops import allreduce_async_, grouped_allreduce_async_


def orthonormalize(p):
    """Replaces the columns of p by an orthonormal basis of their span, in place.

    Householder QR rather than Gram-Schmidt: gradient matrices are often rank-deficient
    (a softmax layer's rows sum to zero), and Gram-Schmidt then normalizes rounding noise into
    columns that are not orthogonal, so P P^T is no projection. QR's basis stays orthonormal
    to rounding whatever the conditioning. Every rank factors the same averaged P, so every
    rank gets the same basis."""
    q, _ = torch.linalg.qr(p, mode="reduced")
    p.copy_(q)
    return p


class PowerSGDState:
    """Per-tensor state of one PowerSGD configuration: error buffers, Q matrices, step count."""

    def __init__(self, config, process_set=None):
        self.config = config
        self.process_set = process_set  # whose ranks average P and Q (None: every rank)
        self.step = 0
        self.errors = {}
        self.qs = {}

    def matrix_shape(self, tensor):
        n = tensor.shape[0] if tensor.dim() > 0 else 1
        return n, tensor.numel() // max(n, 1)

    def compresses(self, tensor):
        """True when `tensor` is a matrix PowerSGD shrinks at least min_compression_rate-fold
        and the warm-up steps (start_iter) are over."""
        if tensor.dim() < 2 or self.step < self.config.start_iter or not tensor.dtype.is_floating_point:
            return False
        n, m = self.matrix_shape(tensor)
        r = min(self.config.rank, n, m)
        return n * m >= self.config.min_compression_rate * (n + m) * r

    def _q(self, name, index, m, r, device):
        q = self.qs.get(name)
        if q is None or q.shape != (m, r) or not self.config.warm_start:
            # The same random start on every rank: seeded by the configuration and the tensor's index.
            g = torch.Generator().manual_seed(self.config.seed * 1_000_003 + index)
            q = torch.randn(m, r, generator=g).to(device)
            self.qs[name] = q
        return q

    def start(self, name, index, grad):
        """Phase 1: error-compensated M, P = M Q and its allreduce. Returns the context for finish()."""
        n, m = self.matrix_shape(grad)
        r = min(self.config.rank, n, m)
        mat = grad.detach().reshape(n, m).to(torch.float32)
        err = self.errors.get(name)
        if err is not None and err.shape == mat.shape:
            mat = mat + err
        q = self._q(name, index, m, r, mat.device)
        orthonormalize(q)
        p = mat @ q
        handle = allreduce_async_(p, name=f"powersgd.P.{name}", op=Average, compression=Compression.none,
                                  process_set=self.process_set)
        return {"name": name, "mat": mat, "p": p, "handle": handle, "q_before": q}

    def finish(self, contexts):
        """Phase 2 for every tensor started this step: orthonormalize P, one grouped allreduce
        of the Qs, and the approximations P Q^T. Returns them (float32, n x m) in order."""
        for c in contexts:
            synchronize(c["handle"])
            orthonormalize(c["p"])
            c["q"] = (c["mat"].t() @ c["p"]).contiguous()
            self.qs[c["name"]] = c["q"]
        if contexts:
            synchronize(grouped_allreduce_async_([c["q"] for c in contexts], name="powersgd.Q",
                                                 op=Average, compression=Compression.none,
                                                 process_set=self.process_set))
        out = []
        for c in contexts:
            approx = c["p"] @ c["q"].t()
            if bool(torch.isfinite(approx).all()):
                self.errors[c["name"]] = c["mat"] - approx
            else:
                # A non-finite step (a loss scaler's overflow on some rank: P and Q are
                # averages, so every rank sees it) shows in the result but is not remembered:
                # the error buffer and the warm-start Q keep their values from before it.
                self.qs[c["name"]] = c["q_before"]
            out.append(approx)
        return out
