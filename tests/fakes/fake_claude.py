"""A fake `claude -p` for fast unit tests: reads the prompt from stdin, prints stream-json.

The prompt picks the behaviour:
  noop              a result at once (cost $0.01)
  dump              also writes {argv, env, cwd, stdin_is_file} to <cwd>/dump-<pid>.json
  sleep:S           sleep S seconds, then a result
  grandchild        start a grandchild that holds stdout open, print a result, exit
  hold              start a grandchild holding stdout, then sleep forever (a hung agent)
  noresult          print an assistant message with usage, then exit 1 without a result
  escape:MARKER     double-fork a setsid grandchild whose argv carries MARKER, then sleep
  waitfile:PATH     sleep while PATH exists, then a result
  pay:USD[:PATH]    (after waiting while PATH exists) a result that cost USD
Every start appends "<pid> <first word>" to spawns.log beside the executable.
Use `install(dir)` to write an executable copy whose shebang is this interpreter.
"""

from __future__ import annotations

import sys
from pathlib import Path

SOURCE = r'''
import json, os, subprocess, sys, time
prompt = sys.stdin.read()
def out(o):
    sys.stdout.write(json.dumps(o) + "\n"); sys.stdout.flush()
out({"type": "system", "subtype": "init", "model": "claude-fake", "cwd": os.getcwd()})
def result(text="ok", cost=0.01):
    out({"type": "result", "subtype": "success", "is_error": False, "result": text, "total_cost_usd": cost,
         "usage": {"input_tokens": 100, "output_tokens": 10}, "terminal_reason": "completed"})
word = prompt.strip().split()[0] if prompt.strip() else "noop"
try:
    with open(os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "spawns.log"), "a") as log:
        log.write(f"{os.getpid()} {word}\n")
except OSError:
    pass   # inside the sandbox the bin dir is read-only: count spawns from transcripts instead
if word == "dump":
    st = os.fstat(0)
    import stat as S
    with open(os.path.join(os.getcwd(), f"dump-{os.getpid()}.json"), "w") as f:
        json.dump({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
                   "stdin_is_file": S.S_ISREG(st.st_mode), "prompt": prompt}, f)
    result("dumped")
elif word.startswith("sleep:"):
    time.sleep(float(word.split(":")[1])); result("slept")
elif word.startswith("waitfile:"):
    while os.path.exists(word.split(":", 1)[1]):
        time.sleep(0.05)
    result("waited")
elif word.startswith("pay:"):
    _, usd, *gate = word.split(":", 2)
    while gate and os.path.exists(gate[0]):
        time.sleep(0.05)
    result("paid", float(usd))
elif word == "grandchild":
    p = subprocess.Popen(["sleep", "300"])
    open(os.path.join(os.getcwd(), f"grandchild-{os.getpid()}"), "w").write(str(p.pid))
    result("left a grandchild")
elif word == "hold":
    p = subprocess.Popen(["sleep", "300"])
    open(os.path.join(os.getcwd(), f"grandchild-{os.getpid()}"), "w").write(str(p.pid))
    out({"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 5000, "output_tokens": 1},
                                           "content": [{"type": "text", "text": "thinking"}]}})
    time.sleep(300)
elif word.startswith("escape:"):
    # Double-fork a grandchild into its own session (it would survive a group kill), named
    # by a marker the test can find in /proc, then sleep as a busy agent.
    marker = word.split(":", 1)[1]
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            os.execv(sys.executable, [sys.executable, "-c", "import time; time.sleep(600)", marker])
        os._exit(0)
    out({"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 10, "output_tokens": 1},
                                           "content": [{"type": "text", "text": "escaped"}]}})
    time.sleep(600)
elif word == "noresult":
    out({"type": "assistant", "message": {"id": "m1", "usage": {"input_tokens": 200000, "output_tokens": 1},
                                           "content": [{"type": "text", "text": "partial"}]}})
    sys.exit(1)
else:
    result("noop")
'''


def install(directory: Path, name: str = "claude") -> Path:
    path = directory / name
    path.write_text(f"#!{sys.executable}\n" + SOURCE)
    path.chmod(0o755)
    return path
