"""Synchronous vs bounded staleness vs asynchronous, measured in one run.

Runs the main job (tools/train/lm_job.py: a small transformer LM, 2 shard
servers, 2 trainer processes) once per mode with the same batches and the
same number of steps per trainer, so the same number of pushes (2 x steps),
with trainer 1 made `--slowdown` times slower. Reports, per mode:

  - each trainer's steps/s over its own run and their sum: in lockstep the
    fast trainer runs at the slow one's pace; asynchronous lets it run at its
    own; bounded staleness lets it run ahead by at most s steps, so over a
    long run its rate is the slow one's (it absorbs jitter, not a steady
    difference);
  - the loss on held-out batches once every push is applied (the same
    pushes in every mode), next to torch.optim's one-process run.

    bash tools/bench/consistency_compare.sh [--steps N] [--slowdown F]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
LM_JOB = os.path.join(HERE, "..", "train", "lm_job.py")


def run_mode(args, consistency, out):
    command = [sys.executable, LM_JOB, "--server_binary", args.server_binary,
               "--steps", str(args.steps), "--slowdown", str(args.slowdown),
               "--consistency", consistency, "--staleness", str(args.staleness),
               "--min_drop", "0", "--out", out]
    print(f"== {consistency}: {' '.join(command[1:])}", flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    tail = "\n".join(done.stdout.splitlines()[-6:])
    print(tail, flush=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {consistency} run failed (exit {done.returncode}):\n"
                           f"{done.stdout}")
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server_binary", default="bazel-bin/server/shardopt_server")
    parser.add_argument("--steps", type=int, default=40, help="steps per trainer")
    parser.add_argument("--slowdown", type=float, default=2.0,
                        help="trainer 1 computes this many times as long")
    parser.add_argument("--staleness", type=int, default=4, help="the bound of bounded mode")
    parser.add_argument("--out", default=None, help="where each mode's run writes (a temp dir)")
    args = parser.parse_args()
    root = args.out or tempfile.mkdtemp(prefix="consistency_compare")
    results = {}
    for mode in ("sync", "bounded", "async"):
        results[mode] = run_mode(args, mode, os.path.join(root, mode))
    print()
    print(f"2 trainers x 2 shards, trainer 1 {args.slowdown:g}x slower, {args.steps} steps "
          f"each ({2 * args.steps} pushes); bounded staleness s = {args.staleness}")
    print(f"{'mode':<16}{'fast trainer':>14}{'slow trainer':>14}{'sum steps/s':>13}"
          f"{'vs sync':>9}{'max staleness':>15}")
    base = sum(results["sync"]["steps_per_s"])
    for mode, r in results.items():
        fast, slow = r["steps_per_s"]
        label = f"bounded (s={args.staleness})" if mode == "bounded" else mode
        print(f"{label:<16}{fast:>14.2f}{slow:>14.2f}{fast + slow:>13.2f}"
              f"{(fast + slow) / base:>8.2f}x{r['max_staleness']:>15d}")
    print()
    print(f"{'mode':<16}{'held-out loss':>15}{'torch.optim (1 process)':>26}")
    for mode, r in results.items():
        label = f"bounded (s={args.staleness})" if mode == "bounded" else mode
        print(f"{label:<16}{r['eval_loss']:>15.4f}{r['torch_eval_loss']:>26.4f}")
    with open(os.path.join(root, "consistency_compare.json"), "w") as f:
        json.dump(results, f, indent=1)
    print(f"(every run's output under {root})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
