"""Child process of tests/test_crash_kill.py: put messages, report each ack, await SIGKILL.

    python tests/crash_writer.py ROOT SEED COUNT [--flush ASYNC_FLUSH|SYNC_FLUSH]
                                 [--synced DIR]
                                 [--pause none|dispatch|close_dispatch|dispatch_index
                                          |close_before_checkpoint
                                          |close_after_checkpoint|close_after_abort_removed]

(with PYTHONPATH at the project root). It opens the store at ROOT with the tiny test
configuration (``writer_config``), writes ``READY``, and puts the COUNT messages
``writer_message(SEED, seq)``, seq = 0, 1, ..., in batches of 1-8 drawn from SEED. Once a
batch is acknowledged it writes one line per message, the whole batch in one write(2)
(well under PIPE_BUF, so a kill never leaves half a batch of lines):

    ACK seq msg_id topic queue_id queue_offset sha1(body)

``--pause none``: the store's service threads run (flush, dispatch, ...), and between
batches it sometimes dispatches too, so consume queues and index are partly built
whenever the kill lands; after the last message it writes ``DONE``.

Any other ``--pause``: the store runs no service threads and it never dispatches while
putting; after the last message it
enters the named call and stops inside it, at a point drawn from SEED, writing
``PAUSE <where>``:

    where                      inside                 stopped
    dispatch                   dispatch()             before dispatching message K
    close_dispatch             close()                before dispatching message K
    dispatch_index             dispatch()             the consume-queue units of the run
                                                      holding message K written, none of
                                                      its index entries (the bulk path)
    close_before_checkpoint    close()                queues and index flushed, checkpoint not
    close_after_checkpoint     close()                checkpoint flushed, abort file still there
    close_after_abort_removed  close()                abort removed, files not yet closed

Either way it then blocks reading stdin; the parent kills it with SIGKILL (and if the
parent dies first, stdin reaches EOF and the child exits). Nothing here sleeps.

``--synced DIR`` keeps, for the power-loss cases, what a disk holds for sure: every
``fdatasync`` of a file under ROOT (through ``FILE_OPS``) copies the file as it was when
the call began to the same path under DIR, and puts the copy in place only once the
call has returned (a kill in between leaves the copy of the sync before), and only if
no later copy of that file is in place already (two threads syncing one file).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import os
import random
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from conftest import small_config  # noqa: E402
from rocketstore.storage import message_store as message_store_module  # noqa: E402
from rocketstore.storage.mapped_file import FILE_OPS  # noqa: E402
from rocketstore.storage import Message, MessageStore, PutMessageStatus, StoreConfig  # noqa: E402

TOPICS = ("KillA", "KillB")
QUEUES = 4
KILL_QUEUES = [(t, q) for t in TOPICS for q in range(QUEUES)]
PAUSES = ("dispatch", "close_dispatch", "dispatch_index", "close_before_checkpoint",
          "close_after_checkpoint", "close_after_abort_removed")


def writer_config(root: str, flush_disk_type: str = "ASYNC_FLUSH") -> StoreConfig:
    return small_config(root, flush_disk_type=flush_disk_type)


def writer_message(seed: int, seq: int) -> Message:
    """Message ``seq`` of the child run with ``seed``; the body names both."""
    rng = random.Random(f"{seed}:{seq}")
    size = rng.choice((8, 40, 120, 300)) if rng.random() < 0.97 else 2500
    payload = bytes(rng.randrange(33, 127) for _ in range(size))
    return Message(topic=rng.choice(TOPICS), body=f"s{seed}-n{seq}-".encode() + payload,
                   queue_id=rng.randrange(QUEUES), tags=f"T{rng.randrange(3)}",
                   keys=[f"k{seed}-{seq}"])


def parse_body(body: bytes) -> tuple[int, int] | None:
    """``(seed, seq)`` of a writer message's body, None for any other body."""
    head = body.split(b"-", 2)
    if len(head) < 3 or not head[0].startswith(b"s") or not head[1].startswith(b"n"):
        return None
    return int(head[0][1:]), int(head[1][1:])


def body_hash(body: bytes) -> str:
    return hashlib.sha1(body).hexdigest()


def _out(text: str) -> None:
    os.write(1, text.encode())


def _stop_here(where: str) -> None:
    _out(f"PAUSE {where}\n")
    sys.stdin.readline()        # blocks until SIGKILL (EOF: the parent is gone)
    os._exit(3)


def _record_syncs(root: str, synced: str) -> None:
    """Make every ``fdatasync`` of a file under ``root`` leave its copy under ``synced``
    (the module docstring)."""
    real = FILE_OPS.fdatasync
    root = os.path.realpath(root)
    lock = threading.Lock()
    copies = itertools.count()
    in_place: dict[str, int] = {}      # target -> the number of the copy there

    def fdatasync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        rel = os.path.relpath(path, root)
        if rel.startswith("..") or path.endswith(" (deleted)"):
            return real(fd)
        target = os.path.join(synced, rel)
        pending = f"{target}.{threading.get_ident()}.pending"
        with lock:                     # copies numbered in the order they were taken
            number = next(copies)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(pending, "wb") as f:
                f.write(os.pread(fd, os.fstat(fd).st_size, 0))
        real(fd)
        with lock:
            if number > in_place.get(target, -1):
                os.replace(pending, target)
                in_place[target] = number
            else:
                os.unlink(pending)
    FILE_OPS.fdatasync = fdatasync


def _put_all(store: MessageStore, seed: int, count: int, dispatch_now_and_then: bool) -> None:
    rng = random.Random(seed)
    seq = 0
    while seq < count:
        n = min(count - seq, rng.randint(1, 8))
        batch = [writer_message(seed, s) for s in range(seq, seq + n)]
        results = store.put_batch(batch)
        lines = []
        for s, m, r in zip(range(seq, seq + n), batch, results):
            if r.status is not PutMessageStatus.PUT_OK:
                raise SystemExit(f"put {s} failed: {r}")
            lines.append(f"ACK {s} {r.msg_id} {m.topic} {r.queue_id} {r.queue_offset} "
                         f"{body_hash(m.body)}\n")
        _out("".join(lines))
        seq += n
        if dispatch_now_and_then and rng.random() < 0.15:
            store.dispatch()


def _arm_pause(store: MessageStore, where: str, k: int) -> None:
    """Make the store stop inside ``dispatch()``/``close()`` at ``where``."""
    if where in ("dispatch", "close_dispatch", "dispatch_index"):
        reput = store.reput
        one_by_one, in_bulk, calls = reput.dispatch, reput.dispatch_run, [0]
        small = reput.dispatch_small

        def paused_dispatch(req):
            calls[0] += 1
            if calls[0] == k:
                _stop_here(where)
            one_by_one(req)

        def paused_run(run):
            before = calls[0]
            calls[0] += len(run)
            if calls[0] < k:
                return in_bulk(run)
            if where == "dispatch_index":          # the run's units written, its index not
                reput.index_service = None
                in_bulk(run)
            elif k - 1 - before > 0:               # every message before K dispatched
                in_bulk(run.prefix(k - 1 - before))
            _stop_here(where)

        def paused_small(records):
            before = calls[0]
            calls[0] += len(records)
            if calls[0] < k:
                return small(records)
            if where == "dispatch_index":          # the run's units written, its index not
                reput.index_service = None
                small(records)
            elif k - 1 - before > 0:               # every message before K dispatched
                small(records[:k - 1 - before])
            _stop_here(where)
        reput.dispatch, reput.dispatch_run = paused_dispatch, paused_run
        reput.dispatch_small = paused_small
    elif where in ("close_before_checkpoint", "close_after_checkpoint"):
        flush = store.checkpoint.flush

        def paused_flush():
            if where == "close_before_checkpoint":
                _stop_here(where)
            flush()
            _stop_here(where)
        store.checkpoint.flush = paused_flush
    elif where == "close_after_abort_removed":
        remove_abort = message_store_module.remove_abort

        def paused_remove(root):
            remove_abort(root)
            _stop_here(where)
        message_store_module.remove_abort = paused_remove
    else:
        raise SystemExit(f"unknown pause point {where!r}")


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("seed", type=int)
    ap.add_argument("count", type=int)
    ap.add_argument("--flush", default="ASYNC_FLUSH", choices=("ASYNC_FLUSH", "SYNC_FLUSH"))
    ap.add_argument("--pause", default="none", choices=("none",) + PAUSES)
    ap.add_argument("--synced", default=None)
    args = ap.parse_args(argv)
    if args.synced:
        _record_syncs(args.root, args.synced)
    # a pause point needs dispatch driven by hand; without one the store's own service
    # threads run, as they do by default, and the kill lands anywhere among them
    store = MessageStore(writer_config(args.root, args.flush), background=args.pause == "none")
    store.load()
    _out(f"READY last_exit_ok={int(store.last_exit_ok)}\n")
    _put_all(store, args.seed, args.count, dispatch_now_and_then=args.pause == "none")
    if args.pause == "none":
        _out("DONE\n")
    else:
        _arm_pause(store, args.pause, random.Random(args.seed).randint(1, args.count))
        if args.pause in ("dispatch", "dispatch_index"):
            store.dispatch()
        else:
            store.close()
        _out(f"MISSED {args.pause}\n")     # the pause point was never reached
    sys.stdin.readline()
    return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
