#!/bin/sh
# Runs a fuzz target (built without libFuzzer) on its committed seed corpus.
# $1: the target, $2: its corpus directory.
set -e
count=$(ls "$2" | wc -l)
if [ "$count" -eq 0 ]; then echo "no seeds in $2" >&2; exit 1; fi
"$1" "$2"
