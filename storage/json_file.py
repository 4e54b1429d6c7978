"""Small JSON files under ``{root}/config/`` (RocketMQ's ConfigManager).

``persist`` writes ``name.json`` atomically: the new text goes to ``name.json.tmp``,
is fsynced, the current file (if any) is kept as ``name.json.bak``, and the temporary
file is renamed over ``name.json``; the directory is fsynced so the rename is durable.
``load`` reads ``name.json`` and falls back to ``name.json.bak`` when the main file is
missing or unreadable, as RocketMQ does.
"""

from __future__ import annotations

import json
import logging
import os
import shutil

from storage.mapped_file import fsync_dir

log = logging.getLogger(__name__)


def persist(path: str, document: dict) -> None:
    """Atomically replace ``path`` with ``document`` as JSON. Raises ``OSError``."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(document, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        shutil.copyfile(path, path + ".bak")
    os.replace(tmp, path)
    fsync_dir(directory)


def load(path: str) -> dict | None:
    """The document at ``path`` (or its ``.bak``), None when neither can be read."""
    for candidate in (path, path + ".bak"):
        try:
            with open(candidate, encoding="utf-8") as f:
                doc = json.load(f)
            if isinstance(doc, dict):
                return doc
            log.warning("%s does not hold a JSON object", candidate)
        except FileNotFoundError:
            continue
        except (OSError, ValueError) as e:
            log.warning("cannot read %s: %s", candidate, e)
    return None
