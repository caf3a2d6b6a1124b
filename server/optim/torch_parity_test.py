"""Cross-checks //server/optim:optimizer against torch.optim 1.13 (foreach=False).

For each optimizer config: seeded random float32 parameters and STEPS steps of
float32 N(0, 1) gradients; torch.optim.<X>(..., foreach=False) runs them on a
float32 tensor, optimizer_replay runs the same file through the C++ kernels
(each step split into 3 uneven Update ranges), and the final parameters and
optimizer state are compared.

PyTorch is run twice, each time in a fresh process:
  * ATEN_CPU_CAPABILITY=default: PyTorch's portable CPU kernels, which round
    every multiply and add separately, as ours do. Here the results must be
    bit-identical, parameters and slots: this pins the operation order (e.g.
    addcdiv_ computes (value * m) / denom, addcmul_ (value * g) * g) and the
    rounding of each host scalar to fp32.
  * PyTorch's own choice (AVX2 or AVX512 on x86-64): its vectorised add(alpha)
    and addcmul_ use fused multiply-adds, so each op can differ by one fp32
    rounding. Bound: max |p_torch - p_ours| / max(|p_torch|, 1) <= PARAM_BOUND
    and, per slot, max |s_torch - s_ours| / max |s_torch| <= SLOT_BOUND.
    Measured worst over these configs (printed below, AVX2 machine): params
    6.6e-7, slots 2.5e-7; the bounds of 2e-6 are 3x and 8x that, i.e. a few
    fp32 roundings (FLT_EPSILON = 1.2e-7) relative.

Usage: torch_parity_test.py OPTIMIZER_REPLAY
Fails (does not skip) when torch or numpy cannot be imported.
"""

import os
import subprocess
import sys
import tempfile

N = 1031  # Odd: exercises the vector loops' epilogues.
STEPS = 200

PARAM_BOUND = 2e-6
SLOT_BOUND = 2e-6

# (name, torch class name, torch keyword arguments). Keys that are not torch
# arguments are the replay file's names for the same fields.
CONFIGS = [
    ("sgd_plain", "SGD", dict(lr=0.01)),
    ("sgd_weight_decay_maximize", "SGD", dict(lr=0.02, weight_decay=0.05, maximize=True)),
    ("sgd_momentum_dampening", "SGD", dict(lr=0.01, momentum=0.9, dampening=0.1)),
    ("sgd_nesterov_weight_decay", "SGD",
     dict(lr=0.01, momentum=0.9, nesterov=True, weight_decay=1e-2)),
    ("sgd_momentum_maximize", "SGD", dict(lr=0.003, momentum=0.5, maximize=True)),
    ("adam_default", "Adam", dict()),
    ("adam_amsgrad", "Adam", dict(amsgrad=True)),
    ("adam_weight_decay", "Adam",
     dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
    ("adam_amsgrad_weight_decay_maximize", "Adam",
     dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True, maximize=True)),
    ("adam_maximize_eps", "Adam", dict(maximize=True, eps=1e-3)),
    ("adamw_default", "AdamW", dict()),
    ("adamw_amsgrad", "AdamW", dict(amsgrad=True)),
    ("adamw_weight_decay", "AdamW", dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1)),
    ("adamw_amsgrad_weight_decay_maximize", "AdamW",
     dict(lr=1e-2, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True, maximize=True)),
    ("adamw_no_weight_decay", "AdamW", dict(lr=3e-3, weight_decay=0.0)),
    ("adagrad_default", "Adagrad", dict(lr=0.1)),
    ("adagrad_lr_decay", "Adagrad", dict(lr=0.1, lr_decay=1e-3)),
    ("adagrad_lr_decay_weight_decay_initial_accumulator", "Adagrad",
     dict(lr=0.1, lr_decay=1e-3, weight_decay=0.05, initial_accumulator_value=0.1)),
    ("adagrad_maximize", "Adagrad",
     dict(lr=0.05, maximize=True, initial_accumulator_value=1.0, eps=1e-6)),
]

KIND = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad"}


def replay_header(cls, kwargs, n, steps, chunks):
    fields = ["shardopt-replay-v1", "kind=" + KIND[cls]]
    for key, value in sorted(kwargs.items()):
        if key == "betas":
            fields += ["beta1=%r" % float(value[0]), "beta2=%r" % float(value[1])]
        elif isinstance(value, bool):
            fields.append("%s=%d" % (key, value))
        else:
            fields.append("%s=%r" % (key, float(value)))
    fields += ["n=%d" % n, "steps=%d" % steps, "chunks=%d" % chunks]
    return " ".join(fields) + "\n"


def run_replay(replay, tmpdir, name, header, params, grads, np):
    in_path = os.path.join(tmpdir, name + ".in")
    out_path = os.path.join(tmpdir, name + ".out")
    with open(in_path, "wb") as f:
        f.write(header.encode("ascii"))
        f.write(params.astype("<f4").tobytes())
        f.write(grads.astype("<f4").tobytes())
    proc = subprocess.run([replay, in_path, out_path], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("optimizer_replay failed (%d): %s" % (proc.returncode, proc.stderr))
    with open(out_path, "rb") as f:
        data = f.read()
    line, _, rest = data.partition(b"\n")
    assert line.startswith(b"slots="), line
    names = [s for s in line[len(b"slots="):].decode("ascii").split(",") if s]
    values = np.frombuffer(rest, dtype="<f4")
    assert values.size == (1 + len(names)) * params.size, (values.size, names)
    out_params = values[:params.size]
    slots = {s: values[(i + 1) * params.size:(i + 2) * params.size]
             for i, s in enumerate(names)}
    return out_params, slots


def run_torch(torch, cls, kwargs, params, grads):
    p = torch.nn.Parameter(torch.from_numpy(params.copy()))
    opt = getattr(torch.optim, cls)([p], foreach=False, **kwargs)
    for g in grads:
        p.grad = torch.from_numpy(g.copy())
        opt.step()
    # SGD without momentum keeps momentum_buffer = None.
    state = {k: v.detach().numpy().copy() for k, v in opt.state[p].items()
             if k != "step" and v is not None}
    return p.detach().numpy().copy(), state


def worker(mode, replay):
    try:
        import numpy as np
        import torch
    except ImportError as e:
        print("FAIL: cannot import torch/numpy with %s: %s (run tools/setup.sh)"
              % (sys.executable, e))
        return 1
    capability = [l.split(":", 1)[1].strip() for l in torch.__config__.show().splitlines()
                  if "CPU capability usage" in l]
    print("[%s] torch %s, CPU capability %s" % (mode, torch.__version__, capability))
    if not torch.__version__.startswith("1.13"):
        print("FAIL: expected torch 1.13, got %s" % torch.__version__)
        return 1
    exact = mode == "default"
    if exact and capability != ["NO AVX"]:
        print("FAIL: ATEN_CPU_CAPABILITY=default did not take effect")
        return 1
    torch.set_num_threads(1)
    failures = 0
    worst_p = worst_s = 0.0
    with tempfile.TemporaryDirectory(dir=os.environ.get("TEST_TMPDIR")) as tmpdir:
        for index, (name, cls, kwargs) in enumerate(CONFIGS):
            rng = np.random.default_rng(1000 + index)
            params = rng.standard_normal(N).astype(np.float32)
            grads = rng.standard_normal((STEPS, N)).astype(np.float32)
            t_params, t_state = run_torch(torch, cls, kwargs, params, grads)
            header = replay_header(cls, kwargs, N, STEPS, chunks=3)
            c_params, c_slots = run_replay(replay, tmpdir, name, header, params, grads, np)

            problems = []
            if sorted(t_state) != sorted(c_slots):
                problems.append("slots: torch %s, ours %s" % (sorted(t_state), sorted(c_slots)))
            p_err = float(np.max(np.abs(t_params.astype(np.float64) - c_params)
                                 / np.maximum(np.abs(t_params.astype(np.float64)), 1.0)))
            p_ulps = int(np.max(np.abs(t_params.view(np.int32).astype(np.int64)
                                       - c_params.view(np.int32).astype(np.int64))))
            p_diff = int(np.count_nonzero(t_params != c_params))
            s_errs = {}
            for s in sorted(set(t_state) & set(c_slots)):
                t = t_state[s].astype(np.float64)
                scale = max(float(np.max(np.abs(t))), 1e-30)
                s_errs[s] = float(np.max(np.abs(t - c_slots[s]))) / scale
                if exact and not np.array_equal(t_state[s].view(np.int32),
                                                c_slots[s].view(np.int32)):
                    problems.append("slot %s not bit-identical (rel err %.3g)" % (s, s_errs[s]))
                if not exact and not s_errs[s] <= SLOT_BOUND:
                    problems.append("slot %s rel err %.3g > %.3g" % (s, s_errs[s], SLOT_BOUND))
            if exact and not np.array_equal(t_params.view(np.int32), c_params.view(np.int32)):
                problems.append("params not bit-identical: %d of %d differ, max %d ulps"
                                % (p_diff, N, p_ulps))
            if not exact and not p_err <= PARAM_BOUND:
                problems.append("params rel err %.3g > %.3g" % (p_err, PARAM_BOUND))
            worst_p = max(worst_p, p_err)
            worst_s = max([worst_s] + list(s_errs.values()))
            print("[%s] %-50s params: max rel err %.3g, %4d of %d differ, max %d ulps; slots: %s %s"
                  % (mode, name, p_err, p_diff, N, p_ulps,
                     ", ".join("%s %.3g" % kv for kv in s_errs.items()),
                     "OK" if not problems else "FAIL: " + "; ".join(problems)))
            failures += bool(problems)
    print("[%s] worst: params %.3g, slots %.3g (%s)"
          % (mode, worst_p, worst_s,
             "must be 0" if exact else "bounds %.3g, %.3g" % (PARAM_BOUND, SLOT_BOUND)))
    return 1 if failures else 0


def main(argv):
    if len(argv) == 4 and argv[1] == "--worker":
        return worker(argv[2], os.path.abspath(argv[3]))
    if len(argv) != 2:
        print(__doc__)
        return 2
    replay = os.path.abspath(argv[1])
    status = 0
    for mode in ("default", "native"):
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        if mode == "default":
            env["ATEN_CPU_CAPABILITY"] = "default"
        sys.stdout.flush()
        rc = subprocess.call([sys.executable, os.path.abspath(__file__), "--worker", mode,
                              replay], env=env)
        if rc != 0:
            print("FAIL: %s mode (exit %d)" % (mode, rc))
            status = 1
    print("PASS" if status == 0 else "FAIL")
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
