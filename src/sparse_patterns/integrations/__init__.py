"""Integrations with the frameworks people train models in.

:mod:`.transformers`: a Hugging Face transformers attention backend (the optional
``transformers`` extra), imported on first use.
"""

__all__ = ["transformers"]
