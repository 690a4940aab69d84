"""Integrations with other libraries. Each submodule imports its library when it is imported;
this package imports nothing (``import moe_cpu`` never imports torch or transformers)."""
