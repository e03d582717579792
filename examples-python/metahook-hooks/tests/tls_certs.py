"""Test certificates made with the `openssl` command: a CA, server certificates for 127.0.0.1 and
localhost, and client certificates, each with its own serial number so a test can tell them apart."""

import subprocess
from dataclasses import dataclass
from pathlib import Path

LEAF_EXTENSIONS = """\
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = {usage}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
"""


@dataclass(frozen=True)
class Pair:
    cert: Path
    key: Path


def openssl(*args, cwd):
    subprocess.run(["openssl", *map(str, args)], cwd=cwd, check=True, capture_output=True)


def new_key(path):
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path, cwd=path.parent)


def make_ca(directory, name="test-ca"):
    """A self-signed CA in `directory`/`name`.crt and .key."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    new_key(pair.key)
    openssl("req", "-x509", "-new", "-key", pair.key, "-subj", f"/CN={name}", "-days", "2", "-out", pair.cert,
            "-config", "/dev/null", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign", "-addext", "subjectKeyIdentifier=hash", cwd=directory)
    return pair


def make_leaf(ca, directory, name, serial, *, server=True):
    """A certificate signed by `ca`: for a server (SAN 127.0.0.1 and localhost) or a client."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    new_key(pair.key)
    csr = directory / f"{name}.csr"
    openssl("req", "-new", "-key", pair.key, "-subj", f"/CN={name}", "-out", csr, "-config", "/dev/null", cwd=directory)
    extensions = LEAF_EXTENSIONS.format(usage="serverAuth" if server else "clientAuth")
    if server:
        extensions += "subjectAltName = IP:127.0.0.1, DNS:localhost\n"
    ext_file = directory / f"{name}.ext"
    ext_file.write_text(extensions)
    openssl("x509", "-req", "-in", csr, "-CA", ca.cert, "-CAkey", ca.key, "-set_serial", serial, "-days", "2",
            "-extfile", ext_file, "-out", pair.cert, cwd=directory)
    return pair
