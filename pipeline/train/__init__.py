"""`pipe train`: recipe-driven PyTorch training into a new artifact version (see docs/training.md)."""
