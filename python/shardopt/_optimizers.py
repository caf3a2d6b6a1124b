"""shardopt.torch's optimizers: their names and hyperparameters with
torch.optim's (or the reference implementation's) defaults."""

from torch.optim.optimizer import required

# torch.optim's defaults; SGD's lr is `required`, as in torch 1.13 (a
# parameter group without one is refused by torch's own add_param_group).
OPTIMIZERS = {
    "sgd": {"lr": required, "momentum": 0.0, "dampening": 0.0, "nesterov": False,
            "weight_decay": 0.0, "maximize": False},
    "adam": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
             "amsgrad": False, "maximize": False},
    "adamw": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 1e-2,
              "amsgrad": False, "maximize": False},
    "adagrad": {"lr": 1e-2, "lr_decay": 0.0, "weight_decay": 0.0,
                "initial_accumulator_value": 0.0, "eps": 1e-10, "maximize": False},
    # Lion (Chen et al. 2023; not in torch.optim): lion-pytorch's defaults.
    "lion": {"lr": 1e-4, "betas": (0.9, 0.99), "weight_decay": 0.0, "maximize": False},
    # LAMB (not in torch.optim): apex FusedLAMB's update and defaults (eps
    # 1e-6, weight decay 0.01), DeepSpeed FusedLamb's trust-ratio clamp.
    "lamb": {"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-6, "weight_decay": 0.01,
             "min_trust_ratio": 0.01, "max_trust_ratio": 10.0, "bias_correction": True,
             "maximize": False},
    # torch.optim.Adafactor (PyTorch 2.5+).
    "adafactor": {"lr": 1e-2, "beta2_decay": -0.8, "eps": (None, 1e-3), "d": 1.0,
                  "weight_decay": 0.0, "maximize": False},
    # torch.optim.Muon (PyTorch 2.9+): 2-D parameters only (the rest goes in
    # a group with optimizer="adamw").
    "muon": {"lr": 1e-3, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True,
             "ns_coefficients": (3.4445, -4.7750, 2.0315), "eps": 1e-7, "ns_steps": 5,
             "adjust_lr_fn": None},
}

# Optimizers that update each tensor from the whole tensor: they need the
# whole_tensors partition (the default for them).
WHOLE_TENSOR_OPTIMIZERS = ("lamb", "adafactor", "muon")
