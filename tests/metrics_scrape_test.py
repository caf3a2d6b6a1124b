"""A live cluster's /metrics pages, scraped during training and parsed with
prometheus-client's parser, agree with Inspect (read with the real grpcurl).

Two shard servers with --metrics_listen, two paced trainers (40 steps, global
norm clipping); a stranger posing as trainer 1 pushes a step far ahead
(refused: OUT_OF_RANGE) and opens a push it never finishes (abandoned when the
idle-stream watchdog cancels it; the real trainer 1 is refused meanwhile). Checks: every page parses; counters never go down between
scrapes; /healthz is 200; at the end, per shard, steps applied / skipped, the
version, bytes received and sent, each trainer's last pushed step equal
Inspect's, the pushes counted per trainer equal the trainers' steps, the
calls counted per method match, and the stranger's pushes are counted
against trainer 1 as refused and abandoned.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

SERVER, TRAINER = sys.argv[1], sys.argv[2]
GRPCURL = os.path.join(os.environ["SHARDOPT_VENV"], "bin", "grpcurl")
STEPS = 40
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)


def start_server(index, tmp):
    port_file = os.path.join(tmp, f"port{index}")
    log = open(os.path.join(tmp, f"server{index}.log"), "w+")
    proc = subprocess.Popen(
        [SERVER, "--listen=127.0.0.1:0", f"--port_file={port_file}", f"--shard_index={index}",
         "--shard_count=2", "--threads=1", "--device=cpu", "--metrics_listen=127.0.0.1:0",
         "--stream_idle_timeout_s=2"], stderr=log)
    deadline = time.time() + 30
    while time.time() < deadline:
        log.seek(0)
        found = re.search(r"serving on port (\d+).*metrics on port (\d+)", log.read())
        if found:
            return proc, f"127.0.0.1:{found.group(1)}", int(found.group(2))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    raise SystemExit(f"shard {index} did not report its ports in 30 s")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
        check(page.headers["Content-Type"].startswith("text/plain; version=0.0.4"),
              f"content type {page.headers['Content-Type']}")
        text = page.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples


def value(samples, name, **labels):
    return samples.get((name, tuple(sorted(labels.items()))))


def total(samples, name, **labels):
    return sum(v for (n, ls), v in samples.items()
               if n == name and all(dict(ls).get(k) == w for k, w in labels.items()))


def grpcurl(address, method, request):
    out = subprocess.run([GRPCURL, "-plaintext", "-d", json.dumps(request), address, method],
                         capture_output=True, text=True, timeout=60)
    return out.returncode, out.stdout + out.stderr


def main():
    tmp = tempfile.mkdtemp(prefix="metrics", dir=os.environ.get("TEST_TMPDIR"))
    servers = [start_server(i, tmp) for i in range(2)]
    addresses = [a for _, a, _ in servers]
    def trainer(rank):
        return subprocess.Popen(
            [TRAINER, "--servers=" + ",".join(addresses), f"--rank={rank}", "--num_trainers=2",
             "--models=adamw", f"--steps={STEPS}", "--max_grad_norm=1", "--min_step_time=100ms",
             "--out_dir=" + tmp])

    # Trainer 0 registers; before trainer 1 starts, a stranger posing as it
    # pushes a step far ahead (refused) and opens the push of step 1, which
    # it never finishes: trainer 1's own push is refused (ABORTED) until the
    # idle-stream watchdog (2 s) cancels the stranger's (abandoned).
    trainers = [trainer(0)]
    deadline = time.time() + 30
    while True:
        rc, out = grpcurl(addresses[0], "shardopt.v1.ShardService/Inspect", {"model_id": "adamw"})
        if rc == 0 or time.time() > deadline:
            break
        time.sleep(0.1)
    check(rc == 0, f"model not registered on shard 0 within 30 s: {out}")
    shard = json.loads(out)
    size = int(shard["range"]["end"]) - int(shard["range"].get("begin", 0))
    rc, out = grpcurl(addresses[0], "shardopt.v1.ShardService/PushGradients",
                      {"header": {"model_id": "adamw", "trainer_rank": 1, "step": 1000,
                                  "num_elements": size}})
    check("OutOfRange" in out, f"push far ahead: {out}")
    stalled = subprocess.Popen(
        [GRPCURL, "-plaintext", "-max-time", "20", "-d", "@", addresses[0],
         "shardopt.v1.ShardService/PushGradients"],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    stalled.stdin.write(json.dumps({"header": {"model_id": "adamw", "trainer_rank": 1, "step": 1,
                                               "num_elements": size}}) + "\n")
    stalled.stdin.flush()
    time.sleep(0.5)
    trainers.append(trainer(1))

    previous = [None, None]
    scrapes = 0
    while any(t.poll() is None for t in trainers) and scrapes < 200:
        for i, (_, _, port) in enumerate(servers):
            samples = scrape(port)
            if previous[i] is not None:
                for key, v in previous[i].items():
                    if key[0].endswith("_total") and key in samples:
                        check(samples[key] >= v, f"shard {i}: {key} went down: {v} -> {samples[key]}")
            previous[i] = samples
        scrapes += 1
        time.sleep(0.2)
    for r, t in enumerate(trainers):
        check(t.wait(timeout=300) == 0, f"trainer {r} failed")
    check(scrapes >= 3, f"only {scrapes} scrapes during training")
    stalled.kill()
    stalled.wait()

    # A request with a body (announced as 1 GiB, or chunked without end) is
    # refused at once (405) without the server reading it (a GET's is not
    # read); /metrics still answers.
    for request, code in [
            (b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n", "405"),
            (b"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
             b"10000\r\n" + b"x" * 4096, "405")]:
        with socket.create_connection(("127.0.0.1", servers[0][2]), timeout=10) as s:
            started = time.monotonic()
            s.sendall(request)
            status = s.recv(64).decode(errors="replace")
        took = time.monotonic() - started
        check(status.startswith("HTTP/1.1 " + code) and took < 1.5,
              f"{request[:40]!r}: {status!r} after {took:.1f} s")

    for i, (proc, address, port) in enumerate(servers):
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
            check(health.status == 200 and health.read().decode().strip() == "SERVING",
                  f"shard {i}: /healthz")
        samples = scrape(port)
        rc, out = grpcurl(address, "shardopt.v1.ShardService/Inspect", {"model_id": "adamw"})
        check(rc == 0, f"shard {i}: Inspect: {out}")
        inspect = json.loads(out)
        m = {"model": "adamw"}
        # (A fresh job: the steps this server applied are the model's.)
        for metric, field in [("shardopt_steps_applied_total", "optimizer_steps"),
                              ("shardopt_model_optimizer_steps", "optimizer_steps"),
                              ("shardopt_model_version", "version")]:
            check(value(samples, metric, **m) == int(inspect.get(field, 0)) == STEPS,
                  f"shard {i}: {metric} {value(samples, metric, **m)} vs Inspect {field} "
                  f"{inspect.get(field)}")
        check(value(samples, "shardopt_steps_skipped_total", **m) ==
              int(inspect.get("skipped_steps", 0)), f"shard {i}: skipped")
        check(value(samples, "shardopt_gradient_bytes_received_total", **m) ==
              int(inspect["bytes"]["gradient_bytes_received"]), f"shard {i}: bytes received")
        check(value(samples, "shardopt_parameter_bytes_sent_total", **m) ==
              int(inspect["bytes"]["parameter_bytes_sent"]), f"shard {i}: bytes sent")
        check(value(samples, "shardopt_state_bytes", kind="parameters", **m) ==
              int(inspect["bytes"]["parameter_bytes"]), f"shard {i}: parameter bytes")
        for t in inspect["trainers"]:
            rank = str(t.get("rank", 0))
            check(value(samples, "shardopt_trainer_last_pushed_step", trainer=rank, **m) ==
                  int(t["last_pushed_step"]) == STEPS, f"shard {i}: trainer {rank} last step")
            check(value(samples, "shardopt_trainer_lag_steps", trainer=rank, **m) == 0,
                  f"shard {i}: trainer {rank} lag")
            # Each step once; the stranger's repeats of pushed steps are
            # answered without staging.
            staged = total(samples, "shardopt_pushes_total", trainer=rank, **m) - sum(
                total(samples, "shardopt_pushes_total", trainer=rank, outcome=o, **m)
                for o in ("duplicate", "already_applied"))
            check(staged == STEPS, f"shard {i}: trainer {rank} staged {staged} pushes: " + str(
                {k: v for k, v in samples.items() if k[0].startswith("shardopt_pushes")}))
        method = {"service": "shardopt.v1.ShardService"}
        check(total(samples, "shardopt_rpc_handled_total", method="PushGradients", code="OK",
                    **method) == total(samples, "shardopt_pushes_total", **m),
              f"shard {i}: PushGradients OK calls vs pushes counted")
        check(total(samples, "shardopt_rpc_duration_seconds_count", method="PushGradients",
                    **method) == total(samples, "shardopt_rpc_handled_total",
                                       method="PushGradients", **method),
              f"shard {i}: push latency count vs calls")
        check(total(samples, "shardopt_pulls_total", **m) >= 2 * STEPS, f"shard {i}: pulls")
        check(value(samples, "shardopt_grad_norm", **m) > 0, f"shard {i}: grad norm")
        for metric, field, default in [
                ("shardopt_last_lr", "last_lr", 0),
                ("shardopt_loss_scale", "last_loss_scale", 0),
                ("shardopt_newest_committed_checkpoint_step", "newest_committed_checkpoint", 0)]:
            check(value(samples, metric, **m) == float(inspect.get(field, default)),
                  f"shard {i}: {metric} {value(samples, metric, **m)} vs Inspect {field} "
                  f"{inspect.get(field)}")
        check(value(samples, "shardopt_shard_info", shard_index=str(i), shard_count="2",
                    device="cpu") == 1, f"shard {i}: info")
        if i == 0:
            check(value(samples, "shardopt_pushes_refused_total", code="OUT_OF_RANGE",
                        trainer="1", **m) == 1, "the stranger's push far ahead is counted")
            check(value(samples, "shardopt_pushes_abandoned_total", trainer="1", **m) == 1,
                  "the stranger's stalled push is counted as abandoned")
            check((value(samples, "shardopt_pushes_refused_total", code="ABORTED", trainer="1",
                         **m) or 0) >= 1, "trainer 1's pushes refused meanwhile are counted")
        proc.terminate()
        proc.wait(timeout=30)
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"metrics agree with Inspect on both shards after {scrapes} scrapes during training")
    return 0


if __name__ == "__main__":
    sys.exit(main())
