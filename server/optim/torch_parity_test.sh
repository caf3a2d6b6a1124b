#!/bin/sh
# Runs torch_parity_test.py with Debian's python3-torch (/usr/bin/python3, not
# whatever python3 is first on PATH). $1: the optimizer_replay binary.
exec /usr/bin/python3 server/optim/torch_parity_test.py "$@"
