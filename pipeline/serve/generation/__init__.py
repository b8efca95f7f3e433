"""Text generation in `pipe serve`: a decoder graph with its KV cache driven by continuous batching.

`engine.Engine` runs one model version's sequences (`sequence.py`) step by step: each step is at most
one onnxruntime call for the prompts joining (`scheduler.py`, chunked) and exactly one for the decode
step of every running sequence, with each sequence's keys and values kept in a bounded block pool
(`kv_pool.py`); tokens are chosen by `sampler.py` and read as text by `detokenizer.py`. The OpenAI
routes (`openai_api.py`), Triton's generate (`handlers.py`) and the SSE stream (`stream.py`)
answer over it; `chat.py` renders the artifact's chat template. numpy, onnxruntime, `tokenizers` and
jinja2 only: no torch, no transformers (docs/language-models.md, serving).
"""
