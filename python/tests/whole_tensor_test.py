"""LAMB, Adafactor and Muon through shardopt.torch, on the whole_tensors
partition (Muon's matrices; the biases in a parameter group of their own with
optimizer="adamw", as the reference recipes do).

torch 1.13 has neither, so the reference is the project's own kernel run in
one process by optimizer_replay on the gradients the trainer computed: the
parameters after 60 steps must be bit-identical to it on 1 and 3 shard
servers (which proves the hyperparameters arrive as given, every tensor is
updated whole by one shard, and the partition's offsets are right), with
non-default hyperparameters of every kind, and the loss must fall. LAMB
also runs on the flat partition of 3 shards (norms gathered over shards) with
the same bits; Adafactor on a flat partition is refused naming the one to use. Run by run_python_test.sh with
the optimizer_replay binary as the extra argument.
"""

import os
import struct
import subprocess
import sys
import tempfile

import torch

STEPS = 60
CASES = {
    "lamb": ({"lr": 2e-2, "betas": (0.85, 0.99), "eps": 1e-7, "weight_decay": 0.05,
              "min_trust_ratio": 0.1, "max_trust_ratio": 5.0, "bias_correction": False},
             "beta1=0.85 beta2=0.99 eps=1e-07 weight_decay=0.05 min_trust_ratio=0.1 "
             "max_trust_ratio=5 bias_correction=0 lr=0.02"),
    "adafactor": ({"lr": 3e-2, "beta2_decay": -0.6, "eps": (1e-5, 1e-2), "d": 1.5,
                   "weight_decay": 0.02},
                  "beta2_decay=-0.6 eps1=1e-05 eps2=0.01 clip_threshold=1.5 weight_decay=0.02 "
                  "lr=0.03"),
    "muon": ({"lr": 2e-2, "weight_decay": 0.05, "momentum": 0.9, "nesterov": True,
              "ns_coefficients": (3.4445, -4.7750, 2.0315), "ns_steps": 4,
              "adjust_lr_fn": "match_rms_adamw"},
             "lr=0.02 weight_decay=0.05 momentum=0.9 nesterov=1 ns_steps=4 "
             "adjust_lr=match_rms_adamw"),
}
# Muon's other group: AdamW for the vectors.
ADAMW_GROUP = ({"lr": 1e-2, "betas": (0.9, 0.99), "weight_decay": 0.0},
               "lr=0.01 beta1=0.9 beta2=0.99 weight_decay=0")


def make_model():
    torch.manual_seed(78)
    return torch.nn.Sequential(torch.nn.Linear(7, 33), torch.nn.Tanh(), torch.nn.Linear(33, 3))


def batch(step):
    g = torch.Generator().manual_seed(600 + step)
    x = torch.randn(24, 7, generator=g)
    y = ((x[:, 0] - x[:, 1] * x[:, 2] > 0).long() + (x[:, 3] > 0.7).long())
    return x, y


def train(kind, addresses, partition=None):
    """shardopt.torch training; returns the losses, the initial and final
    parameters and every step's gradients, in model.parameters() order."""
    import shardopt.torch
    model = make_model()
    initial = [p.detach().clone() for p in model.parameters()]
    params = model.named_parameters()
    if kind == "muon":
        params = [{"params": [p for p in model.parameters() if p.dim() == 2]},
                  dict(ADAMW_GROUP[0], optimizer="adamw",
                       params=[p for p in model.parameters() if p.dim() != 2])]
    opt = shardopt.torch.DistributedOptimizer(
        params, servers=addresses, rank=0, world_size=1, optimizer=kind, partition=partition,
        model_id=f"{kind}{len(addresses)}{partition or ''}", **CASES[kind][0])
    losses, grads = [], []
    for step in range(1, STEPS + 1):
        x, y = batch(step)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        losses.append(loss.item())
        loss.backward()
        grads.append([p.grad.detach().clone() for p in model.parameters()])
        opt.step()
    shards = opt.inspect()[0]
    return losses, initial, [p.detach().clone() for p in model.parameters()], grads, shards


def replay_all(replay_binary, kind, initial, grads):
    """The final parameters by optimizer_replay, in parameter order (Muon:
    its matrices, and the vectors by AdamW)."""
    if kind != "muon":
        return replay(replay_binary, kind, CASES[kind][1], initial, grads)
    out = [None] * len(initial)
    for matrices, name, settings in ((True, "muon", CASES["muon"][1]),
                                     (False, "adamw", ADAMW_GROUP[1])):
        index = [i for i, p in enumerate(initial) if (p.dim() == 2) == matrices]
        final = replay(replay_binary, name, settings, [initial[i] for i in index],
                       [[step[i] for i in index] for step in grads])
        for i, p in zip(index, final):
            out[i] = p
    return out


def replay(replay_binary, kind, settings, initial, grads):
    """optimizer_replay of the same gradients: the final parameters."""
    shapes = [list(p.shape) for p in initial]
    n = sum(p.numel() for p in initial)
    header = (f"shardopt-replay-v1 kind={kind} {settings} n={n} steps={len(grads)} "
              f"shapes={','.join('x'.join(str(d) for d in s) for s in shapes)}\n")
    with tempfile.TemporaryDirectory() as d:
        inp, out = os.path.join(d, "in"), os.path.join(d, "out")
        with open(inp, "wb") as f:
            f.write(header.encode())
            f.write(torch.cat([p.reshape(-1) for p in initial]).numpy().tobytes())
            for step in grads:
                f.write(torch.cat([g.reshape(-1) for g in step]).numpy().tobytes())
        subprocess.run([replay_binary, inp, out], check=True)
        with open(out, "rb") as f:
            f.readline()
            flat = torch.tensor(struct.unpack(f"<{n}f", f.read(4 * n)))
    params, at = [], 0
    for p in initial:
        params.append(flat[at:at + p.numel()].reshape(p.shape))
        at += p.numel()
    return params


def main():
    from support import Cluster
    import shardopt.torch
    replay_binary = os.path.abspath(sys.argv[1])
    failures = 0
    # LAMB also on the flat partition over 3 shards: its weight matrices
    # straddle shards, each step gathers their norms from every shard, and
    # the bits are still those of one process updating whole tensors.
    runs = [(kind, shards, None) for kind in CASES for shards in (1, 3)] + [("lamb", 3, "flat")]
    for kind, shards, partition in runs:
        with Cluster(shards) as cluster:
            losses, initial, params, grads, inspected = train(kind, cluster.addresses, partition)
        want = replay_all(replay_binary, kind, initial, grads)
        exact = all(torch.equal(a, b) for a, b in zip(params, want))
        worst = max((a - b).abs().max().item() for a, b in zip(params, want))
        fell = losses[-1] < 0.8 * losses[0]
        named = all(s["optimizer"].get(kind) is not None for s in inspected)
        wanted = "PARTITION_FLAT" if partition == "flat" else "PARTITION_WHOLE_TENSORS"
        # (The proto's default value is left out of Inspect's JSON.)
        laid = all(s.get("partition", "PARTITION_FLAT") == wanted for s in inspected)
        ok = exact and fell and named and laid
        print(f"{'ok  ' if ok else 'FAIL'} {kind} S={shards} {partition or 'whole_tensors'}: vs "
              f"optimizer_replay max |diff| {worst:.3g}{' (bit-exact)' if exact else ''}; loss "
              f"{losses[0]:.4f} -> {losses[-1]:.4f}; Inspect: {kind} {named}, {wanted} {laid}")
        failures += not ok
    # The flat partition cannot hold Adafactor or Muon.
    with Cluster(2) as cluster:
        try:
            shardopt.torch.DistributedOptimizer(
                make_model().named_parameters(), servers=cluster.addresses, rank=0,
                world_size=1, optimizer="adafactor", partition="flat", model_id="flat_adafactor")
            print("FAIL adafactor with partition='flat' was accepted")
            failures += 1
        except Exception as e:  # pylint: disable=broad-except
            ok = "whole_tensors" in str(e)
            print(f"{'ok  ' if ok else 'FAIL'} adafactor with partition='flat' refused: {e}")
            failures += not ok
    print(f"whole tensors: {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
