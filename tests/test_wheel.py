"""The distribution as a user installs it: the wheel, built from this tree, installed
(with its dependencies) into a fresh virtual environment, puts one package into
site-packages, ``rocketstore``, beside its dist-info and the ``rocketstore`` script; and
``rocketstore demo`` runs from a directory whose own folders are named like the
repository's (``storage/``, ``procs/``, ``shm/``, ``pipeline/``), each a package that
fails when imported: none of them is picked up in place of rocketstore's rooms.

One test, the slowest of the suite (a wheel build and a venv, about 30 s): pip builds
the wheel in an isolated environment and installs the dependencies from its index or
cache, as a user's pip does.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SKIP = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__",
                              "store", ".pytest_cache", ".hypothesis", "tests", "bench")
DECOYS = ("storage", "procs", "shm", "pipeline")


def run(cmd: list[str], cwd: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


def test_the_wheel_installs_one_name_and_its_demo_runs_beside_lookalike_folders(tmp_path):
    source = tmp_path / "source"
    shutil.copytree(ROOT, source, ignore=SKIP, symlinks=True)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
         str(source)], cwd=str(tmp_path))
    (wheel,) = (tmp_path / "dist").glob("rocketstore-*.whl")

    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=str(tmp_path))
    python = str(venv / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", str(wheel)], cwd=str(tmp_path))

    site = run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
               cwd=str(tmp_path)).stdout.strip()
    (dist_info,) = [d for d in os.listdir(site) if d.startswith("rocketstore-")]
    with open(os.path.join(site, dist_info, "RECORD"), encoding="utf-8") as f:
        installed = {line.split(",")[0] for line in f if line.strip()}
    tops = {path.split("/")[0] for path in installed if not path.startswith("..")}
    assert tops == {"rocketstore", dist_info}
    outside = {os.path.normpath(os.path.join(site, p)) for p in installed if p.startswith("..")}
    assert outside == {str(venv / "bin" / "rocketstore")}
    rooms = {p.split("/")[1] for p in installed if p.startswith("rocketstore/") and
             p.count("/") >= 2}
    assert {"storage", "shm", "wire", "client", "procs", "spark", "console", "cli"} <= rooms
    assert {"rocketstore/console/templates/overview.html",
            "rocketstore/console/static/dashboard.js"} <= installed    # the pages go along

    work = tmp_path / "a-data-team-repo"
    for name in DECOYS:
        (work / name).mkdir(parents=True)
        (work / name / "__init__.py").write_text(
            f"raise ImportError('the folder {name}/ of the working directory was imported')\n")
    done = run([str(venv / "bin" / "rocketstore"), "demo", "--count", "500", "--json"],
               cwd=str(work), timeout=300)
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["sent"] == summary["consumed"] == 500
    assert summary["stopped_cleanly"]
    assert os.path.isdir(work / "store" / "commitlog")

    face = run([python, "-c", "import rocketstore, rocketstore.spark; "
                "import json; print(json.dumps(rocketstore.__all__)); print(rocketstore.spark.__file__)"],
               cwd=str(work)).stdout.splitlines()
    assert {"Producer", "Consumer", "MessageStore", "StoreConfig", "Message",
            "PutMessageStatus", "RequestTimeout"} <= set(json.loads(face[0]))
    assert face[1].startswith(site)
