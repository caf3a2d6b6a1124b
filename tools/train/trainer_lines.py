"""TrainerLines: the records (one JSON object per line) that trainer
processes print on stdout, read for the job that started them.

Each process's stdout is read on a thread of its own, so that a wait for
one trainer's next record also notices another trainer's death (a trainer
waiting on the shards for a dead peer is not the one to blame) and is
bounded. `next(rank, what)` returns trainer `rank`'s next record, or raises
RuntimeError naming the trainer and what was awaited: that trainer ended
(and its exit code), another one exited with an error meanwhile, or nothing
came within `timeout_s`. `finish(timeout_s)` waits for every trainer to
exit and returns their codes; one still running then is killed and named.
"""

import json
import queue
import subprocess
import threading
import time


class TrainerLines:
    """Trainer processes' JSON records, with bounded waits that say what they waited for."""

    def __init__(self, processes, timeout_s):
        self._processes = processes
        self._timeout_s = timeout_s
        self._queues = [queue.Queue() for _ in processes]
        for process, lines in zip(processes, self._queues):
            threading.Thread(target=self._read, args=(process.stdout, lines), daemon=True).start()

    @staticmethod
    def _read(stream, lines):
        for line in stream:
            lines.put(line)
        lines.put(None)  # End of the stream: the trainer exited (or closed it).

    def next(self, rank, what):
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                line = self._queues[rank].get(timeout=0.2)
            except queue.Empty:
                self._check_others(rank, what)
                if time.monotonic() > deadline:
                    raise RuntimeError(f"trainer {rank} sent nothing for {what} in "
                                       f"{self._timeout_s:g} s (it is still running)")
                continue
            if line is None:
                code = self._exit_code(rank)
                raise RuntimeError(f"trainer {rank} ended before {what} (exit {code})")
            return json.loads(line)

    def _check_others(self, rank, what):
        for other, process in enumerate(self._processes):
            code = process.poll()
            if other != rank and code not in (None, 0):
                raise RuntimeError(f"trainer {other} exited with code {code} while trainer "
                                   f"{rank} was on {what}")

    def _exit_code(self, rank):
        try:
            return self._processes[rank].wait(timeout=10)
        except subprocess.TimeoutExpired:
            return "unknown: it closed its output and is still running"

    def finish(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        codes = []
        for rank, process in enumerate(self._processes):
            try:
                codes.append(process.wait(timeout=max(0.0, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                process.kill()
                raise RuntimeError(f"trainer {rank} did not exit within {timeout_s:g} s of its "
                                   "last record (killed)") from None
        return codes
