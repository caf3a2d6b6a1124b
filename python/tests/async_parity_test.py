"""Asynchronous training against torch.optim, in each shard's own order.

Two trainer processes train a small MLP with shardopt.torch's
DistributedOptimizer(consistency="async") through two shard servers: each
rank's step is applied on each shard alone, as it arrives. Every shard
reports the order it applied the pushes in (Inspect's applied_order); a
torch.optim run that applies the very gradients the trainers pushed in that
order ends, on that shard's elements, bit-identical to the shard (Adam and
AdamW are elementwise; torch counts its steps as the shard counts its
applied pushes). Each shard's optimizer step count equals the pushes it
applied. Then the same with consistency="bounded", staleness=1, with one
trainer slowed down: no push applied more than one step ahead.

Run by run_python_test.sh; a trainer is this file with --trainer.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

STEPS = 40
BATCH = 16
OPTIMIZERS = {
    "adam": ("adam", {"lr": 0.01}),
    "adamw": ("adamw", {"lr": 0.01, "weight_decay": 0.05}),
}
TORCH = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}


def make_model():
    torch.manual_seed(4321)
    return torch.nn.Sequential(torch.nn.Linear(5, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2))


def batch(rank, step):
    g = torch.Generator().manual_seed(100 * step + rank)
    x = torch.randn(BATCH, 5, generator=g)
    y = (x[:, 0] + x[:, 1] * x[:, 2] > 0).long()
    return x, y


def trainer(args):
    import shardopt.torch
    out = {}
    for name, (kind, hyper) in OPTIMIZERS.items():
        model = make_model()
        opt = shardopt.torch.DistributedOptimizer(
            model.named_parameters(), servers=args.servers.split(","), rank=args.rank,
            world_size=args.world_size, optimizer=kind, model_id=f"{name}-{args.consistency}",
            consistency=args.consistency, staleness=args.staleness, **hyper)
        grads, staleness = {}, []
        for step in range(1, STEPS + 1):
            if args.slow:
                time.sleep(0.02)
            x, y = batch(args.rank, step)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            grads[step] = {n: p.grad.detach().reshape(-1).tolist()
                           for n, p in model.named_parameters()}
            opt.step()
            staleness.append(opt.last_results[0]["staleness"])
        opt.wait_for_every_trainer()
        out[name] = {"grads": grads, "staleness": staleness,
                     "params": {n: p.detach().reshape(-1).tolist()
                                for n, p in model.named_parameters()},
                     "inspect": opt.inspect()[0] if args.rank == 0 else None,
                     "layout": opt._groups[0].client.layout() if args.rank == 0 else None}
    with open(args.out, "w") as f:
        json.dump(out, f)


def replay_on_shard(name, shard, results, layout):
    """torch.optim applying the pushes in `shard`'s order; the shard's elements."""
    kind, hyper = OPTIMIZERS[name]
    model = make_model()
    params = dict(model.named_parameters())
    opt = TORCH[kind](model.parameters(), **hyper)
    for push in shard.get("applied_order", []):
        rank, step = int(push.get("trainer_rank", 0)), int(push["step"])
        for n, p in params.items():
            p.grad = torch.tensor(results[rank][name]["grads"][str(step)][n]).reshape(p.shape)
        opt.step()
    begin, end = int(shard["range"].get("begin", 0)), int(shard["range"]["end"])
    want, got = [], []
    for tensor_name, _shape, offset, size in layout:
        lo, hi = max(begin, offset), min(end, offset + size)
        if lo >= hi:
            continue
        want.append(params[tensor_name].detach().reshape(-1)[lo - offset:hi - offset])
        got.append(torch.tensor(results[0][name]["params"][tensor_name])[lo - offset:hi - offset])
    return torch.cat(got), torch.cat(want)


def run(consistency, staleness, failures):
    from support import Cluster
    world = 2
    with Cluster(2) as cluster:
        outs = [os.path.join(tempfile.mkdtemp(), f"rank{r}.json") for r in range(world)]
        procs = [subprocess.Popen(
            [sys.executable, __file__, "--trainer", "--servers", ",".join(cluster.addresses),
             "--rank", str(r), "--world_size", str(world), "--out", outs[r],
             "--consistency", consistency, "--staleness", str(staleness)] +
            (["--slow"] if consistency == "bounded" and r == 1 else []))
            for r in range(world)]
        codes = [p.wait(timeout=600) for p in procs]
        if any(codes):
            print(f"FAIL {consistency}: trainer exit codes {codes}")
            return failures + 1
        results = []
        for path in outs:
            with open(path) as f:
                results.append(json.load(f))
    for name in OPTIMIZERS:
        if results[0][name]["params"] != results[1][name]["params"]:
            print(f"FAIL {consistency} {name}: the trainers end with different parameters")
            failures += 1
        layout = results[0][name]["layout"]
        for index, shard in enumerate(results[0][name]["inspect"]):
            applied = len(shard.get("applied_order", []))
            steps = int(shard.get("optimizer_steps", 0))
            ok = applied == world * STEPS and steps == applied
            got, want = replay_on_shard(name, shard, results, layout)
            exact = torch.equal(got, want)
            print(f"{'ok  ' if ok and exact else 'FAIL'} {consistency} {name} shard {index}: "
                  f"{applied} pushes applied, {steps} optimizer steps; in the shard's order "
                  f"max |param - torch| = {(got - want).abs().max().item():.3g}"
                  f"{' (bit-exact)' if exact else ''}")
            failures += not (ok and exact)
        if consistency == "bounded":
            worst = max(max(r[name]["staleness"]) for r in results)
            # (Reaching the bound shows the slowed trainer held the other back.)
            ok = worst == staleness
            print(f"{'ok  ' if ok else 'FAIL'} bounded {name}: largest staleness of a push "
                  f"{worst} (bound {staleness})")
            failures += not ok
    return failures


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--trainer", action="store_true")
    parser.add_argument("--servers")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world_size", type=int, default=1)
    parser.add_argument("--out")
    parser.add_argument("--consistency", default="async")
    parser.add_argument("--staleness", type=int, default=0)
    parser.add_argument("--slow", action="store_true")
    args = parser.parse_args()
    if args.trainer:
        trainer(args)
        return 0
    failures = run("async", 0, 0)
    failures = run("bounded", 1, failures)
    print(f"async parity: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
