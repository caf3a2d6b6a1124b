"""Training parity: shardopt.torch.DistributedOptimizer against torch.optim.

For SGD (momentum; nesterov), Adam, AdamW (amsgrad) and Adagrad, a small MLP
is trained for 200 steps by T in {1, 2} trainer processes (data parallel: each
back-propagates the mean loss of its half of every batch) through S in
{1, 2} shard servers, and by one process with torch.optim on the full batches
from the same seed. The loss curves (full-batch loss before every step, as
every trainer sees it) and final parameters must agree within fp32 rounding;
with one trainer (the same gradient as torch's) they must be bit-identical,
since the servers' kernels do torch's operations in torch's order (both run
with ATEN_CPU_CAPABILITY=default, torch's kernels without fused multiply-add).

Run by run_python_test.sh; a trainer is this file with --trainer.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

STEPS = 200
BATCH = 32
OPTIMIZERS = {
    "sgd_momentum": ("sgd", {"lr": 0.05, "momentum": 0.9, "weight_decay": 1e-3}),
    "sgd_nesterov": ("sgd", {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    "adam": ("adam", {"lr": 0.01, "weight_decay": 1e-3}),
    "adamw_amsgrad": ("adamw", {"lr": 0.01, "weight_decay": 0.05, "amsgrad": True}),
    "adagrad": ("adagrad", {"lr": 0.05, "lr_decay": 1e-3, "initial_accumulator_value": 0.1}),
}
TORCH = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW,
         "adagrad": torch.optim.Adagrad}


def make_model():
    torch.manual_seed(1234)
    return torch.nn.Sequential(torch.nn.Linear(6, 24), torch.nn.Tanh(),
                               torch.nn.Linear(24, 24), torch.nn.Tanh(), torch.nn.Linear(24, 3))


def batch(step):
    """The full batch of `step`: points of three classes (a fixed rule)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(BATCH, 6, generator=g)
    y = ((x[:, 0] * 1.5 + x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 0.5).long())
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference(name):
    kind, hyper = OPTIMIZERS[name]
    model = make_model()
    opt = TORCH[kind](model.parameters(), **hyper)
    losses = []
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_of(model, x, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    return losses, [p.detach().clone() for p in model.parameters()]


def trainer(args):
    import shardopt.torch
    rank, world = args.rank, args.world_size
    out = {}
    for name, (kind, hyper) in OPTIMIZERS.items():
        model = make_model()
        opt = shardopt.torch.DistributedOptimizer(
            model.named_parameters(), servers=args.servers.split(","), rank=rank,
            world_size=world, optimizer=kind, model_id=name, **hyper)
        losses = []
        for step in range(1, STEPS + 1):
            x, y = batch(step)
            with torch.no_grad():
                losses.append(loss_of(model, x, y).item())  # Full batch, for the curve.
            share = slice(rank * BATCH // world, (rank + 1) * BATCH // world)
            opt.zero_grad()
            loss_of(model, x[share], y[share]).backward()
            opt.step()
        out[name] = {"losses": losses,
                     "params": [p.detach().reshape(-1).tolist() for p in model.parameters()]}
    with open(args.out, "w") as f:
        json.dump(out, f)


def compare(name, got, want_losses, want_params, exact):
    losses = torch.tensor(got["losses"], dtype=torch.float64)
    ref_losses = torch.tensor(want_losses, dtype=torch.float64)
    params = torch.cat([torch.tensor(p) for p in got["params"]])
    ref_params = torch.cat([p.reshape(-1) for p in want_params])
    loss_diff = (losses - ref_losses).abs().max().item()
    param_diff = (params - ref_params).abs().max().item()
    scale = ref_params.abs().max().item()
    report = (f"{name}: max |loss - torch| = {loss_diff:.3g}, max |param - torch| = "
              f"{param_diff:.3g} (params up to {scale:.3g}); loss {ref_losses[0]:.4f} -> "
              f"{ref_losses[-1]:.4f}")
    if exact:
        ok = torch.equal(params.float(), ref_params.float()) and loss_diff == 0
    else:
        # fp32 rounding: the servers average the halves' gradients, torch
        # differentiates the full batch at once; 200 steps keep the drift small.
        ok = loss_diff <= 1e-5 and param_diff <= 1e-5 * max(1.0, scale)
    return ok, report


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", action="store_true")
    parser.add_argument("--servers")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world_size", type=int, default=1)
    parser.add_argument("--out")
    args = parser.parse_args()
    if args.trainer:
        trainer(args)
        return 0
    from support import Cluster
    references = {name: reference(name) for name in OPTIMIZERS}
    failures = 0
    for shards, trainers in [(1, 1), (2, 1), (1, 2), (2, 2)]:
        with Cluster(shards) as cluster:
            outs = [os.path.join(tempfile.mkdtemp(), f"rank{r}.json") for r in range(trainers)]
            procs = [subprocess.Popen(
                [sys.executable, __file__, "--trainer", "--servers", ",".join(cluster.addresses),
                 "--rank", str(r), "--world_size", str(trainers), "--out", outs[r]])
                for r in range(trainers)]
            codes = [p.wait(timeout=600) for p in procs]
            if any(codes):
                print(f"FAIL S={shards} T={trainers}: trainer exit codes {codes}")
                failures += 1
                continue
            results = []
            for path in outs:
                with open(path) as f:
                    results.append(json.load(f))
            for name in OPTIMIZERS:
                # Every trainer holds the same parameters and saw the same losses.
                if any(r[name] != results[0][name] for r in results[1:]):
                    print(f"FAIL S={shards} T={trainers} {name}: trainers disagree")
                    failures += 1
                ok, report = compare(name, results[0][name], *references[name],
                                     exact=trainers == 1)
                print(f"{'ok  ' if ok else 'FAIL'} S={shards} T={trainers} "
                      f"{'(bit-exact) ' if trainers == 1 else ''}{report}")
                failures += not ok
    print(f"parity: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
