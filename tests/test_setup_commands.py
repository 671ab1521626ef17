"""The README's two set-up commands, as written: the first makes a venv before it installs
anything (a Debian/Ubuntu system Python is externally managed and refuses `pip install`),
the second is what CI runs (.ci/run), and tests/install.sh installs into the venv the
second command's Python belongs to. (The commands themselves were run on Debian 12's
/usr/bin/python3; see the branch's report.)"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def setup_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.match(r"# SwarmBase\n\n```bash\n(.*?)\n```\n", text, re.S)
    assert block, "the README starts with its set-up commands"
    return [re.sub(r"\s+#.*$", "", line).strip() for line in block.group(1).splitlines()]


def test_the_readme_starts_with_two_commands_and_ci_runs_the_second() -> None:
    first, second = setup_commands()
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == [second]
    steps = [s.strip() for s in first.split("&&")]
    assert steps[0] == "python3 -m venv .venv"                          # before any install
    assert all(not s.startswith(("python3 -m pip", "pip ")) for s in steps)
    assert steps[1].startswith(".venv/bin/pip install") and steps[2] == ".venv/bin/swarmbase"
    assert second.split("&&")[1].strip().startswith(".venv/bin/python -m pytest")


def test_install_sh_installs_into_the_venv_of_the_second_command() -> None:
    script = (ROOT / "tests" / "install.sh").read_text()
    assert re.search(r"^VENV=\.venv$", script, re.M)
    assert '[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"' in script
    installs = re.findall(r"^.*pip install.*$", script, re.M)
    assert installs and all(line.startswith('"$VENV/bin/python" -m pip install') for line in installs), installs
