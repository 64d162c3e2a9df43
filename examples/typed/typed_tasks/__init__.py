"""Typed functions for a sandbox; `host_ok.py` calls them the right way."""
