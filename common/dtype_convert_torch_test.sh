#!/bin/sh
# Runs dtype_convert_torch_test.py with Debian's python3-torch (/usr/bin/python3).
# $1: the dtype_convert_tool binary.
exec /usr/bin/python3 common/dtype_convert_torch_test.py "$@"
