"""shardopt.torch's hyperparameters: each parameter group's values as the
servers take them, sent when they change (they take effect at a step), and
taken from the model when the optimizer joins one already past step 0."""

import time
import warnings

import torch

from . import UnavailableError, UnimplementedError
from ._optimizers import OPTIMIZERS as _OPTIMIZERS


class HyperparameterSync:
    """Mixin of DistributedOptimizer: needs param_groups, _groups, _kind_of."""

    def _hyperparameters(self, group):
        # Values, not the group's tensors: torch 2's schedulers change a
        # tensor lr in place, which a kept reference would never tell apart.
        h = {k: float(group[k]) if isinstance(group[k], torch.Tensor) else group[k]
             for k in _OPTIMIZERS[self._kind_of(group)]}
        if "ns_coefficients" in h:
            h["ns_coefficients"] = tuple(float(c) for c in h["ns_coefficients"])
        if "betas" in h:
            h["betas"] = tuple(float(b) for b in h["betas"])
        if "eps" in h and isinstance(h["eps"], (tuple, list)):
            h["eps"] = (None if h["eps"][0] is None else float(h["eps"][0]), float(h["eps"][1]))
        return h

    def _take_the_models_hyperparameters(self, g, group):
        """A synchronous model past step 0 (restored, or running with the
        other ranks: this one restarted) runs with its own hyperparameters,
        maybe changed since it was registered: the group takes them, with a
        warning where the constructor said otherwise. Sending the
        constructor's would change them for every rank, or be refused for
        good where a change is scheduled for the next step (one this rank's
        earlier process sent). Changes made from now on are sent as usual."""
        # (The shards disagree while a change or a step is in flight
        # somewhere: asked again for a while. Older servers do not say: the
        # constructor's values are sent, as before.)
        give_up = time.monotonic() + 5.0
        while True:
            try:
                nxt = g.client.next_hyperparameters()
                break
            except UnimplementedError:
                return
            except UnavailableError:
                if time.monotonic() >= give_up:
                    raise
                time.sleep(0.1)
        theirs = nxt["hyperparameters"]
        mine = self._hyperparameters(group)

        def normal(key, value):
            if key == "adjust_lr_fn" and value == "original":
                return None  # (The same adjustment.)
            return tuple(value) if isinstance(value, list) else value

        differing = [k for k in mine if normal(k, mine[k]) != normal(k, theirs.get(k))]
        if differing:
            warnings.warn(
                f"shardopt.torch: model {g.model_id!r} runs with "
                + ", ".join(f"{k}={theirs[k]!r}" for k in differing)
                + f" from step {nxt['version'] + 1} (the constructor said "
                + ", ".join(f"{k}={mine[k]!r}" for k in differing)
                + f"): parameter group {g.index} takes the model's; set param_groups after "
                "construction (or load_state_dict) to change them for every rank",
                RuntimeWarning, stacklevel=4)
            for k in differing:
                group[k] = theirs[k]
        g.sent_hyperparameters = self._hyperparameters(group)
        # (sent_for_step stays None: a change scheduled for that step may be
        # the other ranks', and one this rank makes now is refused rather
        # than cancel theirs for every rank.)

    def _send_hyperparameters(self, g, version):
        """Sends the group's hyperparameters if they changed since last sent
        (they take effect at `version`); True if it sent them."""
        hyper = self._hyperparameters(self.param_groups[g.index])
        if hyper == g.sent_hyperparameters:
            return False
        # (A push streamed during backward counts as pushed until it ends:
        # a change ends it, as its step must carry the change.)
        g.client.cancel_streamed_push()
        if version <= g.client.last_pushed_step:
            # This step's push went out (a step that failed after it, tried
            # again) with the change sent before: its step runs with that
            # one everywhere, and this one takes effect at the next.
            warnings.warn(f"shardopt.torch: hyperparameters changed after step {version}'s push "
                          f"went out take effect at step {g.client.last_pushed_step + 1}",
                          RuntimeWarning, stacklevel=4)
            version = g.client.last_pushed_step + 1
        if g.sent_for_step == version:
            # Changed again before the step (a scheduler stepped between
            # backward and step, or twice; or after a redirect above): the
            # shards take one change per step, so the one sent for it is
            # taken back first, as torch.optim reads the values when the
            # step runs.
            g.client.cancel_hyperparameters(version)
        g.client.set_hyperparameters(version, self._kind_of(self.param_groups[g.index]), hyper)
        g.sent_hyperparameters = hyper
        g.sent_for_step = version
        return True
