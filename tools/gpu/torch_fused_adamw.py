#!/usr/bin/env python3
"""torch.optim.AdamW(fused=True): step time on the sizes gpu_bench uses.

    python3 tools/gpu/torch_fused_adamw.py [--sizes=64M,1G] [--iters=20] [--warmup=3]

One fp32 parameter tensor of n elements with a random gradient, lr 1e-3,
weight_decay 1e-2 (gpu_bench's AdamW); each optimizer.step() timed with CUDA
events (median of --iters after --warmup; the first warm-up step creates the
state). Counts 28 B/param like gpu_bench. Prints, last, one line per size:
    RESULT kind=torch_adamw_fused n=<n> median_ms=<..> gbps=<..>
Exit status 3 (with a SKIP line) when torch or a CUDA GPU is missing.
"""
import argparse
import statistics
import sys


def parse_size(text):
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip()
    if text and text[-1].upper() in mult:
        return int(float(text[:-1]) * mult[text[-1].upper()])
    return int(text)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64M,1G")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print(f"SKIP: torch is not importable: {e}")
        return 3
    if not torch.cuda.is_available():
        print("SKIP: torch sees no CUDA GPU")
        return 3
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    results = []
    for n in [parse_size(s) for s in args.sizes.split(",") if s]:
        torch.manual_seed(0)
        p = torch.empty(n, device="cuda", dtype=torch.float32).uniform_(-0.5, 0.5)
        p.grad = torch.empty_like(p).uniform_(-1.0, 1.0)
        opt = torch.optim.AdamW([p], lr=1e-3, weight_decay=1e-2, fused=True)
        for _ in range(max(1, args.warmup)):
            opt.step()
        torch.cuda.synchronize()
        times = []
        for _ in range(args.iters):
            start = torch.cuda.Event(enable_timing=True)
            stop = torch.cuda.Event(enable_timing=True)
            start.record()
            opt.step()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        ms = statistics.median(times)
        if not torch.isfinite(p[:16]).all():
            print("non-finite parameters after the benchmark", file=sys.stderr)
            return 1
        results.append((n, ms, 28.0 * n / (ms * 1e-3) / 1e9))
        del opt, p
        torch.cuda.empty_cache()
    for n, ms, gbps in results:
        print(f"RESULT kind=torch_adamw_fused n={n} median_ms={ms:.4f} gbps={gbps:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
