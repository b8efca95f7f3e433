"""The decoder bench/bench_lm_serve.py serves: a random-init Llama of SmolLM-135M's shape, imported once.

    .venv/bin/python bench/lm_serve_model.py DIR      # DIR/source (transformers) and DIR/artifacts (pipe)

Hidden 576, 30 layers, 9 heads / 3 KV heads, intermediate 1536, vocabulary 49,152 (tied embeddings),
2,048 positions: 134.5 M parameters. The tokenizer is a word-level one with a word for every id
(`w0` .. `w49151`, nothing downloaded), so every token a random model picks is text a client sees;
the EOS id is the last row (49,151), which a random model seldom picks, so streams run to their
max_tokens. Random weights time the serving; they judge no quality.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NAME = "llama-135m"
VOCAB = 49152
CHAT_TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s> {% endfor %}<s> assistant:"


def save_word_tokenizer(directory: Path, vocab: int) -> None:
    """A word-level fast tokenizer of `vocab` ids: <pad> <s> </s>, then w3 .. w{vocab-1}."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, vocab)}}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=2048)  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)


def prepare(directory: Path) -> tuple[Path, Path]:
    """The source directory and the repository holding the imported artifact with its weight-only variants
    (each made when missing)."""
    source, repository = directory / "source", directory / "artifacts"
    if not (repository / NAME / "1" / "manifest.json").exists():
        imported(source, repository)
    quantized(repository / NAME / "1")
    return source, repository


def quantized(root: Path) -> None:
    """`pipe optimize` of the artifact into int8-weights and int4-weights, once. Random weights give
    near-uniform next-token distributions, where top-1 agreement means nothing (int4 agreed on 0.31 of
    the tokens with a KL of 0.011 nats): the agreement bound is set to 0 for this timing model only."""
    import json

    from click.testing import CliRunner

    from pipeline.cli.group import main

    variants = json.loads((root / "manifest.json").read_text()).get("variants", {})
    if {"int8-weights", "int4-weights"} <= set(variants):
        return
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["optimize", str(root), "--quantize", "int8-weights", "--quantize",
                                       "int4-weights", "--min-token-agreement", "0"])  # fmt: skip
    print(result.output[-1500:])
    if result.exit_code != 0:
        raise SystemExit(f"pipe optimize failed ({result.exit_code})")
    print(f"optimized in {time.perf_counter() - started:.0f} s")


def imported(source: Path, repository: Path) -> None:
    """The random Llama saved as a transformers directory and imported by `pipe import`."""
    import torch
    from click.testing import CliRunner
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.cli.group import main

    torch.set_num_threads(2)
    save_word_tokenizer(source, VOCAB)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                         tie_word_embeddings=True, pad_token_id=0, bos_token_id=1, eos_token_id=49151)  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(config).eval().save_pretrained(source)
    started = time.perf_counter()
    result = CliRunner().invoke(main, ["import", str(source), "--name", NAME, "--repository", str(repository)])
    print(result.output[-1500:])
    if result.exit_code != 0:
        raise SystemExit(f"pipe import failed ({result.exit_code})")
    print(f"imported in {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    prepare(Path(sys.argv[1]))
