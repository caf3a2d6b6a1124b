"""shardopt.torch with a GPU model over device pairs, against the same
training over the other data planes, bit for bit.

Two shard servers (--device_pairs=KIND, on --server_device) each run as an
NCCL "host" of their own (NCCL_HOSTID apart, so that NCCL takes processes
sharing one GPU for different hosts), and this process trains one small MLP
twice, from the same initial values and batches:

  pairs:  the model on --device, DistributedOptimizer(device_pairs=KIND): the
          flat buffers live on that device, the gradient is pushed from them
          and the parameters pulled into them over the pairs;
  stream: the model's parameters on the CPU, device_pairs="off" and the gRPC
          stream; each step's gradient is computed by a twin on --device that
          holds a copy of the CPU parameters, so that both runs see the very
          same gradients.

Both must end with the same bits, away from where they started, and the pairs
must have carried the pushes and pulls of both shards from and into the
device buffers. The shards load the NCCL library torch loaded here (two NCCL
versions need not talk). With
--kind=loopback --device=cpu --server_device=cpu (the NCCL protocol in host
memory) it runs on any machine; tools/gpu/gpu_check.sh runs it with NCCL on
cuda:0. Prints one line "torch_device_pairs: PASS ..." or "... FAIL ..." and
exits 0 or 1 (2: could not run).

  python3 torch_device_pairs.py [--server=PATH] [--kind=nccl] [--device=cuda:0]
      [--server_device=cuda:0] [--steps=12]
"""

import argparse
import os
import shlex
import sys
import tempfile

STEPS = 12


def loaded_nccl():
    """The libnccl this process has mapped (torch's), or None."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libnccl.so"):
                return path
    return None


def print_server_logs(workdir, count):
    for i in range(count):
        path = os.path.join(workdir, f"server{i}.log")
        if os.path.exists(path):
            with open(path) as said:
                sys.stdout.write(f"--- shard {i} said:\n{said.read()[-1500:]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default=os.environ.get("SHARDOPT_SERVER"),
                        help="the shardopt_server binary, or a command that runs it "
                             "(default: $SHARDOPT_SERVER)")
    parser.add_argument("--kind", default="nccl")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--server_device", default="cuda:0")
    parser.add_argument("--steps", type=int, default=STEPS)
    args = parser.parse_args()
    if not args.server:
        parser.error("--server (or SHARDOPT_SERVER) must name the shardopt_server binary")

    # NCCL's setting for peers on one machine (common/nccl/loopback_environment.h),
    # before this process (a "host" of its own) loads NCCL.
    for name, value in (("NCCL_SOCKET_IFNAME", "lo"), ("NCCL_IB_DISABLE", "1"),
                        ("NCCL_NET", "Socket"), ("NCCL_DEBUG", "WARN")):
        os.environ.setdefault(name, value)
    os.environ["NCCL_HOSTID"] = "torch-device-pairs-trainer"
    import torch
    import shardopt.torch
    from shardopt.local_cluster import start_servers, stop_servers

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("torch_device_pairs: SKIP: this torch sees no CUDA GPU")
            return 2
        # The same gradients from the same values in both runs.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.zeros(1, device=device)  # (CUDA and torch's NCCL loaded.)
        nccl = os.environ.get("SHARDOPT_NCCL_LIBRARY") or loaded_nccl()
        if nccl:
            os.environ["SHARDOPT_NCCL_LIBRARY"] = nccl  # This process's and the shards'.
        print(f"torch_device_pairs: torch {torch.__version__}, "
              f"NCCL library {nccl or '(found by the loader)'}")

    def net():
        torch.manual_seed(3)
        return torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(),
                                   torch.nn.Linear(256, 10))

    def batch(step):
        g = torch.Generator().manual_seed(step)
        return (torch.randn(64, 32, generator=g).to(device),
                torch.randint(0, 10, (64,), generator=g).to(device))

    def loss_of(model, step):
        x, y = batch(step)
        return torch.nn.functional.cross_entropy(model(x), y)

    workdir = tempfile.mkdtemp(prefix="torch_device_pairs")
    # Each shard an NCCL "host" of its own (its later flags win over the
    # defaults').
    try:
        procs, addresses = start_servers(
            shlex.split(args.server), 2, workdir, timeout_s=60,
            extra_flags=[f"--device={args.server_device}", f"--device_pairs={args.kind}",
                         "--threads=2"],
            env_of=lambda i: dict(os.environ, NCCL_HOSTID=f"torch-device-pairs-shard{i}"))
    except RuntimeError as e:
        print(f"torch_device_pairs: FAIL: {e}")
        print_server_logs(workdir, 2)
        return 1
    try:
        common = dict(servers=addresses, rank=0, world_size=1, optimizer="adamw", lr=0.01,
                      weight_decay=0.01)
        pair_model = net().to(device)
        pairs = shardopt.torch.DistributedOptimizer(
            pair_model.named_parameters(), model_id="pairs", device_pairs=args.kind, **common)
        for step in range(1, args.steps + 1):
            pairs.zero_grad()
            loss_of(pair_model, step).backward()
            pairs.step()

        initial = [p.detach().clone() for p in net().parameters()]
        plane_model = net()
        twin = net().to(device)
        planes = shardopt.torch.DistributedOptimizer(
            plane_model.named_parameters(), model_id="stream", device_pairs="off",
            shared_memory=False, socket_payloads=False, **common)
        for step in range(1, args.steps + 1):
            with torch.no_grad():
                for t, p in zip(twin.parameters(), plane_model.parameters()):
                    t.copy_(p)
            twin.zero_grad()
            loss_of(twin, step).backward()
            planes.zero_grad()
            with torch.no_grad():
                for t, p in zip(twin.parameters(), plane_model.parameters()):
                    p.grad.copy_(t.grad)
            planes.step()

        group = pairs._groups[0]
        client = group.client
        problems = []
        if not group.device_buffers:
            problems.append("the pairs run did not keep its buffers on the device")
        if group.flat_params.device != device:
            problems.append(f"the flat parameters are on {group.flat_params.device}")
        # Both shards' push and pull each step from and into the device
        # buffers (a few may find a pair still opening).
        wanted = args.steps * 2 * 2 * 9 // 10
        if client.device_buffer_transfers < wanted:
            problems.append(f"{client.device_buffer_transfers} transfers from or into the device "
                            f"buffers, fewer than {wanted}")
        if planes.device_pair_transfers + planes.shared_memory_transfers + \
                planes.socket_transfers != 0:
            problems.append("the stream run used another data plane")
        if all(torch.equal(p.detach(), q) for p, q in zip(plane_model.parameters(), initial)):
            problems.append("training left the parameters where they started")
        for (name, p), q in zip(pair_model.named_parameters(), plane_model.parameters()):
            if p.device != device:
                problems.append(f"{name} left {device} for {p.device}")
            if not torch.equal(p.detach().cpu(), q.detach()):
                problems.append(f"{name} differs: largest difference "
                                f"{(p.detach().cpu() - q.detach()).abs().max().item():.3g}")
        moved = client.device_buffer_transfers
        if problems:
            print(f"torch_device_pairs: FAIL ({args.kind}, {args.device}): " + "; ".join(problems))
            print_server_logs(workdir, len(procs))
            return 1
        print(f"torch_device_pairs: PASS ({args.kind}, model on {args.device}, shards on "
              f"{args.server_device}): {args.steps} AdamW steps bit-identical to the gRPC "
              f"stream, {moved} transfers from/into the device buffers")
        return 0
    finally:
        stop_servers(procs)


if __name__ == "__main__":
    sys.exit(main())
