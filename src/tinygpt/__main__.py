"""``python -m tinygpt``: the same command line as the ``tinygpt`` script (``tinygpt.cli``).

``run`` is also the ``tinygpt`` script's entry point: it imports ``tinygpt.cli`` inside a
``try``, so that Ctrl-C while Python is still importing gives exit code 130 and one line, not
a traceback. (The first tenth of a second or so, while Python itself starts, is Python's own.)
A Ctrl-C that lands in a callback Python runs on the side (a weak-reference callback of the
import machinery, say) is dropped by Python with an "Exception ignored" message; ``run`` sends
such an interrupt again, so that it stops the command as any other does.
"""

import os
import signal
import sys
import threading
import time


def _interrupt_soon() -> None:
    time.sleep(0.05)
    os.kill(os.getpid(), signal.SIGINT)


def redeliver_ignored_interrupts() -> None:
    """Make a KeyboardInterrupt that Python would drop (raised inside a callback whose errors
    are only reported, through ``sys.unraisablehook``) arrive again, as a new SIGINT."""
    report = sys.unraisablehook

    def hook(unraisable: "sys.UnraisableHookArgs") -> None:  # a type only typeshed names
        if isinstance(unraisable.exc_value, KeyboardInterrupt):  # sent from another thread, a
            # moment later, so that it arrives after this hook has returned (if it lands in such
            # a callback again, this hook sends it again)
            threading.Thread(target=_interrupt_soon, daemon=True).start()
        else:
            report(unraisable)

    sys.unraisablehook = hook


def run() -> int:
    """Import the command line and run it on ``sys.argv[1:]``; return the exit code."""
    try:
        redeliver_ignored_interrupts()
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
