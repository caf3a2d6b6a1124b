"""shardopt's Muon (server/optim/muon.cc, through optimizer_replay) against
torch.optim.Muon of the machine's PyTorch (2.9+), on CPU tensors: matrices
taller and wider than square and square, 30 steps of random gradients, two
configs (the defaults; plain momentum with 3 steps and match_rms_adamw).

    python3 tools/gpu/muon_torch_parity.py --replay "CMD"   # CMD: optimizer_replay

torch runs the Newton-Schulz products in bf16, shardopt in fp32, so the two
agree to what bf16 Newton-Schulz keeps, not to the bit: the momentum buffers
(no products) must agree within 1e-5 (relative Frobenius norm per tensor),
the first step's orthogonalised update within 0.15 relative with a cosine
of at least 0.99 (the quintic iteration does not converge, and bf16 moves
its result by several per cent: 4-7 % measured against a bf16 transcription
in torch 1.13 ops; a wrong lr adjustment, transposition or Nesterov choice
is far outside), and the parameters within 2e-3 of max(|p|, 1) after the run.
Then the same configs again with torch's own Newton-Schulz function made fp32
(newton_schulz_in_fp32: its one bf16 cast replaced), where the two compute
the same thing: the first update within 1e-4 relative, cosine 0.999999, the
parameters within 1e-5. Prints one RESULT line per config and precision
(torch_newton_schulz=bf16|fp32); exits 0 when all hold, 1 otherwise, 77 when this PyTorch has no torch.optim.Muon
(tools/gpu/gpu_check.sh step 8 runs it on the lent GPU machine's torch).
"""

import argparse
import contextlib
import inspect
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

SHAPES = [(37, 11), (5, 53), (16, 16)]
CONFIGS = [
    ({"lr": 2e-3}, "lr=0.002"),
    ({"lr": 1e-3, "momentum": 0.9, "nesterov": False, "ns_steps": 3, "weight_decay": 0.01,
      "adjust_lr_fn": "match_rms_adamw"},
     "lr=0.001 momentum=0.9 nesterov=0 ns_steps=3 weight_decay=0.01 adjust_lr=match_rms_adamw"),
]


def run_replay(replay, settings, params, grads, workdir):
    """shardopt's parameters and momentum buffers after `grads`."""
    n = sum(p.numel() for p in params)
    inp, out = os.path.join(workdir, "in"), os.path.join(workdir, "out")
    with open(inp, "wb") as f:
        f.write((f"shardopt-replay-v1 kind=muon {settings} n={n} steps={len(grads)} shapes=" +
                 ",".join(f"{r}x{c}" for r, c in SHAPES) + "\n").encode())
        f.write(torch.cat([p.reshape(-1) for p in params]).numpy().tobytes())
        for step in grads:
            f.write(torch.cat([g.reshape(-1) for g in step]).numpy().tobytes())
    subprocess.run(shlex.split(replay) + [inp, out], check=True, stderr=subprocess.DEVNULL)
    with open(out, "rb") as f:
        assert f.readline().decode().strip() == "slots=momentum_buffer"
        values = torch.tensor(struct.unpack(f"<{2 * n}f", f.read()))
    split = lambda flat: [t.reshape(s) for t, s in  # noqa: E731
                          zip(torch.split(flat, [r * c for r, c in SHAPES]), SHAPES)]
    return split(values[:n]), split(values[n:])


@contextlib.contextmanager
def newton_schulz_in_fp32():
    """torch's own Newton-Schulz function with its one bf16 cast made fp32
    (a copy, so that the in-place normalisation cannot touch the momentum
    buffer that plain momentum hands it), for the tight comparison."""
    import torch.optim._muon as muon_module
    source = inspect.getsource(muon_module._zeropower_via_newtonschulz)
    assert source.count("grad.bfloat16()") == 1, "torch's Newton-Schulz changed shape"
    namespace = {}
    exec(source.replace("grad.bfloat16()", "grad.to(torch.float32, copy=True)"),
         muon_module.__dict__, namespace)
    original = muon_module._zeropower_via_newtonschulz
    muon_module._zeropower_via_newtonschulz = namespace["_zeropower_via_newtonschulz"]
    try:
        yield
    finally:
        muon_module._zeropower_via_newtonschulz = original


# (first update relative, cosine, parameters relative) bounds per precision.
BOUNDS = {"bf16": (0.15, 0.99, 2e-3), "fp32": (1e-4, 0.999999, 1e-5)}


def run_case(index, config, settings, replay, steps, workdir, precision):
    generator = torch.Generator().manual_seed(300 + index)
    params = [torch.randn(s, generator=generator) * 0.5 for s in SHAPES]
    grads = [[torch.randn(s, generator=generator) * 0.1 for s in SHAPES] for _ in range(steps)]
    theirs = [p.clone().requires_grad_(True) for p in params]
    opt = torch.optim.Muon(theirs, **config)
    worst_update, worst_cosine = 0.0, 1.0
    for k, step in enumerate(grads):
        before = [p.detach().clone() for p in theirs]
        for p, g in zip(theirs, step):
            p.grad = g.clone()
        opt.step()
        # The same step from torch's state, by shardopt: the updates compared.
        mine, _ = run_replay(replay, settings, before, [step], workdir) if k == 0 else (None, None)
        if mine is not None:
            for m, t, b in zip(mine, theirs, before):
                ours, torchs = m - b, t.detach() - b
                worst_update = max(worst_update,
                                   ((ours - torchs).norm() / torchs.norm()).item())
                worst_cosine = min(worst_cosine, torch.nn.functional.cosine_similarity(
                    ours.reshape(-1), torchs.reshape(-1), dim=0).item())
    mine_params, mine_buffers = run_replay(replay, settings, params, grads, workdir)
    worst_buffer = max(((m - opt.state[t]["momentum_buffer"]).norm() /
                        opt.state[t]["momentum_buffer"].norm()).item()
                       for m, t in zip(mine_buffers, theirs))
    worst_param = max(((m - t.detach()).abs() / t.detach().abs().clamp(min=1.0)).max().item()
                      for m, t in zip(mine_params, theirs))
    update_bound, cosine_bound, param_bound = BOUNDS[precision]
    ok = worst_buffer <= 1e-5 and worst_update <= update_bound and \
        worst_cosine >= cosine_bound and worst_param <= param_bound
    print(f"RESULT kind=muon_parity config={index} torch_newton_schulz={precision} "
          f"steps={steps} buffer_rel={worst_buffer:.3g} "
          f"first_update_rel={worst_update:.3g} cosine={worst_cosine:.5f} "
          f"param_rel={worst_param:.3g} "
          f"{'ok' if ok else 'FAIL'}", flush=True)
    return ok


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replay", required=True, help="the optimizer_replay command")
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    if not hasattr(torch.optim, "Muon"):
        print(f"SKIP: torch {torch.__version__} has no torch.optim.Muon (2.9+)")
        return 77
    print(f"torch {torch.__version__}", flush=True)
    with tempfile.TemporaryDirectory() as workdir:
        results = [run_case(i, c, s, args.replay, args.steps, workdir, "bf16")
                   for i, (c, s) in enumerate(CONFIGS)]
        with newton_schulz_in_fp32():
            results += [run_case(i, c, s, args.replay, args.steps, workdir, "fp32")
                        for i, (c, s) in enumerate(CONFIGS)]
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
