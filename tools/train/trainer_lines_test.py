"""TrainerLines against real child processes: records come through; a wait
names the trainer that died (not the one waiting on it), the one that
ended, the one that sent nothing in time, and the one that would not exit."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainer_lines import TrainerLines  # noqa: E402


def trainer(script):
    return subprocess.Popen([sys.executable, "-c", "import json, sys, time\n" + script],
                            stdout=subprocess.PIPE, text=True)


RECORD = 'print(json.dumps({"step": 1}), flush=True)\n'
HANG = "time.sleep(60)\n"


class TrainerLinesTest(unittest.TestCase):
    def tearDown(self):
        for p in getattr(self, "processes", []):
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()

    def start(self, *scripts, timeout_s=30):
        self.processes = [trainer(s) for s in scripts]
        return TrainerLines(self.processes, timeout_s)

    def test_records_come_through_and_the_trainers_exit(self):
        lines = self.start(RECORD, RECORD + "sys.exit(3)\n")
        self.assertEqual(lines.next(0, "its step 1"), {"step": 1})
        self.assertEqual(lines.next(1, "its step 1"), {"step": 1})
        self.assertEqual(lines.finish(timeout_s=30), [0, 3])

    def test_the_trainer_that_died_is_named_not_the_one_waiting(self):
        lines = self.start(HANG, "sys.exit(7)\n")
        with self.assertRaisesRegex(RuntimeError,
                                    "trainer 1 exited with code 7 while trainer 0 was on its "
                                    "step 1"):
            lines.next(0, "its step 1")

    def test_a_trainer_that_ended_is_named_with_its_code(self):
        lines = self.start("sys.exit(0)\n", HANG)
        with self.assertRaisesRegex(RuntimeError, r"trainer 0 ended before its step 1 \(exit 0\)"):
            lines.next(0, "its step 1")

    def test_a_silent_trainer_is_named_after_the_timeout(self):
        lines = self.start(HANG, HANG, timeout_s=0.5)
        with self.assertRaisesRegex(RuntimeError,
                                    "trainer 1 sent nothing for its step 1 in 0.5 s"):
            lines.next(1, "its step 1")

    def test_a_trainer_that_does_not_exit_is_killed_and_named(self):
        lines = self.start(RECORD, RECORD + HANG)
        lines.next(0, "its step 1")
        lines.next(1, "its step 1")
        with self.assertRaisesRegex(RuntimeError, "trainer 1 did not exit within 0.5 s"):
            lines.finish(timeout_s=0.5)
        self.assertIsNotNone(self.processes[1].wait(timeout=10))


if __name__ == "__main__":
    unittest.main()
