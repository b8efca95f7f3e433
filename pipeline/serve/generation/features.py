"""What a decoder graph takes beyond its tokens, mask, positions and pasts, read once from its session when the
engine starts: the scheduler feeds and calls it by these (`scheduler.py`), never by flags of its own.

A written decoder (pipeline/export/fused_decoder.py) has inputs with a default: `logits_from` (-1: the logits of
the last column only, so a prefill does not compute a prompt's worth), `present_new_only` (the presents hold the
new tokens only) and `decode_in_place`, a constant True in the graph pipe serve loads (serve/session.py): its
presents are its pasts, written in place. Another graph has none of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.artifact.generation import DECODE_IN_PLACE, LOGITS_FROM, PRESENT_NEW_ONLY
from pipeline.runtime.session import constants_of

if TYPE_CHECKING:
    from onnxruntime import InferenceSession
    from tokenizers import Tokenizer


@dataclass(frozen=True)
class GraphFeatures:
    """A decoder graph's optional inputs, and the size of its logits."""

    vocab: int  # the logits' last dimension
    logits_from: bool = False  # it takes `logits_from`: a prefill asks for its last column's logits only
    present_new_only: bool = False  # it takes `present_new_only`: every call asks for the new keys and values only
    decode_in_place: bool = False  # its presents are its pasts (`present_new_only` then unused)

    @classmethod
    def of(cls, session: InferenceSession, tokenizer: Tokenizer) -> GraphFeatures:
        optional = _optional_inputs(session)
        return cls(
            vocab=_vocab(session, tokenizer),
            logits_from=LOGITS_FROM in optional,
            present_new_only=PRESENT_NEW_ONLY in optional,
            decode_in_place=DECODE_IN_PLACE in constants_of(session),
        )

    @property
    def feeds_present_new_only(self) -> bool:
        """Every call feeds `present_new_only` True: the graph takes it and does not write its pasts in place."""
        return self.present_new_only and not self.decode_in_place


def _vocab(session: InferenceSession, tokenizer: Tokenizer) -> int:
    """The logits' last dimension as the graph declares it, else the tokenizer's vocabulary."""
    shape = next((o.shape for o in session.get_outputs() if o.name == "logits"), None)
    if shape and isinstance(shape[-1], int):
        return shape[-1]
    return int(tokenizer.get_vocab_size())


def _optional_inputs(session: InferenceSession) -> set[str]:
    """The graph's inputs with a default (a written decoder's `logits_from`, `present_new_only` and
    `decode_in_place`: pipeline/export/fused_decoder.py)."""
    overridable = getattr(session, "get_overridable_initializers", lambda: [])()
    return {i.name for i in overridable}
