"""Where a broker group's master is: ``zk://host:port[,host:port...]/BROKER_NAME`` read
in ZooKeeper (``wire.group_nodes``). ``master`` reads the group's master node once;
``endpoint`` gives the address of the master's socket (``ingest`` or ``reader``). When
the group has no master (an election under way, ZooKeeper unreachable) they raise
``NoStoreError`` at once. ``client.reach`` resolves a group's address through it, and
``client.group_address`` follows the master from one to the next.
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
