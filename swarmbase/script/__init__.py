"""The script: reading its meta block without running it (meta.py), starting its sandboxed
Node runner (runner.py) and the JSON-lines bridge between the runner and the daemon's
ScriptHost (bridge.py)."""
