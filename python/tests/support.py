"""Test support: shard server processes on 127.0.0.1 (ports picked free)."""

import os
import subprocess
import tempfile
import time


def server_binary():
    path = os.environ.get("SHARDOPT_SERVER")
    if not path or not os.access(path, os.X_OK):
        raise RuntimeError("SHARDOPT_SERVER must name the shardopt_server binary")
    return path


class Cluster:
    """S shard servers (shard i of S), stopped on exit; `addresses` in order."""

    def __init__(self, shards, extra_flags=()):
        self.dir = tempfile.mkdtemp(prefix="cluster")
        self.procs = []
        self.addresses = []
        for i in range(shards):
            port_file = os.path.join(self.dir, f"port{i}")
            # A file, not the test's log: what a server said is there for
            # the watchdog (watchdog.py) and for a failed start.
            log_path = os.path.join(self.dir, f"server{i}.log")
            with open(log_path, "w") as log:
                self.procs.append(subprocess.Popen(
                    [server_binary(), "--listen=127.0.0.1:0", f"--port_file={port_file}",
                     f"--shard_index={i}", f"--shard_count={shards}", "--device=cpu",
                     "--threads=1", "--pipeline_range_elements=64", *extra_flags],
                    stdout=subprocess.DEVNULL, stderr=log))
            deadline = time.time() + 30
            while not os.path.exists(port_file):
                if time.time() > deadline or self.procs[-1].poll() is not None:
                    self.stop()
                    with open(log_path) as log:
                        said = log.read()[-2000:]
                    raise RuntimeError(f"shard server {i} did not start; it said:\n{said}")
                time.sleep(0.01)
            with open(port_file) as f:
                self.addresses.append(f"127.0.0.1:{f.read().strip()}")

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
