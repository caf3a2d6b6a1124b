"""Shard servers on 127.0.0.1 for examples, benchmarks and the main job.

    servers, addresses = start_servers(binary, 2, workdir)
    ...  # shardopt.torch.DistributedOptimizer(..., servers=addresses, ...)
    stop_servers(servers)

Each server picks a free port and reports it through a port file in
`workdir` (which must not hold one from an earlier start); its stderr goes to
`workdir`/server<i>.log. stop_servers ends them with SIGTERM, and with
SIGKILL one that is still running after its timeout (saying which).
"""

import os
import subprocess
import sys
import time


def start_servers(binary, count, workdir, extra_flags=(), timeout_s=30, env_of=None):
    """Starts shards 0..count-1 of `count`; returns (processes, addresses).

    `binary`: the server's path, or a command (a list) that runs it, such as a
    wrapper that sets its libraries up. `env_of(i)`: shard i's environment
    (default: this process's).
    """
    command = list(binary) if isinstance(binary, (list, tuple)) else [binary]
    servers, addresses = [], []
    try:
        for i in range(count):
            port_file = os.path.join(workdir, f"port{i}")
            if os.path.exists(port_file):
                raise RuntimeError(f"{port_file} exists: use a fresh directory")
            # (The server writes its own copy of the log's descriptor.)
            with open(os.path.join(workdir, f"server{i}.log"), "w") as log:
                servers.append(subprocess.Popen(
                    [*command, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                     f"--shard_index={i}", f"--shard_count={count}", "--device=cpu",
                     "--threads=1", *extra_flags],
                    stderr=log, env=None if env_of is None else env_of(i)))
            deadline = time.time() + timeout_s
            while not os.path.exists(port_file):
                if time.time() > deadline or servers[-1].poll() is not None:
                    raise RuntimeError(f"shard server {i} did not start within {timeout_s} s "
                                       f"(no {port_file}; see {workdir}/server{i}.log)")
                time.sleep(0.01)
            with open(port_file) as port:
                addresses.append("127.0.0.1:" + port.read().strip())
    except BaseException:
        stop_servers(servers)
        raise
    return servers, addresses


def stop_servers(servers, timeout_s=30):
    """SIGTERM to every server still running; SIGKILL to one that has not
    exited `timeout_s` after it (said on stderr, naming it)."""
    for s in servers:
        if s.poll() is None:
            s.terminate()
    deadline = time.time() + timeout_s
    for i, s in enumerate(servers):
        try:
            s.wait(timeout=max(0.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            sys.stderr.write(f"local_cluster: shard server {i} (pid {s.pid}) did not exit within "
                             f"{timeout_s} s of SIGTERM: killed\n")
            s.kill()
            s.wait()
