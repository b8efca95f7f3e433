"""Tiny causal LMs made in the test, nothing downloaded: a byte-level BPE tokenizer trained with the
`tokenizers` library on a few lines (BOS/EOS/pad specials and a chat template, saved the way transformers
saves a fast tokenizer), and random-init Llama and GPT-2 models of 2 layers, hidden 64, and one of each
family in FAMILIES, saved with save_pretrained. Random weights judge parity only (never quantization: their
top logits are near ties)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LINES = [
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a small village by the sea, there lived an old fisherman.",
    "def add(a, b): return a + b",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10",
    "It rained all day in the city, and the streets were quiet by nightfall.",
    "Q: What is a model? A: A directory that every stage reads.",
]
SPECIALS = ["<pad>", "<s>", "</s>"]  # ids 0, 1, 2
CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)
VOCAB = 320  # the model's rows; the tokenizer makes at most 300 ids


def save_bpe_tokenizer(directory: Path, lines: list[str] = LINES, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """A byte-level BPE fast tokenizer (<s> prepended, no pad on the right) saved in `directory`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(lines, trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>", model_max_length=128
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return directory


def save_llama(directory: Path, seed: int = 0, **config: object) -> Path:
    """A 2-layer Llama (hidden 64, 4 heads, 2 key/value heads: grouped-query attention) with the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    save_bpe_tokenizer(directory)
    torch.manual_seed(seed)
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    LlamaForCausalLM(LlamaConfig(**(settings | config))).eval().save_pretrained(directory)
    return directory


def save_gpt2(directory: Path, seed: int = 0) -> Path:
    """A 2-layer GPT-2 (hidden 64, 4 heads, tied embeddings) with the tokenizer; no pad token in its config."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    save_bpe_tokenizer(directory)
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, bos_token_id=1, eos_token_id=2
    )
    GPT2LMHeadModel(config).eval().save_pretrained(directory)
    return directory


WINDOW = 8  # the tiny families' sliding window: the gate's 18-token prompts and every serving test pass it
# A tiny random decoder of each family pipe traces, as config.json would say it: (config class, model class,
# what the family adds to the shared settings). Sliding windows on some layers (Gemma 2 and 3, Qwen2's and
# Qwen3's use_sliding_window with max_window_layers) or all (Mistral, Phi-3); Gemma 2's soft-capped attention and
# logits; Gemma 3's local rope base on its windowed layers; Qwen3's query and key norms.
FAMILIES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "gemma3": ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(num_hidden_layers=3, num_key_value_heads=1, head_dim=16,
               sliding_window=WINDOW, layer_types=["sliding_attention", "sliding_attention", "full_attention"])),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM", dict(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
               sliding_window=WINDOW, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(num_hidden_layers=2, num_key_value_heads=2,
                sliding_window=WINDOW)),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(num_hidden_layers=2, num_key_value_heads=2,
              use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(num_hidden_layers=2, num_key_value_heads=2, head_dim=16,
              use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(num_hidden_layers=2, num_key_value_heads=2,
             sliding_window=WINDOW)),
}  # fmt: skip


def save_family(directory: Path, family: str, seed: int = 0, **config: Any) -> Path:
    """A tiny random decoder of `family` (FAMILIES: hidden 64, 4 query heads, 256 positions) with the tokenizer."""
    import torch
    import transformers

    config_class, model_class, adds = FAMILIES[family]
    save_bpe_tokenizer(directory)
    torch.manual_seed(seed)
    settings = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                    max_position_embeddings=256, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
    made = getattr(transformers, config_class)(**(settings | adds | config))
    getattr(transformers, model_class)(made).eval().save_pretrained(directory)
    return directory


def random_head_norms(model: Any) -> None:
    """Qwen3's query and key norm weights drawn from [0.5, 1.5]: ones, as at init, would hide a norm left out."""
    import torch

    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                param.uniform_(0.5, 1.5)


def graph_nodes(graph: Any) -> list[Any]:
    """An ONNX graph's nodes and those of its branches, depth first (a written decoder's attention is an If a layer)."""
    branches = [a.g for node in graph.node for a in node.attribute if a.type == a.GRAPH]
    return [*graph.node, *(node for branch in branches for node in graph_nodes(branch))]
