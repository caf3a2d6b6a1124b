"""shardopt.torch and the binding over the shared-memory data plane (on by
default with servers on this host): the flat buffers the parameters and
gradients live in are the client's segment, the shards read and write it in
place, and the bits are those of the gRPC stream (shared_memory=False,
socket_payloads=False), of payload sockets (shared_memory=False) and of
torch.optim; the buffers stay valid after the optimizer and its client are
gone; the binding's shared buffers are plain float32 buffers.
"""

import gc
import sys
import unittest
import weakref

import numpy as np
import torch

import shardopt
import shardopt.torch
from support import Cluster

STEPS = 8


def net():
    torch.manual_seed(3)
    return torch.nn.Sequential(torch.nn.Linear(12, 48), torch.nn.Tanh(), torch.nn.Linear(48, 5))


def train(model, opt):
    for step in range(1, STEPS + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(16, 12, generator=g)
        y = torch.randint(0, 5, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


class SharedMemoryTest(unittest.TestCase):
    def run_job(self, cluster, model_id, **kwargs):
        model = net()
        opt = shardopt.torch.DistributedOptimizer(
            model.named_parameters(), servers=cluster.addresses, rank=0, world_size=1,
            optimizer="adamw", lr=0.01, model_id=model_id, **kwargs)
        train(model, opt)
        return model, opt

    def test_same_bits_as_grpc_and_torch_with_buffers_in_the_segment(self):
        with Cluster(2) as cluster:
            for overlap in (True, False):
                shared_model, shared = self.run_job(cluster, f"shm{overlap}",
                                                    overlap_backward=overlap)
                grpc_model, grpc = self.run_job(cluster, f"grpc{overlap}", shared_memory=False,
                                                socket_payloads=False, overlap_backward=overlap)
                socket_model, socket = self.run_job(cluster, f"socket{overlap}",
                                                    shared_memory=False, overlap_backward=overlap)
                g = shared._groups[0]
                # Pulls (and, when not streamed during backward, pushes) went
                # through the segment, which holds the flat buffers.
                self.assertGreaterEqual(g.client.shared_memory_transfers,
                                        STEPS * 2 * (1 if overlap else 2))
                segment = np.frombuffer(g.client.shared_parameters(), dtype=np.float32)
                self.assertEqual(g.flat_params.data_ptr(), segment.ctypes.data)
                self.assertEqual(grpc._groups[0].client.shared_memory_transfers, 0)
                self.assertEqual(grpc.socket_transfers, 0)
                self.assertIsNone(grpc._groups[0].client.shared_gradients())
                self.assertEqual(shared.socket_transfers, 0)
                # Over payload sockets (shared memory off): the same bits.
                self.assertGreaterEqual(socket.socket_transfers, STEPS * 2 * (1 if overlap else 2))
                self.assertEqual(socket.shared_memory_transfers, 0)
                for p, q, r in zip(shared_model.parameters(), grpc_model.parameters(),
                                   socket_model.parameters()):
                    self.assertTrue(torch.equal(p.detach(), q.detach()))
                    self.assertTrue(torch.equal(r.detach(), q.detach()))
            reference = net()
            train(reference, torch.optim.AdamW(reference.parameters(), lr=0.01))
            for p, q in zip(shared_model.parameters(), reference.parameters()):
                self.assertTrue(torch.equal(p.detach(), q.detach()))

    def test_device_pairs_give_the_same_bits(self):
        # The device data plane on loopback pairs (servers on the CPU; the
        # NCCL kind runs in tools/gpu_check.sh): the GPU trainer's path
        # (step_on_device: the gradient sent from the flat buffer, the
        # parameters received into it) in host memory, the bits of the gRPC
        # stream and of torch.optim.
        with Cluster(2, extra_flags=["--device_pairs=loopback"]) as cluster:
            for overlap in (True, False):
                pair_model, pairs = self.run_job(cluster, f"pairs{overlap}", shared_memory=False,
                                                 socket_payloads=False, device_pairs="loopback",
                                                 overlap_backward=overlap)
                grpc_model, grpc = self.run_job(cluster, f"plain{overlap}", shared_memory=False,
                                                socket_payloads=False, overlap_backward=overlap)
                g = pairs._groups[0]
                self.assertTrue(g.device_buffers)
                # The pushes and pulls of both shards, from and into the flat
                # buffers themselves (all but a few, which may find their
                # pairs still opening under load; no pushes during backward
                # on this path).
                self.assertGreaterEqual(g.client.device_buffer_transfers, STEPS * 2 * 2 * 9 // 10)
                self.assertEqual(g.client.streamed_pushes, 0)
                self.assertEqual(grpc.device_pair_transfers, 0)
                self.assertEqual(pairs.socket_transfers + pairs.shared_memory_transfers, 0)
                for p, q in zip(pair_model.parameters(), grpc_model.parameters()):
                    self.assertTrue(torch.equal(p.detach(), q.detach()))
        reference = net()
        train(reference, torch.optim.AdamW(reference.parameters(), lr=0.01))
        for p, q in zip(pair_model.parameters(), reference.parameters()):
            self.assertTrue(torch.equal(p.detach(), q.detach()))
        with self.assertRaisesRegex(ValueError, "device_pairs"):
            shardopt.torch.DistributedOptimizer(net().named_parameters(), servers=["x:1"], rank=0,
                                                world_size=1, device_pairs="pigeon")

    def test_parameters_outlive_the_optimizer(self):
        with Cluster(1) as cluster:
            # (Without the backward hooks, which would keep the client.)
            model, opt = self.run_job(cluster, "outlive", overlap_backward=False)
            kept = [p.detach().clone() for p in model.parameters()]
            client = weakref.ref(opt._groups[0].client)
            del opt
            gc.collect()
            self.assertIsNone(client(), "the client is gone")
            # The parameters still live in the segment, now held by them alone.
            for p, q in zip(model.parameters(), kept):
                self.assertTrue(torch.equal(p.detach(), q))
            torch.nn.functional.cross_entropy(model(torch.randn(4, 12)),
                                              torch.zeros(4, dtype=torch.long)).backward()

    def test_binding_buffers(self):
        with Cluster(1) as cluster:
            client = shardopt.Client(cluster.addresses, 0)
            self.assertIsNone(client.shared_gradients())  # (Not registered yet.)
            params = np.full(1024, 0.25, dtype=np.float32)
            client.register("raw", [("w", [1024])], "sgd", {"lr": 0.5}, 1, 0.0, params)
            grads = np.frombuffer(client.shared_gradients(), dtype=np.float32)
            shared_params = np.frombuffer(client.shared_parameters(), dtype=np.float32)
            self.assertEqual(grads.size, client.total_elements())
            grads[:] = 0.5
            result = client.step(1, grads, shared_params)
            self.assertEqual(result["version"], 1)
            # 0.25 - 0.5 * 0.5, written by the shard into the segment.
            np.testing.assert_array_equal(shared_params, np.zeros(1024, np.float32))
            self.assertEqual(client.shared_memory_transfers, 2)
            del client
            gc.collect()
            self.assertEqual(float(shared_params[0]), 0.0)  # Still mapped.


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
