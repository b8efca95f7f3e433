"""pipe: one verified ONNX artifact from training to every deployment target."""

__version__ = "0.1.0"
