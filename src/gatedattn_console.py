"""The ``gatedattn`` console script's entry point.

It sits outside the ``gatedattn`` package so that the start-up guard is in place before
the package itself is imported: a Ctrl-C at any moment of start-up (the package, the
command line, its command's modules) ends as one line and status 130, not a traceback.
Nothing here changes how SIGINT behaves for a program that imports ``gatedattn``.
"""

from __future__ import annotations

import sys


def main() -> int:
    """Run the command line of ``sys.argv``; an interrupt while it starts exits 130 with one line."""
    try:
        from gatedattn.cli import main as run  # lazy: start-up guard (a Ctrl-C while the package or the CLI imports)
    except KeyboardInterrupt:
        print("gatedattn: interrupted", file=sys.stderr)
        return 130
    return run()


if __name__ == "__main__":
    sys.exit(main())
