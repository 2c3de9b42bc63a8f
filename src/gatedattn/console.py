"""The console script's entry point as it was installed before it moved out of the package
(``gatedattn.console:main``): the same guarded start, :func:`gatedattn_console.main`.
"""

from __future__ import annotations

import sys

from gatedattn_console import main

__all__ = ["main"]

if __name__ == "__main__":
    sys.exit(main())
