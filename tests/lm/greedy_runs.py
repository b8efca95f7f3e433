"""Greedy answers two ways, for the family tests and bench/bench_families.py: pipe serve's engine given every
prompt at once, and transformers' `generate` on the source directory, one prompt at a time."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any


def engine_greedy(generator: Any, prompts: list[list[int]], steps: int) -> list[list[int]]:
    """Every prompt submitted at once to a `TextGenerator`'s engine; each one's new tokens (to its EOS)."""
    from pipeline.serve.generation.sampler import Sampling
    from pipeline.serve.generation.sequence import Job

    async def run() -> list[list[int]]:
        seqs = [generator.engine.submit(Job(ids, steps, Sampling(temperature=0))) for ids in prompts]
        for seq in seqs:
            assert seq.events is not None
            while (await seq.events.get()).finish is None:
                pass
        return [seq.tokens[len(seq.job.prompt) :] for seq in seqs]

    return asyncio.run(run())


def transformers_greedy(source: Path, ids: list[int], steps: int, eos: int) -> list[int]:
    """transformers' greedy `generate` of `steps` tokens after `ids`, to its EOS included."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(source, attn_implementation="eager").eval()
    config = GenerationConfig(do_sample=False, max_new_tokens=steps, eos_token_id=eos, pad_token_id=0)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.int64),
                             generation_config=config)  # fmt: skip
    made = out[0, len(ids) :].tolist()
    return made[: made.index(eos) + 1] if eos in made else made
