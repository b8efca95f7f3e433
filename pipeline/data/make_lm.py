"""Make what the python-llama recipe trains from: text found on this machine and a Llama to train from scratch.

    python -m pipeline.data.make_lm models/data/python-llama [--corpus-kb 400]

Writes into the directory:

- `python.txt`: the first --corpus-kb KB of this Python's standard library sources (its top-level `*.py`
  files in name order), text every Python installation carries, so nothing is downloaded;
- `scratch/`: a byte-level BPE tokenizer (vocabulary 1024, `<pad>` `<s>` `</s>`, a chat template) trained
  on that text, and a Llama-shaped `config.json` (4 layers, hidden 128, 4 heads, 2 key/value heads,
  256 positions) with no weights: `model: {arch: hf, path: ...}` trains it from scratch.

Deterministic for one Python version; needs transformers and tokenizers (the `hf` profile).
"""

from __future__ import annotations

import argparse
import sysconfig
from pathlib import Path

VOCAB = 1024
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def python_sources(kilobytes: int) -> str:
    """The standard library's top-level .py files, in name order, up to `kilobytes` of text."""
    limit, parts, size = kilobytes * 1024, [], 0
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        parts.append(path.read_text(encoding="utf-8", errors="replace"))
        size += len(parts[-1])
        if size > limit:
            break
    return "\n".join(parts)[:limit]


def save_scratch_llama(directory: Path, text: str) -> Path:
    """A tokenizer trained on `text` and a Llama config, no weights, saved in `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator([text], trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=256
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    config.save_pretrained(directory)
    return directory


def make_lm(directory: Path, corpus_kb: int = 400) -> Path:
    """`directory/python.txt` and `directory/scratch/`; returns `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    text = python_sources(corpus_kb)
    (directory / "python.txt").write_text(text, encoding="utf-8")
    save_scratch_llama(directory / "scratch", text)
    return directory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--corpus-kb", type=int, default=400)
    args = parser.parse_args()
    made = make_lm(args.directory, args.corpus_kb)
    print(f"wrote {made / 'python.txt'} and {made / 'scratch'}")


if __name__ == "__main__":
    main()
