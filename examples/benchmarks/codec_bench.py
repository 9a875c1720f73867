#!/usr/bin/env python3
"""Codec throughput: gradcomp's kernels vs memcpy vs the same max-min algorithm in torch ops.

Runs build/examples/codec_bench (Google Benchmark, one core) on 64 MB of Gaussian float32,
then times a torch-tensor-ops implementation of the same max-min quantization (bucket 512,
round to nearest, identical packing) on the same data with torch.set_num_threads(1), checks
that both produce the same bytes, and prints one table with the ratios.

    /usr/bin/python3 examples/benchmarks/codec_bench.py [--build build] [--min-time 0.5]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

BUCKET = 512
COUNT = (64 << 20) // 4


def torch_encode(x, bits):
    """Max-min quantization with torch ops, docs/design.md's arithmetic and packing."""
    levels = (1 << bits) - 1
    v = x.view(-1, BUCKET)
    mn = v.amin(1, keepdim=True)
    mx = v.amax(1, keepdim=True)
    unit = (mx - mn) / levels
    inv = torch.where(unit > 0, 1.0 / unit, torch.zeros_like(unit))
    q = torch.floor((v - mn) * inv + 0.5).clamp_(0, levels).to(torch.int64).view(-1, 8)
    shifts = torch.arange(8, dtype=torch.int64) * bits
    packed = (q << shifts).sum(1)
    codes = packed.view(torch.uint8).view(-1, 8)[:, :bits].contiguous()
    return torch.cat([mn, unit], 1).contiguous(), codes


def torch_decode(meta, codes, bits, out, accumulate):
    levels = (1 << bits) - 1
    groups = torch.zeros(codes.shape[0], 8, dtype=torch.uint8)
    groups[:, :bits] = codes
    shifts = torch.arange(8, dtype=torch.int64) * bits
    q = (groups.view(torch.int64) >> shifts) & levels
    y = meta[:, :1] + meta[:, 1:] * q.view(-1, BUCKET).to(torch.float32)
    if accumulate:
        out.add_(y.view(-1))
    else:
        out.copy_(y.view(-1))


def wire_bytes(meta, codes):
    return meta.numpy().tobytes() + codes.numpy().tobytes()


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build", help="CMake build directory")
    ap.add_argument("--min-time", default="0.5", help="Google Benchmark --benchmark_min_time")
    ap.add_argument("--repeats", type=int, default=5, help="torch timing repetitions")
    args = ap.parse_args()
    binary = os.path.join(args.build, "examples", "codec_bench")
    if not os.path.exists(binary):
        sys.exit(f"codec_bench: {binary} not found; build first (bash scripts/test.sh or cmake --build build)")

    data = np.random.default_rng(1).normal(0.0, 1e-3, COUNT).astype(np.float32)
    with tempfile.NamedTemporaryFile(suffix=".f32", delete=False) as f:
        f.write(data.tobytes())
        path = f.name
    try:
        env = dict(os.environ, CODEC_BENCH_INPUT=path)
        out = subprocess.run([binary, "--benchmark_format=json", f"--benchmark_min_time={args.min_time}"],
                             env=env, check=True, capture_output=True, text=True).stdout
        ours = {b["name"]: b["bytes_per_second"] / 1e9 for b in json.loads(out)["benchmarks"]}

        sys.path.insert(0, os.path.join(args.build, "python"))
        import gradcomp.codec as gc

        torch.set_num_threads(1)
        x = torch.from_numpy(data)
        gb = COUNT * 4 / 1e9
        memcpy = ours["memcpy"]
        print(f"codec throughput, 64 MB float32, one core (GB/s of float32 input); memcpy {memcpy:.2f} GB/s")
        print(f"{'operation':<22}{'gradcomp':>10}{'% memcpy':>10}{'torch ops':>11}{'gradcomp/torch':>16}")
        for bits in (1, 2, 4, 8):
            meta, codes = torch_encode(x, bits)
            same = wire_bytes(meta, codes) == gc.encode(data, "maxmin", bits=bits, bucket_size=BUCKET)
            print(f"  ({bits}-bit: torch-ops wire bytes {'identical to' if same else 'DIFFER from'} gradcomp's)")
            out_t = torch.zeros(COUNT)
            t_enc = median_seconds(lambda: torch_encode(x, bits), args.repeats)
            t_dec = median_seconds(lambda: torch_decode(meta, codes, bits, out_t, False), args.repeats)
            t_acc = median_seconds(lambda: torch_decode(meta, codes, bits, out_t, True), args.repeats)
            for op, t in (("encode", t_enc), ("decode", t_dec), ("decode_acc", t_acc)):
                g = ours[f"maxmin{bits}/{op}"]
                tg = gb / t
                print(f"{f'maxmin {bits}-bit {op}':<22}{g:>10.2f}{100 * g / memcpy:>9.0f}%{tg:>11.2f}{g / tg:>15.1f}x")
        for label in ("fp16", "bf16", "topk1%", "topk0.1%"):
            for op in ("encode", "decode", "decode_acc"):
                g = ours[f"{label}/{op}"]
                print(f"{f'{label} {op}':<22}{g:>10.2f}{100 * g / memcpy:>9.0f}%{'-':>11}{'-':>16}")
        sys.stdout.flush()
    finally:
        os.unlink(path)


if __name__ == "__main__":
    main()
