"""shardopt.torch's pushes during backward (overlap_backward, on by default):
bucket by bucket from the gradient accumulators' hooks, bit-identical to
torch.optim with one trainer; a second backward before the step
(accumulation) pushes that step whole, still exact; gradients changed between
backward() and step() (clip_grad_norm_, one element) are noticed by the
sent chunks' digests and pushed whole, exactly, and a loop that does it every
step stops streaming with a warning, as does an lr changed between
backward() and step() every step; an lr scheduler's change every step (after
step()) still streams; overlap_backward=False keeps the parameters' own order and
never streams; the hooks neither keep the optimizer alive nor need grad mode.
"""

import gc
import sys
import time
import unittest
import warnings
import weakref

import torch

import shardopt.torch
from support import Cluster

STEPS = 12


def net():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4))


def data(step, part=None):
    g = torch.Generator().manual_seed(500 + step)
    x = torch.randn(32, 16, generator=g)
    y = (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long()
    if part is not None:
        x, y = x[part * 16:(part + 1) * 16], y[part * 16:(part + 1) * 16]
    return x, y


def loss_of(model, x, y):
    return torch.nn.functional.cross_entropy(model(x), y)


def reference(accumulate):
    model = net()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(1, STEPS + 1):
        opt.zero_grad()
        for part in ((0, 1) if accumulate else (None,)):
            (loss_of(model, *data(step, part)) / (2 if accumulate else 1)).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def adam_twins(cluster, model_id, **kwargs):
    """Adam (lr 0.01) on a net() of its own from shardopt.torch, then the same
    from torch.optim: (model, optimizer) pairs, built one after the other."""
    for kind in ("shardopt", "torch"):
        model = net()
        if kind == "shardopt":
            yield model, shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id=model_id, **kwargs)
        else:
            yield model, torch.optim.Adam(model.parameters(), lr=0.01)


def wait_until_sent(opt):
    group = opt._groups[0]
    total = group.flat_grads.numel() * 4
    deadline = time.monotonic() + 30
    while group.client.streamed_bytes_sent < total:
        if time.monotonic() > deadline:
            raise AssertionError(f"the streamed push of step {opt.step_count + 1} sent only "
                                 f"{group.client.streamed_bytes_sent} of {total} bytes in 30 s")
        time.sleep(0.001)


class OverlapTest(unittest.TestCase):
    def run_job(self, cluster, model_id, accumulate=False, **kwargs):
        kwargs.setdefault("overlap_backward", True)
        model = net()
        opt = shardopt.torch.DistributedOptimizer(
            model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
            optimizer="adam", lr=0.01, model_id=model_id, **kwargs)
        for step in range(1, STEPS + 1):
            opt.zero_grad()
            for part in ((0, 1) if accumulate else (None,)):
                (loss_of(model, *data(step, part)) / (2 if accumulate else 1)).backward()
            opt.step()
        return model, opt

    def assert_exact(self, model, expected):
        for p, q in zip(model.parameters(), expected):
            self.assertTrue(torch.equal(p.detach(), q))

    def test_pushes_stream_during_backward_and_match_torch(self):
        with Cluster(2) as cluster:
            # Buckets of ~1300 elements (at tensor boundaries): 3, over both shards.
            model, opt = self.run_job(cluster, "streamed", bucket_cap_mb=0.005)
            group = opt._groups[0]
            self.assertGreaterEqual(len(group.buckets), 3)
            self.assertEqual(group.client.streamed_pushes, STEPS)
            self.assert_exact(model, reference(accumulate=False))
            # The layout runs backward's way: the last layer first.
            names = [name for name, _, _, _ in group.client.layout()]
            self.assertEqual(names[0], "6.bias")
            self.assertEqual(names[-1], "0.weight")

    def test_accumulation_pushes_whole_and_stays_exact(self):
        with Cluster(1) as cluster:
            model, opt = self.run_job(cluster, "accumulated", accumulate=True,
                                      bucket_cap_mb=0.005)
            self.assertEqual(opt._groups[0].client.streamed_pushes, 0)
            self.assert_exact(model, reference(accumulate=True))
            # Each step's first backward streamed for nothing: after three,
            # streaming stopped.
            self.assertFalse(opt._overlap_backward)

    def test_on_by_default(self):
        with Cluster(1) as cluster:
            model = net()
            opt = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="default")
            for step in range(1, 3):
                opt.zero_grad()
                loss_of(model, *data(step)).backward()
                opt.step()
            self.assertEqual(opt._groups[0].client.streamed_pushes, 2)

    def test_off_keeps_the_parameters_order_and_never_streams(self):
        with Cluster(2) as cluster:
            model, opt = self.run_job(cluster, "whole", overlap_backward=False)
            group = opt._groups[0]
            self.assertEqual(group.client.streamed_pushes, 0)
            self.assertEqual([name for name, _, _, _ in group.client.layout()][0], "0.weight")
            self.assert_exact(model, reference(accumulate=False))

    def run_changing_gradients(self, cluster, model_id, change, steps):
        """Both optimizers see `change` applied to their gradients after
        every backward, shardopt's once its streamed push sent every chunk
        (so that what is changed was sent); returns (model, opt, reference
        parameters, warnings)."""
        model = net()
        opt = shardopt.torch.DistributedOptimizer(
            model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
            optimizer="adam", lr=0.01, model_id=model_id, bucket_cap_mb=0.005)
        reference_model = net()
        reference_opt = torch.optim.Adam(reference_model.parameters(), lr=0.01)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(1, steps + 1):
                for m, o in ((model, opt), (reference_model, reference_opt)):
                    o.zero_grad()
                    loss_of(m, *data(step)).backward()
                    if o is opt and opt._overlap_backward:
                        wait_until_sent(opt)
                    change(m, step)
                    o.step()
        return model, opt, [p.detach() for p in reference_model.parameters()], caught

    def test_gradients_clipped_after_backward_are_pushed_whole_and_exact(self):
        with Cluster(2) as cluster:
            model, opt, expected, caught = self.run_changing_gradients(
                cluster, "clip_by_hand",
                lambda m, step: torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05), 5)
            self.assert_exact(model, expected)
            client = opt._groups[0].client
            # Three steps streamed and found changed, then streaming stops.
            self.assertEqual(client.streamed_pushes_changed, 3)
            self.assertEqual(client.streamed_pushes, 0)
            self.assertEqual(len([w for w in caught if "clip_grad_norm_" in str(w.message)]), 1)

    def test_one_element_changed_after_backward_is_noticed(self):
        def change(m, step):
            if step % 2 == 0:
                with torch.no_grad():
                    m[0].weight.grad[3, 5] += 0.25  # The last bucket sent.
        with Cluster(2) as cluster:
            model, opt, expected, caught = self.run_changing_gradients(
                cluster, "one_element", change, 6)
            self.assert_exact(model, expected)
            client = opt._groups[0].client
            self.assertEqual(client.streamed_pushes_changed, 3)  # Steps 2, 4, 6.
            self.assertEqual(client.streamed_pushes, 3)
            self.assertEqual(caught, [])  # Never three in a row.

    def test_an_lr_schedule_still_streams_every_step(self):
        with Cluster(2) as cluster:
            results = []
            for model, opt in adam_twins(cluster, "scheduled", bucket_cap_mb=0.005):
                schedule = torch.optim.lr_scheduler.LambdaLR(opt, lambda e: 1.0 / (1 + e))
                for step in range(1, STEPS + 1):
                    opt.zero_grad()
                    loss_of(model, *data(step)).backward()
                    opt.step()
                    schedule.step()
                results.append((model, opt))
            (model, opt), (reference_model, _) = results
            self.assertEqual(opt._groups[0].client.streamed_pushes, STEPS)
            self.assert_exact(model, [p.detach() for p in reference_model.parameters()])

    def test_an_lr_changed_between_backward_and_step_stops_streaming_with_a_warning(self):
        # The change takes effect at this step, as in torch.optim, but it
        # ends the stream already sent: three steps in a row say so.
        with Cluster(1) as cluster:
            results = []
            for model, opt in adam_twins(cluster, "late_lr"):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for step in range(1, 6):
                        opt.zero_grad()
                        loss_of(model, *data(step)).backward()
                        for group in opt.param_groups:
                            group["lr"] = 0.01 / (1 + step)
                        opt.step()
                results.append((model, opt, caught))
            (model, opt, caught), (reference_model, _, _) = results
            self.assert_exact(model, [p.detach() for p in reference_model.parameters()])
            late = [w for w in caught if "between backward() and step()" in str(w.message)]
            self.assertEqual(len(late), 1, [str(w.message) for w in caught])
            self.assertFalse(opt._overlap_backward)

    def test_an_lr_changed_before_and_after_backward_runs_with_the_last_value(self):
        # The change before backward goes out with the streamed push; the one
        # after it replaces that for the same step (the servers take one
        # change per step: it was refused before), as torch.optim reads lr
        # in step().
        with Cluster(1) as cluster:
            results = []
            for model, opt in adam_twins(cluster, "twice_lr"):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    for step in range(1, 6):
                        opt.zero_grad()
                        for group in opt.param_groups:
                            group["lr"] = 0.02 / (1 + step)
                        loss_of(model, *data(step)).backward()
                        for group in opt.param_groups:
                            group["lr"] = 0.01 / (1 + step)
                        opt.step()
                results.append((model, opt))
            (model, opt), (reference_model, _) = results
            self.assert_exact(model, [p.detach() for p in reference_model.parameters()])

    def test_gradients_set_to_none_before_backward_are_named_once(self):
        # model.zero_grad() (torch 2's default sets None) makes autograd put
        # new tensors outside the pushed buffer: nothing streams, each step
        # goes whole and exact, and one warning says why.
        with Cluster(1) as cluster:
            results = []
            for model, opt in adam_twins(cluster, "set_to_none"):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    for step in range(1, STEPS + 1):
                        model.zero_grad(set_to_none=True)
                        loss_of(model, *data(step)).backward()
                        opt.step()
                results.append((model, opt, caught))
            (model, opt, caught), (reference_model, _, _) = results
            self.assert_exact(model, [p.detach() for p in reference_model.parameters()])
            self.assertEqual(opt._groups[0].client.streamed_pushes, 0)
            named = [w for w in caught if "set to None before backward()" in str(w.message)]
            self.assertEqual(len(named), 1, [str(w.message) for w in caught])

    def test_hooks_need_no_grad_mode_and_do_not_keep_the_optimizer(self):
        with Cluster(1) as cluster:
            model = net()
            with torch.no_grad():
                opt = shardopt.torch.DistributedOptimizer(
                    model.named_parameters(), servers=cluster.addresses, rank=0,
                    world_size=1, optimizer="adam", lr=0.01, model_id="no_grad")
            opt.zero_grad()
            loss_of(model, *data(1)).backward()
            opt.step()
            self.assertEqual(opt._groups[0].client.streamed_pushes, 1)
            gone = weakref.ref(opt)
            del opt
            gc.collect()
            self.assertIsNone(gone())
            # The model trains on without it (the hooks find no optimizer).
            loss_of(model, *data(2)).backward()

    def test_a_rebuilt_optimizer_lets_the_old_one_go(self):
        with Cluster(1) as cluster:
            model = net()
            first = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="first")
            first.zero_grad()
            loss_of(model, *data(1)).backward()
            first.step()
            old_group = weakref.ref(first._groups[0])
            # Built on the same parameters: autograd's accumulators (and the
            # first optimizer's hooks on them) are shared.
            second = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="second")
            del first
            gc.collect()
            self.assertIsNone(old_group(), "the second optimizer keeps the first one's group "
                                           "(its client and flat buffers) alive")
            second.zero_grad()
            loss_of(model, *data(2)).backward()
            second.step()
            self.assertEqual(second._groups[0].client.streamed_pushes, 1)

    def test_clipping_turns_it_off(self):
        with Cluster(1) as cluster:
            model = net()
            opt = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="clipped", max_grad_norm=1.0,
                overlap_backward=True)
            opt.zero_grad()
            loss_of(model, *data(1)).backward()
            opt.step()
            self.assertEqual(opt._groups[0].client.streamed_pushes, 0)
            self.assertEqual(opt._groups[0].accumulators, [])


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
