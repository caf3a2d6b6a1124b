"""Lion through shardopt.torch against Lion written with torch ops.

torch.optim has no Lion; the reference is the lion-pytorch update written
here with torch's own fp32 ops (the same operation order the shards' kernel
follows, run with ATEN_CPU_CAPABILITY=default like the servers' kernels: no
fused multiply-add). One trainer, S in {1, 2} shard servers, 120 steps of a
small MLP with decoupled weight decay: the parameters must be bit-identical
to the reference, and the loss must fall. Run by run_python_test.sh.
"""

import sys

import torch

STEPS = 120
HYPER = {"lr": 3e-3, "betas": (0.9, 0.99), "weight_decay": 0.1}


def make_model():
    torch.manual_seed(77)
    return torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.Tanh(), torch.nn.Linear(33, 3))


def batch(step):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(24, 7, generator=g)
    y = ((x[:, 0] - x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 0.7).long())
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference():
    """lion-pytorch's update_fn, per parameter."""
    model = make_model()
    lr, (beta1, beta2), wd = HYPER["lr"], HYPER["betas"], HYPER["weight_decay"]
    exp_avg = [torch.zeros_like(p) for p in model.parameters()]
    losses = []
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        model.zero_grad()
        loss = loss_of(model, x, y)
        losses.append(loss.item())
        loss.backward()
        with torch.no_grad():
            for p, m in zip(model.parameters(), exp_avg):
                p.mul_(1 - lr * wd)
                update = m.clone().mul_(beta1).add(p.grad, alpha=1 - beta1).sign_()
                p.add_(update, alpha=-lr)
                m.mul_(beta2).add_(p.grad, alpha=1 - beta2)
    return losses, [p.detach().clone() for p in model.parameters()]


def shardopt_run(addresses):
    import shardopt.torch
    model = make_model()
    opt = shardopt.torch.DistributedOptimizer(
        model.named_parameters(), servers=addresses, rank=0, world_size=1, optimizer="lion",
        model_id=f"lion{len(addresses)}", **HYPER)
    losses = []
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        opt.zero_grad()
        loss = loss_of(model, x, y)
        losses.append(loss.item())
        loss.backward()
        opt.step()
    shard = opt.inspect()[0][0]
    return losses, [p.detach().clone() for p in model.parameters()], shard


def main():
    from support import Cluster
    want_losses, want_params = reference()
    failures = 0
    for shards in (1, 2):
        with Cluster(shards) as cluster:
            losses, params, shard = shardopt_run(cluster.addresses)
        exact = all(torch.equal(a, b) for a, b in zip(params, want_params)) and \
            losses == want_losses
        worst = max((a - b).abs().max().item() for a, b in zip(params, want_params))
        fell = losses[-1] < 0.7 * losses[0]
        named = shard["optimizer"].get("lion") is not None
        ok = exact and fell and named
        print(f"{'ok  ' if ok else 'FAIL'} S={shards}: lion vs torch-ops Lion, max |param - ref| = "
              f"{worst:.3g}{' (bit-exact)' if exact else ''}; loss {losses[0]:.4f} -> "
              f"{losses[-1]:.4f}; Inspect names the optimizer: {named}")
        failures += not ok
    print(f"lion: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
