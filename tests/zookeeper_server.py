"""Test support: a real ZooKeeper server (Debian's package) on a free loopback port, in
a directory of its own, for the failover tests and bench/failover.py."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

from store_processes import free_port, wait_for

ZOOKEEPER_JAR = "/usr/share/java/zookeeper.jar"
TICK_MS = 500        # sessions of 2-20 ticks: 1-10 s


def missing() -> str | None:
    """Why no server can be started here, or None."""
    if not os.path.exists(ZOOKEEPER_JAR):
        return f"ZooKeeper is not installed ({ZOOKEEPER_JAR} missing: apt-get install zookeeper)"
    if shutil.which("java") is None:
        return "ZooKeeper cannot run: no java"
    return None


class ZooKeeperServer:
    """``start()`` runs the server in ``directory`` and waits until it answers;
    ``stop()`` kills it. The same directory and port serve a restart."""

    def __init__(self, directory: str):
        self.directory = directory
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.config = os.path.join(directory, "zoo.cfg")
        with open(self.config, "w") as f:
            f.write(f"tickTime={TICK_MS}\ndataDir={os.path.join(directory, 'data')}\n"
                    f"clientPort={self.port}\nclientPortAddress=127.0.0.1\n"
                    "admin.enableServer=false\n4lw.commands.whitelist=ruok\n")

    def start(self, timeout: float = 30) -> "ZooKeeperServer":
        log = open(os.path.join(self.directory, "zookeeper.log"), "a")
        self.proc = subprocess.Popen(
            [shutil.which("java"), "-cp", f"/etc/zookeeper/conf:{ZOOKEEPER_JAR}",
             "org.apache.zookeeper.server.ZooKeeperServerMain", self.config],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        wait_for(self._serving, timeout, what="ZooKeeper to answer", interval=0.1)
        return self

    def _serving(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"ZooKeeper exited with {self.proc.returncode}; see "
                                 f"{self.directory}/zookeeper.log")
        try:
            with socket.create_connection(("127.0.0.1", self.port), 0.5) as s:
                s.sendall(b"ruok")
                return s.recv(4) == b"imok"
        except OSError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
