"""shardopt's Adafactor (server/optim/adafactor.cc, through optimizer_replay)
against torch.optim.Adafactor of the machine's PyTorch (2.5+), on CPU
tensors: odd shapes (matrices taller and wider than square, a 3-D tensor, a
vector, a scalar), 200 steps of random gradients, two configs.

    python3 tools/gpu/adafactor_torch_parity.py --replay "CMD"   # CMD: optimizer_replay

Prints one RESULT line per config and exits 0 when every parameter is within
1e-5 of torch's relative to max(|p|, 1) (as server/optim's float64 reference
test measures) and every factored state value within 1e-5 relative (torch's
reductions sum in another order, so bits differ by fp32 rounding), 1
otherwise, 77 when
this PyTorch has no torch.optim.Adafactor (Debian's 1.13 has none: the check
is meant for the lent GPU machine's torch, tools/gpu/gpu_check.sh step 8).
"""

import argparse
import os
import shlex
import struct
import subprocess
import sys
import tempfile

try:
    import torch
except ImportError as e:  # gpu_check.sh reports exit 77 as "not run".
    print(f"SKIP: torch is not importable: {e}")
    sys.exit(77)

SHAPES = [(37, 11), (5, 53), (3, 4, 7), (131,), (), (1, 9), (9, 1)]
CONFIGS = [
    {"lr": 1e-2},
    {"lr": 5e-2, "beta2_decay": -0.5, "eps": (1e-5, 1e-2), "d": 1.5, "weight_decay": 0.02,
     "maximize": True},
]
BOUND = 1e-5


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def replay_header(config, n, steps):
    fields = ["shardopt-replay-v1", "kind=adafactor", f"lr={config['lr']!r}", f"n={n}",
              f"steps={steps}",
              "shapes=" + ",".join("x".join(str(d) for d in s) for s in SHAPES)]
    if "beta2_decay" in config:
        fields.append(f"beta2_decay={config['beta2_decay']!r}")
    if "eps" in config:
        eps1, eps2 = config["eps"]
        fields += [f"eps1={-1.0 if eps1 is None else eps1!r}", f"eps2={eps2!r}"]
    if "d" in config:
        fields.append(f"clip_threshold={config['d']!r}")
    if "weight_decay" in config:
        fields.append(f"weight_decay={config['weight_decay']!r}")
    if config.get("maximize"):
        fields.append("maximize=1")
    return " ".join(fields) + "\n"


def run_case(index, config, replay, steps, workdir):
    generator = torch.Generator().manual_seed(100 + index)
    params = [torch.randn(s, generator=generator) * 0.5 for s in SHAPES]
    grads = [[torch.randn(s, generator=generator) * (0.1 + 0.05 * (k % 7)) for s in SHAPES]
             for k in range(steps)]
    n = sum(numel(s) for s in SHAPES)
    inp, out = os.path.join(workdir, f"in{index}"), os.path.join(workdir, f"out{index}")
    with open(inp, "wb") as f:
        f.write(replay_header(config, n, steps).encode())
        f.write(torch.cat([p.reshape(-1) for p in params]).numpy().tobytes())
        for step in grads:
            f.write(torch.cat([g.reshape(-1) for g in step]).numpy().tobytes())
    subprocess.run(shlex.split(replay) + [inp, out], check=True)

    theirs = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.Adafactor(theirs, foreach=False, **config)
    for step in grads:
        for p, g in zip(theirs, step):
            p.grad = g.clone()
        opt.step()

    with open(out, "rb") as f:
        slots = f.readline().decode().strip()
        data = f.read()
    assert slots == "slots=row_var,col_var", slots
    values = struct.unpack(f"<{3 * n}f", data)
    mine_p, mine_rows, mine_cols = values[:n], values[n:2 * n], values[2 * n:]
    worst = 0.0
    at = 0
    for shape, p in zip(SHAPES, theirs):
        size = numel(shape)
        state = opt.state[p]
        for a, b in zip(mine_p[at:at + size], p.detach().reshape(-1).tolist()):
            worst = max(worst, abs(a - b) / max(abs(b), 1.0))
        pairs = []
        if len(shape) >= 2:
            rows = state["row_var"].reshape(-1).tolist()
            cols = state["col_var"].reshape(-1).tolist()
            pairs += list(zip(mine_rows[at:at + len(rows)], rows))
            pairs += list(zip(mine_cols[at:at + len(cols)], cols))
        else:
            pairs += list(zip(mine_rows[at:at + size], state["variance"].reshape(-1).tolist()))
        for a, b in pairs:
            worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
        at += size
    ok = worst <= BOUND
    print(f"RESULT kind=adafactor_parity config={index} steps={steps} max_rel={worst:.3g} "
          f"bound={BOUND} {'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", required=True, help="the optimizer_replay command")
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    if not hasattr(torch.optim, "Adafactor"):
        print(f"SKIP: torch {torch.__version__} has no torch.optim.Adafactor (2.5+)")
        return 77
    print(f"torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [run_case(i, c, args.replay, args.steps, workdir) for i, c in enumerate(CONFIGS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
