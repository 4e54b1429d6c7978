"""A broker group's nodes in ZooKeeper: their paths and the JSON they hold.

Stores (``procs.controller``) write them; clients (``client.group_address``) and
``rocketstore status`` read them. Under ``/rocketstore/{broker_name}``:

    node                 kind        holds (UTF-8 JSON)                     written by
    -------------------  ----------  -------------------------------------  -------------
    members/{broker_id}  ephemeral   {broker_id, ingest, reader, ha, role,  the member
                                      end, epoch}                           (end: its
                                                                            WRITTEN, every
                                                                            REPORT_MS)
    master               ephemeral   {broker_id, epoch, start, ingest,      the elected
                                      reader, ha}                           member, with
                                                                            epoch, in one
                                                                            transaction
    epoch                persistent  {epoch, broker_id, start}              the elected
    syncStateSet         persistent  {epoch, members: [broker_id, ...]}     the master
    handover             persistent  {from, to, epoch, timeout_ms, state,   ``rocketstore
                                      end, why}                             promote``, the
                                                                            master, the
                                                                            member taking
                                                                            over

``ingest`` and ``reader`` are ZeroMQ addresses (``tcp://host:port``), ``ha`` the HA
socket's ``host:port`` (a slave's ``ha_master_address``). ``start`` is the master's
CommitLog end when it was elected. The master node is ephemeral: it goes with the
master's ZooKeeper session, which is what lets another member be elected. ``handover``
exists while a planned hand-over is asked for or under way, and holds the last one's
refusal or abort until the next request replaces it (``procs.handover``).
"""

from __future__ import annotations

import json

ROOT = "/rocketstore"


def group_path(broker_name: str) -> str:
    return f"{ROOT}/{broker_name}"


def members_path(broker_name: str) -> str:
    return f"{group_path(broker_name)}/members"


def member_path(broker_name: str, broker_id: int) -> str:
    return f"{members_path(broker_name)}/{broker_id}"


def master_path(broker_name: str) -> str:
    return f"{group_path(broker_name)}/master"


def epoch_path(broker_name: str) -> str:
    return f"{group_path(broker_name)}/epoch"


def sync_state_set_path(broker_name: str) -> str:
    return f"{group_path(broker_name)}/syncStateSet"


def handover_path(broker_name: str) -> str:
    return f"{group_path(broker_name)}/handover"


def encode(doc: dict) -> bytes:
    return json.dumps(doc, sort_keys=True).encode()


def decode(data: bytes) -> dict:
    """A node's document; ``{}`` for an empty node or one that is not a JSON object."""
    try:
        doc = json.loads(data or b"{}")
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
