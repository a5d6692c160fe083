"""Reporting: the run folder, Veeksha-compatible files, console tables, progress lines."""
