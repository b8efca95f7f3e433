"""Generate the small token-classification dataset the transformer and MoE recipes train on.

    python -m pipeline.data.make_tokens models/data/tokens.npz [--samples 2000] [--seed 0]

Each sequence is 8 to 32 random "word" ids (5..vocab-1) padded with 0 to length 32. Two marker
ids, A=1 and B=2, are planted at random positions or not; the class says which markers the
sequence holds: 0 none, 1 only A, 2 only B, 3 both. A third id, 3, is a decoy planted at random
in every class, so counting tokens is not enough: the model has to tell ids apart anywhere in a
variable-length sequence. Chance is 25%. The output is deterministic in the seed.
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path

import numpy as np

from pipeline.core.fsutil import atomic_write_bytes

LABELS = ("none", "a", "b", "both")
MARKER_A, MARKER_B, DECOY = 1, 2, 3
FIRST_WORD = 5


def make_tokens(samples: int = 2000, max_len: int = 32, vocab: int = 64, seed: int = 0) -> dict[str, np.ndarray]:
    """Token ids [samples, max_len] (uint8, 0 = padding), classes y [samples] and label names."""
    rng = np.random.default_rng(seed)
    tokens = np.zeros((samples, max_len), dtype=np.uint8)
    y = rng.integers(0, len(LABELS), size=samples)
    for i in range(samples):
        length = int(rng.integers(8, max_len + 1))
        seq = rng.integers(FIRST_WORD, vocab, size=length)
        planted = [m for m, on in ((MARKER_A, y[i] & 1), (MARKER_B, y[i] & 2)) if on]
        if rng.random() < 0.5:
            planted.append(DECOY)
        where = rng.choice(length, size=len(planted), replace=False)
        seq[where] = planted
        tokens[i, :length] = seq
    return {"tokens": tokens, "y": y.astype(np.int64), "labels": np.array(LABELS)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="the .npz file to write")
    parser.add_argument("--samples", type=int, default=2000)
    parser.add_argument("--max-len", type=int, default=32)
    parser.add_argument("--vocab", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.max_len < 8 or not FIRST_WORD < args.vocab <= 256:
        parser.error(f"need --max-len >= 8 (got {args.max_len}) and {FIRST_WORD} < --vocab <= 256 (got {args.vocab})")
    arrays = make_tokens(args.samples, args.max_len, args.vocab, args.seed)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)
    atomic_write_bytes(args.out, buffer.getvalue())
    print(f"wrote {args.out}: {args.samples} sequences, up to {args.max_len} tokens, vocab {args.vocab}")


if __name__ == "__main__":
    main()
