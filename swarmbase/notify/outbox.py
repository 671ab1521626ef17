"""Durable notices: an append-only log, `outbox.jsonl`, of `add` and `ack` lines.

- `add(caller, notice)` appends an add line and fsyncs it before returning, so it is on
  disk before any push is tried.
- `ack(event_id)` (the host answered accepted or duplicate) appends an ack line at once:
  a crash of the daemon process after that never re-sends the notice. Its fsync is
  coalesced (every ACK_SYNC_S, or at the next add or flush); only a power loss inside that
  window can re-send a notice, with its same eventId, which hosts dedupe.
- A torn last line (a crash mid-write) is skipped on load and cut off before the next
  append, so it loses nothing that was written whole.
- When dead lines (acks and the adds they cancel) outnumber live ones, the log is
  compacted in the background: live adds rewritten by temp + fsync + rename.
- A disk that refuses writes (ENOSPC, EIO, EROFS, ...) never makes add() or ack() raise:
  the notice stays in memory (delivery works from there), the fault is logged once, and
  the unwritten lines are retried on every add/ack/flush and every RETRY_S by maintain().
- An old whole-file `outbox.json` is migrated on load and then deleted.
- `amend(event_id, notice)` replaces a notice not yet pushed (a run's end notice gets its
  end-record hash once the record is written): a further add line for the same eventId,
  which wins over the earlier one on load.
- Every add gets a sequence number within the log (`seq`), and the log names itself in a
  base line, `{"op":"base","log":<id>,"seq":B}`, written first in a new or rewritten log:
  "every notice of this log numbered below B that is not in this file was acknowledged".
  add() returns the notice's (log, seq); the run records it in run.json, so boot can tell
  a notice that a torn or damaged line lost (its seq at or above B, its eventId on no
  line) from one acknowledged and compacted away, and queue the lost one again
  (lost_at_load; issue 25 #3). A run whose record names another log (the file was
  deleted) or none (older runs) is never re-notified.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import trio

from . import outbox_file
from .outbox_file import LogFile

log = logging.getLogger("swarmbase.outbox")

ACK_SYNC_S = 1.0
RETRY_S = 5.0
COMPACT_MIN_DEAD = 256      # never compact a log with fewer dead lines than this


def _line(value: dict[str, Any]) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def add_line(entry: dict[str, Any]) -> bytes:
    return _line({"op": "add", **entry})


def base_line(log_id: str, seq: int) -> bytes:
    return _line({"op": "base", "log": log_id, "seq": seq})


class Outbox:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.recovered_from_damage = False
        self._by_caller: dict[str, dict[str, dict[str, Any]]] = {}
        self._caller_of: dict[str, str] = {}
        self._changed: dict[str, trio.Event] = {}
        self._queue: list[tuple[str, str, bytes]] = []   # (op, eventId, line) not yet written
        self._nowhere: set[str] = set()     # queued adds that are on no disk at all yet
        self._file = LogFile(path)
        self._file_lines = 0      # whole lines in the file
        self._file_live = 0       # live entries whose add line is in the file
        self._unsynced = False
        self._failing: OSError | None = None
        self._legacy: Path | None = None     # outbox.json to delete once its entries are written
        self._capture: list[tuple[str, str, bytes]] | None = None   # lines written while compacting
        self._held: set[str] = set()        # queued durably, not to be pushed yet (see add)
        self._wake = trio.Event()
        self.compactions = 0
        self.log_id = secrets.token_hex(8)
        self._next_seq = 0
        self._base_due = True               # the file has no base line for log_id yet
        self._base_seq = 0                  # what that base line will say
        # What the log held when loaded, for boot's lost_at_load (freed by boot_done).
        self._loaded_log: str | None = None
        self._loaded_base = 0
        self._loaded_ids: set[str] = set()
        self._load()

    # -- loading --------------------------------------------------------------
    def _load(self) -> None:
        legacy_path = self.path.with_name("outbox.json")
        try:
            outbox_file.remove_temps(self.path)
            legacy = outbox_file.read_legacy(legacy_path)
        except OSError as e:        # unreadable or read-only now: it stays for the next start
            log.error("cannot read %s (%s); it is left as it is", legacy_path, e.strerror or e)
            legacy = outbox_file.Legacy([])
        if legacy.damaged_copy is not None:
            self.recovered_from_damage = True
            log.warning("outbox.json was damaged; kept %d notices, the original is at %s",
                        len(legacy.entries), legacy.damaged_copy)
        for entry in legacy.entries:
            self._remember(entry)
        try:
            loaded = outbox_file.read_log(self.path)
            self._file.size = loaded.good_size
        except OSError as e:
            # Unreadable now (EIO): serve from memory, append after whatever is there.
            self._fail(e, "read")
            loaded = outbox_file.Loaded([], 0, 0, 0, None)
        for rec in loaded.records:
            if rec["op"] == "add":
                if not self._remember(rec):
                    self._replace(rec)          # an amend: the later line wins
            else:
                self._forget(rec["eventId"])
        if loaded.damaged:
            self.recovered_from_damage = True
            log.warning("%s had %d damaged line(s); kept every whole one; the original is %s",
                        self.path.name, loaded.damaged,
                        f"at {loaded.damaged_copy}" if loaded.damaged_copy else "left as it is")
        if loaded.torn_tail:
            log.warning("%s ended in a torn line (a crash mid-write); it was skipped", self.path.name)
        self._file_lines = len(loaded.records)
        self._file_live = len({rec["eventId"] for rec in loaded.records
                               if rec["op"] == "add" and rec["eventId"] in self._caller_of})
        if loaded.base is not None:
            self.log_id, self._next_seq, self._base_due = loaded.base["log"], loaded.base["seq"], False
            self._loaded_log, self._loaded_base = loaded.base["log"], loaded.base["seq"]
        self._loaded_ids = {rec["eventId"] for rec in loaded.records}
        seqs = [rec["seq"] for rec in loaded.records if rec["op"] == "add" and isinstance(rec.get("seq"), int)]
        self._next_seq = max([self._next_seq, *(q + 1 for q in seqs)])
        # A log without a base line (new, or older than seq numbers) gets one with its first
        # write: no notice of this (new) log id is below it.
        self._base_seq = self._loaded_base if loaded.base is not None else self._next_seq
        migrating = legacy.found
        if migrating or loaded.damaged_copy or loaded.intact_tail:
            self._legacy = legacy_path if migrating and legacy_path.exists() else None
            self._rewrite_now()

    def _rewrite_now(self) -> None:
        """Write the live entries as a fresh log (migration, damage). On failure the old
        files stay and the entries are queued, so nothing is lost. Unlike a compaction it
        keeps the base and an ack line for every notice acknowledged so far: boot has not
        yet asked lost_at_load about the runs, and the answers must not change."""
        entries = list(self._entries())
        acked = sorted(self._loaded_ids - set(self._caller_of))
        try:
            outbox_file.rewrite(self.path, base_line(self.log_id, self._base_seq)
                                + b"".join(add_line(e) for e in entries)
                                + b"".join(_line({"op": "ack", "eventId": eid}) for eid in acked))
        except OSError as e:
            self._fail(e, "rewrite")
            self._queue = [("add", e["notice"]["eventId"], add_line(e)) for e in entries]
            return
        self._base_due = False
        self._file.reopen(size=None)
        self._file_lines = len(entries) + len(acked)
        self._file_live = len(entries)
        self._retire_legacy()

    def _retire_legacy(self) -> None:
        if self._legacy is not None:
            try:
                self._legacy.unlink(missing_ok=True)
                log.info("migrated outbox.json to %s", self.path.name)
            except OSError as e:
                log.warning("could not delete the migrated %s: %s", self._legacy, e.strerror)
            self._legacy = None

    # -- memory -----------------------------------------------------------------
    def _remember(self, entry: dict[str, Any]) -> bool:
        notice = entry.get("notice")
        caller = entry.get("caller")
        if not isinstance(notice, dict) or not isinstance(caller, str) or not isinstance(notice.get("eventId"), str):
            return False
        eid = notice["eventId"]
        if eid in self._caller_of:
            return False
        kept = {"caller": caller, "addedAt": entry.get("addedAt", time.time()), "notice": notice}
        if isinstance(entry.get("seq"), int):
            kept["seq"] = entry["seq"]
        self._by_caller.setdefault(caller, {})[eid] = kept
        self._caller_of[eid] = caller
        return True

    def _replace(self, entry: dict[str, Any]) -> None:
        """A pending notice's params replaced (same eventId and caller; its place kept)."""
        notice, caller = entry.get("notice"), entry.get("caller")
        eid = notice.get("eventId") if isinstance(notice, dict) else None
        if isinstance(eid, str) and isinstance(caller, str) and self._caller_of.get(eid) == caller:
            self._by_caller[caller][eid]["notice"] = notice

    def _forget(self, eid: str) -> bool:
        caller = self._caller_of.pop(eid, None)
        if caller is None:
            return False
        del self._by_caller[caller][eid]
        return True

    def _entries(self) -> Iterator[dict[str, Any]]:
        for per in self._by_caller.values():
            yield from per.values()

    def __len__(self) -> int:
        return len(self._caller_of)

    # -- the API used by the supervisor and sessions ----------------------------------
    def add(self, caller: str, notice: dict[str, Any], hold: bool = False) -> tuple[str, int] | None:
        """Keep a notice until its host acknowledges it. Never raises on a disk fault.
        `hold`: durable now, pushed only after release() (a run's end notice is queued
        before its final record is written, and goes out once that is done). Returns the
        notice's place in this log, (log id, seq), for the run's record (None: that
        eventId is pending already)."""
        seq = self._next_seq
        entry = {"caller": caller, "addedAt": time.time(), "seq": seq, "notice": notice}
        if not self._remember(entry):
            return None
        self._next_seq += 1
        if hold:
            self._held.add(notice["eventId"])
        self._queue.append(("add", notice["eventId"], add_line(entry)))
        self._nowhere.add(notice["eventId"])
        self._persist(sync=True)
        ev = self._changed.pop(caller, None)
        if ev is not None:
            ev.set()
        return (self.log_id, seq)

    def ack(self, event_id: str) -> None:
        """The host answered accepted or duplicate: the notice is never sent again."""
        if not self._forget(event_id):
            return
        if event_id in self._nowhere:
            # Never written: its add line is dropped; the ack line alone still says it was
            # acknowledged, so a boot reading its run's record does not queue it again.
            self._nowhere.discard(event_id)
            self._queue = [q for q in self._queue if q[1] != event_id]
        else:
            self._file_live -= 1
        self._queue.append(("ack", event_id, _line({"op": "ack", "eventId": event_id})))
        self._persist(sync=False)
        if self.compaction_due():
            self._wake.set()

    def amend(self, event_id: str, notice: dict[str, Any]) -> bool:
        """Replace a pending notice by one with the same eventId, durably, before it is
        pushed (while held, or at boot). Never raises on a disk fault. False when no such
        notice is pending."""
        caller = self._caller_of.get(event_id)
        if caller is None or notice.get("eventId") != event_id:
            return False
        entry = self._by_caller[caller][event_id]
        entry["notice"] = notice
        line = add_line(entry)
        if event_id in self._nowhere:        # its add is not written yet: write the new one instead
            self._queue = [(op, eid, line if op == "add" and eid == event_id else data)
                           for op, eid, data in self._queue]
        else:
            self._queue.append(("amend", event_id, line))
        self._persist(sync=True)
        return True

    def release(self, event_id: str) -> None:
        if event_id in self._held:
            self._held.discard(event_id)
            caller = self._caller_of.get(event_id)
            ev = self._changed.pop(caller, None) if caller else None
            if ev is not None:
                ev.set()

    def notice(self, event_id: str) -> dict[str, Any] | None:
        """A pending notice by eventId."""
        caller = self._caller_of.get(event_id)
        return self._by_caller[caller][event_id]["notice"] if caller else None

    def ref(self, event_id: str) -> tuple[str, int] | None:
        """A pending notice's place in this log, as add() returned it."""
        caller = self._caller_of.get(event_id)
        seq = self._by_caller[caller][event_id].get("seq") if caller else None
        return (self.log_id, seq) if isinstance(seq, int) else None

    def lost_at_load(self, event_id: str, ref: tuple[str, int] | None) -> bool:
        """Boot: True when the notice at `ref` (what add() returned, kept in its run's
        record) was queued in this log and the log held no line of it when loaded: a
        torn or damaged line lost it, and the caller was never told. False for anything
        the log cannot vouch for (another log, no ref, before its base)."""
        if ref is None or self._loaded_log is None or ref[0] != self._loaded_log or ref[1] < self._loaded_base:
            return False
        return event_id not in self._loaded_ids and event_id not in self._caller_of

    def boot_done(self) -> None:
        """Boot has checked every run: let go of what the log held at load."""
        self._loaded_ids = set()

    def pending(self, caller: str) -> list[dict[str, Any]]:
        """The caller's notices, oldest first."""
        return [e["notice"] for e in self._by_caller.get(caller, {}).values()]

    def next_pending(self, caller: str, skip: Any = (),
                     allow: Callable[[dict[str, Any]], bool] | None = None) -> dict[str, Any] | None:
        """The caller's oldest notice whose eventId is not in `skip` (and that `allow`
        lets through: the session's route). A held notice stops the walk: the ones behind
        it wait for it (a hold lasts one final write), so a host always receives a caller's
        notices in the order they were queued."""
        for eid, e in self._by_caller.get(caller, {}).items():
            if eid in self._held:
                return None
            if eid not in skip and (allow is None or allow(e["notice"])):
                return e["notice"]
        return None

    def changed_event(self, caller: str) -> trio.Event:
        """Set at the caller's next add(). Take it *before* reading pending(), so an add
        that lands in between cannot be missed."""
        ev = self._changed.get(caller)
        if ev is None:
            ev = self._changed[caller] = trio.Event()
        return ev

    def flush(self) -> None:
        """Write and fsync everything written so far (shutdown, an emptied queue)."""
        self._persist(sync=True)

    def close(self) -> None:
        """Let go of the log file (it is reopened by the next write)."""
        self._file.close()

    @property
    def persisted(self) -> bool:
        """True when every notice and ack is on disk (fsync'd)."""
        return not self._queue and not self._unsynced

    # -- writing ------------------------------------------------------------------
    def _persist(self, sync: bool) -> bool:
        if self._queue:
            batch = self._queue
            base = base_line(self.log_id, self._base_seq) if self._base_due else b""
            try:
                self._file.append(base + b"".join(line for _, _, line in batch))
            except OSError as e:
                self._fail(e, "write")
                return False
            self._base_due = False
            self._queue = []
            self._nowhere.clear()
            self._file_lines += len(batch)
            self._file_live += sum(1 for op, _, _ in batch if op == "add")
            self._unsynced = True
            if self._capture is not None:
                self._capture.extend(batch)
        if sync and self._unsynced:
            try:
                self._file.sync()
            except OSError as e:
                self._fail(e, "fsync")
                return False
            self._unsynced = False
        if self._failing is not None:
            log.warning("%s is written again; nothing was lost", self.path.name)
            self._failing = None
        if self._legacy is not None and not self._queue:
            self._retire_legacy()
        return True

    def _fail(self, e: OSError, what: str) -> None:
        if self._failing is None:
            log.error("cannot %s %s (%s); %d notices are kept in memory and still delivered; "
                      "retrying every %.0f s and at the next change", what, self.path, e.strerror or e,
                      len(self), RETRY_S)
        self._failing = e

    # -- compaction and retries ---------------------------------------------------------
    def compaction_due(self) -> bool:
        dead = self._file_lines - self._file_live
        return dead >= COMPACT_MIN_DEAD and dead >= self._file_live

    async def maintain(self) -> None:
        """Background duty: retry unwritten lines, fsync acks, compact when acks dominate."""
        while True:
            with trio.move_on_after(RETRY_S if self._queue else ACK_SYNC_S):
                await self._wake.wait()
            self._wake = trio.Event()
            if self._queue or self._unsynced:
                self._persist(sync=True)
            if not self._queue and self.compaction_due():
                await self.compact()

    async def compact(self) -> bool:
        """Rewrite the log with only live adds. The big write and its fsync run in a
        thread; lines appended meanwhile are carried over before the rename."""
        if self._queue or self._capture is not None:
            return False
        snapshot = list(self._entries())
        # Every notice numbered below _next_seq is in the snapshot or was acknowledged.
        data = base_line(self.log_id, self._next_seq) + b"".join(add_line(e) for e in snapshot)
        self._capture = []
        tmp = None
        try:
            tmp = await trio.to_thread.run_sync(outbox_file.write_temp, self.path, data)
            carried = self._capture
            outbox_file.finish_temp(self.path, tmp, b"".join(line for _, _, line in carried))
        except OSError as e:
            if tmp is not None:
                outbox_file.discard(tmp)
            log.warning("compacting %s failed (%s); the old log stays in use", self.path.name, e.strerror or e)
            return False
        finally:
            self._capture = None
        self._file.reopen(size=None)
        self._file_lines = len(snapshot) + len(carried)
        queued_adds = sum(1 for op, _, _ in self._queue if op == "add")
        self._file_live = len(self) - queued_adds
        self._unsynced = False
        self.compactions += 1
        log.info("compacted %s to %d live notices", self.path.name, len(snapshot))
        return True
