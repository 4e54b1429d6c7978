"""The test suite on a busy machine: pytest beside CPU-bound hogs, or pinned to one core.

Not a benchmark of the store: it checks that no test assumes something happens "by now".
A test that passes on an idle machine but fails here waits for a condition by sleeping, or
bounds a wall time it cannot own; it is a flaky test, to be fixed by waiting for the
condition it needs (see ``wait_for`` in tests/store_processes.py).

    python bench/loaded_suite.py [--hogs 1] [--one-core] [--runs 1] [--json] [-- PYTEST ARGS]

``--hogs N`` starts N plain Python busy loops beside the suite (on this 2-core machine one
hog takes half the CPU, two take all of it but what the scheduler shares out);
``--one-core`` runs the suite under ``taskset -c 0``, with the hogs pinned to the same
core. Each run prints its outcome and the failing tests; the exit code is 0 when every run
passed, 1 when one failed, 2 on a usage error. Arguments after ``--`` go to pytest (e.g.
``-- tests/test_cli.py -x``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOG = "while True: pass"
FAILED = re.compile(r"^(?:FAILED|ERROR) (\S+)", re.MULTILINE)
SUMMARY = re.compile(r"^=*\s*(.*\d+ (?:passed|failed|error).*?)\s*=*$", re.MULTILINE)


@dataclass
class Run:
    """One pytest run under load: its exit code, summary line, failures and wall time."""

    number: int
    returncode: int
    summary: str
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.returncode == 0


def _pinned(argv: list[str], one_core: bool) -> list[str]:
    """``argv`` under ``taskset -c 0`` when the run is pinned to one core."""
    return ["taskset", "-c", "0", *argv] if one_core else argv


def start_hogs(count: int, one_core: bool) -> list[subprocess.Popen]:
    """``count`` busy-looping Python processes (pinned beside the suite when asked)."""
    return [subprocess.Popen(_pinned([sys.executable, "-c", HOG], one_core))
            for _ in range(count)]


def stop_hogs(hogs: list[subprocess.Popen]) -> None:
    for hog in hogs:
        hog.kill()
    for hog in hogs:
        hog.wait()


def run_suite(number: int, pytest_args: list[str], one_core: bool) -> Run:
    """One pytest run; its output streams to stderr, its verdict comes back as a ``Run``."""
    argv = _pinned([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                    *pytest_args], one_core)
    started = time.monotonic()
    lines = []
    with subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as proc:
        for line in proc.stdout:
            sys.stderr.write(line)
            lines.append(line)
    output = "".join(lines)
    summaries = SUMMARY.findall(output)
    return Run(number, proc.returncode, summaries[-1] if summaries else "(no summary)",
               round(time.monotonic() - started, 1), sorted(set(FAILED.findall(output))))


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    pytest_args: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, pytest_args = argv[:cut], argv[cut + 1:]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hogs", type=int, default=1, help="busy loops beside the suite")
    parser.add_argument("--one-core", action="store_true", help="taskset the suite to core 0")
    parser.add_argument("--runs", type=int, default=1, help="suite runs, one after another")
    parser.add_argument("--json", action="store_true", help="print the runs as JSON")
    args = parser.parse_args(argv)
    if args.hogs < 0 or args.runs < 1:
        parser.error("--hogs must be >= 0 and --runs >= 1")
    if args.one_core and shutil.which("taskset") is None:
        parser.error("--one-core needs taskset (util-linux)")
    return args, pytest_args


def main(argv: list[str] | None = None) -> int:
    args, pytest_args = parse_args(sys.argv[1:] if argv is None else argv)
    runs = []
    hogs = start_hogs(args.hogs, args.one_core)
    try:
        for number in range(1, args.runs + 1):
            print(f"loaded run {number}/{args.runs}: {args.hogs} hog(s)"
                  f"{', one core' if args.one_core else ''}", file=sys.stderr, flush=True)
            runs.append(run_suite(number, pytest_args, args.one_core))
    finally:
        stop_hogs(hogs)
    if args.json:
        print(json.dumps({"hogs": args.hogs, "one_core": args.one_core,
                          "runs": [asdict(r) for r in runs]}, indent=2))
    else:
        for run in runs:
            verdict = "passed" if run.passed else "FAILED"
            print(f"run {run.number}: {verdict} in {run.seconds:.0f} s: {run.summary}")
            for failure in run.failures:
                print(f"    {failure}")
        print(f"{sum(r.passed for r in runs)} of {len(runs)} loaded run(s) passed "
              f"({args.hogs} hog(s){', one core' if args.one_core else ''})")
    return 0 if all(r.passed for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
