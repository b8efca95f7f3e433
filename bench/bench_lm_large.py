"""A random-init causal LM over 2 GB through `pipe import`: time, peak memory, external data hashed and a
tampered byte refused.

    .venv/bin/python bench/bench_lm_large.py [--hidden 1536] [--layers 20] [--out bench/results/lm_large.json]

A Llama of about 600 M parameters (2.4 GB in fp32: past protobuf's 2 GiB, so its weights go to
`model.onnx.data`) is made from a config with random weights and saved with save_pretrained, then
imported in this process (`pipeline/export/causal_lm.py`: the dynamo export with external data, the gate
on greedy generation against transformers at batch 1, 2 and 4, the files hashed). Peak memory is this
process's maximum resident set. Then one byte of the external data is changed and loading the artifact
must refuse it, naming the file. Never run by the test suite (minutes and gigabytes); random weights
judge parity only.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def peak_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # Linux: KiB


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=20)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "lm_large.json")
    args = parser.parse_args()
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from pipeline.artifact.directory import Artifact
    from pipeline.core.errors import ArtifactError
    from pipeline.export.causal_lm import import_causal_lm
    from tests.lm.lm_models import save_bpe_tokenizer

    torch.set_num_threads(2)
    out: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        source = save_bpe_tokenizer(Path(tmp) / "big")
        config = LlamaConfig(vocab_size=32000, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3,
                             num_hidden_layers=args.layers, num_attention_heads=12, num_key_value_heads=4,
                             max_position_embeddings=2048, pad_token_id=0, bos_token_id=1, eos_token_id=2)  # fmt: skip
        started = time.perf_counter()
        torch.manual_seed(0)
        model = LlamaForCausalLM(config).eval()
        parameters = sum(p.numel() for p in model.parameters())
        model.save_pretrained(source)
        del model
        out["parameters"] = parameters
        out["made_s"] = round(time.perf_counter() - started, 1)
        print(f"made {parameters / 1e6:.0f} M parameters ({parameters * 4 / 1e9:.2f} GB fp32) in {out['made_s']} s")
        started = time.perf_counter()
        artifact = import_causal_lm(source, "big", Path(tmp) / "artifacts")
        out["import_s"] = round(time.perf_counter() - started, 1)
        out["peak_gb"] = round(peak_gb(), 2)
        files = artifact.manifest.files
        out["files"] = {k: v.size for k, v in files.items() if k.startswith("model.onnx")}
        rows = artifact.manifest.stages.import_.parity["rows"]
        out["gate"] = {"passed": all(r["passed"] for r in rows), "checks": len(rows),
                       "max_logit_abs": max(r["max_abs"] or 0.0 for r in rows if r["output"] == "logits")}  # fmt: skip
        out["notes"] = artifact.manifest.stages.import_.notes
        print(f"imported in {out['import_s']} s, peak {out['peak_gb']} GB; files {out['files']}; gate {out['gate']}")
        data = artifact.root / "model.onnx.data"
        started = time.perf_counter()
        Artifact.load(artifact.root)
        out["verify_load_s"] = round(time.perf_counter() - started, 1)
        copy = Path(tmp) / "tampered" / "big" / "1"
        shutil.copytree(artifact.root, copy)
        with open(copy / data.name, "r+b") as f:
            f.seek(1 << 20)
            byte = f.read(1)
            f.seek(1 << 20)
            f.write(bytes([byte[0] ^ 1]))
        try:
            Artifact.load(copy)
            out["tampered"] = "loaded (NOT refused)"
        except ArtifactError as exc:
            out["tampered"] = f"refused: {str(exc)[:200]}"
        print(f"verified load {out['verify_load_s']} s; one byte changed in {data.name}: {out['tampered']}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
