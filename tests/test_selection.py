"""The feature-set selection state of a session (swarmbase/mcpl/selection.py), pure: what
each host sends, and what becomes the grant."""

from __future__ import annotations

from swarmbase.mcpl import features, selection
from swarmbase.mcpl.features import EMPTY_GRANT, NOTIFY_SET, TOOLS_SET

BOTH = {"enabled": [TOOLS_SET, NOTIFY_SET]}
REQUEST = {"effectiveCapabilities": ["pushEvents", "tools"], "enabled": [TOOLS_SET, NOTIFY_SET]}


def test_a_05_request_is_the_grant_and_a_later_notification_only_disables() -> None:
    sel = selection.Selection("0.5", push_advertised=True)
    grant, receipt = sel.on_request(REQUEST)
    assert grant.can_push and receipt["accepted"] is True
    after = sel.on_notification(grant, {"enabled": [TOOLS_SET, NOTIFY_SET], "disabled": [NOTIFY_SET]})
    assert after.grant is not None and not after.grant.can_push
    # Enabling by notification grants nothing in 0.5.
    assert sel.on_notification(features.Grant(frozenset({"tools"}), frozenset({TOOLS_SET})), BOTH).grant.active_sets \
        == {TOOLS_SET}
    assert sel.on_grace_over(grant) == selection.NO_CHANGE


def test_a_05_notification_becomes_the_selection_only_when_no_request_came_in_the_grace() -> None:
    sel = selection.Selection("0.5", push_advertised=True)
    assert sel.grace_s == selection.NOTIFIED_05_GRACE_S
    assert sel.on_notification(EMPTY_GRANT, BOTH) == selection.NO_CHANGE       # not yet
    d = sel.on_grace_over(EMPTY_GRANT)
    assert d.grant is not None and d.grant.can_push and d.grant.active_sets == {TOOLS_SET, NOTIFY_SET}
    assert "only as a featureSets/update notification" in d.note
    assert "active sets: swarmbase, swarmbase.notify" in d.note
    # After the grace, a new notification is applied at once; a late request still wins.
    d2 = sel.on_notification(d.grant, {"enabled": [TOOLS_SET], "disabled": [NOTIFY_SET]})
    assert d2.grant is not None and not d2.grant.can_push
    grant, _ = sel.on_request(REQUEST)
    assert grant.can_push and sel.on_notification(grant, BOTH).grant == grant   # disable-only again


def test_a_request_within_the_grace_wins_over_an_earlier_notification() -> None:
    sel = selection.Selection("0.5", push_advertised=True)
    sel.on_notification(EMPTY_GRANT, BOTH)
    grant, _ = sel.on_request({"effectiveCapabilities": ["tools"], "enabled": [TOOLS_SET, NOTIFY_SET]})
    assert not grant.can_push
    assert sel.on_grace_over(grant) == selection.NO_CHANGE


def test_a_05_host_that_sends_nothing_stays_unpushed_and_it_is_said() -> None:
    sel = selection.Selection("0.5", push_advertised=True)
    d = sel.on_grace_over(EMPTY_GRANT)
    assert d.grant is None and "sent no featureSets/update" in d.note


def test_a_05_host_without_push_events_gets_no_push_grant() -> None:
    sel = selection.Selection("0.5", push_advertised=False)
    sel.on_notification(EMPTY_GRANT, BOTH)
    d = sel.on_grace_over(EMPTY_GRANT)
    assert d.grant is None and "without pushEvents" in d.note


def test_pre_05_hosts_select_by_notification_or_by_default_after_the_grace() -> None:
    sel = selection.Selection("0.4", push_advertised=True)
    assert sel.grace_s == selection.PRE_05_GRACE_S
    d = sel.on_notification(EMPTY_GRANT, {"enabled": [TOOLS_SET]})
    assert d.grant is not None and d.grant.active_sets == {TOOLS_SET} and d.note is None
    assert sel.on_grace_over(d.grant) == selection.NO_CHANGE       # it selected: nothing to assume
    silent = selection.Selection("0.4", push_advertised=True)
    assumed = silent.on_grace_over(EMPTY_GRANT)
    assert assumed.grant is not None and assumed.grant.can_push and assumed.note is None
    assert selection.Selection("0.4", push_advertised=False).grace_s is None
