"""Stop a real `pipe serve` under keep-alive load, three times per case, and print what the clients got.

    .venv/bin/python bench/bench_drain.py [--runs 3] [--drain-seconds 2] [--how sigterm ctrl-c] [--workers 1 2]

Each run: a server on 127.0.0.1 over one small real model, 16 keep-alive client threads and a
health checker (tests/serve/drain_load.py has the rules), then SIGTERM to the server's pid or SIGINT
to its own process group (a terminal's Ctrl-C), and the counts: answered, resets (a request sent on
an open connection without an answer), refused connections, how the checker saw the server leave.
`--drain-seconds none` passes no drain option (a pipe from before the drain; its default otherwise).
Writes bench/results/drain.json. Exit 1 when any run reset or refused a request.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # the model builders, server runner and load the tests use


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--drain-seconds", default="2")
    parser.add_argument("--how", nargs="+", default=["sigterm", "ctrl-c"], choices=["sigterm", "ctrl-c"])
    parser.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "drain.json")
    args = parser.parse_args()
    drain_s = None if args.drain_seconds == "none" else float(args.drain_seconds)

    from drain_load import run_once
    from serve_models import mlp, write_artifact

    results, bad = [], 0
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "artifacts"
        write_artifact(repo, "mlp", 1, mlp([4, 8, 3], seed=1))
        for workers in args.workers:
            for how in args.how:
                for run in range(1, args.runs + 1):
                    counts = run_once(repo, Path(tmp) / f"serve-{workers}-{how}-{run}.log", workers, how, drain_s)
                    print(f"workers {workers} {how:7} run {run}: {counts.line()}", flush=True)
                    bad += counts.resets + counts.refused > 0
                    results.append({
                        "workers": workers, "how": how, "run": run, "answered": counts.answered,
                        "statuses": dict(counts.statuses), "resets": counts.resets, "refused": counts.refused,
                        "closes": counts.closes, "not_ready": counts.not_ready, "exit_code": counts.exit_code,
                    })  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"drain_seconds": drain_s, "runs": results}, indent=2) + "\n")
    print(f"{bad} of {len(results)} runs reset or refused a request; wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
