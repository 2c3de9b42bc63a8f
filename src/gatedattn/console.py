"""The ``gatedattn`` console script.

The script imports this module alone; the command line (:mod:`gatedattn.cli`) and the
modules of its commands are imported here, so a Ctrl-C while they import (the first
moments of every command) ends as one line and status 130, not a traceback. Nothing
here changes how SIGINT behaves for a program that imports ``gatedattn``.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run the command line of ``sys.argv``; an interrupt while it starts exits 130 with one line."""
    try:
        from gatedattn.cli import main as run  # lazy: start-up guard (a Ctrl-C while it imports exits 130)
    except KeyboardInterrupt:
        print("gatedattn: interrupted", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
