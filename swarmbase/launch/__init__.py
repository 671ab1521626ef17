"""Launching agent CLIs: the seam between engines (what to run) and where and how it runs."""
