"""Small JSON files under ``{root}/config/`` (RocketMQ's ConfigManager).

``persist`` writes ``name.json`` atomically: the new text goes to ``name.json.tmp``,
is fsynced, the current file (if any) is kept as ``name.json.bak``, and the temporary
file is renamed over ``name.json``; the directory is fsynced so the rename is durable.
``load`` reads ``name.json`` and falls back to ``name.json.bak`` when the main file is
missing or unreadable, as RocketMQ does; files RocketMQ wrote (fastjson: integer map
keys without quotes) read too.
"""

from __future__ import annotations

import json
import logging
import re
import os
import shutil

from rocketstore.storage.dir_sync import fsync_creation
from rocketstore.storage import file_modes

log = logging.getLogger(__name__)


def persist(path: str, document: dict, *, compact: bool = False) -> None:
    """Atomically replace ``path`` with ``document`` as JSON (indented; on one line
    when ``compact``, for large documents). Raises ``OSError``."""
    made = file_modes.make_dirs(os.path.dirname(path) or ".")
    tmp = path + ".tmp"
    with os.fdopen(file_modes.create(tmp, os.O_WRONLY | os.O_TRUNC), "w", encoding="utf-8") as f:
        if compact:
            json.dump(document, f, separators=(",", ":"), sort_keys=True)
        else:
            json.dump(document, f, indent=2, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    if os.path.exists(path):
        shutil.copyfile(path, path + ".bak")
        os.chmod(path + ".bak", file_modes.file_mode())
    os.replace(tmp, path)
    fsync_creation(path, made)


_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def remove(path: str) -> None:
    """Remove the document at ``path`` and its ``.bak`` (``load`` would read the
    ``.bak`` back: a request handled and removed would come back as it was before)."""
    for candidate in (path, path + ".bak"):
        try:
            os.remove(candidate)
        except FileNotFoundError:
            pass


def _load_fastjson(path: str) -> dict | None:
    """RocketMQ writes its config files with fastjson, which leaves integer map keys
    unquoted (``{"offsetTable":{1:0}}``); quote them and try again."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.loads(_BARE_INT_KEY.sub(r'\1"\2"\3', f.read()))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


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
        except ValueError:
            doc = _load_fastjson(candidate)
            if doc is not None:
                return doc
            log.warning("cannot read %s: not JSON", candidate)
        except OSError as e:
            log.warning("cannot read %s: %s", candidate, e)
    return None
