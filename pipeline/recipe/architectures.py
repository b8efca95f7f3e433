"""The recipe's `model` section, a union keyed on `arch`, and the `lora` section that adapts an `hf` model.

Each built-in architecture has its own fields; `arch: custom` names the user's `package.module:factory`,
`arch: onnx` an artifact's model.onnx (trained further with the ORT backend) and `arch: hf` a
transformers directory. `pipeline/recipe/schema.py` puts them into the whole recipe.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from pipeline.recipe.strict import Strict


class MLPSpec(Strict):
    arch: Literal["mlp"]
    hidden: list[Annotated[int, Field(gt=0)]] = [128, 64]  # width of each hidden layer
    dropout: float = Field(0.1, ge=0, lt=1)


class CNNSpec(Strict):
    arch: Literal["cnn"]
    channels: list[Annotated[int, Field(gt=0)]] = [32, 64]  # conv channels per stage (3x3, pool after each)
    hidden: int = Field(128, gt=0)  # width of the classifier head
    dropout: float = Field(0.1, ge=0, lt=1)


class TransformerSpec(Strict):
    arch: Literal["transformer"]
    d_model: int = Field(64, gt=0)
    heads: int = Field(4, gt=0)
    layers: int = Field(2, gt=0)
    ff_mult: int = Field(4, gt=0)  # feed-forward width = ff_mult * d_model
    max_len: int = Field(64, gt=0)  # longest token sequence the position embedding covers
    vocab_size: int | None = Field(None, gt=0)  # None: taken from the data
    dropout: float = Field(0.1, ge=0, lt=1)

    @model_validator(mode="after")
    def _heads_divide(self) -> TransformerSpec:
        if self.d_model % self.heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by heads ({self.heads})")
        return self


class MoESpec(TransformerSpec):
    arch: Literal["moe"]  # type: ignore[assignment]
    experts: int = Field(4, gt=1)  # feed-forward experts per block
    top_k: int = Field(2, gt=0)  # experts each token is routed to

    @model_validator(mode="after")
    def _top_k_fits(self) -> MoESpec:
        if self.top_k > self.experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed experts ({self.experts})")
        return self


class CustomSpec(Strict):
    arch: Literal["custom"]
    factory: str = Field(pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")  # "package.module:function"
    kwargs: dict[str, Any] = {}  # passed to the factory


class OnnxSpec(Strict):
    """A model that is already ONNX: an artifact's model.onnx, trained further with `train.backend: ort`."""

    arch: Literal["onnx"]
    artifact: str  # the parent artifact: a version directory, or a model directory (its newest version)


class HFSpec(Strict):
    """A Hugging Face Transformers model directory (`save_pretrained` output), fine-tuned as a classifier, or as a
    causal LM (task text-generation; a directory with config.json and a tokenizer but no weights trains one
    from scratch)."""

    arch: Literal["hf"]
    path: str = Field(min_length=1)  # the directory (config.json, weights, tokenizer), relative to the recipe


ModelSpec = Annotated[
    MLPSpec | CNNSpec | TransformerSpec | MoESpec | CustomSpec | OnnxSpec | HFSpec, Field(discriminator="arch")
]


class LoraSpec(Strict):
    """LoRA through PEFT: low-rank adapters on `target_modules`, merged into the base weights before export."""

    rank: int = Field(8, gt=0, le=4096)  # the adapters' inner width r
    alpha: float = Field(16.0, gt=0)  # scaling: the update is (alpha / rank) * B @ A
    dropout: float = Field(0.0, ge=0, lt=1)  # dropout on the adapters' input
    # module names (or name suffixes) to adapt, e.g. [query, value] for BERT; the classifier head always trains
    target_modules: list[Annotated[str, Field(min_length=1)]] = Field(["query", "value"], min_length=1)
