"""The fork server's own first import: it outlives a signal to the whole process group.

The supervisor starts its processes as forks of multiprocess's fork server (``PRELOAD``
of ``procs.supervisor``, whose first module this is), a process of the supervisor's
group: ``kill -TERM -- -PGID``, a terminal's hang-up or systemd's KillMode=control-group
reach it too. Killed, it would take every store process with it (they die with their
parent, ``procs.service``) before the supervisor could stop them in order. Imported by
the fork server, and only by it, this module makes it ignore SIGTERM and SIGHUP (it
ignores SIGINT itself); it exits when the supervisor's end of its "alive" pipe closes.
A process it forks installs its own handlers for them (``procs.service.run_service``).
"""

import signal

for _signo in (signal.SIGTERM, signal.SIGHUP):
    signal.signal(_signo, signal.SIG_IGN)
