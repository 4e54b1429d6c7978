"""A broker group's address, ``zk://host:port[,host:port...]/BROKER_NAME``: the store
its members elected master, found in ZooKeeper (``wire.group_nodes``).

    Producer("zk://127.0.0.1:2181/broker-a", idempotent=True)
    ReaderClient("zk://127.0.0.1:2181/broker-a")

``endpoint`` reads the group's master node once and returns the address of the
master's socket (``ingest`` or ``reader``), which ``client.reach.locate`` takes as the
client's target: the client then talks to that store as to any ``tcp://`` address. When the group has no master (an election under
way, ZooKeeper unreachable) it raises ``NoStoreError`` at once.

After a failover the old master answers nothing, or SERVICE_NOT_AVAILABLE with a
reason starting ``NOT_MASTER`` (``procs.fencing``): make a new client from the group's
address, which finds the new master, and send again what was not acknowledged. An
idempotent producer's resends keep its ``producer_id`` and sequences (pass
``producer_id=`` and set ``next_sequence``): the new master holds every record the old
one acknowledged and answers those as duplicates, so each is stored once. A plain
producer may store a message twice across a failover.
"""

from __future__ import annotations

from rocketstore.client.errors import BadAddressError, NoStoreError
from rocketstore.wire import group_nodes as nodes

SCHEME = "zk://"
CONNECT_TIMEOUT_S = 5.0


def parse(address: str) -> tuple[str, str]:
    """``(connect string, broker_name)`` of a ``zk://`` address. Raises
    ``BadAddressError``."""
    hosts, sep, name = address[len(SCHEME):].partition("/")
    if not address.startswith(SCHEME) or not sep or not hosts or not name or "/" in name:
        raise BadAddressError(f"{address!r} is not a broker group's address: "
                              "zk://host:port[,host:port...]/BROKER_NAME")
    return hosts, name


def master(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> dict:
    """The group's master node (``wire.group_nodes``). Raises ``NoStoreError`` when
    ZooKeeper cannot be reached or the group has no master now."""
    from kazoo.client import KazooClient
    from kazoo.exceptions import KazooException, NoNodeError
    from kazoo.handlers.threading import KazooTimeoutError

    hosts, name = parse(address)
    zk = KazooClient(hosts=hosts, timeout=timeout_s)
    try:
        zk.start(timeout=timeout_s)
        data, _ = zk.get(nodes.master_path(name))
    except NoNodeError:
        raise NoStoreError(f"broker group {name} has no master now (an election may be "
                           f"under way): {address}") from None
    except (KazooException, KazooTimeoutError) as e:
        raise NoStoreError(f"ZooKeeper at {hosts} cannot be reached ({e or type(e).__name__})"
                           f": no master of {name} can be found") from None
    finally:
        zk.stop()
        zk.close()
    return nodes.decode(data)


def endpoint(address: str, socket_name: str) -> str:
    """The address of the master's ``socket_name`` (``ingest`` or ``reader``) socket."""
    found = master(address).get(socket_name)
    if not isinstance(found, str):
        raise NoStoreError(f"the master node of {address} names no {socket_name} socket")
    return found
