"""README.md's marked shell blocks as commands, and a shell that runs them as written.

A block is marked by an HTML comment on the line above its fence (GitHub does not render it),
with an optional note in parentheses::

    <!-- readme-test: kubernetes -->
    ```bash
    ...
    ```

:func:`block` returns the block's commands, one per shell command line (a line that ends in ``\\``
continues on the next one); the text is kept exactly as written, comments included, because bash
runs it. A test picks its commands by how they start (:meth:`Block.between`) and replaces the few
it must (:meth:`Block.substituted`): each replaced command must be in the block, so a README edit that
drops or renames one fails the test with a message naming it instead of silently testing less.
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
MARK = re.compile(r"<!-- readme-test: (?P<name>[\w-]+)(?: \(.*\))? -->")
"""``<!-- readme-test: NAME -->``, or ``<!-- readme-test: NAME (a note for the reader) -->``."""


@dataclass(frozen=True)
class Block:
    name: str
    commands: tuple[str, ...]

    def index(self, start: str) -> int:
        """The position of the one command that starts with ``start``."""
        found = [i for i, c in enumerate(self.commands) if c.startswith(start)]
        if len(found) != 1:
            raise AssertionError(
                f"README.md's '{self.name}' block has {len(found)} commands starting with {start!r} "
                f"(the README test needs exactly one): {list(self.commands)}"
            )
        return found[0]

    def between(self, first: str, before: str | None = None) -> Block:
        """The commands from the one starting with ``first`` up to (not including) ``before``."""
        end = len(self.commands) if before is None else self.index(before)
        start = self.index(first)
        if start >= end:
            raise AssertionError(
                f"README.md's '{self.name}' block: {first!r} does not come before {before!r}"
            )
        return Block(self.name, self.commands[start:end])

    def substituted(self, replacements: Mapping[str, str | Callable[[str], str] | None]) -> Block:
        """Each command starting with a key replaced by its value: a text, a function of the
        command's text, or None (left out)."""
        commands = list(self.commands)
        for start, replacement in replacements.items():
            i = self.index(start)
            if replacement is None:
                commands[i] = ""
            elif isinstance(replacement, str):
                commands[i] = replacement
            else:
                commands[i] = replacement(commands[i])
        return Block(self.name, tuple(c for c in commands if c))

    def script(self) -> str:
        return "\n".join(self.commands) + "\n"


def block(name: str, readme: Path = README) -> Block:
    """The commands of README.md's ``bash`` block marked ``<!-- readme-test: NAME -->``."""
    lines = readme.read_text().splitlines()
    mark = f"<!-- readme-test: {name} -->"
    marks = [i for i, line in enumerate(lines) if (m := MARK.fullmatch(line.strip())) and m["name"] == name]
    if len(marks) != 1:
        raise AssertionError(f"{readme} has {len(marks)} lines {mark!r} (one, above a ```bash fence)")
    start = marks[0] + 1
    if start >= len(lines) or lines[start].strip() != "```bash":
        raise AssertionError(f"{readme}:{start + 1}: the line after {mark!r} is not a ```bash fence")
    commands: list[str] = []
    current: list[str] = []
    for line in lines[start + 1 :]:
        if line.strip() == "```":
            break
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue  # blank lines and whole-line comments between commands
        current.append(line)
        if not line.endswith("\\"):
            commands.append("\n".join(current))
            current = []
    else:
        raise AssertionError(f"{readme}: the '{name}' block has no closing fence")
    if current:
        raise AssertionError(f"{readme}: the '{name}' block ends in a continued line: {current[-1]!r}")
    return Block(name, tuple(commands))


def run(
    commands: Block | Sequence[Block],
    *,
    env: Mapping[str, str] | None = None,
    cwd: Path = README.parent,
    timeout_s: float = 600.0,
) -> subprocess.CompletedProcess[str]:
    """Run the commands as one ``bash -e -u -o pipefail`` script in ``cwd`` (the repository's root,
    where the README's commands are typed), with ``set -x`` so that the output shows each command
    before what it printed. ``env`` is added to this process's environment, less ``KUBECONFIG``
    (the README sets its own). Raises with the whole output when a command fails."""
    blocks = [commands] if isinstance(commands, Block) else list(commands)
    script = "set -x\n" + "".join(b.script() for b in blocks)
    full_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    full_env.update(env or {})
    done = subprocess.run(
        ["bash", "-e", "-u", "-o", "pipefail", "-c", script],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(
            f"README.md's commands failed ({done.returncode}):\n{script}\n--- stdout:\n{done.stdout}"
            f"\n--- stderr (set -x shows each command):\n{done.stderr}"
        )
    return done
