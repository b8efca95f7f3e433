"""Tiny text models made in the test, nothing downloaded: a WordPiece tokenizer trained with the `tokenizers`
library on a few lines and saved the way transformers saves a fast tokenizer, and (with torch) a 2-layer
BERT built from a config and saved with save_pretrained."""

from __future__ import annotations

from pathlib import Path

LINES = [
    "the cat sat on the mat",
    "a dog ran in the park",
    "the bird sang a song in the tree",
    "cats and dogs are friends",
    "it rained all day in the city",
    "she read a book by the window",
]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def save_tokenizer(directory: Path, max_length: int = 32, lines: list[str] = LINES) -> Path:
    """A BERT-style fast tokenizer ([CLS] text [SEP], lowercased, [PAD] = 0) saved in `directory`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(lines, trainers.WordPieceTrainer(vocab_size=120, special_tokens=SPECIALS))
    cls, sep = tokenizer.token_to_id("[CLS]"), tokenizer.token_to_id("[SEP]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=[("[CLS]", cls), ("[SEP]", sep)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=max_length,
    )
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(directory)
    return directory


def save_bert(
    directory: Path, task: str = "embedding", labels: tuple[str, ...] = ("neg", "pos"), lines: list[str] = LINES
) -> Path:
    """A 2-layer BERT (hidden 32) with the tokenizer above, saved with save_pretrained: a classifier
    (BertForSequenceClassification, id2label from `labels`) or an encoder (BertModel)."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    save_tokenizer(directory, lines=lines)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=128,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        pad_token_id=0,
        id2label=dict(enumerate(labels)),
        label2id={name: i for i, name in enumerate(labels)},
    )
    model = BertForSequenceClassification(config) if task == "classification" else BertModel(config)
    model.eval().save_pretrained(directory)
    return directory
