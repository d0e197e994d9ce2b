"""Samplers: each behind a small protocol, each returning plain data."""
