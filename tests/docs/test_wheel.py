"""cairn as PyPI would ship it: the sdist and the wheel built from it pass `twine check`,
and the wheel, installed alone into a clean virtualenv, is what a web app needs to
enqueue and a worker needs to run, without the HTTP server (`cairn[server]`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from cairn.store import PgStore
from tests.helpers.services import ROOT

BIN = Path(sys.executable).parent
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
# What the sdist is made of, copied out of the checkout so the build writes nothing into
# it (egg-info, build/) while other tests import from it.
SOURCES = ("pyproject.toml", "README.md", "cairn", "store", "steps", "workers")
SERVER = ("fastapi", "uvicorn", "jinja2")


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, and the wheel `python -m build` makes from it (so the sdist is complete)."""
    root = tmp_path_factory.mktemp("wheel")
    src = root / "src"
    src.mkdir()
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=junk)
        else:
            shutil.copy(ROOT / name, src / name)
    out = root / "dist"
    # --no-isolation: setuptools from the dev extra, so the build needs no index.
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(src)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return out


@pytest.fixture(scope="module")
def plain(dist: Path) -> Path:
    """A fresh virtualenv with the wheel installed without extras; its bin directory.
    Its dependencies come from the index (pip's cache makes a second run quick)."""
    (wheel,) = dist.glob("cairn-*.whl")
    env_dir = dist.parent / "venv"
    venv.create(env_dir, with_pip=True)
    subprocess.run(
        [str(env_dir / "bin" / "python"), "-m", "pip", "install", "-q",
         "--disable-pip-version-check", str(wheel)],
        check=True, capture_output=True, timeout=600,
    )  # fmt: skip
    return env_dir / "bin"


def _run(
    bin_dir: Path, *argv: str, cwd: Path, timeout: float = 60, **env: str
) -> subprocess.CompletedProcess[str]:
    """A command of the clean venv, from outside the checkout, with none of ours set."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "PYTHON"))}
    return subprocess.run(
        [str(bin_dir / argv[0]), *argv[1:]],
        cwd=cwd,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_sdist_and_the_wheel_pass_twine_check(dist: Path) -> None:
    files = sorted(str(p) for p in dist.iterdir())
    assert [Path(f).name for f in files] == [
        f"cairn-{VERSION}-py3-none-any.whl",
        f"cairn-{VERSION}.tar.gz",
    ]
    done = subprocess.run(
        [str(BIN / "twine"), "check", "--strict", *files],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_wheel_ships_py_typed_and_the_data_files_and_only_cairn(dist: Path) -> None:
    (wheel,) = dist.glob("cairn-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {n.split("/")[0] for n in names} == {"cairn", f"cairn-{VERSION}.dist-info"}
    assert "cairn/py.typed" in names  # PEP 561: a user's type checker reads our hints
    assert {"cairn/store/sql/queries.sql", "cairn/store/lua/acquire.lua"} <= names
    assert any(n.startswith("cairn/web/templates/") for n in names)
    for package in ("cairn/web/routers", "cairn/testing/memory", "cairn/testing/standins"):
        assert f"{package}/__init__.py" in names, package  # pyproject's packages list
    assert "cairn/testing/demos/invoice.py" in names  # `cairn demo` and `cairn chaos` load it
    with tarfile.open(next(dist.glob("cairn-*.tar.gz"))) as sdist:
        assert f"cairn-{VERSION}/cairn/py.typed" in sdist.getnames()
    metadata = zipfile.ZipFile(wheel).read(f"cairn-{VERSION}.dist-info/METADATA").decode()
    required = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    for name in SERVER:  # in the server extra only
        assert all(name not in r.lower() or 'extra == "server"' in r for r in required), name


def test_a_plain_install_has_the_client_and_the_worker_but_no_server(
    plain: Path, tmp_path: Path
) -> None:
    code = (
        "import importlib.util, cairn; cairn.Client; cairn.AsyncClient; cairn.workflow; "
        f"print(cairn.__version__, *[importlib.util.find_spec(m) for m in {SERVER!r}])"
    )
    done = _run(plain, "python", "-c", code, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [VERSION, "None", "None", "None"]
    web = _run(plain, "python", "-c", "import cairn.web.api", cwd=tmp_path)
    assert "pip install 'cairn[server]'" in web.stderr, web.stderr
    version = _run(plain, "cairn", "--version", cwd=tmp_path)
    assert version.stdout == f"cairn {VERSION}\n", version.stderr  # pyproject's, one place
    for command in ("worker", "beat", "enqueue", "db"):
        helped = _run(plain, "cairn", command, "--help", cwd=tmp_path)
        assert helped.returncode == 0, f"cairn {command} --help:\n{helped.stderr}"


def test_cairn_serve_without_the_server_extra_says_which_to_install(
    plain: Path, tmp_path: Path
) -> None:
    for argv in (["serve"], ["demo", "--serve"]):
        start = time.monotonic()
        # Nothing listens at this database: the command must fail before it tries one.
        done = _run(plain, "cairn", *argv, cwd=tmp_path, timeout=30,
                    CAIRN_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")  # fmt: skip
        took = time.monotonic() - start
        assert done.returncode == 1, done.stdout + done.stderr
        assert "pip install 'cairn[server]'" in done.stderr, done.stderr
        assert took < 15, f"cairn {' '.join(argv)} took {took:.1f}s to refuse"


def test_a_web_app_with_the_plain_install_enqueues(
    plain: Path, tmp_path: Path, settings, store: PgStore
) -> None:
    """Both clients against this test's Postgres and Redis, from the clean venv, with a
    workflow the app has not registered (a web app's Client needs only its name)."""
    code = """
import asyncio, cairn

with cairn.Client() as client:
    print(client.enqueue("greet", {"name": "Ada"}, run_id="plain-1"))

async def main():
    async with cairn.AsyncClient() as client:
        print(await client.enqueue("greet", {"name": "Bo"}, run_id="plain-2"))

asyncio.run(main())
"""
    env = {
        "CAIRN_DATABASE_URL": settings.database_url,
        "CAIRN_DATABASE_PREPARE": "1" if settings.database_prepare else "0",
        "CAIRN_REDIS_URL": settings.redis_url,
    }
    done = _run(plain, "python", "-c", code, cwd=tmp_path, **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["plain-1", "plain-2"]
    for run_id, name in (("plain-1", "Ada"), ("plain-2", "Bo")):
        run = store.get(run_id)
        assert run is not None and run.workflow == "greet" and run.input == {"name": name}
