"""Two trainer processes train a PyTorch MLP through two local shard servers.

    bash python/examples/run_example.sh            # builds, then runs this

Each trainer holds a replica of the model and back-propagates the mean loss
of its half of every batch; shardopt.torch.DistributedOptimizer averages the
two halves' gradients on the shard servers, applies AdamW there (each server
owns half of the optimizer state) and writes the new parameters back into
both replicas. Rank 0 prints the loss and accuracy on the full batch.
"""

import argparse
import math
import os
import subprocess
import sys
import tempfile

import torch


def spirals(n, generator):
    """n points of three interleaved spirals, labelled by arm."""
    arm = torch.randint(0, 3, (n,), generator=generator)
    r = torch.rand(n, generator=generator)
    angle = arm * (2 * math.pi / 3) + r * 4.0 + 0.2 * torch.randn(n, generator=generator)
    x = torch.stack([r * torch.cos(angle), r * torch.sin(angle)], dim=1)
    return x, arm


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(2, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 3))


def train(args):
    import shardopt.torch
    net = model()
    opt = shardopt.torch.DistributedOptimizer(
        net.named_parameters(), servers=args.servers.split(","), rank=args.rank,
        world_size=2, optimizer="adamw", lr=0.01, weight_decay=1e-4, model_id="spirals")
    schedule = torch.optim.lr_scheduler.StepLR(opt, step_size=args.steps // 2, gamma=0.3)
    half = slice(args.rank * args.batch // 2, (args.rank + 1) * args.batch // 2)
    losses = []
    for step in range(1, args.steps + 1):
        x, y = spirals(args.batch, torch.Generator().manual_seed(step))
        opt.zero_grad()
        torch.nn.functional.cross_entropy(net(x[half]), y[half]).backward()
        opt.step()
        schedule.step()  # lr changes reach every shard at the next step
        if args.rank == 0 and (step % args.print_every == 0 or step == 1):
            with torch.no_grad():
                logits = net(x)
                loss = torch.nn.functional.cross_entropy(logits, y).item()
                losses.append(loss)
                accuracy = (logits.argmax(1) == y).float().mean().item()
            print(f"step {step:4d}  loss {loss:.4f}  accuracy {accuracy:.2f}  "
                  f"lr {opt.last_results[0]['lr']:.4g}", flush=True)
    opt.finish()  # Every rank, at the end (saved where the servers keep checkpoints).
    if args.rank == 0 and not losses[-1] < losses[0]:
        print(f"the loss did not go down: {losses[0]:.4f} -> {losses[-1]:.4f}")
        return 1
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--print_every", type=int, default=50)
    parser.add_argument("--server_binary", default=os.environ.get(
        "SHARDOPT_SERVER", "bazel-bin/server/shardopt_server"))
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--servers", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank is not None:
        return train(args)
    workdir = tempfile.mkdtemp(prefix="shardopt_example")
    from shardopt.local_cluster import start_servers, stop_servers
    servers, addresses = start_servers(args.server_binary, 2, workdir)
    try:
        print(f"shard servers on {', '.join(addresses)}; 2 trainers, {args.steps} steps",
              flush=True)
        trainers = [subprocess.Popen(
            [sys.executable, __file__, "--rank", str(r), "--servers", ",".join(addresses),
             "--steps", str(args.steps), "--batch", str(args.batch),
             "--print_every", str(args.print_every)]) for r in range(2)]
        codes = [t.wait() for t in trainers]
        return 0 if codes == [0, 0] else 1
    finally:
        stop_servers(servers)


if __name__ == "__main__":
    sys.exit(main())
