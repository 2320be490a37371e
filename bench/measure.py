#!/usr/bin/env python3
"""measure.py OUT COMMAND...: runs COMMAND (its exit status is ours) and
writes "WALL PEAK_KB" to OUT, like `/usr/bin/time -f "%e %M" -o OUT`, but
also counting processes that leave the command's tree.

cachescope's tracer is such a process: it runs detached (a grandchild in a
session of its own, as `strace -D` does) while the command's own process
becomes the client, so `/usr/bin/time` would see only the client. This
wrapper makes itself the child subreaper (prctl PR_SET_CHILD_SUBREAPER):
orphans are reparented to it and reaped here, each with its own rusage.
PEAK_KB is the largest resident set of the command's tree (as %M reports
it) plus that of the largest orphan: the client and the tool, which are one
process under Valgrind, both hold their memory while the program runs.
WALL runs until the command exits (the profile is written before that).
"""
import ctypes
import os
import sys
import time

PR_SET_CHILD_SUBREAPER = 36


def main():
    out, cmd = sys.argv[1], sys.argv[2:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(f"measure.py: prctl: {os.strerror(ctypes.get_errno())}")
    start = time.monotonic()
    child = os.fork()
    if child == 0:
        try:
            os.execvp(cmd[0], cmd)
        finally:
            os._exit(127)
    status, wall, tree_kb, orphan_kb = None, 0.0, 0, 0
    while True:
        try:
            pid, st, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if pid == child:
            status, wall = st, time.monotonic() - start
            tree_kb = usage.ru_maxrss
        else:
            orphan_kb = max(orphan_kb, usage.ru_maxrss)
    with open(out, "w") as f:
        f.write(f"{wall:.2f} {tree_kb + orphan_kb}\n")
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
