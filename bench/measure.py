#!/usr/bin/env python3
"""measure.py OUT COMMAND...: runs COMMAND (its exit status is ours) and
writes "WALL PEAK_KB" to OUT, like `/usr/bin/time -f "%e %M" -o OUT`, but
counting every process of the command's tree at once, including those that
leave it.

cachescope's tracer is such a process: it runs detached (a grandchild in a
session of its own, as `strace -D` does) while the command's own process
becomes the client, so `/usr/bin/time` would see only the client. This
wrapper makes itself the child subreaper (prctl PR_SET_CHILD_SUBREAPER), so
orphans are reparented to it and stay in its tree.

PEAK_KB is the highest memory the tree held at one moment: every 100 ms a
thread sums the proportional set size (`Pss` of /proc/PID/smaps_rollup) of
all the processes below this one. Pss charges a page mapped by several
processes once in all, split between them: the client and the tracer share
the trace buffers and code-cache chunks, which a sum of resident sets would
count twice. Summing each process's own peak (`ru_maxrss`) would also add
peaks that happen at different times. As a floor against a peak shorter
than the sampling period, PEAK_KB is at least the largest `ru_maxrss` of
any single process. Valgrind's runs are measured the same way (one process).

A sample is not free: the kernel walks the page tables of every mapping for
smaps_rollup (4 ms for a 180 MB python client, and the tracer as much
again), a tenth of a core at this rate. A run that keeps both cores busy
(cachescope's client and consumer) pays for it in wall time, where a
single-threaded one (Valgrind) leaves the sampler a core of its own:
python-json measured 8 % slower sampled. With MEASURE_PEAK=no in the
environment nothing is sampled (PEAK_KB is then the largest `ru_maxrss`
alone), for runs that only time: bench/engine.sh takes memory from a run's
first pass and times from every pass.
WALL runs until the command exits (the profile is written before that).
"""
import ctypes
import os
import sys
import threading
import time

PR_SET_CHILD_SUBREAPER = 36
SAMPLE_SECONDS = 0.1


def descendants(root):
    """Pids of every process below `root`, from each process's parent."""
    parent_of = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # The command name may hold spaces or parentheses: fields after it.
        fields = stat[stat.rfind(")") + 2 :].split()
        parent_of[int(entry)] = int(fields[1])
    found, frontier = [], {root}
    while frontier:
        below = [p for p, pp in parent_of.items() if pp in frontier]
        found.extend(below)
        frontier = set(below)
    return found


def pss_kb(pid):
    """The process's proportional set size in KiB, 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


class Sampler(threading.Thread):
    """Samples the tree's summed Pss until stopped, keeping the highest."""

    def __init__(self):
        super().__init__(daemon=True)
        self.peak_kb = 0
        self.done = threading.Event()

    def run(self):
        me = os.getpid()
        while not self.done.wait(SAMPLE_SECONDS):
            total = sum(pss_kb(p) for p in descendants(me))
            self.peak_kb = max(self.peak_kb, total)


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
    sampler = Sampler()
    if os.environ.get("MEASURE_PEAK", "yes") != "no":
        sampler.start()
    status, wall, single_kb = None, 0.0, 0
    while True:
        try:
            pid, st, usage = os.wait4(-1, 0)
        except ChildProcessError:
            break
        if pid == child:
            status, wall = st, time.monotonic() - start
        single_kb = max(single_kb, usage.ru_maxrss)
    sampler.done.set()
    if sampler.is_alive():
        sampler.join()
    with open(out, "w") as f:
        f.write(f"{wall:.2f} {max(sampler.peak_kb, single_kb)}\n")
    if os.WIFSIGNALED(status):
        sys.exit(128 + os.WTERMSIG(status))
    sys.exit(os.WEXITSTATUS(status))


if __name__ == "__main__":
    main()
