"""``python -m tinygpt``: the same command line as the ``tinygpt`` script (``tinygpt.cli``).

``run`` is also the ``tinygpt`` script's entry point: it imports ``tinygpt.cli`` inside a
``try``, so that Ctrl-C while Python is still importing gives exit code 130 and one line, not
a traceback. (The first tenth of a second or so, while Python itself starts, is Python's own.)
"""

import os
import signal
import sys


def run() -> int:
    """Import the command line and run it on ``sys.argv[1:]``; return the exit code."""
    try:
        from tinygpt.cli import main

        code = main()
    except KeyboardInterrupt:
        print("tinygpt: interrupted", file=sys.stderr)
        code = 130
    if code == 130:  # interrupted: a second Ctrl-C, or a half-imported module, must not
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # turn the exit into a traceback
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)
    return code


if __name__ == "__main__":
    sys.exit(run())
