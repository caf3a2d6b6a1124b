"""shardopt.torch against torch.optim.Adafactor and torch.optim.Muon of a
recent PyTorch (Debian's 1.13 has neither; run_python_test.sh runs this file
with the python in $SHARDOPT_TORCH_RECENT when the BUILD asks for it).

The same model is trained twice in lockstep on the same batches: through
shardopt.torch on 2 shard servers (whole tensors; Muon with the vectors in
an optimizer="adamw" group, as the reference recipes do) and by torch.optim
in this process (Muon plus AdamW for the vectors). Their gradients differ
only by the parameters' drift, so after every step the parameters must
agree to fp32 rounding: within BOUND of max(|p|, 1). torch's Muon runs its
Newton-Schulz products in bf16 and shardopt in fp32, so for Muon torch's own
function runs with that cast made fp32 (tools/gpu/muon_torch_parity.py's
newton_schulz_in_fp32; the bf16 comparison is that script's job). The loss
must fall in both.
"""

import sys

import torch

sys.path.insert(0, "tools/gpu")
from muon_torch_parity import newton_schulz_in_fp32  # noqa: E402

STEPS = 40
BOUND = {"adafactor": 1e-6, "muon": 2e-5}
ADAFACTOR = {"lr": 3e-2, "beta2_decay": -0.6, "eps": (1e-5, 1e-2), "d": 1.5,
             "weight_decay": 0.02}
MUON = {"lr": 5e-2, "weight_decay": 0.05, "momentum": 0.9, "nesterov": True, "ns_steps": 5,
        "adjust_lr_fn": "match_rms_adamw"}
ADAMW_FOR_VECTORS = {"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.01}


def make_model():
    torch.manual_seed(91)
    return torch.nn.Sequential(torch.nn.Linear(9, 37), torch.nn.Tanh(), torch.nn.Linear(37, 13),
                               torch.nn.Tanh(), torch.nn.Linear(13, 4))


def batch(step):
    g = torch.Generator().manual_seed(700 + step)
    x = torch.randn(32, 9, generator=g)
    y = (x[:, 0] * x[:, 1] > 0).long() + 2 * (x[:, 2] - x[:, 3] > 0.3).long()
    return x, y


def optimizers(kind, mine, theirs, addresses):
    import shardopt.torch
    if kind == "adafactor":
        ours = shardopt.torch.DistributedOptimizer(
            mine.named_parameters(), servers=addresses, rank=0, world_size=1,
            optimizer="adafactor", model_id="recent_adafactor", **ADAFACTOR)
        return ours, [torch.optim.Adafactor(theirs.parameters(), **ADAFACTOR)]
    matrices = lambda m: [p for p in m.parameters() if p.dim() == 2]  # noqa: E731
    vectors = lambda m: [p for p in m.parameters() if p.dim() != 2]  # noqa: E731
    ours = shardopt.torch.DistributedOptimizer(
        [{"params": matrices(mine)}, dict(ADAMW_FOR_VECTORS, optimizer="adamw",
                                          params=vectors(mine))],
        servers=addresses, rank=0, world_size=1, optimizer="muon", model_id="recent_muon",
        **MUON)
    return ours, [torch.optim.Muon(matrices(theirs), **MUON),
                  torch.optim.AdamW(vectors(theirs), **ADAMW_FOR_VECTORS)]


def lockstep(kind, addresses):
    mine, theirs = make_model(), make_model()
    ours, torchs = optimizers(kind, mine, theirs, addresses)
    worst, first, last = 0.0, None, None
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        for model, opts in ((mine, [ours]), (theirs, torchs)):
            for opt in opts:
                opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            for opt in opts:
                opt.step()
            if model is mine:
                first = loss.item() if first is None else first
                last = loss.item()
        worst = max(worst, max(((a - b).abs() / b.abs().clamp(min=1.0)).max().item()
                               for a, b in zip(mine.parameters(), theirs.parameters())))
    return worst, first, last


def main():
    from support import Cluster
    print(f"torch {torch.__version__}")
    failures = 0
    for kind in ("adafactor", "muon"):
        with Cluster(2) as cluster, newton_schulz_in_fp32():
            worst, first, last = lockstep(kind, cluster.addresses)
        ok = worst <= BOUND[kind] and last < 0.8 * first
        print(f"{'ok  ' if ok else 'FAIL'} {kind} S=2 vs torch.optim: worst parameter difference "
              f"{worst:.3g} over {STEPS} steps (bound {BOUND[kind]:g}); loss {first:.4f} -> "
              f"{last:.4f}")
        failures += not ok
    print(f"recent torch: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
