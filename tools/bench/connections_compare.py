"""Does a second connection per shard help? The pipelining issue asks for a
small pool of connections per shard "if one gRPC connection per shard is the
limit". This measures both halves of that question in one run:

  raw TCP    shardopt_bench's section (a): the same bytes over 1, 2 and 4
             loopback connections at once (a sender and a receiver thread
             each): what the transport itself gains from more connections;
  shardopt   one trainer (the C++ client through the Python binding, gRPC
             streams: shared_memory=False, socket_payloads=False) pushing, updating with Adam and
             pulling the same model on 1 shard server and on 2 (2 connections
             AND 2 server processes: more parallelism than a pool to one
             shard would give), interleaved over --rounds, medians.

If 2 shards are no faster than 1, a pool of connections to one shard cannot
be either on this machine: the limit is the CPU work of gRPC's transport on
both ends, not the connection.

    bash tools/bench/connections_compare.sh [--sizes_mib=64,256] [--rounds=3]
"""

import argparse
import re
import shutil
import statistics
import subprocess
import tempfile

from bench_steps import synthetic_model, time_steps

ADAM = {"lr": 1e-3}


def step_time(server_binary, shards, mib, seconds):
    """Median seconds of one trainer's step (push + Adam + pull) of `mib`."""
    import shardopt
    from shardopt.local_cluster import start_servers, stop_servers
    workdir = tempfile.mkdtemp(prefix="connections_compare")
    servers, addresses = start_servers(server_binary, shards, workdir, extra_flags=["--threads=0"])
    try:
        n = mib << 18
        client = shardopt.Client(addresses, 0, shared_memory=False, socket_payloads=False)
        params, grads = synthetic_model(n)
        client.register(f"c{shards}", [("w", [n])], "adam", ADAM, 1, 0.0, params)
        times, _ = time_steps(client, grads, params, seconds)
        del client
        return statistics.median(times)
    finally:
        stop_servers(servers)
        shutil.rmtree(workdir, ignore_errors=True)


def raw_tcp(bench_binary, tcp_mib):
    out = subprocess.run(
        [bench_binary, "--skip_push_pull", "--skip_optimizer", "--wire_mib=0",
         "--pipeline_sizes_mib=", "--transport_sizes_mib=", f"--tcp_mib={tcp_mib}",
         "--tcp_repeats=3", "--tcp_parallel_connections=2,4"],
        check=True, capture_output=True, text=True).stdout
    one = float(re.search(r"best \(used for ratios\)\s*\|?[\s|]*([\d.]+)", out).group(1))
    more = {int(c): float(g) for c, g in
            re.findall(r"(\d+) connections at once: best ([\d.]+) GB/s", out)}
    return one, more


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server_binary", required=True)
    parser.add_argument("--bench_binary", required=True)
    parser.add_argument("--sizes_mib", default="64,256")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per case and round")
    parser.add_argument("--tcp_mib", type=int, default=2048)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes_mib.split(",") if s]
    one, more = raw_tcp(args.bench_binary, args.tcp_mib)
    print(f"raw TCP loopback, best of 3: 1 connection {one:.2f} GB/s; " +
          "; ".join(f"{c} at once {g:.2f} GB/s in all ({g / one:.2f}x)"
                    for c, g in sorted(more.items())))
    times = {}
    for _ in range(args.rounds):
        for mib in sizes:
            for shards in (1, 2):
                times.setdefault((mib, shards), []).append(
                    step_time(args.server_binary, shards, mib, args.seconds))
    print(f"{'job':>8}  {'1 shard ms':>10}  {'2 shards ms':>11}  {'2 vs 1':>7}")
    for mib in sizes:
        a, b = statistics.median(times[(mib, 1)]), statistics.median(times[(mib, 2)])
        print(f"{mib:>4} MiB  {a * 1e3:>10.1f}  {b * 1e3:>11.1f}  {a / b:>6.2f}x")


if __name__ == "__main__":
    main()
