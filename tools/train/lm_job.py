"""The main job: a small transformer language model (tools/train/tiny_lm.py)
trained with PyTorch through shardopt.torch on a local cluster of 2 shard
servers and 2 trainer processes, then the same model trained by one process
with torch.optim.AdamW on the same batches; the two loss curves go into one
PNG and must lie on each other.

    bash tools/main_job.sh            # sets up, builds, runs this

Each trainer back-propagates the mean loss of its half of every batch;
DistributedOptimizer averages the halves' gradients on the shard servers,
which hold the fp32 master weights and the AdamW moments (half each), and
pulls the new weights back into the trainer's model. Progress shows the
step, the loss of the whole batch, tokens/s, how much of a step the
trainer spends waiting in opt.step() (push, update and pull), and the share
of the push sent while backward() still ran (overlap_backward).

With --consistency=async (or bounded, --staleness) each trainer's step is
applied on the shards alone as it arrives (shardopt.torch's consistency):
the curve is then not torch.optim's (every half batch is an update of its
own, on parameters other trainers moved meanwhile), so only the loss's fall
is checked, and both runs report the loss on held-out batches at the end.
--slowdown=F makes trainer 1 F times slower (it sleeps after backward), as
tools/bench/consistency_compare.py measures.

--optimizer=lion, lamb, adafactor or muon trains with that optimizer instead
of AdamW (lamb, adafactor and muon on the whole_tensors partition, each
tensor on one shard; muon for the matrices, the vectors by AdamW in a
parameter group of their own); torch 1.13 has none of them, so there is no
torch.optim curve to lie on: only the loss's fall is checked. --shards sets
the shard count.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_lm  # noqa: E402
from trainer_lines import TrainerLines  # noqa: E402

WORLD_SIZE = 2
BETAS = (0.9, 0.95)
# The learning rate each optimizer trains this model with when --lr is not
# given (LAMB's and Adafactor's are relative to each tensor's norm).
DEFAULT_LR = {"adamw": 3e-3, "lion": 1e-3, "lamb": 1e-2, "adafactor": 1e-2, "muon": 2e-2}


def optimizer_arguments(args, model):
    """shardopt.torch's parameters (or groups), optimizer and hyperparameters
    for --optimizer. Muon takes the matrices; the embeddings' and norms'
    vectors go to AdamW in a group of their own (the reference recipe)."""
    if args.optimizer == "muon":
        groups = [{"params": [p for p in model.parameters() if p.dim() == 2]},
                  {"params": [p for p in model.parameters() if p.dim() != 2],
                   "optimizer": "adamw", "lr": DEFAULT_LR["adamw"], "betas": BETAS,
                   "weight_decay": 0.0}]
        return groups, dict(optimizer="muon", lr=args.lr, weight_decay=args.weight_decay,
                            adjust_lr_fn="match_rms_adamw")
    if args.optimizer == "adafactor":
        return model.named_parameters(), dict(optimizer="adafactor", lr=args.lr,
                                              weight_decay=args.weight_decay)
    betas = (0.9, 0.99) if args.optimizer == "lion" else BETAS
    return model.named_parameters(), dict(optimizer=args.optimizer, lr=args.lr, betas=betas,
                                          weight_decay=args.weight_decay)


def run_trainer(args):
    """One trainer process: prints one JSON line per step."""
    import shardopt.torch
    torch.set_num_threads(1)
    corpus, _ = tiny_lm.load_corpus(args.corpus_bytes)
    model = tiny_lm.make_model(args)
    params, settings = optimizer_arguments(args, model)
    opt = shardopt.torch.DistributedOptimizer(
        params, servers=args.servers.split(","), rank=args.rank,
        world_size=WORLD_SIZE, model_id="tiny_lm", **settings,
        overlap_backward=not args.no_overlap_backward, consistency=args.consistency,
        staleness=args.staleness if args.consistency == "bounded" else 0)
    began = time.perf_counter()
    for step in range(1, args.steps + 1):
        inputs, targets = tiny_lm.batch(corpus, step, args.batch, args.context, args.rank,
                                        WORLD_SIZE)
        started = time.perf_counter()
        opt.zero_grad()
        loss = tiny_lm.loss_of(model, inputs, targets)
        loss.backward()
        if args.rank == 1 and args.slowdown > 1:
            time.sleep((args.slowdown - 1) * (time.perf_counter() - started))
        computed = time.perf_counter()
        opt.step()
        done = time.perf_counter()
        result = opt.last_results[0]
        early = result["bytes_pushed_early"] / max(1, result["bytes_pushed"])
        print(json.dumps({"step": step, "loss": loss.item(), "compute_s": computed - started,
                          "step_s": done - computed, "early": early,
                          "shm": opt.shared_memory_transfers,
                          "staleness": result.get("staleness", 0)}), flush=True)
    own_s = time.perf_counter() - began
    # The end (asynchronous: the others' last pushes too; saved where the
    # servers keep checkpoints).
    if not opt.finish():
        raise RuntimeError("the job rolled back at its end; this job does not train again")
    print(json.dumps({"steps_per_s": args.steps / own_s,
                      "eval_loss": held_out_loss(model, args) if args.rank == 0 else None}),
          flush=True)
    return 0


def held_out_loss(model, args):
    """The mean loss on 8 whole batches no step trains on."""
    corpus, _ = tiny_lm.load_corpus(args.corpus_bytes)
    with torch.no_grad():
        return sum(tiny_lm.loss_of(model, *tiny_lm.batch(corpus, 1_000_000 + i, args.batch,
                                                         args.context)).item()
                   for i in range(8)) / 8


def run_reference(args, progress):
    """The same model, batches and AdamW in this process with torch.optim."""
    torch.set_num_threads(2)
    progress.begin("torch.optim")
    corpus, _ = tiny_lm.load_corpus(args.corpus_bytes)
    model = tiny_lm.make_model(args)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=BETAS,
                            weight_decay=args.weight_decay)
    losses = []
    for step in range(1, args.steps + 1):
        inputs, targets = tiny_lm.batch(corpus, step, args.batch, args.context)
        opt.zero_grad()
        loss = tiny_lm.loss_of(model, inputs, targets)
        loss.backward()
        opt.step()
        losses.append(loss.item())
        progress.show(step, losses[-1], None)
    progress.done()
    return losses, held_out_loss(model, args)


class Progress:
    """A progress bar on a terminal, a line every 10 % otherwise."""

    def __init__(self, steps, tokens_per_step):
        self.steps = steps
        self.tokens_per_step = tokens_per_step
        self.tty = sys.stdout.isatty()
        self.begin(None)

    def begin(self, label):
        """A new run: its rates count from now."""
        self.label = label
        self.started = time.perf_counter()

    def show(self, step, loss, wait_share, early_share=None):
        label = self.label
        elapsed = time.perf_counter() - self.started
        tokens_per_s = step * self.tokens_per_step / max(elapsed, 1e-9)
        filled = int(30 * step / self.steps)
        line = (f"{label:12s} [{'#' * filled}{'.' * (30 - filled)}] step {step:4d}/{self.steps}"
                f"  loss {loss:.3f}  {tokens_per_s:6.0f} tokens/s")
        if wait_share is not None:
            line += f"  in opt.step() {100 * wait_share:4.1f}% of the time"
        if early_share is not None:
            line += f"  push hidden behind backward {100 * early_share:3.0f}%"
        if self.tty:
            print("\r" + line, end="", flush=True)
        elif step == 1 or step % max(1, self.steps // 10) == 0 or step == self.steps:
            print(line, flush=True)

    def done(self):
        if self.tty:
            print(flush=True)


def run_cluster(args, workdir, progress):
    """Both trainers; returns the whole batch's loss per step and the share
    of a step spent in opt.step()."""
    from shardopt.local_cluster import start_servers, stop_servers
    progress.begin("shardopt")
    servers, addresses = start_servers(args.server_binary, args.shards, workdir)
    trainers = []
    try:
        for rank in range(WORLD_SIZE):
            command = [sys.executable, os.path.abspath(__file__), "--rank", str(rank),
                       "--servers", ",".join(addresses), "--steps", str(args.steps)]
            for name in ("context", "width", "layers", "heads", "batch", "lr", "weight_decay",
                         "corpus_bytes", "optimizer"):
                command += [f"--{name}", str(getattr(args, name))]
            if args.no_overlap_backward:
                command.append("--no_overlap_backward")
            command += ["--consistency", args.consistency, "--staleness", str(args.staleness),
                        "--slowdown", str(args.slowdown)]
            trainers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        lines = TrainerLines(trainers, args.step_timeout)
        losses, shares, early, records = [], [], [], []
        stalest = 0
        for step in range(1, args.steps + 1):
            try:
                records = [lines.next(rank, f"its step {step}") for rank in range(WORLD_SIZE)]
            except RuntimeError as e:
                raise RuntimeError(f"{e}; shard logs in {workdir}") from None
            # Equal halves: the whole batch's mean loss is the halves' mean.
            losses.append(sum(r["loss"] for r in records) / WORLD_SIZE)
            shares.append(max(r["step_s"] / (r["step_s"] + r["compute_s"]) for r in records))
            early.append(sum(r["early"] for r in records) / WORLD_SIZE)
            stalest = max([stalest] + [r["staleness"] for r in records])
            progress.show(step, losses[-1], sum(shares) / len(shares), sum(early) / len(early))
        progress.done()
        try:
            finals = [lines.next(rank, "its final record") for rank in range(WORLD_SIZE)]
            codes = lines.finish(timeout_s=60)
        except RuntimeError as e:
            raise RuntimeError(f"{e}; shard logs in {workdir}") from None
        if codes != [0] * WORLD_SIZE:
            raise RuntimeError(f"trainers exited with {codes}; shard logs in {workdir}")
        transfers = sum(r["shm"] for r in records)
        print(f"data plane: {'shared memory' if transfers else 'gRPC streams'} ({transfers} "
              f"shard transfers through shared memory; pushes sent during backward stream "
              f"over gRPC)", flush=True)
        if args.consistency != "sync":
            bound = f" (staleness {args.staleness})" if args.consistency == "bounded" else ""
            rates = ", ".join(f"{final['steps_per_s']:.2f}" for final in finals)
            print(f"consistency: {args.consistency}{bound}; trainers' steps/s {rates}; "
                  f"largest staleness of a push {stalest}", flush=True)
        finals[0]["max_staleness"] = stalest
        return losses, shares, early, finals
    finally:
        for t in trainers:
            if t.poll() is None:
                t.kill()
        stop_servers(servers)


def plot(path, distributed, reference, title, label):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(8, 4.5), dpi=100)
    steps = range(1, len(distributed) + 1)
    if reference is not None:
        axes.plot(steps, reference, label="one process, torch.optim.AdamW", linewidth=3,
                  alpha=0.5)
    axes.plot(steps, distributed, label=label, linewidth=1)
    axes.set_xlabel("step")
    axes.set_ylabel("training loss (nats per byte)")
    axes.set_title(title)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--out", default="out/main_job", help="where the plot and losses go")
    parser.add_argument("--server_binary", default="bazel-bin/server/shardopt_server")
    parser.add_argument("--min_drop", type=float, default=0.5,
                        help="the loss must fall by this much (first 5 / last 10 steps)")
    parser.add_argument("--no_overlap_backward", action="store_true",
                        help="push each gradient whole in step() instead of during backward()")
    parser.add_argument("--consistency", choices=("sync", "async", "bounded"), default="sync",
                        help="the step protocol (shardopt.torch's consistency)")
    parser.add_argument("--staleness", type=int, default=4, help="the bound of --consistency="
                        "bounded")
    parser.add_argument("--slowdown", type=float, default=1.0,
                        help="trainer 1 computes this many times as long")
    parser.add_argument("--optimizer", choices=sorted(DEFAULT_LR), default="adamw",
                        help="lion, lamb, adafactor and muon have no torch.optim curve to compare")
    parser.add_argument("--shards", type=int, default=2, help="shard servers")
    parser.add_argument("--step_timeout", type=float, default=600,
                        help="seconds a trainer may take for one step before the job fails "
                             "naming it")
    tiny_lm.add_model_arguments(parser)
    parser.set_defaults(lr=None)  # (DEFAULT_LR of the optimizer.)
    parser.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--servers", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.lr is None:
        args.lr = DEFAULT_LR[args.optimizer]
    if args.rank is not None:
        return run_trainer(args)

    os.makedirs(args.out, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="shardopt_main_job")
    corpus, files = tiny_lm.load_corpus(args.corpus_bytes)
    parameters = sum(p.numel() for p in tiny_lm.make_model(args).parameters())
    print(f"tiny transformer LM: {parameters / 1e6:.2f}M parameters ({args.layers} layers, width "
          f"{args.width}, {args.heads} heads, context {args.context}); {len(corpus) / 1e6:.1f} MB "
          f"of Python standard library sources ({files} files); batch {args.batch} x "
          f"{args.context} tokens; {args.optimizer} lr {args.lr}; {WORLD_SIZE} trainers x "
          f"{args.shards} shards; {args.steps} steps", flush=True)
    tokens_per_step = args.batch * args.context
    progress = Progress(args.steps, tokens_per_step)
    started = time.perf_counter()
    distributed, shares, early, finals = run_cluster(args, workdir, progress)
    cluster_s = time.perf_counter() - started
    started = time.perf_counter()
    compared = args.optimizer == "adamw"
    if compared:
        reference, reference_eval = run_reference(args, progress)
    else:
        print(f"no torch.optim {args.optimizer} in torch {torch.__version__.split('+')[0]}: "
              f"only the loss's fall is checked", flush=True)
        reference, reference_eval = None, float("nan")
    reference_s = time.perf_counter() - started

    gap = max(abs(a - b) for a, b in zip(distributed, reference)) if compared else float("nan")
    png = os.path.join(args.out, "loss.png")
    plot(png, distributed, reference,
         f"tiny transformer LM ({parameters / 1e6:.1f}M parameters)" +
         (": the same curve" if compared else f", {args.optimizer}"),
         f"{WORLD_SIZE} trainers x {args.shards} shards, shardopt {args.optimizer}")
    with open(os.path.join(args.out, "losses.csv"), "w") as f:
        f.write("step,shardopt,torch_optim\n")
        for step, a in enumerate(distributed, 1):
            b = f"{reference[step - 1]:.6f}" if compared else ""
            f.write(f"{step},{a:.6f},{b}\n")
    head = sum(distributed[:5]) / 5
    tail = sum(distributed[-10:]) / 10
    print(f"shardopt: {cluster_s:.0f} s, {args.steps * tokens_per_step / cluster_s:.0f} tokens/s, "
          f"opt.step() {100 * sum(shares) / len(shares):.1f}% of a step on average, "
          f"{100 * sum(early) / len(early):.0f}% of the push sent during backward; "
          f"torch.optim: {reference_s:.0f} s")
    comparison = (f"the curves differ by at most {gap:.1e} over {args.steps} steps" if compared
                  else "no torch.optim curve to compare")
    print(f"loss {head:.3f} -> {tail:.3f} (mean of the first 5 / last 10 steps); {comparison}; "
          f"plot: {png}")
    print(f"held-out loss: shardopt ({args.optimizer}, {args.consistency}) "
          f"{finals[0]['eval_loss']:.4f}" +
          (f", torch.optim {reference_eval:.4f}" if compared else ""), flush=True)
    with open(os.path.join(args.out, "summary.json"), "w") as f:
        json.dump({"optimizer": args.optimizer, "shards": args.shards,
                   "consistency": args.consistency, "staleness": args.staleness,
                   "slowdown": args.slowdown, "tokens_per_s": args.steps * tokens_per_step /
                   cluster_s, "steps_per_s": [f["steps_per_s"] for f in finals],
                   "eval_loss": finals[0]["eval_loss"], "torch_eval_loss": reference_eval,
                   "max_staleness": finals[0]["max_staleness"],
                   "gap": gap}, f)
    if not tail < head - args.min_drop:
        print("FAIL: the loss did not go down enough")
        return 1
    if args.consistency != "sync" or not compared:
        # Not torch.optim's curve: only the fall counts.
        print("PASS")
        return 0
    if not gap < 0.05:
        print("FAIL: the curves do not lie on each other")
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
