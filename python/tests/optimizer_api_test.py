"""The torch.optim-like API against torch.optim itself, with one trainer
(bit-identical): state_dict() checkpoints on the servers and servers
restarted from it (on another shard count) resume exactly; parameter groups
keep their own hyperparameters; lr schedulers reach the servers. And the
binding's step results say which trainer's push completed a step."""

import json
import os
import sys
import tempfile
import threading
import time
import unittest

import numpy as np

import torch

import shardopt
import shardopt.torch
from support import Cluster


def net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def data(step):
    g = torch.Generator().manual_seed(step)
    x = torch.randn(12, 5, generator=g)
    return x, (x.sum(1) > 0).long()


def train(model, opt, first, last):
    for step in range(first, last + 1):
        x, y = data(step)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


class OptimizerApiTest(unittest.TestCase):
    def test_the_step_result_says_which_trainer_completed_the_step(self):
        with Cluster(1) as cluster:
            clients = [shardopt.Client(cluster.addresses, rank) for rank in (0, 1)]
            params = [np.full(256, 1.0, dtype=np.float32) for _ in clients]
            clients[0].register("completed", [("w", [256])], "sgd", {"lr": 0.5}, 2, 0.0,
                                params[0])
            clients[1].register("completed", [("w", [256])], "sgd", {"lr": 0.5}, 2)
            results = [None, None]

            def step(rank):
                grads = np.full(256, float(rank + 1), dtype=np.float32)
                results[rank] = clients[rank].step(1, grads, params[rank])

            # Rank 0 pushes first and waits in its pull; rank 1's push completes the step.
            first = threading.Thread(target=step, args=(0,))
            first.start()
            for _ in range(300):
                shard = json.loads(clients[1].inspect_json()[0])
                if shard.get("trainers_pushed") == [0]:
                    break
                time.sleep(0.1)
            self.assertEqual(shard.get("trainers_pushed"), [0], "rank 0's push did not arrive")
            self.assertTrue(first.is_alive(), "rank 0's step waits for rank 1's push")
            step(1)
            first.join(timeout=30)
            self.assertFalse(first.is_alive())
            self.assertEqual([r["version"] for r in results], [1, 1])
            self.assertEqual([r["applied_here"] for r in results], [False, True])
            # The mean gradient 1.5, times lr 0.5: 1 - 0.75.
            for p in params:
                np.testing.assert_array_equal(p, np.full(256, 0.25, dtype=np.float32))

    def test_state_dict_checkpoint_then_restart_on_other_shard_count(self):
        root = tempfile.mkdtemp()
        reference = net()
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.02)
        train(reference, ref_opt, 1, 10)

        model = net()
        with Cluster(2) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adamw", lr=0.02, model_id="resumed", checkpoint_dir=root)
            # (Sets the groups' initial_lr; no change of lr within the test.)
            torch.optim.lr_scheduler.StepLR(opt, step_size=100)
            train(model, opt, 1, 5)
            state = opt.state_dict()
        self.assertEqual(state["shardopt"]["step"], 5)
        manifest = state["shardopt"]["checkpoints"][0]
        self.assertTrue(os.path.exists(manifest), manifest)
        checkpoint = os.path.dirname(manifest)

        resumed = net()  # fresh values: the servers' step-5 values replace them
        with Cluster(3, [f"--restore_from={checkpoint}"]) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                resumed.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adamw", lr=0.02, model_id="resumed")
            self.assertEqual(opt.step_count, 5)
            opt.load_state_dict(state)
            # A scheduler resumed where it was: the groups' initial_lr came back.
            torch.optim.lr_scheduler.StepLR(opt, step_size=100, last_epoch=4)
            train(resumed, opt, 6, 10)
        for a, b in zip(resumed.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())

    def test_parameter_groups_keep_their_hyperparameters(self):
        reference = net()
        groups = lambda m: [{"params": m[0].parameters(), "lr": 0.05, "weight_decay": 0.1},
                            {"params": m[2].parameters()}]
        ref_opt = torch.optim.AdamW(groups(reference), lr=0.01, weight_decay=0.0)
        train(reference, ref_opt, 1, 20)
        model = net()
        with Cluster(2) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                groups(model), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adamw", lr=0.01, weight_decay=0.0, model_id="grouped")
            train(model, opt, 1, 20)
            # One shardopt model per group, each with its own hyperparameters.
            inspected = opt.inspect()
            self.assertEqual([shards[0]["model_id"] for shards in inspected],
                             ["grouped.g0", "grouped.g1"])
            self.assertAlmostEqual(inspected[0][0]["current_optimizer"]["adamw"]["lr"], 0.05)
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())


    def test_a_restart_between_the_groups_pushes_of_a_step_goes_on(self):
        groups = lambda m: [{"params": m[0].parameters(), "lr": 0.05},
                            {"params": m[2].parameters()}]
        with Cluster(2) as cluster:
            model = net()
            opt = shardopt.torch.DistributedOptimizer(
                groups(model), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="halfway", overlap_backward=False)
            train(model, opt, 1, 3)
            # Step 4 reaches the first group's model only, then the trainer dies.
            x, y = data(4)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            first = opt._groups[0]
            first.client.step(4, first.flat_grads.numpy(), first.flat_params.numpy())
            del opt
            restarted = net()
            opt = shardopt.torch.DistributedOptimizer(
                groups(restarted), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="halfway", overlap_backward=False)
            self.assertEqual([g.version for g in opt._groups], [4, 3])
            self.assertEqual(opt.step_count, 3)
            train(restarted, opt, 4, 4)  # Step 4 goes to the second group only.
            self.assertTrue(opt.last_results[0]["applied_before_restart"])
            self.assertEqual(opt.last_results[1]["version"], 4)
            train(restarted, opt, 5, 6)
            self.assertEqual(opt.step_count, 6)
            self.assertEqual([shards[0]["version"] for shards in opt.inspect()], ["6", "6"])

    def test_sixteen_bit_wire_matches_torch_with_the_same_roundings(self):
        # Mixed precision with fp32 masters: the servers update fp32 master
        # weights with the gradients rounded to the push type, and the model
        # computes with the masters rounded to the pull type. torch.optim on
        # fp32 masters with the same two roundings gives the same bits.
        for push, pull, to in (("bfloat16", "bfloat16", torch.bfloat16),
                               ("float16", "float16", torch.float16)):
            reference = net()
            masters = [p.detach().clone().requires_grad_() for p in reference.parameters()]
            ref_opt = torch.optim.AdamW(masters, lr=0.01, weight_decay=0.05)
            with torch.no_grad():
                for p, m in zip(reference.parameters(), masters):
                    p.copy_(m.to(to).float())
            model = net()
            with Cluster(2) as cluster:
                opt = shardopt.torch.DistributedOptimizer(
                    model.parameters(), servers=cluster.addresses, rank=0, world_size=1,
                    optimizer="adamw", lr=0.01, weight_decay=0.05, model_id="wire_" + push,
                    push_dtype=push, pull_dtype=pull)
                for step in range(1, 31):
                    x, y = data(step)
                    opt.zero_grad()
                    torch.nn.functional.cross_entropy(model(x), y).backward()
                    opt.step()
                    reference.zero_grad()
                    torch.nn.functional.cross_entropy(reference(x), y).backward()
                    for p, m in zip(reference.parameters(), masters):
                        m.grad = p.grad.to(to).float()
                    ref_opt.step()
                    with torch.no_grad():
                        for p, m in zip(reference.parameters(), masters):
                            p.copy_(m.to(to).float())
                pushed = opt.last_results[0]["bytes_pushed"]
                flat_elements = opt._groups[0].flat_grads.numel()  # the padded layout
            for a, b in zip(model.parameters(), reference.parameters()):
                self.assertTrue(torch.equal(a, b), (push, (a - b).abs().max()))
            # Two bytes per element of the flat layout: half of fp32.
            self.assertEqual(pushed, 2 * flat_elements)

    def test_loss_scaling_skips_overflowing_steps_everywhere(self):
        # fp16 gradients with dynamic loss scaling: the trainer back-propagates
        # the scaled loss, the servers unscale, and the steps where a gradient
        # overflowed (planted here) are skipped on both shards and back the
        # scale off. torch.optim on the same unscaled fp16-rounded gradients,
        # skipping the same steps, gives the same bits.
        planted = {3, 7}
        reference = net()
        ref_opt = torch.optim.AdamW(reference.parameters(), lr=0.01, weight_decay=0.05)
        model = net()
        scales, skipped = [], []
        with Cluster(2) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                model.parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adamw", lr=0.01, weight_decay=0.05, model_id="scaled",
                push_dtype="float16",
                loss_scaler={"initial_scale": 4096.0, "hysteresis": 1, "growth_interval": 1000})
            for step in range(1, 11):
                x, y = data(step)
                scale = opt.loss_scale
                scales.append(scale)
                opt.zero_grad()
                opt.scale(torch.nn.functional.cross_entropy(model(x), y)).backward()
                if step in planted:
                    next(model.parameters()).grad[0, 0] = float("inf")
                opt.step()
                skipped.append(opt.last_results[0]["skipped"])
                self.assertEqual(opt.last_results[0]["loss_scale"], scale)
                # The reference: the same scaled backward and fp16 rounding,
                # unscaled by the same power of two; no update on a skip.
                reference.zero_grad()
                (torch.nn.functional.cross_entropy(reference(x), y) * scale).backward()
                if step not in planted:
                    for p in reference.parameters():
                        p.grad = p.grad.to(torch.float16).float() * (1.0 / scale)
                    ref_opt.step()
            shards = opt.inspect()[0]
        self.assertEqual(skipped, [s in planted for s in range(1, 11)])
        # Backed off (hysteresis 1) after each overflow, unchanged otherwise.
        self.assertEqual(scales, [4096.0] * 3 + [2048.0] * 4 + [1024.0] * 3)
        for info in shards:
            self.assertEqual(int(info["skipped_steps"]), 2)
            self.assertEqual(int(info["optimizer_steps"]), 8)
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())

    def test_lr_scheduler_changes_reach_the_servers(self):
        reference = net()
        ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
        ref_sched = torch.optim.lr_scheduler.StepLR(ref_opt, step_size=4, gamma=0.5)
        model = net()
        with Cluster(1) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                model.parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="sgd", lr=0.1, momentum=0.9, model_id="scheduled")
            sched = torch.optim.lr_scheduler.StepLR(opt, step_size=4, gamma=0.5)
            lrs = []
            for step in range(1, 13):
                for m, o, s in ((reference, ref_opt, ref_sched), (model, opt, sched)):
                    train(m, o, step, step)
                    s.step()
                lrs.append(opt.last_results[0]["lr"])
        self.assertEqual(lrs[:5], [0.1, 0.1, 0.1, 0.1, 0.05])
        self.assertEqual(lrs[-1], 0.025)
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())


    def test_a_tensor_lr_changed_in_place_reaches_the_servers(self):
        # As torch 2's schedulers change a tensor lr (param_group["lr"].fill_()).
        model = net()
        with Cluster(1) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                model.parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="sgd", lr=0.1, model_id="tensor_lr")
            opt.param_groups[0]["lr"] = torch.tensor(0.2)
            train(model, opt, 1, 1)
            self.assertAlmostEqual(opt.last_results[0]["lr"], 0.2)
            opt.param_groups[0]["lr"].fill_(0.05)
            train(model, opt, 2, 2)
            self.assertAlmostEqual(opt.last_results[0]["lr"], 0.05)

    def test_frozen_parameters_and_zero_copy(self):
        reference = net()
        reference[0].bias.requires_grad_(False)
        ref_opt = torch.optim.AdamW([p for p in reference.parameters() if p.requires_grad],
                                    lr=0.02)
        train(reference, ref_opt, 1, 6)
        model = net()
        model[0].bias.requires_grad_(False)
        frozen_before = model[0].bias.detach().clone()
        with Cluster(1) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                model.parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adamw", lr=0.02, model_id="frozen", foreach=None)
            group = opt._groups[0]
            x, y = data(1)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            # Autograd wrote into the pushed buffer, and the parameters live in
            # the pulled one: nothing is copied on the way to C++.
            base_g, base_p = group.flat_grads.data_ptr(), group.flat_params.data_ptr()
            end_g = base_g + group.flat_grads.numel() * 4
            end_p = base_p + group.flat_params.numel() * 4
            for p in group.params:
                self.assertTrue(base_g <= p.grad.data_ptr() < end_g)
                self.assertTrue(base_p <= p.data_ptr() < end_p)
            opt.step()
            train(model, opt, 2, 6)
        self.assertTrue(torch.equal(model[0].bias, frozen_before))
        self.assertIsNone(model[0].bias.grad)
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())

    def test_asynchronous_state_dict_is_the_cut_at_the_callers_step(self):
        # Each rank calls state_dict() at the same step: the checkpoint is the
        # cut where every rank pushed it, named after it, here in the servers'
        # own periodic root. A rank already past the caller's step makes the
        # call fail at once (it used to ask for the highest step any rank had
        # applied: a rank behind waited for itself until its budget ran out,
        # and the directory was named after another step).
        root = tempfile.mkdtemp()
        with Cluster(2, [f"--checkpoint_dir={root}", "--checkpoint_every=1000"]) as cluster:
            models = [net(), net()]
            opts = [shardopt.torch.DistributedOptimizer(
                models[rank].parameters(), servers=cluster.addresses, rank=rank, world_size=2,
                optimizer="adam", lr=0.01, model_id="async_cut", consistency="async",
                checkpoint_dir=root, retry_budget=20.0) for rank in (0, 1)]
            for step in range(1, 4):
                for rank in (0, 1):
                    x, y = data(10 * rank + step)
                    opts[rank].zero_grad()
                    torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                    opts[rank].step()
            states = [opts[rank].state_dict() for rank in (0, 1)]
            for state in states:
                self.assertEqual(state["shardopt"]["step"], 3)
                self.assertEqual(os.path.dirname(state["shardopt"]["checkpoints"][0]),
                                 os.path.join(root, "async_cut", "step-00000003"))
            self.assertTrue(os.path.exists(states[0]["shardopt"]["checkpoints"][0]))
            for step in (4, 5):
                x, y = data(10 + step)
                opts[1].zero_grad()
                torch.nn.functional.cross_entropy(models[1](x), y).backward()
                opts[1].step()
            started = time.monotonic()
            with self.assertRaisesRegex(shardopt.FailedPreconditionError, "checkpoint a later step"):
                opts[0].state_dict()
            self.assertLess(time.monotonic() - started, 10)

    def test_frozen_parameters_of_any_kind_and_named_groups(self):
        # Frozen parameters are left out whatever their dtype, device or
        # layout (a half-precision frozen base), a group of frozen ones alone
        # included; groups may hold (name, parameter) pairs, as in torch 2.
        reference = net()
        ref_opt = torch.optim.AdamW([{"params": reference[0].parameters()},
                                     {"params": reference[2].parameters(), "lr": 0.05}],
                                    lr=0.02)
        train(reference, ref_opt, 1, 4)
        model = net()
        base = torch.nn.Parameter(torch.ones(4, 6, dtype=torch.float16).t(),
                                  requires_grad=False)
        with Cluster(1) as cluster:
            opt = shardopt.torch.DistributedOptimizer(
                [{"params": list(model[0].named_parameters())},
                 {"params": [base], "weight_decay": 0.0},
                 {"params": list(model[2].named_parameters()), "lr": 0.05}],
                servers=cluster.addresses, rank=0, world_size=1, optimizer="adamw", lr=0.02,
                model_id="frozen_kinds")
            self.assertEqual([g.index for g in opt._groups], [0, 2])
            self.assertEqual(sorted(opt._groups[0].names), ["bias", "weight"])
            train(model, opt, 1, 4)
            base.requires_grad_(True)
            x, y = data(5)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            with self.assertRaisesRegex(shardopt.FailedPreconditionError, "requires grad now"):
                opt.step()
        for a, b in zip(model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(a, b), (a - b).abs().max())

    def test_a_restored_or_running_model_keeps_its_hyperparameters(self):
        # The servers hold the optimizer, its hyperparameters included: a new
        # optimizer on a running model (a rank restarted while the others
        # train: sending its constructor's lr would change every rank's) or
        # a restored one takes the model's, saying so when its constructor
        # said otherwise. A change after construction (or load_state_dict)
        # is sent as usual.
        root = tempfile.mkdtemp()
        model = net()
        make = lambda params, servers, **extra: shardopt.torch.DistributedOptimizer(
            params, servers=servers, rank=0, world_size=1, optimizer="sgd", lr=0.001,
            model_id="relr", **extra)
        with Cluster(1) as cluster:
            opt = make(model.parameters(), cluster.addresses, checkpoint_dir=root)
            train(model, opt, 1, 2)
            opt.param_groups[0]["lr"] = 0.05  # on the servers from step 3
            train(model, opt, 3, 3)
            self.assertEqual(opt.last_results[0]["lr"], 0.05)
            state = opt.state_dict()
            del opt
            with self.assertWarnsRegex(RuntimeWarning, r"runs with lr=0\.05 from step 4 "
                                       r"\(the constructor said lr=0\.001\)"):
                again = make(model.parameters(), cluster.addresses)
            self.assertEqual(again.param_groups[0]["lr"], 0.05)
            train(model, again, 4, 4)
            self.assertEqual(again.last_results[0]["lr"], 0.05)
            again.param_groups[0]["lr"] = 0.02
            train(model, again, 5, 5)
            self.assertEqual(again.last_results[0]["lr"], 0.02)
            del again
        checkpoint = os.path.dirname(state["shardopt"]["checkpoints"][0])
        for load in (False, True):
            with Cluster(1, [f"--restore_from={checkpoint}"]) as cluster:
                resumed = net()
                with self.assertWarnsRegex(RuntimeWarning, r"runs with lr=0\.05 from step 4"):
                    opt = make(resumed.parameters(), cluster.addresses)
                if load:
                    opt.load_state_dict(state)
                train(resumed, opt, 4, 4)
                self.assertEqual(opt.last_results[0]["lr"], 0.05)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
