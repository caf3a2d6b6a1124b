"""Bad uses of shardopt's Python API each raise a clear exception, not a crash."""

import inspect
import os
import re
import signal
import sys
import tempfile
import threading
import time
import unittest
import warnings

import numpy
import torch
from torch.optim.optimizer import required

import shardopt
import shardopt.torch
from support import Cluster


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 2))


class BadUseTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = Cluster(2)
        cls.servers = cls.cluster.addresses

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()

    def optimizer(self, model, model_id, params=None, **kwargs):
        args = dict(servers=self.servers, rank=0, world_size=1, optimizer="adam", lr=0.01,
                    model_id=model_id, retry_budget=2.0)
        args.update(kwargs)
        return shardopt.torch.DistributedOptimizer(
            model.parameters() if params is None else params, **args)

    def test_rank_outside_world_size(self):
        with self.assertRaisesRegex(ValueError, r"rank 2 is not in \[0, world_size=2\)"):
            self.optimizer(tiny_model(), "ws1", rank=2, world_size=2)

    def test_world_size_other_than_the_registered_model(self):
        self.optimizer(tiny_model(), "ws2", world_size=2)  # rank 0 of 2 registers
        with self.assertRaises(shardopt.FailedPreconditionError) as caught:
            self.optimizer(tiny_model(), "ws2", rank=0, world_size=3)
        self.assertIn("different config", str(caught.exception))
        self.assertEqual(caught.exception.code, "FAILED_PRECONDITION")

    def test_parameter_added_after_registration(self):
        opt = self.optimizer(tiny_model(), "added")
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "cannot be added") as raised:
            opt.add_param_group({"params": [torch.nn.Parameter(torch.zeros(3))]})
        # Raised from Python, it carries its code as one from C++ does.
        self.assertEqual(raised.exception.code, "FAILED_PRECONDITION")
        # Another trainer declaring one more tensor for the same model id is refused too.
        bigger = tiny_model()
        bigger.add_module("extra", torch.nn.Linear(2, 2))
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "different config"):
            self.optimizer(bigger, "added")

    def test_tokens(self):
        # A server that wants bearer tokens (plaintext here: the TLS paths
        # are the C++ client's, tested in //tests:security_test).
        directory = tempfile.mkdtemp()
        tokens = os.path.join(directory, "tokens")
        with open(tokens, "w") as f:
            f.write("trainer trainer-token-0123456789\nreadonly reader-token-0123456789\n")
        with Cluster(1, ["--auth_token_file=" + tokens]) as secured:
            def build(model_id, **security):
                return shardopt.torch.DistributedOptimizer(
                    tiny_model().parameters(), servers=secured.addresses, rank=0, world_size=1,
                    optimizer="adam", lr=0.01, model_id=model_id, retry_budget=2.0,
                    security=security or None)
            with self.assertRaises(shardopt.UnauthenticatedError) as caught:
                build("tok")
            self.assertEqual(caught.exception.code, "UNAUTHENTICATED")
            with self.assertRaises(shardopt.UnauthenticatedError):
                build("tok", auth_token="trainer-token-wrong-56789")
            with self.assertRaises(PermissionError):  # shardopt.PermissionDeniedError
                build("tok", auth_token="reader-token-0123456789")
            with self.assertRaisesRegex(ValueError, "unknown security option 'token'"):
                build("tok", token="trainer-token-0123456789")
            model = tiny_model()
            opt = shardopt.torch.DistributedOptimizer(
                model.parameters(), servers=secured.addresses, rank=0, world_size=1,
                optimizer="adam", lr=0.01, model_id="tok", retry_budget=2.0,
                security={"auth_token": "trainer-token-0123456789"})
            model(torch.ones(1, 3)).sum().backward()
            opt.step()
            self.assertEqual(opt.last_results[0]["version"], 1)

    def test_server_down(self):
        dead = Cluster(1)
        address = dead.addresses[0]
        dead.stop()
        with self.assertRaises(shardopt.UnavailableError) as caught:
            shardopt.torch.DistributedOptimizer(
                tiny_model().parameters(), servers=[address], rank=0, world_size=1,
                optimizer="sgd", lr=0.1, retry_budget=0.5)
        self.assertIsInstance(caught.exception, ConnectionError)
        self.assertIn(address, str(caught.exception))
        # The raw client counts the attempts that failed.
        client = shardopt.Client([address], 0, retry_budget_s=0.3)
        self.assertEqual(client.failed_attempts, 0)
        with self.assertRaises(shardopt.UnavailableError):
            client.register("raw", [("w", [5])], "sgd", {"lr": 0.1}, 1, 0.0,
                            numpy.zeros(client.layout_for([("w", [5])])[-1][2],
                                        dtype=numpy.float32))
        self.assertGreaterEqual(client.failed_attempts, 2)  # the first and a retry
        self.assertEqual(client.replayed_pushes, 0)
        self.assertIsNone(client.rolled_back_to)  # No rollback: not an AbortedError.

    def test_non_contiguous_parameter(self):
        weight = torch.nn.Parameter(torch.randn(4, 3).t())  # a transposed view
        self.assertFalse(weight.is_contiguous())
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            shardopt.torch.DistributedOptimizer([weight], servers=self.servers, rank=0,
                                                world_size=1, optimizer="sgd", lr=0.1)

    def test_non_contiguous_or_mistyped_buffer_to_the_client(self):
        client = shardopt.Client(self.servers, 0, retry_budget_s=2.0)
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "register"):
            client.layout()
        n = client.layout_for([("w", [5])])[-1][2]
        values = numpy.zeros(n, dtype=numpy.float32)
        client.register("raw", [("w", [5])], "sgd", {"lr": 0.1}, 1, 0.0, values)
        with self.assertRaisesRegex(ValueError, "not contiguous"):
            client.pull(0, numpy.zeros(2 * n, dtype=numpy.float32)[::2])
        with self.assertRaisesRegex(ValueError, "float32"):
            client.pull(0, numpy.zeros(n, dtype=numpy.float64))
        with self.assertRaisesRegex(ValueError, f"{n}"):
            client.pull(0, numpy.zeros(10, dtype=numpy.float32))
        grads = numpy.full(n, numpy.nan, dtype=numpy.float32)
        with self.assertRaises(shardopt.InvalidArgumentError) as caught:
            client.step(1, grads, values)
        self.assertIn("nothing was pushed", str(caught.exception))

    def test_a_failed_registration_leaves_no_model_to_step_with(self):
        # (It replaced the transports' view of the layout with the new one's:
        # a step with the old sizes then overran the buffers.)
        client = shardopt.Client(self.servers, 0, retry_budget_s=2.0)
        small = numpy.zeros(client.layout_for([("w", [64])])[-1][2], dtype=numpy.float32)
        client.register("reshaped", [("w", [64])], "sgd", {"lr": 0.1}, 1, 0.0, small)
        big = numpy.zeros(client.layout_for([("w", [1 << 20])])[-1][2], dtype=numpy.float32)
        with self.assertRaises(shardopt.FailedPreconditionError):
            client.register("reshaped", [("w", [1 << 20])], "sgd", {"lr": 0.1}, 1, 0.0, big)
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "register"):
            client.step(1, small, small.copy())
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "register"):
            client.layout()
        # Registering again (attaching to the model as it is) works.
        client.register("reshaped", [("w", [64])], "sgd", {"lr": 0.1}, 1, 0.0, small)
        self.assertEqual(client.step(1, small, small.copy())["version"], 1)
        # Another model of the same size that refuses it: no model either
        # (its steps would have gone to the other model).
        other = shardopt.Client(self.servers, 0, retry_budget_s=2.0)
        other.register("same_size", [("w", [64])], "adam", {"lr": 0.1}, 1, 0.0, small)
        with self.assertRaises(shardopt.FailedPreconditionError):
            client.register("same_size", [("w", [64])], "sgd", {"lr": 0.1}, 1, 0.0, small)
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "register"):
            client.step(2, small, small.copy())

    def test_ctrl_c_ends_a_step_that_waits_on_another_trainer(self):
        # (It sat out the retry budget, a minute here, before Python saw the signal.)
        rank0 = shardopt.Client(self.servers, 0, retry_budget_s=60.0, rpc_timeout_s=60.0)
        rank1 = shardopt.Client(self.servers, 1, retry_budget_s=60.0, rpc_timeout_s=60.0)
        n = rank0.layout_for([("w", [64])])[-1][2]
        rank0.register("interrupted", [("w", [64])], "sgd", {"lr": 0.5}, 2, 0.0,
                       numpy.zeros(n, dtype=numpy.float32))
        rank1.register("interrupted", [("w", [64])], "sgd", {"lr": 0.5}, 2)
        grads = numpy.zeros(n, dtype=numpy.float32)
        grads[:64] = 0.25  # (Padding gets zero gradients.)
        params0, params1 = numpy.zeros(n, dtype=numpy.float32), numpy.zeros(n, dtype=numpy.float32)
        timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
        timer.start()
        started = time.monotonic()
        with self.assertRaises(KeyboardInterrupt):
            rank0.step(1, grads, params0)
        self.assertLess(time.monotonic() - started, 10)
        timer.join()
        # The client goes on: retried with trainer 1's push, the step completes.
        other = threading.Thread(target=rank1.step, args=(1, grads, params1))
        other.start()
        self.assertEqual(rank0.step(1, grads, params0)["version"], 1)
        other.join(timeout=60)
        self.assertTrue(numpy.all(params0[:64] == -0.125))

    def test_an_lr_changed_after_a_step_pushed_and_failed_takes_effect_at_the_next(self):
        # Rank 0's step 1 pushed, then waited on rank 1 and was interrupted;
        # its lr changed before it was tried again. Step 1 runs with the lr
        # its push went out under (refused forever before: a change for a step
        # already pushed), the change from step 2 on, with a warning.
        models = [tiny_model(), tiny_model()]
        opts = [self.optimizer(models[rank], "late_change", rank=rank, world_size=2,
                               optimizer="sgd", lr=0.5, retry_budget=60.0,
                               overlap_backward=False) for rank in (0, 1)]
        x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(1)), \
            torch.tensor([0, 1] * 4)

        def backward(rank):
            opts[rank].zero_grad()
            torch.nn.functional.cross_entropy(models[rank](x), y).backward()

        backward(0)

        def interrupted_step():
            timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            with self.assertRaises(KeyboardInterrupt):
                opts[0].step()
            timer.join()

        interrupted_step()
        # Changed, and a try that sent it (to step 2) failed again: the next
        # change replaces it there. (What a retry does first, then fails.)
        opts[0].param_groups[0]["lr"] = 0.3
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.assertTrue(opts[0]._send_hyperparameters(opts[0]._groups[0], 1))
        opts[0].param_groups[0]["lr"] = 0.25
        backward(1)
        other = threading.Thread(target=opts[1].step)
        other.start()
        with self.assertWarnsRegex(RuntimeWarning, "take effect at step 2"):
            opts[0].step()
        other.join(timeout=60)
        self.assertEqual(opts[0].step_count, 1)
        opts[1].param_groups[0]["lr"] = 0.25
        for rank in (0, 1):
            backward(rank)
        other = threading.Thread(target=opts[1].step)
        other.start()
        opts[0].step()
        other.join(timeout=60)
        # torch.optim.SGD with lr 0.5, then 0.25, on the same gradient (both
        # ranks computed the same one: their mean is it).
        reference = tiny_model()
        sgd = torch.optim.SGD(reference.parameters(), lr=0.5)
        for lr in (0.5, 0.25):
            sgd.param_groups[0]["lr"] = lr
            sgd.zero_grad()
            torch.nn.functional.cross_entropy(reference(x), y).backward()
            sgd.step()
        for p, q in zip(models[0].parameters(), reference.parameters()):
            self.assertTrue(torch.equal(p.detach(), q.detach()))

    def test_a_restarted_rank_takes_the_change_its_earlier_process_scheduled(self):
        # Its earlier process sent a change for step 2 (lr 0.3) and ended
        # before pushing: the shards hold it. The new process, built with the
        # constructor's lr 0.5, takes it and steps; its constructor's lr sent
        # instead was refused at every try ("a different hyperparameter
        # change is already scheduled"), and the job stood still.
        model = tiny_model()
        x, y = torch.randn(8, 3, generator=torch.Generator().manual_seed(2)), \
            torch.tensor([0, 1] * 4)

        def step(opt):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

        make = lambda: self.optimizer(model, "restarted_change", optimizer="sgd", lr=0.5,
                                      overlap_backward=False)
        opt = make()
        step(opt)
        opt.param_groups[0]["lr"] = 0.3
        self.assertTrue(opt._send_hyperparameters(opt._groups[0], 2))
        del opt
        with self.assertWarnsRegex(RuntimeWarning, r"runs with lr=0\.3 from step 2"):
            opt = make()
        step(opt)
        self.assertEqual(opt.last_results[0]["lr"], 0.3)
        # A change from now on is sent as usual.
        opt.param_groups[0]["lr"] = 0.2
        step(opt)
        self.assertEqual(opt.last_results[0]["lr"], 0.2)

    def test_a_streamed_push_holds_its_gradient_buffer(self):
        client = shardopt.Client(self.servers, 0, retry_budget_s=2.0)
        n = client.layout_for([("w", [4096])])[-1][2]
        client.register("streamed_buffer", [("w", [4096])], "sgd", {"lr": 0.5}, 1, 0.0,
                        numpy.zeros(n, dtype=numpy.float32))
        grads = numpy.full(n, 0.25, dtype=numpy.float32)
        client.begin_streamed_push(1, grads)
        held = sys.getrefcount(grads)
        del grads  # The push still reads it: the client keeps it.
        client.mark_gradient_ready(0, n)
        params = numpy.zeros(n, dtype=numpy.float32)
        result = client.finish_streamed_step(1, numpy.full(n, 0.25, dtype=numpy.float32), params)
        self.assertEqual(result["version"], 1)
        self.assertTrue(numpy.all(params == -0.125))
        self.assertGreater(held, 2)

    def test_unknown_optimizer_and_hyperparameter(self):
        with self.assertRaisesRegex(ValueError, "unknown optimizer"):
            self.optimizer(tiny_model(), "x", optimizer="shampoo")
        with self.assertRaisesRegex(ValueError, "no hyperparameter"):
            self.optimizer(tiny_model(), "x", momentum=0.9)
        with self.assertRaises(shardopt.InvalidArgumentError):
            self.optimizer(tiny_model(), "x", lr=-1.0)
        # As torch.optim.Adafactor (a negative eps1 is not its None).
        with self.assertRaisesRegex(ValueError, "epsilon1 should be >= 0 but is: -0.001"):
            self.optimizer(tiny_model(), "x", optimizer="adafactor", lr=0.01, eps=(-1e-3, 1e-3))
        # As torch 1.13's torch.optim.SGD: no default learning rate.
        with self.assertRaisesRegex(ValueError, "required optimization parameter lr"):
            shardopt.torch.DistributedOptimizer(tiny_model().parameters(), servers=self.servers,
                                                rank=0, world_size=1, optimizer="sgd",
                                                model_id="no-lr")
        if inspect.signature(torch.optim.SGD).parameters["lr"].default is required:
            with self.assertRaisesRegex(ValueError, "required optimization parameter lr"):
                torch.optim.SGD(tiny_model().parameters())

    def test_one_address_string_and_hyperparameters_without_values(self):
        with self.assertRaisesRegex(TypeError, "list of addresses"):
            self.optimizer(tiny_model(), "one_string", servers=self.servers[0])
        model = tiny_model()
        # A group of its own optimizer takes its defaults: SGD has no lr.
        with self.assertRaisesRegex(ValueError, "required optimization parameter lr"):
            self.optimizer(model, "group_sgd", optimizer="adamw", lr=1e-3, params=[
                {"params": model[0].parameters()},
                {"params": model[2].parameters(), "optimizer": "sgd", "momentum": 0.9}])
        for bad in ({"lr": None}, {"betas": (0.9,)}):
            with self.assertRaisesRegex(TypeError, "hyperparameters must be numbers") as caught:
                self.optimizer(tiny_model(), "bad_values", **bad)
            self.assertIn(next(iter(bad)), str(caught.exception))

    def test_none_in_the_security_options_means_not_set(self):
        # (os.environ.get of an unset variable: it was the token or file "None".)
        model = tiny_model()
        opt = self.optimizer(model, "security_none",
                             security={"tls_ca_file": None, "auth_token": None})
        model(torch.ones(1, 3)).sum().backward()
        opt.step()
        self.assertEqual(opt.last_results[0]["version"], 1)

    def test_ctrl_c_ends_an_inspect_that_waits_on_a_server_down(self):
        with Cluster(1) as down:
            opt = shardopt.torch.DistributedOptimizer(
                tiny_model().parameters(), servers=down.addresses, rank=0, world_size=1,
                optimizer="sgd", lr=0.1, model_id="inspected", retry_budget=60.0,
                rpc_timeout=60.0)
            down.stop()
            timer = threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT))
            timer.start()
            started = time.monotonic()
            with self.assertRaises(KeyboardInterrupt):
                opt.inspect()
            self.assertLess(time.monotonic() - started, 10)
            timer.join()

    def test_state_dict_of_another_step(self):
        model = tiny_model()
        opt = self.optimizer(model, "states", checkpoint_dir=tempfile.mkdtemp())
        state = opt.state_dict()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        # The directory the servers restore from (not the manifest in it).
        checkpoint = os.path.dirname(state["shardopt"]["checkpoints"][0])
        with self.assertRaisesRegex(shardopt.FailedPreconditionError,
                                    re.escape(f"--restore_from={checkpoint} to go back")):
            opt.load_state_dict(state)
        opt.load_state_dict(opt.state_dict())  # the current step: accepted


    def test_weights_changed_after_construction_are_refused_not_lost(self):
        model = tiny_model()
        opt = self.optimizer(model, "changed")
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        with torch.no_grad():
            model[0].weight.fill_(0.5)  # e.g. model.load_state_dict(pretrained)
        model(torch.randn(2, 3)).sum().backward()
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "changed after"):
            opt.step()
        model[2].weight.data = torch.zeros(2, 4)  # replaced storage
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "changed after"):
            opt.step()

    def test_a_failed_step_can_be_retried(self):
        model = tiny_model()
        opt = self.optimizer(model, "retried")
        model(torch.randn(2, 3)).sum().backward()
        model[0].weight.grad[0, 0] = float("nan")
        with self.assertRaises(shardopt.InvalidArgumentError):
            opt.step()
        opt.zero_grad()
        model(torch.randn(2, 3)).sum().backward()
        opt.step()  # the same step again, now with a good gradient
        self.assertEqual(opt.step_count, 1)
        self.assertEqual(opt.last_results[0]["version"], 1)

    def test_a_step_that_failed_after_the_servers_wrote_some_parameters_can_be_retried(self):
        model = tiny_model()
        opt = self.optimizer(model, "half_pulled", overlap_backward=False)
        group = opt._groups[0]
        real = group.client

        class FailsAfterWriting:
            """The client, but its step writes part of the parameters (as a
            pull of some shards would) and then fails."""
            def __getattr__(self, name):
                return getattr(real, name)

            def step(self, version, grads, params):
                params[:3] += 1.0
                raise shardopt.UnavailableError("UNAVAILABLE: a shard went away")

        group.client = FailsAfterWriting()
        model(torch.randn(2, 3)).sum().backward()
        with self.assertRaises(shardopt.UnavailableError):
            opt.step()
        group.client = real
        opt.step()  # the same step again: not taken for a change of the user's
        self.assertEqual(opt.last_results[0]["version"], 1)
        self.assertEqual([shard["version"] for shard in opt.inspect()[0]], ["1", "1"])

    def test_freezing_or_unfreezing_after_construction_is_refused(self):
        model = tiny_model()
        model[2].bias.requires_grad_(False)
        opt = self.optimizer(model, "refrozen", overlap_backward=False)
        model[2].bias.requires_grad_(True)
        model(torch.randn(2, 3)).sum().backward()
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "requires grad now"):
            opt.step()
        model[2].bias.requires_grad_(False)
        model[0].weight.requires_grad_(False)
        with self.assertRaisesRegex(shardopt.FailedPreconditionError,
                                    "frozen .requires_grad=False. after"):
            opt.step()
        model[0].weight.requires_grad_(True)
        opt.step()  # As built again: the step goes through.
        self.assertEqual(opt.last_results[0]["version"], 1)

    def test_a_parameter_without_gradient_is_refused(self):
        model = tiny_model()
        opt = self.optimizer(model, "nograd")
        opt.zero_grad(set_to_none=True)
        model[0](torch.randn(2, 3)).sum().backward()  # the last layer gets no gradient
        with self.assertRaisesRegex(shardopt.FailedPreconditionError, "no gradient"):
            opt.step()

    def test_sets_duplicates_and_clipping_with_groups(self):
        model = tiny_model()
        with self.assertRaisesRegex(TypeError, "ordered"):
            self.optimizer(model, "set", params=set(model.parameters()))
        with self.assertRaisesRegex(TypeError, "iterable"):
            shardopt.torch.DistributedOptimizer(model[0].weight, servers=self.servers, rank=0,
                                                world_size=1)
        w = model[0].weight
        with self.assertRaisesRegex(ValueError, "twice"):
            shardopt.torch.DistributedOptimizer([w, w], servers=self.servers, rank=0,
                                                world_size=1, optimizer="sgd", lr=0.1)
        with self.assertRaisesRegex(ValueError, "single parameter group"):
            shardopt.torch.DistributedOptimizer(
                [{"params": model[0].parameters()}, {"params": model[2].parameters()}],
                servers=self.servers, rank=0, world_size=1, max_grad_norm=1.0)
        with self.assertRaisesRegex(ValueError, "single parameter group"):
            shardopt.torch.DistributedOptimizer(
                [{"params": model[0].parameters()}, {"params": model[2].parameters()}],
                servers=self.servers, rank=0, world_size=1, loss_scaler={})
        with self.assertRaisesRegex(ValueError, "unknown loss scaler option 'scale'"):
            self.optimizer(tiny_model(), "badscaler", loss_scaler={"scale": 2.0})
        with self.assertRaises(shardopt.InvalidArgumentError):
            self.optimizer(tiny_model(), "badscaler2", loss_scaler={"backoff_factor": 2.0})


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
