"""examples-python/Dockerfile, checked without a Docker engine: what its COPY lines name exists in the
build context, the file its CMD runs is in every hook directory its comments document, and the library
builds from exactly the files it copies."""

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

CONTEXT = Path(__file__).resolve().parents[2]  # examples-python/, the documented build context
DOCKERFILE = CONTEXT / "Dockerfile"


def instructions():
    """(INSTRUCTION, arguments) of the Dockerfile, comments dropped and continued lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(line for line in DOCKERFILE.read_text().splitlines()
                                        if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip()) for line in text.splitlines() if line.strip()]


def documented_hooks():
    """The HOOK values the comments build with, and the ARG default."""
    hooks = set(re.findall(r"--build-arg HOOK=(\S+)", DOCKERFILE.read_text()))
    defaults = [args.split("=", 1)[1] for op, args in instructions() if op == "ARG" and args.startswith("HOOK=")]
    assert len(hooks) >= 2 and len(defaults) == 1, (hooks, defaults)
    return sorted(hooks | set(defaults))


def copies(hook):
    """(sources, destination) of each COPY, with $HOOK replaced."""
    result = []
    for op, args in instructions():
        if op == "COPY":
            words = [w.replace("${HOOK}", hook).replace("$HOOK", hook) for w in args.split() if not w.startswith("--")]
            result.append((words[:-1], words[-1]))
    return result


def the_one(op):
    (args,) = [args for name, args in instructions() if name == op]
    return args


@pytest.mark.parametrize("hook", documented_hooks())
def test_every_copy_source_exists_in_the_build_context(hook):
    assert (CONTEXT / hook).is_dir(), f"the Dockerfile documents HOOK={hook}, but there is no {hook}/"
    for sources, _ in copies(hook):
        for source in sources:
            assert (CONTEXT / source).exists(), f"COPY {source}: not in {CONTEXT}"


@pytest.mark.parametrize("hook", documented_hooks())
def test_the_cmd_runs_a_file_the_hook_directory_has(hook):
    command = json.loads(the_one("CMD"))
    assert command[0] == "python"
    script = Path(the_one("WORKDIR")) / command[1]
    origins = [CONTEXT / source / script.relative_to(destination)
               for sources, destination in copies(hook) for source in sources
               if destination.endswith("/") and script.is_relative_to(destination)]
    assert origins, f"no COPY puts anything at {script}"
    for origin in origins:
        assert origin.is_file(), f"CMD runs {script}, which would come from {origin}: missing"


def test_the_image_is_the_documented_one():
    assert the_one("FROM") == "python:3.11-slim"
    assert the_one("EXPOSE") == "8080"
    user = the_one("USER").split(":")[0]
    assert user.isdigit() and int(user) != 0, "a numeric non-root user, which runAsNonRoot can check"


def test_generated_keys_stay_out_of_the_build_context():
    ignored = (CONTEXT / ".dockerignore").read_text().splitlines()
    assert "**/certs" in ignored and "**/*.key" in ignored


def test_the_library_installs_from_the_files_the_dockerfile_copies(tmp_path):
    # Lay out /src/metahook-hooks as the library's COPY lines do, then pip-install it as the RUN does.
    library = [(sources, destination) for sources, destination in copies("mtls") if destination.startswith("/src/")]
    assert library
    for sources, destination in library:
        target = tmp_path / destination.lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for source in sources:
            path = CONTEXT / source
            if path.is_dir():
                shutil.copytree(path, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                shutil.copy(path, target / path.name)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input",
                    "--target", str(site), str(tmp_path / "src" / "metahook-hooks")], check=True, cwd=tmp_path)
    assert (site / "metahook_hooks" / "server.py").is_file()
    assert (site / "metahook_hooks" / "py.typed").is_file()
