"""agent-framework's event gate and push handler, ported to Python for the wake-rule tests.

The gate decides whether an accepted push event wakes the agent. Ported from these sources
(read, not copied; the ports keep their structure so a difference can be checked line by
line):

- G1: anima-research/agent-framework @ 0329c034e8b2 (2026-03-31, main),
  src/gate/event-gate.ts: `validateConfig`, `validatePolicy`, `compileGlob`,
  `compiledMatches`, `evaluate`, `asShouldTriggerCallback`. Match fields scope, source,
  channel, filter; behaviours always | skip | {debounce}; a `match` key it does not know
  is dropped (validation is lenient), and a behaviour string it does not know becomes
  "always". The first gate: added in fec59c7 (2026-03-23).
- G2: antra-tess/agent-framework @ a13fece07619 (2026-05-29, main), same file: G1 plus
  match fields mount, pathGlob, metadataTrue and behaviours rate_limit, passive_sample.
- G3: anima-research/agent-framework @ 41596416fc02, same file: G2 plus tagsAny / tagsAll /
  tagsNone, the behaviour "defer" (and "skip" kept as its old name), sleep suppression and
  gate.js (neither is in play here: no sleep, no gate.js).

What each build's push handler hands the gate (src/mcpl/push-handler.ts, the `metadata`
given to `shouldTriggerInference`):

- before 3c8e25c (e.g. 58af1a24bd16, 2026-02-19): {serverId, featureSet, eventId, ...origin}:
  no eventType, so the gate sees "unknown";
- 3c8e25c (2026-03-06) to a80644a (2026-04-17), e.g. 0329c03 and 1d0fd23 (line 198):
  eventType "push:event", then origin spread over it;
- a80644a on, e.g. a13fece: eventType "mcpl:push-event";
- later builds, e.g. Meganeuridae/agent-framework @ 3666acde5a63 (2026-07): and `tags`.

Builds before fec59c7 (2026-03-23), e.g. 58af1a24bd16 and 1d0fd23, have no gate at all
(no src/gate/): the framework passes no `shouldTriggerInference`, so every accepted push
event wakes the agent and no gate.json rule applies. Such a build's `gate` is None here.
None of the builds read here looks at `origin.suppressWake` (git grep over every branch of
anima-research/agent-framework and antra-tess/agent-framework).

Rate limits, samples and debounce timers are not ported: a debounced or rate-limited
decision does not wake at once, which is all the tests need to know of them.
"""

from __future__ import annotations

import re
from typing import Any

import attrs

G1_MATCH = ("scope", "source", "channel", "filter")
G2_MATCH = G1_MATCH + ("mount", "pathGlob", "metadataTrue")
G3_MATCH = G2_MATCH + ("tagsAny", "tagsAll", "tagsNone")
GATES: dict[str, dict[str, Any]] = {
    "G1": {"match": G1_MATCH, "strings": ("always", "skip"), "defaults": ("always", "skip")},
    "G2": {"match": G2_MATCH, "strings": ("always", "skip"), "defaults": ("always", "skip")},
    "G3": {"match": G3_MATCH, "strings": ("always", "defer", "skip"), "defaults": ("always", "defer", "skip")},
}


@attrs.frozen
class Build:
    commit: str
    repo: str
    date: str
    event_type: str | None      # None: the push handler sets no eventType
    sends_tags: bool
    gate: str | None            # the gate generation that judges its events; None: no gate


BUILDS = [
    Build("58af1a24bd16", "anima-research/agent-framework", "2026-02-19", None, False, None),
    Build("1d0fd23", "anima-research/agent-framework feature/mcpl-v05-state-branches", "2026-03-16",
          "push:event", False, None),
    Build("0329c03", "anima-research/agent-framework main", "2026-03-31", "push:event", False, "G1"),
    Build("a13fece07619", "antra-tess/agent-framework main", "2026-05-29", "mcpl:push-event", False, "G2"),
    Build("3666acde5a63", "Meganeuridae/agent-framework", "2026-07", "mcpl:push-event", True, "G3"),
]


class GateConfigError(ValueError):
    pass


def compile_glob(pattern: str) -> re.Pattern[str]:
    """`compileGlob`: everything literal except `*`, anchored at both ends."""
    return re.compile("^" + ".*".join(re.escape(part) for part in pattern.split("*")) + "$")


def validate_policy(raw: Any, gen: str) -> dict[str, Any]:
    g = GATES[gen]
    if not isinstance(raw, dict):
        raise GateConfigError("Each gate policy must be an object")
    if not isinstance(raw.get("name"), str) or not raw["name"]:
        raise GateConfigError('Gate policy must have a "name" string')
    b = raw.get("behavior")
    if b in g["strings"]:
        behavior: Any = b
    elif isinstance(b, dict) and b:
        behavior = b                 # debounce / rate_limit / passive_sample: never an immediate wake
    else:
        behavior = "always"          # `else { behavior = 'always'; }`
    match: dict[str, Any] = {}
    m = raw.get("match")
    if isinstance(m, dict):
        for key in g["match"]:
            v = m.get(key)
            if key in ("scope",) and isinstance(v, list):
                match[key] = [s for s in v if isinstance(s, str)]
            elif key in ("source", "channel", "mount", "pathGlob") and isinstance(v, str):
                match[key] = v
            elif key in ("metadataTrue", "tagsAny", "tagsAll", "tagsNone") and isinstance(v, list):
                kept = [s for s in v if isinstance(s, str) and s]
                if kept:
                    match[key] = kept
            elif key == "filter" and isinstance(v, dict) and v.get("type") in ("text", "regex") \
                    and isinstance(v.get("pattern"), str):
                match[key] = {"type": v["type"], "pattern": v["pattern"]}
    return {"name": raw["name"], "match": match, "behavior": behavior}


def validate_config(raw: Any, gen: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise GateConfigError("gate.json must be a JSON object")
    default = raw.get("default", "always")
    if default not in GATES[gen]["defaults"]:
        raise GateConfigError(f'gate.json "default" must be one of {GATES[gen]["defaults"]}, got: {default}')
    policies = [validate_policy(p, gen) for p in raw["policies"]] if isinstance(raw.get("policies"), list) else []
    return {"policies": policies, "default": default}


def _truthy(v: Any) -> bool:
    """`isMetadataTruthy`: empty strings, arrays and objects count as false."""
    if v is None:
        return False
    if isinstance(v, (str, list, dict)):
        return len(v) > 0
    return bool(v)


def matches(policy: dict[str, Any], info: dict[str, Any]) -> bool:
    """`compiledMatches`: every field the policy has must hold."""
    m = policy["match"]
    if m.get("scope") and info["eventType"] not in m["scope"]:
        return False
    if "source" in m and m["source"] and not compile_glob(m["source"]).search(info["serverId"]):
        return False
    if "channel" in m and m["channel"] and not compile_glob(m["channel"]).search(info["channelId"]):
        return False
    if "mount" in m and m["mount"] and not (info.get("mount") and compile_glob(m["mount"]).search(info["mount"])):
        return False
    if "pathGlob" in m and m["pathGlob"]:
        paths = info.get("paths") or []
        if not any(compile_glob(m["pathGlob"]).search(p) for p in paths):
            return False
    f = m.get("filter")
    if f:
        if f["type"] == "text":
            if f["pattern"].lower() not in info["content"].lower():
                return False
        elif not re.search(f["pattern"], info["content"], re.IGNORECASE):
            return False
    if m.get("metadataTrue"):
        md = info.get("metadata") or {}
        if not any(_truthy(md.get(k)) for k in m["metadataTrue"]):
            return False
    if any(k in m for k in ("tagsAny", "tagsAll", "tagsNone")):
        tags = info.get("tags") or []

        def hit(p: str) -> bool:
            return any(compile_glob(p).search(t) for t in tags)
        if "tagsAny" in m and not any(hit(p) for p in m["tagsAny"]):
            return False
        if "tagsAll" in m and not all(hit(p) for p in m["tagsAll"]):
            return False
        if "tagsNone" in m and any(hit(p) for p in m["tagsNone"]):
            return False
    return True


def evaluate(config: dict[str, Any], info: dict[str, Any]) -> tuple[bool, str | None]:
    """`evaluate` / `computeDecision` for an immediate decision: (trigger, policy name)."""
    for policy in config["policies"]:            # first match wins
        if matches(policy, info):
            return policy["behavior"] == "always", policy["name"]
    return config["default"] == "always", None


def push_metadata(build: Build, server_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """The metadata this build's PushHandler hands `shouldTriggerInference`."""
    md: dict[str, Any] = {"serverId": server_id, "featureSet": params["featureSet"], "eventId": params["eventId"]}
    if build.event_type is not None:
        md["eventType"] = build.event_type
    md.update(params.get("origin") or {})
    if build.sends_tags and params.get("tags"):
        md["tags"] = params["tags"]
    return md


def wakes(build: Build, gate_json: dict[str, Any], server_id: str, params: dict[str, Any]) -> tuple[bool, str | None]:
    """Whether this build wakes the agent for push/event `params` from the server registered
    under `server_id` (`asShouldTriggerCallback` wraps the metadata into the gate's event).
    A build without a gate wakes on every accepted event, whatever `gate_json` says."""
    if build.gate is None:
        return True, None
    config = validate_config(gate_json, build.gate)
    md = push_metadata(build, server_id, params)
    content = "\n".join(b["text"] for b in params["payload"]["content"] if b.get("type") == "text")
    info = {"content": content, "eventType": md.get("eventType", "unknown"), "serverId": md.get("serverId", ""),
            "channelId": md.get("channelId", ""), "metadata": md,
            "tags": md["tags"] if isinstance(md.get("tags"), list) else None}
    return evaluate(config, info)
