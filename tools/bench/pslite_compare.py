"""shardopt against ps-lite (dmlc/ps-lite), side by side in one run.

    bash tools/bench/pslite_compare.sh --pslite=DIR [--sizes_mib=64,256] [--rounds=4]

DIR is a ps-lite source tree or git directory (e.g. a `git clone
https://github.com/dmlc/ps-lite`; nothing is downloaded here); without
--pslite only shardopt and raw TCP run (the smoke test does that). Its sources
are copied into a temporary folder and built there with Debian's protobuf and
ZeroMQ (libzmq3-dev, installed by this script when missing and run as root),
together with tools/bench/pslite/adam_kv_bench.cc; none of it enters the
repository or shardopt's build.

Every job is 1 trainer (worker) and 1 server process on 127.0.0.1 doing
push + Adam + pull of --sizes_mib MiB of fp32 per step:

  ps-lite pipelined  the values split into --key_mib keys, every push in
                     flight at once, each key pulled as soon as its push is
                     acknowledged (the server updates each key as it
                     arrives);
  ps-lite single     the whole gradient as one key (one message each way);
  shardopt           shardopt_server (defaults: ranges updated as they
                     arrive) and the C++ client through the Python binding
                     (overlap_pull on: the pull streams during the push),
                     payloads in the gRPC streams (shared_memory=False,
                     socket_payloads=False);
  shardopt socket    the same with payloads over the server's payload socket
                     (plain TCP; shared_memory=False: the default data plane
                     of a trainer on another host over plaintext);
  shardopt shm       the same with payloads through shared memory, the
                     trainer computing in the client's shared buffers (the
                     default data plane of a trainer on the server's host);
  raw TCP            shardopt_bench's (a), one direction, best repetition.

The jobs alternate over --rounds rounds (the machine's noise falls on all);
the table gives each job's median step time, its payload rate (push + pull
bytes, both directions counted, over the median step) and that rate over raw
TCP's, and each shardopt job's speed over each ps-lite mode; below it, each
job's rate in each round over raw TCP's in the same round.
"""

import argparse
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

import numpy as np

from bench_steps import synthetic_model, time_steps

HERE = os.path.dirname(os.path.abspath(__file__))
ADAM = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0,
        "amsgrad": False, "maximize": False}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(cmd, **kwargs):
    result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            **kwargs)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({result.returncode}):\n{result.stdout}")
    return result.stdout


def ensure_zeromq():
    if os.path.exists("/usr/include/zmq.h"):
        return
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        raise RuntimeError("ps-lite needs ZeroMQ's headers: apt-get install libzmq3-dev")
    print("installing libzmq3-dev (ps-lite's transport) ...", flush=True)
    run(["apt-get", "install", "-y", "-q", "libzmq3-dev"],
        env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"))


def build_pslite(source, workdir):
    """Builds ps-lite and the Adam bench from `source`; returns the binary."""
    src = os.path.join(workdir, "ps-lite")
    if os.path.isdir(os.path.join(source, "objects")) and os.path.exists(
            os.path.join(source, "HEAD")):  # A bare git directory.
        os.makedirs(src)
        archive = subprocess.run(["git", f"--git-dir={source}", "archive", "HEAD"],
                                 stdout=subprocess.PIPE, check=True).stdout
        subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    else:
        shutil.copytree(source, src, ignore=shutil.ignore_patterns(".git", "build", "deps"))
    for needed in ("src/meta.proto", "include/ps/ps.h", "src/van.cc"):
        if not os.path.exists(os.path.join(src, needed)):
            raise RuntimeError(f"{source} is not a ps-lite source tree (no {needed})")
    run(["protoc", "--cpp_out=src", "--proto_path=src", "src/meta.proto"], cwd=src)
    flags = ["-O3", "-std=c++14", "-fPIC", "-w", "-Isrc", "-Iinclude"]
    objects = []
    for name in ("customer", "postoffice", "van", "meta.pb"):
        obj = os.path.join(workdir, name + ".o")
        run(["g++", *flags, "-c", f"src/{name}.cc", "-o", obj], cwd=src)
        objects.append(obj)
    binary = os.path.join(workdir, "adam_kv_bench")
    run(["g++", *flags, os.path.join(HERE, "pslite", "adam_kv_bench.cc"), *objects, "-o", binary,
         "-lzmq", "-lprotobuf", "-pthread"], cwd=src)
    return binary


def time_pslite(binary, mib, key_mib, seconds):
    port = free_port()
    env = dict(os.environ, DMLC_NUM_SERVER="1", DMLC_NUM_WORKER="1",
               DMLC_PS_ROOT_URI="127.0.0.1", DMLC_PS_ROOT_PORT=str(port),
               DMLC_NODE_HOST="127.0.0.1", DMLC_INTERFACE="lo")
    args = [binary, f"--mib={mib}", f"--key_mib={key_mib}", f"--seconds={seconds}"]
    procs = {role: subprocess.Popen(args, env=dict(env, DMLC_ROLE=role), stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)
             for role in ("scheduler", "server", "worker")}
    try:
        out, _ = procs["worker"].communicate(timeout=300)
        for role in ("scheduler", "server"):
            procs[role].wait(timeout=60)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    match = re.search(r"RESULT steps=(\d+) median_ms=([\d.]+) min_ms=([\d.]+)", out or "")
    if procs["worker"].returncode != 0 or not match:
        raise RuntimeError(f"ps-lite worker ({mib} MiB, key_mib {key_mib}) failed:\n{out}")
    return int(match.group(1)), float(match.group(2)) / 1e3, float(match.group(3)) / 1e3


def time_shardopt(server_binary, mib, seconds, name, plane):
    import shardopt
    from shardopt.local_cluster import start_servers, stop_servers
    workdir = tempfile.mkdtemp(prefix="pslite_compare_shardopt")
    servers, addresses = start_servers(server_binary, 1, workdir, extra_flags=["--threads=0"])
    try:
        n = mib << 18
        shared_memory = plane == "shm"
        client = shardopt.Client(addresses, 0, shared_memory=shared_memory,
                                 socket_payloads=plane == "socket")
        params, grads = synthetic_model(n)
        client.register(name, [("w", [n])], "adam", ADAM, 1, 0.0, params)
        if shared_memory:
            shared_grads = client.shared_gradients()
            if shared_grads is None:
                raise RuntimeError("the client got no shared memory")
            shared_params = np.frombuffer(client.shared_parameters(), dtype=np.float32)
            np.frombuffer(shared_grads, dtype=np.float32)[:] = grads
            shared_params[:] = params
            grads, params = np.frombuffer(shared_grads, dtype=np.float32), shared_params
        times, step = time_steps(client, grads, params, seconds)
        if shared_memory and client.shared_memory_transfers < 2 * step:
            raise RuntimeError("shardopt's payloads did not all go through shared memory")
        if plane == "socket" and client.socket_transfers < 2 * step:
            raise RuntimeError("shardopt's payloads did not all go over the payload socket")
        del client
        return len(times), statistics.median(times), min(times)
    finally:
        stop_servers(servers)
        shutil.rmtree(workdir, ignore_errors=True)


def raw_tcp(bench_binary, tcp_mib):
    out = run([bench_binary, "--skip_push_pull", "--skip_optimizer", "--wire_mib=0",
               "--pipeline_sizes_mib=", "--transport_sizes_mib=", f"--tcp_mib={tcp_mib}", "--tcp_repeats=3"])
    match = re.search(r"best \(used for ratios\)\s*\|?[\s|]*([\d.]+)", out)
    if not match:
        raise RuntimeError(f"no raw TCP result in:\n{out}")
    return float(match.group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pslite", default="",
                        help="a ps-lite source tree or git directory (none: shardopt only)")
    parser.add_argument("--sizes_mib", default="64,256")
    parser.add_argument("--key_mib", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=3.0, help="per job and round")
    parser.add_argument("--tcp_mib", type=int, default=512, help="per raw TCP repetition")
    parser.add_argument("--server_binary", default="bazel-bin/server/shardopt_server")
    parser.add_argument("--bench_binary", default="bazel-bin/tools/bench/shardopt_bench")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",") if s]

    workdir = tempfile.mkdtemp(prefix="pslite_compare")
    try:
        if args.pslite:
            ensure_zeromq()
            print(f"building ps-lite from {args.pslite} in {workdir} ...", flush=True)
            binary = build_pslite(os.path.abspath(args.pslite), workdir)
            jobs = ["ps-lite pipelined", "ps-lite single", "shardopt", "shardopt socket",
                    "shardopt shm"]
        else:
            print("no --pslite given: shardopt and raw TCP only", flush=True)
            jobs = ["shardopt", "shardopt socket", "shardopt shm"]
        times = {(mib, job): [] for mib in sizes for job in jobs}
        tcp = []
        for r in range(args.rounds):
            tcp.append(raw_tcp(args.bench_binary, args.tcp_mib))
            for mib in sizes:
                for job in jobs:
                    if job.startswith("shardopt"):
                        plane = job.split()[1] if " " in job else "grpc"
                        _, median, _ = time_shardopt(args.server_binary, mib, args.seconds,
                                                     f"cmp{r}_{mib}", plane)
                    else:
                        key_mib = args.key_mib if job == "ps-lite pipelined" else 0
                        _, median, _ = time_pslite(binary, mib, key_mib, args.seconds)
                    times[(mib, job)].append(median)
            print(f"round {r + 1}/{args.rounds}: raw TCP {tcp[-1]:.2f} GB/s; " + "; ".join(
                f"{mib} MiB " + ", ".join(f"{job} {times[(mib, job)][-1] * 1e3:.0f} ms"
                                          for job in jobs) for mib in sizes), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    tcp_median = statistics.median(tcp)
    print(f"\n1 trainer, 1 server, Adam, fp32; medians over {args.rounds} interleaved rounds "
          f"(each round's value is that job's median step); raw TCP {tcp_median:.2f} GB/s "
          f"(median of the rounds' bests)")
    print(f"  {'size':>8s}  {'job':18s} {'median ms':>10s} {'GB/s':>7s} {'vs TCP':>7s} "
          f"{'shardopt is':>12s} {'socket is':>10s} {'shm is':>8s}")
    for mib in sizes:
        ours = statistics.median(times[(mib, "shardopt")])
        socket_median = statistics.median(times[(mib, "shardopt socket")])
        shm = statistics.median(times[(mib, "shardopt shm")])
        for job in jobs:
            median = statistics.median(times[(mib, job)])
            gbps = 2 * mib * (1 << 20) / median / 1e9
            speed = "" if job == "shardopt" else f"{median / ours:.2f}x"
            socket_speed = "" if job == "shardopt socket" else f"{median / socket_median:.2f}x"
            shm_speed = "" if job == "shardopt shm" else f"{median / shm:.2f}x"
            print(f"  {mib:5d} MiB  {job:18s} {median * 1e3:10.1f} {gbps:7.2f} "
                  f"{gbps / tcp_median:6.2f}x {speed:>12s} {socket_speed:>10s} {shm_speed:>8s}")
    # Each round's job against the raw TCP of the same round: the machine's
    # drift over the run falls on both sides of each ratio.
    print("\nvs raw TCP round by round (min / median / max):")
    for mib in sizes:
        for job in jobs:
            ratios = sorted(2 * mib * (1 << 20) / t / 1e9 / rate
                            for t, rate in zip(times[(mib, job)], tcp))
            print(f"  {mib:5d} MiB  {job:18s} {ratios[0]:.2f}x / {statistics.median(ratios):.2f}x / "
                  f"{ratios[-1]:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
