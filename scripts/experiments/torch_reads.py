#!/usr/bin/env python3
"""What each read of a CUDA tensor costs from Python (issue 18: where the Python layer's time goes).

The fast path of Fabric.copy_ reads, per tensor: get_device(), is_contiguous(), data_ptr(), nbytes
and the current raw stream of its GPU. This times each (and a bare Python method frame, for scale)
by timeit: the fastest of --repeat runs of --number calls, in ns per call. Needs PyTorch and a GPU.
"""

from __future__ import annotations

import argparse
import timeit

import torch


class Frame:
    def call(self, a: object, b: object) -> None:
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--number", type=int, default=100000)
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    t = torch.zeros(4096, dtype=torch.uint8, device="cuda:0")
    raw = torch._C._cuda_getCurrentRawStream
    frame = Frame()
    reads = {
        "t.get_device()": lambda: t.get_device(),
        "t.is_contiguous()": lambda: t.is_contiguous(),
        "t.data_ptr()": lambda: t.data_ptr(),
        "t.nbytes": lambda: t.nbytes,
        "t.dtype": lambda: t.dtype,
        "t.device": lambda: t.device,
        "_cuda_getCurrentRawStream(0)": lambda: raw(0),
        "torch.cuda.current_stream(0).cuda_stream": lambda: torch.cuda.current_stream(0).cuda_stream,
        "Python method frame (2 args)": lambda: frame.call(t, t),
        "lambda alone (subtracted)": lambda: None,
    }
    base = min(timeit.repeat(reads["lambda alone (subtracted)"], number=args.number, repeat=args.repeat))
    print(f"torch {torch.__version__}, ns per call beyond a bare lambda ({base / args.number * 1e9:.1f} ns)")
    for name, read in reads.items():
        best = min(timeit.repeat(read, number=args.number, repeat=args.repeat))
        print(f"{name:<44} {(best - base) / args.number * 1e9:8.1f}")


if __name__ == "__main__":
    main()
