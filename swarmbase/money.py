"""How money is shown, wherever a person or a model reads it: notices, tool texts, the
client, the CLI's tables, error messages and the dashboard (dashboard/static/common.js
has the same rule in JavaScript). Pure.

One rule: an amount is shown to 1/10,000 of a dollar, rounded half up, and a total is the
exact sum rounded once by that rule, so a table's foot shows the figure the run's header,
its notices and `usage` show for the same spend (summing the rounded rows made a foot of
$0.0015 under a header of $0.0014, issue 32.4). Cents (what notices and the client used
to print) turn most agents' spend into "$0.00"; the dashboard always showed four places.
Stored figures (run.json, agent records, `usage` JSON) keep their full precision.
"""

from __future__ import annotations

import math
from typing import Any, Iterable

UNIT = 10_000                     # shown amounts are whole 1/10,000ths of a dollar


def exact(value: Any) -> float:
    """The amount as a finite float (0 for what is no number)."""
    try:
        v = float(value or 0)
    except (TypeError, ValueError):
        return 0.0
    return v if math.isfinite(v) else 0.0


def units(value: Any) -> int:
    """The amount as shown, in 1/10,000 dollars: round half up (0 for what is no number)."""
    return math.floor(exact(value) * UNIT + 0.5)


def fmt_units(n: int) -> str:
    sign = "-" if n < 0 else ""
    n = abs(n)
    return f"{sign}${n // UNIT}.{n % UNIT:04d}"


def usd(value: Any) -> str:
    """`$1.2346` for 1.23456."""
    return fmt_units(units(value))


def total(values: Iterable[Any]) -> str:
    """The exact sum of the amounts, rounded once (the figure a header shows for them)."""
    return usd(math.fsum(exact(v) for v in values))
