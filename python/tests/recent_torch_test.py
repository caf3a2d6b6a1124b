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

Then Adafactor's state goes to torch: after 20 steps through shardopt.torch
the servers checkpoint, `shardoptctl export --optimizer_state` writes it as
safetensors in torch's state shapes (row_var (R, 1), col_var (1, C),
variance), and a torch.optim.Adafactor loaded with it (and the step count)
continues 20 more steps on the same batches as shardopt does: the two runs'
parameters agree to the same bound. (argv[1]: the shardoptctl binary.)
"""

import os
import subprocess
import sys
import tempfile

import torch

sys.path[:0] = ["tools/gpu", "tests"]
from muon_torch_parity import newton_schulz_in_fp32  # noqa: E402
from safetensors_torch_check import spec_read  # noqa: E402

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


def train_steps(model, opts, steps):
    for step in steps:
        x, y = batch(step)
        for opt in opts:
            opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        for opt in opts:
            opt.step()


def adafactor_state_to_torch(ctl, addresses, workdir):
    """The check described at the top; returns (worst difference, state keys)."""
    import shardopt.torch
    mine, theirs = make_model(), make_model()
    ours = shardopt.torch.DistributedOptimizer(
        mine.named_parameters(), servers=addresses, rank=0, world_size=1,
        optimizer="adafactor", model_id="exported_adafactor", checkpoint_dir=workdir,
        **ADAFACTOR)
    train_steps(mine, [ours], range(1, 21))
    # (The committed checkpoint's manifest.)
    checkpoint = os.path.dirname(ours.state_dict()["shardopt"]["checkpoints"][0])
    exported = os.path.join(workdir, "exported.safetensors")
    subprocess.run([ctl, "export", "--optimizer_state", f"--checkpoint={checkpoint}",
                    f"--out={exported}"], check=True, stdout=subprocess.DEVNULL)
    # (The project's strict reader of the format: the recent-torch venv has
    # no safetensors package.)
    tensors, metadata = spec_read(exported)
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            p.copy_(tensors[name])
    opt = torch.optim.Adafactor(theirs.parameters(), **ADAFACTOR)
    keys = set()
    for name, p in theirs.named_parameters():
        state = {"step": torch.tensor(float(metadata["shardopt.optimizer_steps"]))}
        for key in ("row_var", "col_var", "variance"):
            if f"optimizer.{key}.{name}" in tensors:
                state[key] = tensors[f"optimizer.{key}.{name}"].clone()
                keys.add(f"{key}{list(state[key].shape)}")
        opt.state[p] = state
    train_steps(mine, [ours], range(21, 41))
    train_steps(theirs, [opt], range(21, 41))
    worst = max(((a - b).abs() / b.abs().clamp(min=1.0)).max().item()
                for a, b in zip(mine.parameters(), theirs.parameters()))
    return worst, keys


def main():
    from support import Cluster
    print(f"torch {torch.__version__}")
    ctl = os.path.abspath(sys.argv[1])
    failures = 0
    for kind in ("adafactor", "muon"):
        with Cluster(2) as cluster, newton_schulz_in_fp32():
            worst, first, last = lockstep(kind, cluster.addresses)
        ok = worst <= BOUND[kind] and last < 0.8 * first
        print(f"{'ok  ' if ok else 'FAIL'} {kind} S=2 vs torch.optim: worst parameter difference "
              f"{worst:.3g} over {STEPS} steps (bound {BOUND[kind]:g}); loss {first:.4f} -> "
              f"{last:.4f}")
        failures += not ok
    with Cluster(2) as cluster, tempfile.TemporaryDirectory() as workdir:
        worst, keys = adafactor_state_to_torch(ctl, cluster.addresses, workdir)
    want = {"row_var[37, 1]", "col_var[1, 9]", "variance[37]", "row_var[13, 1]",
            "col_var[1, 37]", "variance[13]", "row_var[4, 1]", "col_var[1, 13]", "variance[4]"}
    ok = worst <= BOUND["adafactor"] and keys == want
    print(f"{'ok  ' if ok else 'FAIL'} adafactor state exported after 20 steps, loaded into "
          f"torch.optim.Adafactor, 20 more steps: worst parameter difference {worst:.3g} "
          f"(bound {BOUND['adafactor']:g}); state {sorted(keys)}")
    failures += not ok
    print(f"recent torch: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
