"""Run-end notices, from the record to the caller's host: what a notice says (notices.py),
the durable outbox that holds it until the host accepts it (outbox.py over the append-only
log in outbox_file.py), and the push loop of one connected host (delivery.py)."""
