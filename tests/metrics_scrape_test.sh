#!/bin/sh
# Runs metrics_scrape_test.py with the .venv-tools Python (prometheus-client,
# the real grpcurl). $1: shardopt_server, $2: test_trainer.
if [ -z "$SHARDOPT_VENV" ] || [ ! -x "$SHARDOPT_VENV/bin/python" ]; then
  echo "SHARDOPT_VENV is not set or has no python: run through tools/run_tests.sh" >&2
  exit 1
fi
exec "$SHARDOPT_VENV/bin/python" tests/metrics_scrape_test.py "$@"
