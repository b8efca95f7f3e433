"""`pipe report`: the model card (reports/model-card.md) and the training curves (reports/training-curves.png).

`run.py` is the stage (`report_artifact`, `report_fresh`); `card.py` assembles the card from the
sections in `variants.py` (variants, edge models, benchmark) and `usage.py` (serve, device,
check); `curves.py` reads and plots the training history; `policy.py` says which policy each
variant was held to; `markdown.py` writes tables that render.
"""
