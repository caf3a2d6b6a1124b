"""shardopt.torch goes on by itself when the job rolls back: two trainers
(threads of this process) train on one shard server with periodic
checkpoints; the server is killed with SIGKILL after step 5 and its newest
checkpoint (step 4) is lost, so it comes back at step 2 and the trainers no
longer hold the pushes of steps 3-5 (no journal). Their next step() rolls the
job back to step 2 (a RuntimeWarning, last_results saying so), both pull that
checkpoint's parameters, and the loops run to their end, the two trainers'
parameters equal throughout.

And the end of a job, finish(): it saves the last step (5, no multiple of
--checkpoint_every), so a server killed after the trainers finished comes back
there; killed before it (and back at step 2), finish() follows the job's
rollback (False), the trainers redo steps 3-5 and the second finish() ends it.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings

import torch

import shardopt.torch
from support import server_binary

LOOP = 8
KILL_AFTER = 5


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One shard server on a fixed port, restartable, restoring from its
    checkpoint directory."""

    def __init__(self, workdir):
        self.workdir = workdir
        self.checkpoints = os.path.join(workdir, "checkpoints")
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.starts = 0
        self.proc = None

    def start(self):
        self.starts += 1
        port_file = os.path.join(self.workdir, f"port{self.starts}")
        self.proc = subprocess.Popen(
            [server_binary(), f"--listen={self.address}", f"--port_file={port_file}",
             "--shard_index=0", "--shard_count=1", "--device=cpu", "--threads=1",
             "--pipeline_range_elements=64", f"--checkpoint_dir={self.checkpoints}",
             "--checkpoint_every=2", f"--restore_from={self.checkpoints}"],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(self.workdir, f"server{self.starts}.log"), "w"))
        deadline = time.time() + 30
        while not os.path.exists(port_file):
            if time.time() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"the shard server did not start (see {self.workdir})")
            time.sleep(0.01)

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def net():
    torch.manual_seed(11)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


def batch(i, rank):
    g = torch.Generator().manual_seed(1000 * rank + i)
    x = torch.randn(8, 6, generator=g)
    return x, (x[:, 0] > 0).long() + (x[:, 1] > 0).long()


class RollbackTest(unittest.TestCase):
    def test_step_follows_a_rollback_and_the_loops_finish(self):
        workdir = tempfile.mkdtemp(prefix="rollback_test")
        server = Server(workdir)
        server.start()
        paused = threading.Barrier(3, timeout=60)
        resumed = threading.Barrier(3, timeout=60)
        models, opts, errors = [None, None], [None, None], []
        versions, rolled_back = [[], []], [[], []]

        def trainer(rank):
            try:
                models[rank] = net()
                opts[rank] = opt = shardopt.torch.DistributedOptimizer(
                    models[rank].named_parameters(), servers=[server.address], rank=rank,
                    world_size=2, optimizer="adam", lr=0.01, model_id="rollback",
                    rpc_timeout=5.0, retry_budget=30.0)
                for i in range(1, LOOP + 1):
                    opt.zero_grad()
                    x, y = batch(i, rank)
                    torch.nn.functional.cross_entropy(models[rank](x), y).backward()
                    opt.step()
                    versions[rank].append(opt.step_count)
                    rolled_back[rank].append(opt.last_results[0].get("rolled_back_to"))
                    if i == KILL_AFTER:
                        paused.wait()
                        resumed.wait()
            except BaseException as e:  # pylint: disable=broad-except
                errors.append((rank, repr(e)))
                paused.abort()
                resumed.abort()

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        # (Recorded here: catch_warnings is process-wide, not per thread.)
        caught = warnings.catch_warnings(record=True)
        seen = caught.__enter__()
        warnings.simplefilter("always")
        try:
            for t in threads:
                t.start()
            paused.wait()
            # Step 4's checkpoint committed, then lost with the server.
            for _ in range(500):
                newest = int(opts[0].inspect()[0][0].get("newest_committed_checkpoint", 0))
                if newest >= 4:
                    break
                time.sleep(0.01)
            self.assertEqual(newest, 4)
            server.kill()
            shutil.rmtree(os.path.join(server.checkpoints, "rollback", "step-00000004"))
            server.start()
            resumed.wait()
            for t in threads:
                t.join(timeout=120)
                self.assertFalse(t.is_alive(), "a trainer did not finish")
        finally:
            caught.__exit__(None, None, None)
            server.stop()
        self.assertEqual(errors, [])
        # Loop 6 rolled the job back to version 2; loops 7 and 8 made 3 and 4.
        for rank in range(2):
            self.assertEqual(versions[rank], [1, 2, 3, 4, 5, 2, 3, 4], versions[rank])
            self.assertEqual(rolled_back[rank], [None] * 5 + [2, None, None])
        messages = [str(w.message) for w in seen]
        self.assertEqual(len([m for m in messages if "rolled back to step 2" in m]), 2, messages)
        for a, b in zip(models[0].parameters(), models[1].parameters()):
            self.assertTrue(torch.equal(a, b))
        shutil.rmtree(workdir, ignore_errors=True)

    def run_two(self, server, body):
        """Runs body(rank, opt, model) on two trainer threads against
        `server`; the errors they raised."""
        errors = []

        def trainer(rank):
            try:
                model = net()
                opt = shardopt.torch.DistributedOptimizer(
                    model.named_parameters(), servers=[server.address], rank=rank,
                    world_size=2, optimizer="adam", lr=0.01, model_id="ending",
                    rpc_timeout=5.0, retry_budget=30.0)
                body(rank, opt, model)
            except BaseException as e:  # pylint: disable=broad-except
                errors.append((rank, repr(e)))

        threads = [threading.Thread(target=trainer, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
            self.assertFalse(t.is_alive(), "a trainer did not finish")
        return errors

    def train_to(self, opt, model, rank, last):
        for i in range(opt.step_count + 1, last + 1):
            opt.zero_grad()
            x, y = batch(i, rank)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()

    def test_finish_saves_the_end_a_restarted_server_comes_back_there(self):
        """5 steps with checkpoints every 2: finish() saves step 5, so the
        server killed after both trainers finished comes back at step 5 (not
        4), and trainers started again find nothing left to do."""
        workdir = tempfile.mkdtemp(prefix="finish_test")
        server = Server(workdir)
        server.start()
        finished, params = [None, None], [None, None]

        def body(rank, opt, model):
            self.train_to(opt, model, rank, 5)
            finished[rank] = opt.finish()
            params[rank] = [p.detach().clone() for p in model.parameters()]

        try:
            self.assertEqual(self.run_two(server, body), [])
            self.assertEqual(finished, [True, True])
            self.assertTrue(os.path.exists(os.path.join(
                server.checkpoints, "ending", "step-00000005", "manifest.json")))
            server.kill()
            server.start()
            again = [None, None]

            def restarted(rank, opt, model):
                again[rank] = opt.step_count
                self.train_to(opt, model, rank, 5)  # Nothing left.
                self.assertTrue(opt.finish())
                for a, b in zip(model.parameters(), params[rank]):
                    self.assertTrue(torch.equal(a.detach(), b))

            self.assertEqual(self.run_two(server, restarted), [])
            self.assertEqual(again, [5, 5])
        finally:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def test_finish_follows_a_rollback_and_the_job_ends_after_it(self):
        """The server is killed after step 5 and before finish(), and comes
        back at step 2 (step 4's checkpoint lost): the trainers hold no
        history, so finish() rolls the job back to 2 (False); they train
        steps 3-5 again and the second finish() saves step 5."""
        workdir = tempfile.mkdtemp(prefix="finish_rollback_test")
        server = Server(workdir)
        server.start()
        trained = threading.Barrier(3, timeout=60)
        restarted = threading.Barrier(3, timeout=60)
        outcomes = [[], []]

        def body(rank, opt, model):
            self.train_to(opt, model, rank, 5)
            trained.wait()
            restarted.wait()
            while True:
                done = opt.finish()
                outcomes[rank].append((done, opt.step_count))
                if done or len(outcomes[rank]) > 3:
                    break
                self.train_to(opt, model, rank, 5)

        caught = warnings.catch_warnings(record=True)
        seen = caught.__enter__()
        warnings.simplefilter("always")
        try:
            runner = threading.Thread(target=lambda: errors.extend(self.run_two(server, body)))
            errors = []
            runner.start()
            trained.wait()
            for _ in range(500):
                if os.path.exists(os.path.join(server.checkpoints, "ending", "step-00000004",
                                               "manifest.json")):
                    break
                time.sleep(0.01)
            server.kill()
            shutil.rmtree(os.path.join(server.checkpoints, "ending", "step-00000004"))
            server.start()
            restarted.wait()
            runner.join(timeout=150)
            self.assertFalse(runner.is_alive())
        finally:
            caught.__exit__(None, None, None)
            server.stop()
        self.assertEqual(errors, [])
        for rank in range(2):
            self.assertEqual(outcomes[rank], [(False, 2), (True, 5)], outcomes)
        messages = [str(w.message) for w in seen]
        self.assertEqual(len([m for m in messages if "rolled back to step 2" in m]), 2, messages)
        self.assertTrue(os.path.exists(os.path.join(
            server.checkpoints, "ending", "step-00000005", "manifest.json")))
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
