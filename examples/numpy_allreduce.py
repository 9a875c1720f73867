"""gradcomp from NumPy: an exact and a 4-bit compressed allreduce of the same gradient.

    gcrun -np 2 /usr/bin/python3 examples/numpy_allreduce.py
"""
import numpy as np

import gradcomp.numpy as gc


def main():
    gc.init()
    rank, size = gc.rank(), gc.size()
    grad = np.random.default_rng(rank).normal(size=(1024, 256)).astype(np.float32)
    exact = gc.allreduce(grad, name="grad.exact", compression="none")
    approx = gc.allreduce(grad, name="grad.4bit", compression={"codec": "maxmin", "bits": 4, "bucket_size": 512})
    error = float(np.linalg.norm(approx - exact) / np.linalg.norm(exact))
    s = gc.stats()
    if rank == 0:
        print(f"{size} ranks averaged a {grad.shape} float32 gradient")
        print(f"4-bit max-min: relative L2 error {error:.4f}; this rank sent {s['compressed_bytes_on_wire']} bytes "
              f"for {s['compressed_bytes_in']} bytes of gradient")
    total = gc.allreduce(np.array([rank], np.int64), op=gc.Sum, name="ranks")
    assert int(total[0]) == size * (size - 1) // 2
    gc.shutdown()


if __name__ == "__main__":
    main()
