"""How a host's feature-set selection becomes a session's grant. Pure: no I/O, no clock
(the session runs the grace timer and logs the notes).

What hosts send (docs/decisions.md, "featureSets form per host", has the sources):

- 0.5 hosts send `featureSets/update` as a *Request* right after `initialize`: that is
  the grant, answered with a receipt. The spec makes a 0.5 *Notification* disable-only.
- Pre-0.5 hosts select with a Notification, or never send one (mcpl-harness): after a
  grace period the selection is assumed to be "every set".
- One fetchable build is in between: agent-framework `feature/mcpl-v05-state-branches`
  (1d0fd23) advertises 0.5 but selects only with a Notification. Held to the 0.5 rule it
  never got a notice and nothing said why. So a 0.5 Notification that arrives while no
  Request has come is kept; when the grace period ends with still no Request, it is taken
  as the selection, exactly as for a pre-0.5 host, with a note saying what was assumed.
  A Request, whenever it comes, is the grant from then on.

Guessing wrong costs nothing lost: a strict 0.5 host whose Request is merely late answers
an early push with -32002, and delivery waits for the Request's grant and resends.
"""

from __future__ import annotations

from typing import Any

import attrs

from . import features

PRE_05_GRACE_S = 20.0       # discord-mcpl waits 20 s for an old host's selection
# A 0.5 host sends its Request right after `notifications/initialized` (its own timer for
# the answer is 15 s), so 5 s without one, after a Notification, means it is not coming.
NOTIFIED_05_GRACE_S = 5.0


@attrs.frozen
class Decision:
    grant: features.Grant | None = None     # None: the grant does not change
    note: str | None = None                 # what to log (once) about what was assumed


NO_CHANGE = Decision()


def _sets(grant: features.Grant) -> str:
    return ", ".join(sorted(grant.active_sets)) or "none"


class Selection:
    """The selection state of one MCPL session, from `initialize` on."""

    def __init__(self, version: str, push_advertised: bool) -> None:
        self.version = version
        self.strict = features.is_05_or_later(version)
        self.push_advertised = push_advertised
        self.requested = False          # a featureSets/update Request has come
        self.notified: Any = None       # a 0.5 Notification's params, kept until the grace ends
        self.grace_over = False

    @property
    def grace_s(self) -> float | None:
        """How long to wait for the host before assuming; None: nothing to wait for."""
        if self.strict:
            return NOTIFIED_05_GRACE_S
        return PRE_05_GRACE_S if self.push_advertised else None

    def on_request(self, params: Any) -> tuple[features.Grant, dict[str, Any]]:
        """A Request is always the grant (raises features.GrantError for a contradiction)."""
        self.requested = True
        self.notified = None
        return features.apply_update(params)

    def on_notification(self, current: features.Grant, params: Any) -> Decision:
        if not self.strict:
            return Decision(features.legacy_selection(params))
        if self.requested:
            return Decision(features.disable_only(current, params))
        self.notified = params if params is not None else {}
        return self._assume() if self.grace_over else NO_CHANGE

    def on_grace_over(self, current: features.Grant) -> Decision:
        self.grace_over = True
        if self.requested:
            return NO_CHANGE
        if self.strict:
            if self.notified is not None:
                return self._assume()
            return Decision(note=f"the host advertises MCPL {self.version} but sent no featureSets/update in "
                                 f"{NOTIFIED_05_GRACE_S:g} s: notices wait until it sends one")
        if current is features.EMPTY_GRANT:
            return Decision(features.legacy_selection({}))
        return NO_CHANGE

    def _assume(self) -> Decision:
        if not self.push_advertised:
            return Decision(note=f"the host advertises MCPL {self.version} without pushEvents and selected its "
                                 "feature sets only with a notification: no notices are pushed to it")
        grant = features.legacy_selection(self.notified)
        return Decision(grant, note=(
            f"the host advertises MCPL {self.version} but sent its feature-set selection only as a "
            f"featureSets/update notification, with no request in {NOTIFIED_05_GRACE_S:g} s; taking that "
            f"notification as its selection, as for a pre-0.5 host (assumed granted: pushEvents, tools; "
            f"active sets: {_sets(grant)})"))
