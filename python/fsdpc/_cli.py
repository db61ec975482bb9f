"""The `fsdpc` command the wheel installs: the same program as the Rust
binary."""

from __future__ import annotations

import signal
import sys

from . import _fsdpc


def main() -> None:
    # Ctrl-C stops the command at once, as it stops the binary (Python's
    # handler would wait for the native call to return).
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    sys.exit(_fsdpc.main(sys.argv[1:]))


if __name__ == "__main__":
    main()
