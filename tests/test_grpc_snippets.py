"""The README's and docs/OPERATIONS.md's programs for RocketMQ's official Python client
run as printed against a store serving gRPC (``rocketstore up`` with
``grpc_listen_port``), the endpoint the one thing changed: its port, the store's here
instead of 8081. What they send is read back with rocketstore's own Consumer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from rocketstore import Consumer
from grpc_store import proxied_store
from store_processes import ROOT, WORK_DIR

ENDPOINT = "127.0.0.1:8081"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    with proxied_store(tmp_path_factory.mktemp("grpc-snippets")) as rs:
        yield rs



def python_block(doc: str, heading: str) -> str:
    """The first ```python block after the line ``heading`` of ``doc`` (a path from the
    repository's root)."""
    with open(os.path.join(ROOT, doc)) as f:
        text = f.read()
    start = text.index("\n" + heading + "\n")
    begin = text.index("```python\n", start) + len("```python\n")
    return text[begin:text.index("```", begin)]


def run_against(store, code: str) -> list[str]:
    """Run ``code`` with the store's endpoint in place of 8081's (it names it once);
    the lines it printed."""
    assert code.count(ENDPOINT) == 1, code
    code = code.replace(ENDPOINT, f"127.0.0.1:{store.grpc_port}")
    r = subprocess.run([sys.executable, "-c", code], cwd=WORK_DIR, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


def stored(store, topic: str, uniq_key: str, group: str):
    """The message of ``topic`` whose UNIQ_KEY is ``uniq_key``, read with rocketstore's
    own Consumer (None if it is not there within 20 s)."""
    with Consumer(store.store_dir, group, topic, wait_for_topic=True) as c:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            for m in c.poll(64, timeout_ms=500):
                if m.uniq_key == uniq_key:
                    return m
    return None


def test_the_readmes_program_sends_to_the_store(store):
    code = python_block("README.md", "## RocketMQ's own clients")
    (message_id,) = run_against(store, code)
    m = stored(store, "Orders", message_id, "readme-readers")
    assert m is not None, f"{message_id} is not in Orders"
    assert (m.body, m.tags) == (b"order 42", "created")


def test_the_operations_guides_program_sends_and_pop_consumes(store):
    code = python_block("docs/OPERATIONS.md", "## RocketMQ's own clients: the gRPC endpoint")
    lines = run_against(store, code)
    sent = [line.split()[1] for line in lines if line.startswith("sent ")]
    received = [line.split(maxsplit=2)[1:] for line in lines if line.startswith("received ")]
    assert len(sent) == 1 and received == [[sent[0], "b'order 42'"]], lines
    m = stored(store, "Orders", sent[0], "operations-readers")
    assert m is not None and (m.tags, m.keys) == ("paid", ["order-42"])
