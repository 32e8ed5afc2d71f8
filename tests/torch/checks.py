# SPDX-License-Identifier: Apache-2.0
"""What the torch test scripts share: timing a call that must raise."""
import time


def timed_error(call):
    """Runs call(): (the text of the RuntimeError it raised, or None if it
    returned, and the seconds it took)."""
    start = time.monotonic()
    try:
        call()
    except RuntimeError as e:
        return str(e), time.monotonic() - start
    return None, time.monotonic() - start
