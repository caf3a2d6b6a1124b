"""shardopt against PyTorch DDP's way of running an optimizer, side by side.

    bash tools/bench/ddp_compare.sh [--params=67108864] [--steps=6] [--rounds=3]

Both jobs run 2 trainer processes on this machine over a model of one fp32
tensor of --params elements (64M: 256 MiB) with Adam, and time the optimizer
part of a step from a gradient that is already computed (the same synthetic
gradient in both, so no backward pass is timed):

  ddp       torch.distributed (gloo) all_reduce of the gradient, divided by
            the world size (what DistributedDataParallel's reducer does),
            then a local torch.optim.Adam step on each process;
  shardopt  shardopt.torch.DistributedOptimizer over 2 shard servers (each
            holds half of the Adam state): push, update on the servers, pull;
            payloads through shared memory (the default on one host);
  shardopt-socket  the same with shared_memory=False: payloads over the
            servers' payload sockets (plain TCP; the default of trainers on
            other hosts over plaintext);
  shardopt-grpc  the same with shared_memory=False, socket_payloads=False:
            payloads in the gRPC streams.

The two alternate over --rounds rounds; the table gives each job's median
step time and steps/s, and shardopt's ratio to DDP.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import torch


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_gradient(n, rank):
    g = torch.arange(n, dtype=torch.float32)
    return torch.sin(g * 1e-3 + rank) * 1e-2


def ddp_worker(args):
    import torch.distributed as dist
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                            rank=args.rank, world_size=2)
    p = torch.nn.Parameter(torch.zeros(args.params))
    opt = torch.optim.Adam([p], lr=1e-4)
    g = synthetic_gradient(args.params, args.rank)
    times = []
    for step in range(args.steps + 1):
        dist.barrier()
        started = time.perf_counter()
        p.grad = g.clone()
        dist.all_reduce(p.grad)
        p.grad /= 2
        opt.step()
        if step > 0:  # The first is a warm-up.
            times.append(time.perf_counter() - started)
    dist.destroy_process_group()
    print(" ".join(f"{t:.6f}" for t in times), flush=True)


def shardopt_worker(args):
    import shardopt.torch
    torch.set_num_threads(1)
    p = torch.nn.Parameter(torch.zeros(args.params))
    opt = shardopt.torch.DistributedOptimizer(
        [p], servers=args.servers.split(","), rank=args.rank, world_size=2, optimizer="adam",
        lr=1e-4, model_id=f"bench{args.round}", check_parameters=False,
        shared_memory=args.plane == "shm", socket_payloads=args.plane != "grpc")
    g = synthetic_gradient(args.params, args.rank)
    times = []
    for step in range(args.steps + 1):
        started = time.perf_counter()
        p.grad.copy_(g)
        opt.step()
        if step > 0:
            times.append(time.perf_counter() - started)
    moved = {"shm": opt.shared_memory_transfers, "socket": opt.socket_transfers}
    if args.plane in moved and moved[args.plane] < 2 * 2 * (args.steps + 1):
        raise RuntimeError(f"only {moved[args.plane]} pushes and pulls went by {args.plane}")
    print(" ".join(f"{t:.6f}" for t in times), flush=True)


def run_pair(args, job, extra):
    procs = [subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--worker", job, "--rank", str(r),
         "--params", str(args.params), "--steps", str(args.steps), *extra],
        stdout=subprocess.PIPE, text=True) for r in range(2)]
    outs = [p.communicate()[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        raise RuntimeError(f"{job} workers failed: {[p.returncode for p in procs]}")
    # A step ends when both trainers are done with it.
    per_rank = [[float(t) for t in o.split()] for o in outs]
    return [max(a, b) for a, b in zip(*per_rank)]


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--server_binary", default="bazel-bin/server/shardopt_server")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--servers", help=argparse.SUPPRESS)
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--plane", default="shm", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker == "ddp":
        return ddp_worker(args)
    if args.worker in ("shardopt", "shardopt-socket", "shardopt-grpc"):
        return shardopt_worker(args)

    print(f"2 trainer processes, {args.params} fp32 parameters ({args.params * 4 >> 20} MiB), "
          f"Adam; {args.steps} timed steps per job per round, {args.rounds} rounds; "
          f"torch {torch.__version__}", flush=True)
    from shardopt.local_cluster import start_servers, stop_servers
    times = {"ddp": [], "shardopt": [], "shardopt-socket": [], "shardopt-grpc": []}
    for r in range(args.rounds):
        times["ddp"] += run_pair(args, "ddp", ["--port", str(free_port())])
        for job, plane in (("shardopt", "shm"), ("shardopt-socket", "socket"),
                           ("shardopt-grpc", "grpc")):
            servers, addresses = start_servers(args.server_binary, 2,
                                               tempfile.mkdtemp(prefix="ddp_compare"))
            try:
                times[job] += run_pair(
                    args, job, ["--servers", ",".join(addresses), "--round", str(r),
                                "--plane", plane])
            finally:
                stop_servers(servers)
        print(f"round {r + 1}: " + ", ".join(
            f"{job} {statistics.median(t) * 1e3:.0f} ms" for job, t in times.items()) +
            " (medians so far)", flush=True)
    print(f"\n  {'job':15s} {'steps':>5s} {'median ms':>10s} {'min ms':>8s} {'steps/s':>8s} "
          f"{'vs ddp':>7s}")
    ddp_median = statistics.median(times["ddp"])
    for job in times:
        median = statistics.median(times[job])
        print(f"  {job:15s} {len(times[job]):5d} {median * 1e3:10.1f} {min(times[job]) * 1e3:8.1f} "
              f"{1 / median:8.2f} {ddp_median / median:6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
