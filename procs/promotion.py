"""A SLAVE store becomes a master: the supervisor's side of ``rocketstore promote``.

RocketMQ's classic master/slave has no automatic failover: an operator (or a tool of
theirs) promotes a slave, with ``rocketstore promote`` (``cli.promote``), which

1. sets ``broker_role`` in the store's config file's ``[store]`` table
   (``set_role_in_config``: the line is rewritten, comments and every other line kept;
   the file is replaced atomically), so the store is a master at every start from now on;
2. asks a running store (``request``: ``config/haPromoteRequest.json``, which its
   supervisor looks for every tenth of a second, ``requested_role``): the supervisor
   stops its processes, restarts them as a master (the writer rebuilds its queue offsets
   and idempotent producers' table from the files and takes puts; the delay scheduler
   runs; the HA process serves slaves when ``ha_listen_port`` is set) and removes the
   request (``clear_request``). A stopped store is a master at its next start.

In controller mode (``procs.controller``) the group makes these requests itself: the
member elected asks for its master role, and every other member asks to follow the
master (``request_follow``: the processes start again as a SLAVE of its HA address,
nothing written into the settings file: which member is master is the group's choice).

The old master, when it comes back, must be configured as a SLAVE of the new one
(``ha_master_address``): whatever it holds that the new master does not (acknowledged
by it alone, under ASYNC_MASTER) is cut and kept in its ``quarantine/``
(procs.replica's divergence rule).
"""

from __future__ import annotations

import os
import re

from rocketstore.storage import json_file

PROMOTE_REQUEST_FILE = "haPromoteRequest.json"
MASTER_ROLES = ("ASYNC_MASTER", "SYNC_MASTER")


def set_role_in_config(path: str, role: str) -> None:
    """Rewrite ``broker_role`` in the ``[store]`` table of the TOML file at ``path``
    (added as the table's first setting when it is not there)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    table = None
    done = False
    for i, line in enumerate(lines):
        header = re.match(r"\s*\[([^\]]+)\]", line)
        if header:
            if table == "store" and not done:
                break
            table = header.group(1).strip()
            continue
        if table == "store" and re.match(r"\s*broker_role\s*=", line):
            comment = line[line.index("#"):].rstrip("\n") if "#" in line else ""
            lines[i] = f'broker_role = "{role}"' + (f"    {comment}" if comment else "") + "\n"
            done = True
    if not done:
        at = next((i + 1 for i, line in enumerate(lines)
                   if re.match(r"\s*\[store\]", line)), None)
        if at is None:
            lines += ["[store]\n"]
            at = len(lines)
        lines.insert(at, f'broker_role = "{role}"\n')
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(lines)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def request_path(config_dir: str) -> str:
    return os.path.join(config_dir, PROMOTE_REQUEST_FILE)


def clear_request(config_dir: str) -> None:
    """A master has no promotion to make (the supervisor calls this at each start)."""
    json_file.remove(request_path(config_dir))


def requested_role(config_dir: str) -> str | None:
    """The role a promotion asked for, when one is pending."""
    doc = json_file.load(request_path(config_dir))
    role = (doc or {}).get("role")
    return role if role in MASTER_ROLES else None


def requested_master(config_dir: str) -> str | None:
    """The master's HA address a controller asked this store to follow, when pending."""
    doc = json_file.load(request_path(config_dir)) or {}
    master = doc.get("master")
    return master if doc.get("role") == "SLAVE" and isinstance(master, str) else None


def request_follow(config_dir: str, master_address: str) -> None:
    """Ask a running store's supervisor to run as a SLAVE of ``master_address`` (the
    group's master's HA socket, "host:port")."""
    json_file.persist(request_path(config_dir), {"role": "SLAVE", "master": master_address})


def request(config_dir: str, role: str) -> None:
    """Ask a running store's supervisor to become ``role`` (it looks for the request every
    tenth of a second and removes it once the processes run in that role)."""
    json_file.persist(request_path(config_dir), {"role": role})
