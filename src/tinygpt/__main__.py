"""``python -m tinygpt``: the same command line as the ``tinygpt`` script (``tinygpt.cli``).

``run`` is also the ``tinygpt`` script's entry point: it imports ``tinygpt.cli`` inside a
``try``, so that Ctrl-C while Python is still importing gives exit code 130 and one line, not
a traceback.
"""

import sys


def run() -> int:
    """Import the command line and run it on ``sys.argv[1:]``; return the exit code."""
    try:
        from tinygpt.cli import main
    except KeyboardInterrupt:
        print("tinygpt: interrupted", file=sys.stderr)
        return 130
    return main()


if __name__ == "__main__":
    sys.exit(run())
