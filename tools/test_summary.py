#!/usr/bin/env python3
"""Prints "N passed, N failed, N skipped" for a `bazel test` run.

Counts test cases from the JUnit XML files Bazel leaves under bazel-testlogs
(one per GoogleTest case; one per shell test), for the test targets the run
reported. A target that failed to build, timed out or crashed without XML
counts as one failed case. --extra names a file of "PASSED NAME" / "FAILED
NAME" lines for checks run outside this Bazel run (the fuzzers, the
sanitized tests' targets), one case each.
Exits 1 when anything failed or nothing ran. The end of each failed
target's test.log is printed just above the summary line, so that a log that
keeps only the tail of CI's output still says what a failure or a timeout
was doing, and below them every failed case's own failure messages (from
the XML; a long test's log tail may hold only what came after them).
"""
import argparse
import os
import re
import sys
import xml.etree.ElementTree as ET

RESULT = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED|TIMEOUT|NO STATUS|FLAKY|"
                    r"FAILED TO BUILD|INCOMPLETE|SKIPPED)\b")


FAILURE_TEXT_CHARS = 2000
MAX_FAILED_CASES_SHOWN = 10


def count_xml(path, failures=None):
    """Returns (passed, failed, skipped) test cases in one JUnit XML file;
    appends (case name, failure text) of each failed case to `failures`."""
    root = ET.parse(path).getroot()
    passed = failed = skipped = 0
    for case in root.iter("testcase"):
        problems = case.findall("failure") + case.findall("error")
        if problems:
            failed += 1
            if failures is not None:
                name = f"{case.get('classname', '')}.{case.get('name', '')}".strip(".")
                text = "\n".join((p.text or p.get("message") or "").strip() for p in problems)
                failures.append((name, text[:FAILURE_TEXT_CHARS]))
        elif (case.get("result") in ("suppressed", "skipped") or
              case.find("skipped") is not None):
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


LOG_TAIL_LINES = 60


def print_log_tail(target, path):
    """The last LOG_TAIL_LINES lines of a failed target's test.log."""
    if not os.path.exists(path):
        print(f"--- {target}: no test.log at {path}")
        return
    with open(path, errors="replace") as log:
        lines = log.read().splitlines()[-LOG_TAIL_LINES:]
    print(f"--- {target}: the last {len(lines)} lines of its test.log")
    for line in lines:
        print(f"  | {line}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bazel_log", required=True)
    parser.add_argument("--testlogs", required=True)
    parser.add_argument("--extra", default="")
    args = parser.parse_args()
    sys.stdout.reconfigure(errors="replace")  # (Test output in any encoding.)

    passed = failed = skipped = 0
    targets = {}
    failed_logs = []
    failed_cases = []
    with open(args.bazel_log, errors="replace") as log:
        for line in log:
            m = RESULT.match(line.strip())
            if m:
                targets[m.group(1)] = m.group(2)
    for target, status in sorted(targets.items()):
        if status == "SKIPPED":
            print(f"skipped (incompatible on this machine): {target}")
            continue
        rel = target[2:].replace(":", "/")
        xml = os.path.join(args.testlogs, rel, "test.xml")
        p = f = k = 0
        if status in ("PASSED", "FAILED", "FLAKY") and os.path.exists(xml):
            try:
                p, f, k = count_xml(xml, failed_cases)
            except ET.ParseError:
                p, f, k = 0, 0, 0
        if status not in ("PASSED", "FLAKY") and f == 0:
            f = 1  # Failed to build, timed out, or crashed before writing XML.
        if f:
            failed_logs.append((target, os.path.join(args.testlogs, rel, "test.log")))
        if p + f + k == 0:
            p = 1  # A passing target without cases (e.g. a script): one case.
        if k:
            print(f"{k} test cases skipped in {target} (see its test.log for why)")
        passed += p
        failed += f
        skipped += k
    if not targets:
        print("no test results found in the bazel log", file=sys.stderr)
        failed += 1
    if args.extra and os.path.exists(args.extra):
        with open(args.extra) as extra:
            for line in extra:
                word = line.split()[0] if line.strip() else ""
                if word == "PASSED":
                    passed += 1
                elif word == "FAILED":
                    print(f"failed outside bazel: {line.strip()}")
                    failed += 1
    for target, path in failed_logs:
        print_log_tail(target, path)
    if len(failed_cases) > MAX_FAILED_CASES_SHOWN:
        print(f"--- {len(failed_cases)} failed cases; the messages of the first "
              f"{MAX_FAILED_CASES_SHOWN}:")
    for name, text in failed_cases[:MAX_FAILED_CASES_SHOWN]:
        print(f"--- failed case {name}:")
        for line in text.splitlines():
            print(f"  ! {line}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
