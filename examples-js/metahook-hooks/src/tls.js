/**
 * TLS for the hook server, with certificates that are replaced while it runs.
 *
 * In Kubernetes the certificate comes from a Secret mounted as files, and cert-manager (or a person)
 * renews it by updating the Secret: the kubelet writes the new files into a fresh directory and swaps
 * the `..data` symlink to it. A hook that read its certificate once would serve the old one until it
 * restarts, and then fail every call once it expires. So the server watches the files and gives new
 * connections the new certificate; connections already open keep theirs.
 */

import { readFileSync, realpathSync, statSync } from "node:fs";
import https from "node:https";
import { createSecureContext } from "node:tls";

/** Files are looked at no more than once a second, however many connections arrive. */
export const CHECK_INTERVAL_MS = 1000;
const ENV = { cert: "TLS_CERT_FILE", key: "TLS_KEY_FILE", ca: "TLS_CLIENT_CA_FILE" };

/**
 * `{ cert, key, ca }`: the PEM paths to serve with, from the options, else from `$TLS_CERT_FILE`,
 * `$TLS_KEY_FILE` and `$TLS_CLIENT_CA_FILE`; `null` when none is set (plain HTTP). A certificate
 * without its key, or a client CA without a certificate, is a configuration error, thrown at start-up.
 */
export function tlsFiles({ tlsCert, tlsKey, clientCa } = {}, env = process.env) {
  const fromEnv = (name) => (env[name] ?? "").trim() || undefined;
  const files = { cert: tlsCert ?? fromEnv(ENV.cert), key: tlsKey ?? fromEnv(ENV.key), ca: clientCa ?? fromEnv(ENV.ca) };
  if (!files.cert && !files.key && !files.ca) return null;
  if (!files.cert || !files.key) {
    throw new TypeError(`TLS needs a certificate and its key: tlsCert and tlsKey, or ${ENV.cert} and ${ENV.key}`);
  }
  return files;
}

/**
 * The files' contents, as `createSecureContext` takes them. Throws if they cannot be read or do not
 * make a context (e.g. a key that does not match the certificate), before anything is replaced.
 */
function secureContextOptions(files) {
  const options = { cert: readFileSync(files.cert), key: readFileSync(files.key) };
  if (files.ca) options.ca = readFileSync(files.ca);
  createSecureContext(options);
  return options;
}

/**
 * What identifies the files' current versions: real path (the kubelet's swap changes it), inode,
 * modification time and size (an in-place write or a rename over changes those). A missing file is a
 * version too, so that it is reported once.
 */
function fingerprint(files) {
  return [files.cert, files.key, files.ca]
    .filter(Boolean)
    .map((path) => {
      try {
        const stat = statSync(path);
        return `${realpathSync(path)}:${stat.ino}:${stat.mtimeMs}:${stat.size}`;
      } catch (e) {
        return `${path}:${e instanceof Error && "code" in e ? e.code : "unreadable"}`;
      }
    })
    .join("|");
}

/**
 * Options for `https.createServer`: the certificate and key, and with a client CA, mutual TLS — a
 * client must present a certificate that CA signed, or the handshake fails.
 */
function serverOptions(files) {
  const options = secureContextOptions(files);
  return files.ca ? { ...options, requestCert: true, rejectUnauthorized: true } : options;
}

/** New connections get the files' certificate, or, if they do not load, keep the previous one; one line either way. */
function reload(server, files, write) {
  try {
    server.setSecureContext(secureContextOptions(files));
    write(`hook server: TLS files changed: serving the certificate now in ${files.cert}`);
  } catch (e) {
    write(`hook server: TLS files changed but do not load, still serving the previous certificate: ${e instanceof Error ? e.message : e}`);
  }
}

/**
 * An https.Server for `listener` serving `files`, which loads them again whenever they change: checked
 * when a connection arrives, before its handshake, at most once a second, so the next connection after
 * a renewal gets the new certificate. A new version that does not load is reported in one line and the
 * previous certificate kept; it is tried again when the files change again. Files that do not load at
 * start-up throw.
 */
export function createTlsServer(files, listener, write) {
  let loaded = fingerprint(files); // before reading, so that a change while reading is seen later
  const server = https.createServer(serverOptions(files), listener);
  let checked = Date.now();
  const check = () => {
    if (Date.now() - checked < CHECK_INTERVAL_MS) return;
    checked = Date.now();
    const current = fingerprint(files);
    if (current === loaded) return;
    loaded = current;
    reload(server, files, write);
  };
  // Before the TLS server's own listener, which starts the handshake with the context of that moment.
  server.prependListener("connection", check);
  return server;
}
