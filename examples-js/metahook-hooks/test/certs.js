// Test certificates made with the openssl command line: a CA, two server certificates for 127.0.0.1 and
// localhost (serials 1001 and 1002, as a renewal would give), a client certificate from the same CA, and
// one from another CA. No tests here: node --test runs this file too, and it only defines the helper.
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

const EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];

function openssl(dir, ...args) {
  execFileSync("openssl", args, { cwd: dir, stdio: ["ignore", "ignore", "pipe"] });
}

/** `<name>.crt` and `<name>.key`: a CA certificate that signs the others. */
function ca(dir, name) {
  openssl(dir, "req", "-x509", ...EC, "-keyout", `${name}.key`, "-out", `${name}.crt`, "-days", "2", "-subj", `/CN=${name}`,
    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign");
}

/** `<name>.crt` and `<name>.key`, signed by `signer`, with `serial` (hex) and the extensions in `ext`. */
function leaf(dir, name, signer, serial, ext) {
  writeFileSync(join(dir, `${name}.ext`), ext);
  openssl(dir, "req", "-new", ...EC, "-keyout", `${name}.key`, "-out", `${name}.csr`, "-subj", `/CN=${name}`);
  openssl(dir, "x509", "-req", "-in", `${name}.csr`, "-CA", `${signer}.crt`, "-CAkey", `${signer}.key`,
    "-set_serial", `0x${serial}`, "-days", "2", "-out", `${name}.crt`, "-extfile", `${name}.ext`);
}

const SERVER_EXT = "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n";
const CLIENT_EXT = "extendedKeyUsage=clientAuth\n";

/**
 * Makes the certificates in `dir` and returns their paths: `ca`, `server1`/`server2` and `client`
 * (each `{ cert, key }`, `ca` also as the CA file), and `rogue`, a client certificate another CA signed.
 */
export function makeCertificates(dir) {
  ca(dir, "ca");
  ca(dir, "rogue-ca");
  leaf(dir, "server1", "ca", "1001", SERVER_EXT);
  leaf(dir, "server2", "ca", "1002", SERVER_EXT);
  leaf(dir, "client", "ca", "2001", CLIENT_EXT);
  leaf(dir, "rogue", "rogue-ca", "3001", CLIENT_EXT);
  const pair = (name) => ({ cert: join(dir, `${name}.crt`), key: join(dir, `${name}.key`) });
  return { ca: join(dir, "ca.crt"), server1: pair("server1"), server2: pair("server2"), client: pair("client"), rogue: pair("rogue") };
}
