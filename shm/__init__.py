"""Coordination between rocketstore's processes: the shared-memory position table, the
notification bus, and the ``lock`` and ``abort`` files of a running store.

Imports point one way, ``procs -> shm -> storage``: this package builds on ``storage``
and never the reverse.
"""
