#!/bin/sh
# Runs trainer_lines_test.py (the main job's reading of its trainers' records).
exec /usr/bin/python3 tools/train/trainer_lines_test.py "$@"
