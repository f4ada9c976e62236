"""Run one step of building a lab artefact (an image, the wheelhouse) so that its failure
reads as one line: what failed, the line of its output that says why, what to check.

The whole output is kept in a log file named in the message, for the rest.
"""

from __future__ import annotations

import re
import subprocess
import tempfile

# Lines that name the cause: apt's and debootstrap's errors, pip's, curl's, Ansible's.
_CAUSE = re.compile(r"^(E: |Err:|ERROR: |W: Failure|curl: \(|fatal: |.*No matching distribution)")


class BuildError(RuntimeError):
    """A lab artefact could not be built; the message is one line a person can act on."""


def cause(output: str) -> str:
    """The output line that says why a build step failed (else its last line)."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in lines:
        if _CAUSE.match(line):
            return line
    return lines[-1] if lines else "no output"


def run_step(cmd: list[str], what: str, check: str, **kwargs) -> None:
    """Run `cmd`; on failure raise BuildError("WHAT failed (CAUSE); CHECK (log: FILE)")."""
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          **kwargs)
    if done.returncode == 0:
        return
    with tempfile.NamedTemporaryFile("w", prefix="inferfleet-build-", suffix=".log",
                                     delete=False) as log:
        log.write(done.stdout)
    raise BuildError(f"{what} failed ({cause(done.stdout)}); {check} (log: {log.name})")

