"""Runs one test as a child process and says what it was doing if it hangs.

Usage: watchdog.py COMMAND [ARGS...]. tools/run_tests.sh puts every test
under it (bazel test --run_under), python/tests/run_python_test.sh every
Python test (which it runs unbuffered with faulthandler on, so that what it
printed before a hang reaches the log); a watchdog under a watchdog
(SHARDOPT_UNDER_WATCHDOG set) only runs its command. When the test has not
finished a margin before Bazel's timeout (TEST_TIMEOUT; DEFAULT_DEADLINE_S
outside Bazel; the margin a tenth of it, at most MARGIN_S), the watchdog
prints, for the test process and every process under it (the shard servers
it started), each thread's stack as gdb sees it (the frames in shardopt
code, and where each thread sleeps) and the end of each shard server's log
file (python/tests/support.py writes them), then SIGABRTs the test (a
Python test's faulthandler prints its Python stacks), kills what is left and
exits 1 naming the deadline. Without this, a test that hangs ends as
Bazel's bare TIMEOUT and its log says nothing.
Exit status: the child's, or 1 after a timeout.
"""

import glob
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

MARGIN_S = 20
UNDER_WATCHDOG = "SHARDOPT_UNDER_WATCHDOG"
SYMBOLS_OF = ("libc.so", "_shardopt", "libgrpc", "libgpr", "libabsl")  # (Name prefixes.)
DEFAULT_DEADLINE_S = 600
GDB_TIMEOUT_S = 5
FRAMES_PER_THREAD = 8
LOG_LINES = 10  # Of each shard server's log file.
FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(\S+)")
LOCATION = re.compile(r" (?:at|from) (\S+)$")


def children_of():
    """Parent pid -> child pids, from /proc."""
    tree = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The command may hold spaces and parentheses: split after its last ')'.
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        tree.setdefault(int(fields[1]), []).append(int(entry))
    return tree


def process_tree(root):
    tree, order, todo = children_of(), [], [root]
    while todo:
        pid = todo.pop(0)
        order.append(pid)
        todo.extend(tree.get(pid, []))
    return order


def command_of(pid):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            words = f.read().split(b"\0")
    except OSError:
        return "?"
    return " ".join(w.decode(errors="replace") for w in words[:3] if w)


def condensed_stacks(gdb_output):
    """One line per thread in shardopt code: where it sleeps, the first
    caller outside the C library, and its frames in shardopt code; the other
    threads are counted."""
    lines, thread, frames, in_libc_so_far = [], None, [], True

    others = 0

    def flush():
        nonlocal others
        if thread is None:
            return
        if any("shardopt" in f for f in frames):
            lines.append(f"  {thread}: " + " <- ".join(frames[:FRAMES_PER_THREAD]))
        else:
            others += 1

    for line in gdb_output.splitlines():
        if line.startswith("Thread "):
            flush()
            thread, frames, in_libc_so_far = line.split(" (", 1)[0], [], True
            continue
        m = FRAME.match(line)
        if not m or thread is None:
            continue
        where = LOCATION.search(line)
        place = os.path.basename(where.group(1)) if where else ""
        name = m.group(2).split("(", 1)[0] + (f" [{place}]" if place else "")
        in_libc = re.search(r"\.[cS]:\d+$|libc\.so", place) is not None
        # Where it sleeps, who called into the C library, and shardopt's frames.
        if m.group(1) == "0" or "shardopt" in line or (in_libc_so_far and not in_libc):
            frames.append(name)
        in_libc_so_far = in_libc_so_far and in_libc
    flush()
    if others:
        lines.append(f"  (and {others} thread(s) outside shardopt code: gRPC's, torch's, idle)")
    return lines


def print_server_logs(since):
    """The end of every shard server log support.Cluster wrote since `since`
    (a server that died is no process in the tree any more, but its log
    stays)."""
    pattern = os.path.join(tempfile.gettempdir(), "cluster*", "server*.log")
    for path in sorted(glob.glob(pattern)):
        if os.path.getmtime(path) < since:
            continue
        with open(path, errors="replace") as log:
            lines = log.read().splitlines()[-LOG_LINES:]
        print(f"watchdog: {path}, last {len(lines)} lines:", flush=True)
        for line in lines:
            print(f"    | {line}", flush=True)


def print_stacks(pid):
    print(f"watchdog: pid {pid} ({command_of(pid)}):", flush=True)
    try:
        gdb = subprocess.run(
            # Symbols of the libraries worth naming only: reading all of a
            # recent torch's takes gdb longer than the margin.
            ["gdb", "-batch", "-nx", "-p", str(pid), "-iex", "set auto-solib-add off",
             *[a for lib in SYMBOLS_OF for a in ("-ex", f"sharedlibrary {lib}")],
             "-ex", "set pagination off",
             "-ex", "thread apply all bt 40"],
            capture_output=True, text=True, timeout=GDB_TIMEOUT_S, check=False)
    except FileNotFoundError:
        print("  (no gdb on this machine: no native stacks)", flush=True)
        return
    except subprocess.TimeoutExpired:
        print(f"  (gdb did not answer in {GDB_TIMEOUT_S} s)", flush=True)
        return
    lines = condensed_stacks(gdb.stdout)
    if not lines:
        lines = [f"  (gdb could not read it: {gdb.stderr.strip().splitlines()[-1:]})"]
    print("\n".join(lines), flush=True)


def main():
    if len(sys.argv) < 2:
        print("usage: watchdog.py COMMAND [ARGS...]", file=sys.stderr)
        return 2
    command = sys.argv[1:]
    if os.environ.get(UNDER_WATCHDOG):
        os.execvp(command[0], command)  # (Watched already: the signals reach the test.)
    # A Python test by its script, anything else by its program.
    name = next((os.path.basename(a) for a in command if a.endswith(".py")),
                os.path.basename(command[0]))
    budget = float(os.environ.get("TEST_TIMEOUT", DEFAULT_DEADLINE_S))
    deadline_s = max(10.0, budget - min(MARGIN_S, budget / 10))
    child = subprocess.Popen(command, env={**os.environ, UNDER_WATCHDOG: "1"})
    # Bazel's own timeout sends SIGTERM: pass it on so the servers go too.
    signal.signal(signal.SIGTERM, lambda *_: child.terminate())
    start = time.monotonic()
    started_at = time.time()
    try:
        rc = child.wait(timeout=deadline_s)
        return rc if rc >= 0 else 128 - rc  # Killed by a signal: as a shell says it.
    except subprocess.TimeoutExpired:
        pass
    print(f"\nwatchdog: {name} did not finish within {deadline_s:.0f} s "
          f"({time.monotonic() - start:.0f} s since it started); the stacks of its processes:",
          flush=True)
    tree = process_tree(child.pid)
    for pid in reversed(tree):  # The servers first, the test (whose SIGABRT ends it) last.
        print_stacks(pid)
    print_server_logs(started_at)
    child.send_signal(signal.SIGABRT)  # faulthandler: the Python stacks of every thread.
    try:
        child.wait(timeout=3)
    except subprocess.TimeoutExpired:
        pass
    for pid in tree:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    print(f"watchdog: FAIL: {name} timed out after {deadline_s:.0f} s "
          "(stacks above)", flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
