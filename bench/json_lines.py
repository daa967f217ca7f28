"""The JSON result lines of the benchmarks, picked out of a log that holds other text too."""
import json
import sys


def bench_lines(lines, bench):
    """Yields each JSON object among `lines` whose "bench" is `bench`; other lines are skipped."""
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and r.get("bench") == bench:
            yield r


def read_logs(paths, read, results):
    """Calls read(lines, results) on each file of `paths`, or on standard input when there is none."""
    if not paths:
        read(sys.stdin, results)
        return
    for path in paths:
        with open(path, encoding="utf-8", errors="replace") as f:
            read(f, results)
