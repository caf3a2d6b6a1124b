"""Cross-checks common/dtype_convert against PyTorch 1.13's own conversions.

Feeds the same fp32 values (random bit patterns of every class: normals,
subnormals, values near the 16-bit types' limits, exact ties, +-0, +-inf,
NaNs) to `.to(torch.bfloat16)` / `.half()` and to dtype_convert_tool, and
requires identical bit patterns. Fails (does not skip) without torch.
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

tool = sys.argv[1]
rng = np.random.default_rng(7)
parts = [
    rng.integers(0, 2**32, size=1_000_000, dtype=np.uint64).astype(np.uint32),
    # Near fp16's and bf16's overflow and underflow, and exact ties.
    (np.float32(65504.0).view(np.uint32) + np.arange(-5000, 5000)).astype(np.uint32),
    (np.float32(2**-14).view(np.uint32) + np.arange(-200000, 20000)).astype(np.uint32),
    (np.arange(0, 70000, dtype=np.uint32) << 12) | 0x1000,   # fp16 ties (13 dropped bits = 0x1000)
    (np.arange(0, 70000, dtype=np.uint32) << 16) | 0x8000,   # bf16 ties
    np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000, 0x7F800001,
              0x7F7FFFFF, 0x00000001, 0x80000001], dtype=np.uint32),
]
bits = np.concatenate(parts).astype(np.uint32)
values = bits.view(np.float32)
failures = 0
with tempfile.TemporaryDirectory() as tmp:
    src = os.path.join(tmp, "in.f32")
    values.tofile(src)
    for name, torch_dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        out = os.path.join(tmp, name)
        subprocess.run([tool, name, src, out], check=True)
        ours = np.fromfile(out, dtype=np.uint16)
        theirs = torch.from_numpy(values.copy()).to(torch_dtype).view(torch.int16).numpy()
        theirs = theirs.view(np.uint16)
        bad = np.nonzero(ours != theirs)[0]
        print(f"{name}: {len(values)} values, {len(bad)} differ")
        for i in bad[:10]:
            print(f"  fp32 0x{bits[i]:08x}: ours 0x{ours[i]:04x}, torch 0x{theirs[i]:04x}")
        failures += len(bad)
sys.exit(1 if failures else 0)
