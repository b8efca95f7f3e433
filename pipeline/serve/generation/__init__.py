"""Text generation in `pipe serve`: a decoder graph with its KV cache driven by continuous batching.

`engine.Engine` runs one model version's sequences (`sequence.py`) step by step: each step is at most
one onnxruntime call for the prompts joining (`scheduler.py`, chunked) and exactly one for the decode
step of every running sequence, with each sequence's keys and values kept in a bounded block pool
(`kv_pool.py`), the graph called as its `features.py` say; tokens are chosen by `sampler.py` and read as
text by `detokenizer.py`. The handlers of the OpenAI routes (`openai_api.py`) and of Triton's generate
(`handlers.py`) answer over it, streamed by `stream.py`; `chat.py` renders the artifact's chat template
and `served.TextGenerator` holds a version's engine, tokenizer and template. numpy, onnxruntime, `tokenizers` and
jinja2 only: no torch, no transformers (docs/language-models.md, serving).
"""
