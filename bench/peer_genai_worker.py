"""onnxruntime-genai's side of bench/peer_genai.py: a process under the peer's own venv (numpy and
onnxruntime_genai only) that loads the model once and answers one JSON line per cell on stdin:

    /work/peers/genai/bin/python bench/peer_genai_worker.py DIRECTORY --mode generator|engine

Times are taken here as bench_lm_serve.py defines them (time to first token from the cell's start, the
gaps between a stream's tokens, the cell's wall time).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np


def generator_cell(og: Any, model: Any, prompts: list[list[int]], new_tokens: int, pad: int) -> dict[str, Any]:
    """All prompts as one Generator batch, right-padded with the pad id; one timestamp per step.

    onnxruntime-genai 0.18 reads a batch's trailing pad ids as padding (mask 0, positions of the real
    tokens kept); leading pad ids it takes for tokens (mask 1), so a left-padded row generates other
    ids than it does alone. The rows step together: each makes `new_tokens` ids (max_length is the
    longest prompt's + new_tokens); the bench's prompts are of one length.
    """
    started = time.perf_counter()
    longest = max(len(p) for p in prompts)
    batch = np.full((len(prompts), longest), pad, dtype=np.int32)
    for row, prompt in enumerate(prompts):
        batch[row, : len(prompt)] = prompt
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, batch_size=len(prompts), max_length=longest + new_tokens,
                              min_length=longest + new_tokens)  # fmt: skip
    generator = og.Generator(model, params)
    generator.append_tokens(batch)  # the prefill of every row
    times: list[float] = []
    ids: list[list[int]] = [[] for _ in prompts]
    while not generator.is_done():
        generator.generate_next_token()
        new = generator.get_next_tokens()  # [batch] int32
        times.append(time.perf_counter())
        for row, token in enumerate(new.tolist()):
            ids[row].append(token)
    wall = time.perf_counter() - started
    gaps = np.diff(times).tolist()
    streams = [{"ttft": times[0] - started, "gaps": gaps, "tokens": len(row), "ids": row} for row in ids]
    return {"streams": streams, "wall": wall}


def engine_cell(og: Any, engine: Any, prompts: list[list[int]], new_tokens: int) -> dict[str, Any]:
    """One Engine request per prompt, all submitted at the cell's start; each token timed on its event."""
    started = time.perf_counter()
    requests = []
    for prompt in prompts:
        request = engine.create_request()
        turn = og.TurnOptions(request)
        turn.set_do_sample(False)
        turn.set_max_generated_tokens(new_tokens)
        turn.set_min_generated_tokens(new_tokens)
        request.begin_turn(np.asarray(prompt, dtype=np.int32), turn)
        requests.append(request)
    row = {id(r): i for i, r in enumerate(requests)}  # an event's .request is the very object created
    times: list[list[float]] = [[] for _ in prompts]
    ids: list[list[int]] = [[] for _ in prompts]
    events = engine.create_event_buffer(max(64, 2 * len(prompts)))
    while engine.has_pending_requests():
        engine.run(events)
        now = time.perf_counter()
        for k in range(len(events)):
            event = events[k]
            if event.flags & og.EngineEventFlags.FAILED:
                raise RuntimeError(f"engine request failed: {event.error_code}")
            if event.flags & og.EngineEventFlags.TOKEN:
                i = row[id(event.request)]
                times[i].append(now)
                ids[i].append(int(event.token))
    wall = time.perf_counter() - started
    for request in requests:
        request.close()
    streams = [{"ttft": t[0] - started, "gaps": np.diff(t).tolist(), "tokens": len(i), "ids": i}
               for t, i in zip(times, ids, strict=True)]  # fmt: skip
    return {"streams": streams, "wall": wall}


def worker(directory: Path, mode: str) -> None:
    """Load the model once, then answer JSON lines on stdin until {"op": "quit"}."""
    import onnxruntime
    import onnxruntime_genai as og

    def say(answer: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()

    config = json.loads((directory / "genai_config.json").read_text())
    started = time.perf_counter()
    try:
        model = og.Model(str(directory))
        engine = og.Engine(model) if mode == "engine" else None
    except RuntimeError as error:
        say({"error": f"loading {directory}: {error}"})
        return
    ready = {"load_s": time.perf_counter() - started, "onnxruntime_genai": og.__version__,
             "onnxruntime": onnxruntime.__version__}  # fmt: skip
    if engine is not None:
        capabilities = engine.get_capabilities()
        ready["engine_max_batch"] = capabilities.configured_max_batch_size
    say(ready)
    for line in sys.stdin:
        request = json.loads(line)
        if request["op"] == "quit":
            say({"bye": True})
            return
        try:
            if engine is not None:
                say(engine_cell(og, engine, request["prompts"], request["new_tokens"]))
            else:
                pad = config["model"]["pad_token_id"]
                say(generator_cell(og, model, request["prompts"], request["new_tokens"], pad))
        except RuntimeError as error:
            say({"error": str(error)})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--mode", choices=("generator", "engine"), default="generator")
    args = parser.parse_args()
    worker(args.directory, args.mode)
