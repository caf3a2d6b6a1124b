"""What shardopt.torch's optimizer tells of the servers' side: transfer
counters, Inspect, and state dicts (which name server checkpoints: the
optimizer state itself stays on the servers). A mixin of
DistributedOptimizer, whose groups and settings it reads."""

import copy
import json
import os

from . import FailedPreconditionError


class ServerState:
    """DistributedOptimizer's counters, Inspect and state dicts."""

    @property
    def shared_memory_transfers(self):
        """Pushes and pulls to single shards that went through shared memory."""
        return sum(g.client.shared_memory_transfers for g in self._groups)

    @property
    def socket_transfers(self):
        """Pushes and pulls to single shards that went over payload sockets."""
        return sum(g.client.socket_transfers for g in self._groups)

    @property
    def device_pair_transfers(self):
        """Pushes and pulls to single shards that went over device pairs."""
        return sum(g.client.device_pair_transfers for g in self._groups)

    def inspect(self):
        """Every shard's Inspect of each group's model: [[dict per shard] per group]."""
        return [[json.loads(s) for s in g.client.inspect_json()] for g in self._groups]

    # -- state ---------------------------------------------------------------

    def state_dict(self):
        checkpoints = None
        if self._checkpoint_dir:
            checkpoints = [
                # (Asynchronous: the cut at this rank's step, which every rank
                # reaches when each calls state_dict() at the same step, as
                # torch users do; a rank already past it is refused at once.
                # The highest step any rank applied, as before, named the
                # directory wrongly, and a rank behind waited for itself.)
                g.client.checkpoint(os.path.join(self._checkpoint_dir, g.model_id,
                                                 f"step-{self._version:08d}"), self._version)
                for g in self._groups]
        groups = []
        index = 0
        for group in self.param_groups:
            entry = {k: v for k, v in group.items() if k != "params"}
            entry["params"] = list(range(index, index + len(group["params"])))
            index += len(group["params"])
            groups.append(entry)
        return {
            "state": {},
            "param_groups": groups,
            "shardopt": {"step": self._version, "optimizer": self._kind,
                         "model_ids": [g.model_id for g in self._groups],
                         "checkpoints": checkpoints},
        }

    def load_state_dict(self, state_dict):
        info = state_dict.get("shardopt")
        if info is None:
            raise ValueError("not a shardopt state dict (no 'shardopt' entry)")
        if info["model_ids"] != [g.model_id for g in self._groups] or \
                info["optimizer"] != self._kind:
            raise ValueError(f"state dict of models {info['model_ids']} ({info['optimizer']}); "
                             f"this optimizer trains {[g.model_id for g in self._groups]} "
                             f"({self._kind})")
        if info["step"] != self._version:
            # (checkpoint() returns the manifest's path: the servers take its directory.)
            saved = info.get("checkpoints")
            where = os.path.dirname(saved[0]) if saved else \
                "(no checkpoint was saved: give checkpoint_dir)"
            raise FailedPreconditionError(
                f"FAILED_PRECONDITION: the servers are at step {self._version}, the state dict "
                f"is of step {info['step']}: the optimizer state lives on the shard servers; "
                f"restart them with --restore_from={where} to go back to it (once: restart "
                f"crashed servers with the checkpoint root; docs/checkpoints.md)")
        if len(state_dict["param_groups"]) != len(self.param_groups):
            raise ValueError(f"state dict has {len(state_dict['param_groups'])} parameter groups; "
                             f"this optimizer has {len(self.param_groups)}")
        for i, (group, saved) in enumerate(zip(self.param_groups, state_dict["param_groups"])):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(f"parameter group {i} of the state dict has "
                                 f"{len(saved['params'])} parameters; this optimizer's has "
                                 f"{len(group['params'])}")
            if saved.get("optimizer", info["optimizer"]) != self._kind_of(group):
                raise ValueError(f"parameter group {i} of the state dict is "
                                 f"{saved.get('optimizer', info['optimizer'])}; this "
                                 f"optimizer's is {self._kind_of(group)}")
        # Every key of the groups but their parameters (the optimizer is
        # fixed at registration), copied as torch.optim does: an lr
        # scheduler's initial_lr too.
        for group, saved in zip(self.param_groups, state_dict["param_groups"]):
            for k, v in saved.items():
                if k not in ("params", "optimizer"):
                    group[k] = copy.deepcopy(v)
