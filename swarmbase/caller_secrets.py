"""The secret values a daemon's records must never show: every caller's API key and MCPL
token, read from their files (the redactor is seeded with them at start and on reload)."""

from __future__ import annotations

from pathlib import Path

from .config import Config


def caller_secrets(cfg: Config) -> list[str]:
    """Every caller's key and MCPL token, so no record of any run can show any of them."""
    out = []
    for c in cfg.callers:
        paths = [cfg.state_dir / f"mcpl-{c.name}.token"] + ([Path(c.apiKeyFile)] if c.apiKeyFile else [])
        for p in paths:
            try:
                value = p.read_text().strip()
            except OSError:
                continue
            if value:
                out.append(value)
    return out
