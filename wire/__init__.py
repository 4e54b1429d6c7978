"""The socket protocols: the contract the store's processes and its clients both import.

``protocol`` (the ingest and reader sockets' frames, docs/PROTOCOL.md §4), ``ha_protocol``
(master/slave replication frames, §10), ``endpoints`` (where each socket of a store
listens), ``curve`` (CURVE keys and the authenticator for TCP beyond this host). Builds
on ``shm`` and ``storage`` only.
"""
