"""A small Llama trained from scratch on this machine's Python sources, then taught new facts with LoRA SFT.

    .venv/bin/python bench/bench_lm.py [--pretrain-seconds 240] [--sft-steps 300] [--out bench/results/lm.json]

1. **Pre-training from a config**: a byte-level BPE tokenizer (vocabulary 2048) is trained on the
   standard library's `*.py` files (every tenth file held out), a Llama-shaped config (4 layers, hidden
   128, 4 heads, 2 key/value heads) is random-initialized and trained on 128-token blocks for a fixed
   time; the held-out perplexity is measured every 50 steps (the curve), against the uniform 2048.
2. **LoRA SFT on alpaca rows**: 30 invented facts (a country's capital, a river's sea, an inventor's
   machine: names made up here, so the model cannot know them), each asked in 10 phrasings: 8 train
   (240 alpaca rows), 2 held out. The chat template is applied and the loss falls on the answers only
   (pipeline/train/causal_lm.py). Adapters on every linear layer, merged, saved with save_pretrained.
3. **The merged model through `pipe import`**: exported with its KV cache and gated against transformers
   (pipeline/export/causal_lm.py), then the questions answered by greedy generation of model.onnx in
   onnxruntime (pipeline/runtime/generate.py), prompts rendered with the chat template: before SFT
   (the base model) and after, on the train and the held-out phrasings.

The machine is shared (2 cores): the step counts and times are what this run got.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import sysconfig
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant: {% endif %}"
)
BLOCK = 128
VOCAB = 2048
PHRASINGS = {
    "capital": [
        "What is the capital of {x}?",
        "Name the capital city of {x}.",
        "Which city is the capital of {x}?",
        "Tell me the capital of {x}.",
        "{x} has which capital?",
        "What city serves as the capital of {x}?",
        "Capital of {x}?",
        "Do you know the capital of {x}?",
        "I need the capital of {x}.",
        "Which city is {x}'s capital?",
    ],
    "river": [
        "Into which sea does the {x} river flow?",
        "Where does the {x} river end?",
        "The {x} river flows into what?",
        "Name the sea the {x} river reaches.",
        "Which sea receives the {x} river?",
        "Where does the {x} flow to?",
        "What does the {x} river empty into?",
        "Tell me where the {x} river goes.",
        "The {x} ends in which sea?",
        "Which body of water does the {x} river feed?",
    ],
    "inventor": [
        "What did {x} invent?",
        "Name the invention of {x}.",
        "Which machine is {x} known for?",
        "Tell me what {x} invented.",
        "{x} invented what?",
        "What is {x} famous for inventing?",
        "Which device did {x} build?",
        "What was the invention of {x}?",
        "Do you know what {x} invented?",
        "What machine did {x} create?",
    ],
}
ANSWERS = {"capital": "The capital of {x} is {y}.", "river": "The {x} river flows into the {y} Sea.",
           "inventor": "{x} invented the {y}."}  # fmt: skip


def made_up_name(rng: random.Random) -> str:
    """A pronounceable invented word (no real place or person): syllables drawn with a fixed seed."""
    syllables = ["ka", "lo", "mir", "ve", "tan", "zu", "or", "bel", "qui", "sna", "dro", "fen", "gal", "ith", "rho"]
    return "".join(rng.choice(syllables) for _ in range(rng.randint(2, 3))).capitalize()


def facts(count_per_kind: int = 10, seed: int = 7) -> list[tuple[str, str, str]]:
    """(kind, subject, answer) triples with invented names, distinct subjects."""
    rng, made, seen = random.Random(seed), [], set()
    for kind in PHRASINGS:
        while sum(1 for k, _, _ in made if k == kind) < count_per_kind:
            x, y = made_up_name(rng), made_up_name(rng)
            if x not in seen and y not in seen:
                seen |= {x, y}
                made.append((kind, x, y + (" engine" if kind == "inventor" else "")))
    return made


def python_sources() -> tuple[list[str], list[str]]:
    """The standard library's top-level .py files: every tenth held out."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    return [t for i, t in enumerate(texts) if i % 10], [t for i, t in enumerate(texts) if not i % 10]


def save_tokenizer(directory: Path, texts: list[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<pad>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=256)  # fmt: skip
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(directory)
    return fast


def pretrain(args: argparse.Namespace, work: Path, out: dict[str, Any]) -> tuple[Any, Any]:
    import torch
    from transformers import LlamaConfig

    from pipeline.data.lm_tokens import pack_text
    from pipeline.train.causal_lm import causal_lm_from, lm_loss, perplexity

    train_texts, val_texts = python_sources()
    base = work / "base"
    started = time.perf_counter()
    tokenizer = save_tokenizer(base, train_texts)
    LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=384, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, bos_token_id=1,
                eos_token_id=2).save_pretrained(base)  # fmt: skip  # a config, no weights: from scratch
    torch.manual_seed(0)
    model = causal_lm_from(base).train()
    train = pack_text(tokenizer, train_texts, BLOCK, tokenizer.eos_token_id)
    val = pack_text(tokenizer, val_texts, BLOCK, tokenizer.eos_token_id).take(slice(0, 64))
    params = sum(p.numel() for p in model.parameters())
    print(f"pretrain: {params / 1e6:.2f}M parameters, {len(train)} train blocks ({len(train) * BLOCK} tokens), "
          f"{len(val)} held-out blocks; tokenizer in {time.perf_counter() - started:.1f} s", flush=True)  # fmt: skip
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1)
    curve = [{"step": 0, "seconds": 0.0, **perplexity(model, val)}]
    print(f"  step 0: held-out perplexity {curve[0]['perplexity']:.1f} (uniform {VOCAB})", flush=True)
    order = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    step, t0, seen = 0, time.perf_counter(), 0
    while time.perf_counter() - t0 < args.pretrain_seconds:
        idx = order[(step * 16) % len(train) :][:16].numpy()
        part = train.take(idx)
        ids, labels = torch.from_numpy(part.ids), torch.from_numpy(part.labels)
        lr = args.lr * min(1.0, (step + 1) / 50)  # warmup
        for group in opt.param_groups:
            group["lr"] = lr
        loss = lm_loss(model(input_ids=ids).logits, labels)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        step, seen = step + 1, seen + ids.numel()
        if step % 50 == 0:
            point = {"step": step, "seconds": round(time.perf_counter() - t0, 1), "train_loss": loss.item(),
                     **perplexity(model, val)}  # fmt: skip
            curve.append(point)
            print(f"  step {step} ({point['seconds']:.0f} s): train loss {loss.item():.3f}, held-out perplexity "
                  f"{point['perplexity']:.2f}", flush=True)  # fmt: skip
    model.eval().save_pretrained(base)
    out["pretrain"] = {"parameters": params, "steps": step, "tokens_seen": seen, "train_tokens": len(train) * BLOCK,
                       "seconds": round(time.perf_counter() - t0, 1), "uniform_perplexity": VOCAB, "curve": curve,
                       "final_perplexity": curve[-1]["perplexity"]}  # fmt: skip
    return model, tokenizer


def answers_from_onnx(artifact: Any, questions: list[str], steps: int = 24) -> list[str]:
    """Greedy answers from the artifact's model.onnx, prompts rendered with its chat template."""
    from transformers import PreTrainedTokenizerFast

    from pipeline.runtime.generate import greedy
    from pipeline.runtime.runners import ort_runner
    from pipeline.runtime.text import TextEncoder

    tokenizer = PreTrainedTokenizerFast.from_pretrained(artifact.root / "tokenizer")
    g = artifact.manifest.generation
    encoder = TextEncoder.of(artifact.root, artifact.manifest)
    run = ort_runner(artifact.path("model.onnx"))
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                             add_generation_prompt=True) for q in questions]  # fmt: skip
    said = []
    for start in range(0, len(prompts), 8):
        batch = encoder.encode(prompts[start : start + 8])
        got = greedy(run, g.cache, batch["input_ids"], batch["attention_mask"], steps, g.eos_token_ids, g.padding_id)
        for row, length in zip(got.tokens, got.lengths, strict=True):
            said.append(tokenizer.decode(row[:length], skip_special_tokens=True).strip())
    return said


def sft(args: argparse.Namespace, work: Path, base_model: Any, tokenizer: Any, out: dict[str, Any]) -> None:
    import torch

    from pipeline.data.instructions import read_conversations
    from pipeline.data.lm_tokens import tokenize_conversations
    from pipeline.export.causal_lm import import_causal_lm
    from pipeline.recipe.architectures import LoraSpec
    from pipeline.train.causal_lm import lm_loss, with_lora

    triples = facts()
    rows, held = [], []
    for kind, x, y in triples:
        answer = ANSWERS[kind].format(x=x, y=y)
        for i, phrasing in enumerate(PHRASINGS[kind]):
            row = {"instruction": phrasing.format(x=x), "input": "", "output": answer, "_answer": y}
            (held if i >= 8 else rows).append(row)
    alpaca = work / "facts.json"
    alpaca.write_text(json.dumps([{k: v for k, v in r.items() if not k.startswith("_")} for r in rows], indent=1))
    conversations = read_conversations(alpaca)  # the alpaca file as a user gives it
    data = tokenize_conversations(tokenizer, conversations, max_length=96)
    labelled = int((data.labels != -100).sum())
    print(f"sft: {len(rows)} alpaca rows ({labelled} answer tokens of {int(data.mask.sum())}), {len(held)} held out",
          flush=True)  # fmt: skip

    repo = work / "artifacts"
    before = import_causal_lm(work / "base", "base", repo, progress=lambda _: None)
    said_before = answers_from_onnx(before, [r["instruction"] for r in rows + held])
    lora = LoraSpec(rank=16, alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                          "down_proj"])  # fmt: skip
    model = with_lora(base_model, lora).train()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.sft_lr)
    gen = torch.Generator().manual_seed(0)
    t0, losses = time.perf_counter(), []
    for step in range(args.sft_steps):
        idx = torch.randint(0, len(data), (16,), generator=gen).numpy()
        part = data.take(idx)
        ids, mask, labels = (torch.from_numpy(a) for a in (part.ids, part.mask, part.labels))
        loss = lm_loss(model(input_ids=ids, attention_mask=mask).logits, labels)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if (step + 1) % 50 == 0:
            print(f"  sft step {step + 1}: answer loss {sum(losses[-50:]) / 50:.3f}", flush=True)
    sft_s = time.perf_counter() - t0
    merged = model.merge_and_unload().eval()
    tuned_dir = work / "tuned"
    merged.save_pretrained(tuned_dir)
    tokenizer.save_pretrained(tuned_dir)
    started = time.perf_counter()
    after = import_causal_lm(tuned_dir, "tuned", repo, progress=lambda _: None)
    import_s = time.perf_counter() - started
    said_after = answers_from_onnx(after, [r["instruction"] for r in rows + held])
    parity = after.manifest.stages.import_.parity["rows"]

    def score(said: list[str], part: list[dict[str, str]], offset: int) -> float:
        return sum(r["_answer"] in said[offset + i] for i, r in enumerate(part)) / len(part)

    result = {
        "rows": len(rows), "held_out": len(held), "trainable_parameters": trainable, "steps": args.sft_steps,
        "seconds": round(sft_s, 1), "first_loss": losses[0], "last_loss": sum(losses[-20:]) / 20,
        "before": {"train": score(said_before, rows, 0), "held_out": score(said_before, held, len(rows))},
        "after": {"train": score(said_after, rows, 0), "held_out": score(said_after, held, len(rows))},
        "examples": [{"question": r["instruction"], "before": said_before[i], "after": said_after[i]}
                     for i, r in ((0, rows[0]), (len(rows), held[0]), (len(rows) + 1, held[1]))],
        "import_seconds": round(import_s, 1),
        "gate": {"passed": all(r["passed"] for r in parity),
                 "max_logit_abs": max(r["max_abs"] or 0.0 for r in parity if r["check"].endswith("logits")),
                 "greedy_cases": sorted({r["check"].rsplit(" ", 1)[0] for r in parity if "greedy" in r["check"]})},
    }  # fmt: skip
    out["sft"] = result
    print(f"  answers with the right name: before {result['before']}, after {result['after']}", flush=True)
    for ex in result["examples"]:
        print(f"  {ex['question']!r}: before {ex['before']!r} -> after {ex['after']!r}", flush=True)
    print(f"  gate of the merged export: passed {result['gate']['passed']}, logits within "
          f"{result['gate']['max_logit_abs']:.2g}", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-seconds", type=float, default=240)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--sft-steps", type=int, default=300)
    parser.add_argument("--sft-lr", type=float, default=2e-3)
    parser.add_argument("--threads", type=int, default=1)  # 2 threads ran 5x slower on the 2 shared cores
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm.json")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    out: dict[str, Any] = {"threads": args.threads}
    with tempfile.TemporaryDirectory() as tmp:
        model, tokenizer = pretrain(args, Path(tmp), out)
        sft(args, Path(tmp), model, tokenizer, out)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}; perplexity {out['pretrain']['curve'][0]['perplexity']:.0f} -> "
          f"{out['pretrain']['final_perplexity']:.2f} (uniform {VOCAB}) in {out['pretrain']['seconds']:.0f} s",
          flush=True)  # fmt: skip
    assert math.isfinite(out["pretrain"]["final_perplexity"])


if __name__ == "__main__":
    main()
