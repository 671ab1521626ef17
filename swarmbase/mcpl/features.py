"""Feature sets, the RFC-001 tag ontology and the featureSets/update grant logic. No I/O."""

from __future__ import annotations

from typing import Any

import attrs

TOOLS_SET = "swarmbase"
NOTIFY_SET = "swarmbase.notify"

BUDGET_WARNING_DEBOUNCE_MS = 30_000

TAG_ONTOLOGY: dict[str, Any] = {
    "tags": {
        "swarmbase:run-end": {"desc": "A run reached a terminal state", "facet": "lifecycle",
                              "suggestedTreatment": "immediate"},
        "swarmbase:completed": {"desc": "The run's script returned normally", "facet": "lifecycle"},
        "swarmbase:failed": {"desc": "The run ended in failure", "facet": "lifecycle"},
        "swarmbase:cancelled": {"desc": "The run was cancelled by its caller or an admin", "facet": "lifecycle"},
        "swarmbase:interrupted": {"desc": "The daemon stopped while the run was in flight", "facet": "lifecycle"},
        "surface:done": {"desc": "Work surfaced to the agent is finished", "stability": "experimental"},
        # "Batched" in RFC-001 terms: a debounce, so warnings arriving close together
        # (several runs crossing their threshold) reach the agent as one wake-up.
        "swarmbase:budget-warning": {"desc": "A run's spend plus reservations crossed its budget warning "
                                             "threshold; it may still be cancelled before the ceiling",
                                     "facet": "lifecycle", "suggestedTreatment": {"debounce": BUDGET_WARNING_DEBOUNCE_MS}},
        # Context only: a progress notice (a run that asked for them, progress_notice.py)
        # says how far the run got; the end notice is what needs the agent.
        "swarmbase:progress": {"desc": "How far a run that asked for progress notices got (a phase ended, its "
                                       "first agent failed); no need to wake the agent, the end notice follows",
                               "facet": "lifecycle", "suggestedTreatment": "mute"},
    },
    "suggestedTreatment": [{"tagsAny": ["swarmbase:progress"], "behavior": "mute"},
                           {"tagsAny": ["swarmbase:run-end"], "behavior": "immediate"},
                           {"tagsAny": ["swarmbase:budget-warning"],
                            "behavior": {"debounce": BUDGET_WARNING_DEBOUNCE_MS}}],
    "open": True,
}

DECLARATIONS: dict[str, dict[str, Any]] = {
    TOOLS_SET: {"description": "Start, inspect, cancel and resume swarm runs", "uses": ["tools"]},
    NOTIFY_SET: {"description": "Run-completion notices pushed when a SwarmBase run ends (and, for runs that "
                                "ask, progress notices before it)",
                 "uses": ["pushEvents"], "tagOntology": TAG_ONTOLOGY},
}


def version_tuple(v: Any) -> tuple[int, ...]:
    try:
        return tuple(int(p) for p in str(v).split("."))
    except ValueError:
        return (0,)


def is_05_or_later(version: Any) -> bool:
    return version_tuple(version) >= (0, 5)


# The featureSets shape each known host parses, by clientInfo.name. The version a host
# advertises cannot decide it: agent-framework says "0.4" and needs the object form.
# Evidence for every row is in docs/decisions.md ("featureSets form per host").
KNOWN_HOSTS: dict[str, str] = {
    "agent-framework": "object",      # types featureSets as an object and spreads it
    "mcpl-harness": "array",          # 0.1.x CLI (same handshake as the web UI)
    "mcpl-harness-web": "array",      # 0.1.x web UI: `for (const fs of decls ?? [])` throws on an object
}


def declaration_form(version: Any, client_name: Any) -> str:
    """'object' (the 0.5 form, and the default) or 'array' (only pre-0.5 builds of hosts
    known to need it; a 0.5 host must parse the object form whatever its name)."""
    if is_05_or_later(version):
        return "object"
    known = KNOWN_HOSTS.get(client_name) if isinstance(client_name, str) else None
    return known or "object"


def declarations_for(version: Any, client_name: Any = None) -> Any:
    if declaration_form(version, client_name) == "object":
        return DECLARATIONS
    return [{"name": name, **decl} for name, decl in DECLARATIONS.items()]


def _segment_match(pattern: str, path: str) -> bool:
    p, q = pattern.split("."), path.split(".")
    return len(p) == len(q) and all(a == "*" or a == b for a, b in zip(p, q, strict=True))


def _set_selected(name: str, enabled: list[str] | None, disabled: list[str]) -> bool:
    def hit(patterns: list[str]) -> bool:
        for pat in patterns:
            if pat == name or pat == "*":
                return True
            if pat.endswith("*") and name.startswith(pat[:-1]):
                return True
        return False
    if hit(disabled):
        return False
    return enabled is None or hit(enabled)


@attrs.frozen
class Grant:
    capabilities: frozenset[str]
    active_sets: frozenset[str]

    @property
    def can_push(self) -> bool:
        return NOTIFY_SET in self.active_sets


EMPTY_GRANT = Grant(frozenset(), frozenset())


class GrantError(ValueError):
    pass


def apply_update(params: Any) -> tuple[Grant, dict[str, Any]]:
    """A featureSets/update Request → (grant, receipt). Raises GrantError for a grant that
    contradicts itself (a path both granted and denied)."""
    params = params if isinstance(params, dict) else {}
    eff = params.get("effectiveCapabilities")
    eff = [str(x) for x in eff] if isinstance(eff, list) else []
    denied = params.get("deniedCapabilities")
    denied = [str(x) for x in denied] if isinstance(denied, list) else []
    both = sorted(set(eff) & set(denied))
    if both:
        raise GrantError(f"capabilities both granted and denied: {', '.join(both)}")
    enabled = params.get("enabled")
    enabled = [str(x) for x in enabled] if isinstance(enabled, list) else None
    disabled = params.get("disabled")
    disabled = [str(x) for x in disabled] if isinstance(disabled, list) else []

    def granted(path: str) -> bool:
        return any(_segment_match(p, path) for p in eff)

    active: set[str] = set()
    unavailable: list[dict[str, Any]] = []
    for name, decl in DECLARATIONS.items():
        if not _set_selected(name, enabled, disabled):
            continue
        missing = [u for u in decl["uses"] if not granted(u)]
        if missing:
            unavailable.append({"featureSet": name, "missingCapabilities": missing, "effect": "disabled"})
        else:
            active.add(name)
    receipt: dict[str, Any] = {"accepted": True, "unavailableFeatures": unavailable, "notes": []}
    if unavailable:
        receipt["mode"] = "degraded"
    caps = frozenset(p for p in ("tools", "pushEvents") if granted(p))
    return Grant(caps, frozenset(active)), receipt


def legacy_selection(params: Any) -> Grant:
    """Pre-0.5 hosts: a featureSets/update Notification is the selection; pushEvents was
    advertised by the host at initialize."""
    params = params if isinstance(params, dict) else {}
    enabled = params.get("enabled")
    enabled = [str(x) for x in enabled] if isinstance(enabled, list) else None
    disabled = params.get("disabled")
    disabled = [str(x) for x in disabled] if isinstance(disabled, list) else []
    active = frozenset(n for n in DECLARATIONS if _set_selected(n, enabled, disabled))
    return Grant(frozenset({"tools", "pushEvents"}), active)


def disable_only(grant: Grant, params: Any) -> Grant:
    """A 0.5 Notification carrying grant fields: apply `disabled`, ignore the rest."""
    params = params if isinstance(params, dict) else {}
    disabled = params.get("disabled")
    disabled = [str(x) for x in disabled] if isinstance(disabled, list) else []
    active = frozenset(n for n in grant.active_sets if _set_selected(n, None, disabled))
    return Grant(grant.capabilities, active)
