"""Expiry decisions: when files may be deleted, and when the disk is too full to write.

CommitLog files are deleted oldest first, never the current one, when one of three
triggers fires (CleanCommitLogService):

* the hour is one of ``delete_when`` (``"04"``, or ``"03;04"``), local time;
* the disk is fuller than ``disk_max_used_space_ratio`` percent (75);
* a manual (forced) clean was asked for.

A file goes when it has not been modified for ``file_reserved_time`` hours, or at any age
when the disk is past ``disk_space_clean_forcibly_ratio`` (0.85) and
``clean_file_forcibly_enable`` holds. Past ``disk_space_warning_level_ratio`` (0.90) the
store also refuses writes (SERVICE_NOT_AVAILABLE, flag DISK_FULL) until usage falls back
under the forcible ratio. At most 10 files go per run (``DELETE_FILES_BATCH_MAX``).
Consume queue and index files then follow the CommitLog's new minimum offset.
"""

from __future__ import annotations

import dataclasses
import os
import time

from rocketstore.storage.config import StoreConfig


def disk_partition_used_ratio(path: str) -> float:
    """``UtilAll.getDiskPartitionSpaceUsedPercent``: (total - free) / total, -1 on error."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1.0
    total = st.f_blocks * st.f_frsize
    if total <= 0:
        return -1.0
    return (total - st.f_bfree * st.f_frsize) / total


def is_time_to_delete(delete_when: str, now_ms: int | None = None) -> bool:
    """``UtilAll.isItTimeToDo``: the current local hour is one of ``delete_when``."""
    hour = time.localtime((time.time() if now_ms is None else now_ms / 1000)).tm_hour
    for token in delete_when.split(";"):
        token = token.strip()
        if token.isdigit() and int(token) == hour:
            return True
    return False


@dataclasses.dataclass
class SpaceDecision:
    """What one look at the disk decides."""

    space_to_delete: bool = False     # delete expired files now, whatever the hour
    clean_immediately: bool = False   # ... and unexpired ones too (forcible ratio passed)
    disk_full: bool | None = None     # True: refuse writes; False: accept again; None: keep
    ratios: dict[str, float] = dataclasses.field(default_factory=dict)


def decide_space(physic_ratio: float, logics_ratio: float, config: StoreConfig) -> SpaceDecision:
    """``isSpaceToDelete``, for the CommitLog partition and then the ConsumeQueue one."""
    d = SpaceDecision(ratios={"commitlog": physic_ratio, "consumequeue": logics_ratio})
    max_ratio = config.disk_max_used_space_ratio / 100.0
    for ratio in (physic_ratio, logics_ratio):
        if ratio > config.disk_space_warning_level_ratio:
            d.disk_full = True
            d.clean_immediately = True
        elif ratio > config.disk_space_clean_forcibly_ratio:
            d.clean_immediately = True
        elif d.disk_full is None:
            d.disk_full = False
        if ratio < 0 or ratio > max_ratio:
            d.space_to_delete = True
            break
    return d
