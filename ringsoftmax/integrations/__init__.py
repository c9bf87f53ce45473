"""Adapters that put ringsoftmax under other libraries' model code (each imports its library lazily).

- ``transformers.py``: ``attn_implementation="ringsoftmax"`` for Hugging Face transformers models.
"""
