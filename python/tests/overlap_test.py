"""shardopt.torch's pushes during backward (overlap_backward=True): bucket by
bucket from the gradient accumulators' hooks, bit-identical to torch.optim
with one trainer; a second backward before the step (accumulation) pushes
that step whole, still exact; without it (the default) the parameters keep
their own order, nothing streams, and gradients changed between backward()
and step() (clip_grad_norm_) are what the shards apply.
"""

import sys
import unittest

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

    def test_off_keeps_the_parameters_order_and_never_streams(self):
        with Cluster(2) as cluster:
            model, opt = self.run_job(cluster, "whole", overlap_backward=False)
            group = opt._groups[0]
            self.assertEqual(group.client.streamed_pushes, 0)
            self.assertEqual([name for name, _, _, _ in group.client.layout()][0], "0.weight")
            self.assert_exact(model, reference(accumulate=False))

    def test_by_default_gradients_may_change_before_the_step(self):
        with Cluster(1) as cluster:
            model = net()
            opt = shardopt.torch.DistributedOptimizer(
                model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="clip_by_hand")
            reference_model = net()
            reference_opt = torch.optim.Adam(reference_model.parameters(), lr=0.01)
            for step in range(1, 4):
                for m, o in ((model, opt), (reference_model, reference_opt)):
                    o.zero_grad()
                    loss_of(m, *data(step)).backward()
                    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.05)
                    o.step()
            self.assertEqual(opt._groups[0].client.streamed_pushes, 0)
            self.assertEqual(opt._groups[0].accumulators, [])
            self.assert_exact(model, [p.detach() for p in reference_model.parameters()])

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
