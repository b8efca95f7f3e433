"""Fuzz a real `pipe serve` from its own /openapi.json with schemathesis: 2,000+ generated requests.

    .venv/bin/python bench/fuzz_serve.py [--cases-per-operation 200] [--workers 1]

Starts a server on 127.0.0.1 over a repository of small real models (the tests' builders, and the tests'
tiny imported Llama, so the generation routes run real generations), sends
positive and negative cases to every documented operation, and checks each answer: no 5xx, and a
status code, content type, headers and body the document declares; schema-invalid requests must be
refused. Prints the counts and writes bench/results/fuzz_serve.json. Exit 1 when anything failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "serve"))  # the model builders, server runner and fuzzer the tests use


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases-per-operation", type=int, default=200)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "fuzz_serve.json")
    args = parser.parse_args()

    import shutil

    from openapi_fuzz import fuzz
    from serve_models import embed, mlp, strings, two_in_two_out, write_artifact
    from serve_process import start_server

    from tests.lm.imported_lm import NAME, imported_llama

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "artifacts"
        write_artifact(repo, "mlp", 1, mlp([4, 8, 3], seed=1))
        write_artifact(repo, "mlp", 2, mlp([4, 8, 3], seed=2))
        write_artifact(repo, "pair", 1, two_in_two_out())
        write_artifact(repo, "embed", 1, embed())
        write_artifact(repo, "strings", 1, strings())
        _, language = imported_llama(Path(tmp) / "lm", 512)  # the generation tests' cached import
        shutil.copytree(language / NAME, repo / NAME)
        server = start_server([repo], Path(tmp) / "serve.log", "--poll", "0", "--workers", str(args.workers))
        started = time.perf_counter()
        try:
            result = fuzz(server.url, args.cases_per_operation)
        finally:
            server.stop()
        seconds = time.perf_counter() - started
        tracebacks = server.logs().count("Traceback")

    print(f"{result.cases} cases over {result.operations} operations in {seconds:.0f} s")
    print("statuses:", dict(sorted(result.statuses.items())))
    print(f"server errors (5xx): {len(result.server_errors)}; schema mismatches: {len(result.mismatches)}; "
          f"tracebacks in the server log: {tracebacks}")  # fmt: skip
    for line in (result.server_errors + result.mismatches)[:20]:
        print("  ", line)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    summary = {
        "cases": result.cases,
        "operations": result.operations,
        "statuses": {str(k): v for k, v in sorted(result.statuses.items())},
        "server_errors": result.server_errors,
        "mismatches": result.mismatches,
        "tracebacks": tracebacks,
        "seconds": round(seconds, 1),
    }
    args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 1 if result.server_errors or result.mismatches or tracebacks else 0


if __name__ == "__main__":
    sys.exit(main())
