"""shardopt.local_cluster: real shard servers start and stop; a process
that ignores SIGTERM is killed after the stop's timeout, named."""

import contextlib
import io
import subprocess
import sys
import tempfile
import time
import unittest

from shardopt.local_cluster import start_servers, stop_servers
from support import server_binary


class LocalClusterTest(unittest.TestCase):
    def test_servers_start_and_stop(self):
        servers, addresses = start_servers(server_binary(), 2, tempfile.mkdtemp())
        self.assertEqual(len(addresses), 2)
        self.assertTrue(all(a.startswith("127.0.0.1:") for a in addresses))
        stop_servers(servers)
        self.assertTrue(all(s.poll() is not None for s in servers))

    def test_a_server_that_ignores_sigterm_is_killed_after_the_timeout(self):
        stubborn = subprocess.Popen([sys.executable, "-c",
                                     "import signal, sys, time\n"
                                     "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                     "print('ready', flush=True)\n"
                                     "time.sleep(60)\n"], stdout=subprocess.PIPE)
        self.assertEqual(stubborn.stdout.readline().strip(), b"ready")
        said = io.StringIO()
        start = time.time()
        with contextlib.redirect_stderr(said):
            stop_servers([stubborn], timeout_s=1)
        self.assertLess(time.time() - start, 20)
        self.assertIsNotNone(stubborn.poll())
        self.assertIn(f"shard server 0 (pid {stubborn.pid}) did not exit within 1 s",
                      said.getvalue())
        stubborn.stdout.close()

    def test_a_server_that_does_not_start_is_named(self):
        with self.assertRaisesRegex(RuntimeError, "shard server 0 did not start"):
            start_servers([sys.executable, "-c", "import sys; sys.exit(3)"], 1,
                          tempfile.mkdtemp())


if __name__ == "__main__":
    sys.exit(unittest.main(verbosity=2))
