"""The library installs with plain `pip install <dir>` into a clean virtualenv, with its metadata and
its `py.typed` marker, and a hook written against the installed copy serves calls.

Slow-ish (a venv and a wheel build: a few seconds); it needs PyPI for the build backend (setuptools),
as any `pip install` of a source tree does.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
import venv
from pathlib import Path

import metahook_hooks

LIBRARY = Path(__file__).resolve().parent.parent

HOOK = textwrap.dedent(
    """
    import metahook_hooks
    from metahook_hooks import CompositeRequest, CompositeResponse, composite_response, parent_of, serve

    # Imported from the virtualenv, not from the source tree.
    assert "site-packages" in metahook_hooks.__file__, metahook_hooks.__file__

    async def sync(request: CompositeRequest) -> CompositeResponse:
        return composite_response(children=[], status={"hello": parent_of(request)["metadata"]["name"]})

    serve({"/sync": sync})
    """
)

METADATA = textwrap.dedent(
    """
    import json
    from importlib.metadata import metadata
    from importlib.resources import files
    meta = metadata("metahook-hooks")
    import metahook_hooks
    print(json.dumps({
        "name": meta["Name"],
        "version": meta["Version"],
        "module_version": metahook_hooks.__version__,
        "urls": meta.get_all("Project-URL"),
        "classifiers": meta.get_all("Classifier"),
        "requires_python": meta["Requires-Python"],
        "typed": files("metahook_hooks").joinpath("py.typed").is_file(),
    }))
    """
)


def test_pip_installs_the_library_into_a_clean_venv_and_a_hook_runs_on_it(tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    subprocess.run(
        [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", str(LIBRARY)],
        check=True,
        cwd=tmp_path,
    )
    # Outside the source tree, with no PYTHONPATH: only the installed copy can be imported.
    clean_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    meta = json.loads(subprocess.run([python, "-c", METADATA], check=True, capture_output=True, text=True,
                                     cwd=tmp_path, env=clean_env).stdout)
    assert meta["name"] == "metahook-hooks"
    assert meta["version"] == meta["module_version"] == metahook_hooks.__version__
    assert meta["typed"], "py.typed is installed, so type checkers use the library's annotations"
    assert any(url.startswith("Source, https://") for url in meta["urls"]), meta["urls"]
    assert "Typing :: Typed" in meta["classifiers"]
    assert meta["requires_python"] == ">=3.11"

    (tmp_path / "hook.py").write_text(HOOK)
    port = _free_port()
    hook = subprocess.Popen([python, "hook.py"], cwd=tmp_path, env={**clean_env, "PORT": str(port), "HOST": "127.0.0.1"},
                            stderr=subprocess.PIPE, text=True)
    try:
        _wait_until_listening(port, hook)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=10) as health:
            assert health.status == 200
        body = json.dumps({"parent": {"metadata": {"name": "world"}}, "children": {}, "finalizing": False}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/sync", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as answer:
            assert json.loads(answer.read()) == {"children": [], "status": {"hello": "world"}}
    finally:
        hook.terminate()
        assert hook.wait(timeout=20) == 0, hook.stderr.read() if hook.stderr else ""


def pyproject_version():
    """`[project] version` of pyproject.toml."""
    import tomllib

    return tomllib.loads((LIBRARY / "pyproject.toml").read_text())["project"]["version"]


def test_the_module_version_is_the_package_version():
    assert metahook_hooks.__version__ == pyproject_version()
    assert re.fullmatch(r"\d+\.\d+\.\d+", metahook_hooks.__version__)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until_listening(port, process, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert process.poll() is None, f"the hook exited: {process.stderr.read() if process.stderr else ''}"
            assert time.monotonic() < deadline, "the hook did not listen on $PORT"
            time.sleep(0.05)
