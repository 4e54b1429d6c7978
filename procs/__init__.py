"""rocketstore's OS processes: the supervisor and one module per process it runs (writer,
flusher, dispatcher, cleaner, scheduler, reader, HA, replica), with what they share
(``service``, ``stats``, ``recovery``, ``status``, ``metrics``, ``promotion``,
``allocator``).
They build on ``client`` (the scheduler re-puts through a Producer), ``wire``, ``shm``
and ``storage``; nothing here imports the command line or the Spark source.
"""
