// A hook that speaks only HTTP/2 over TLS (no HTTP/1.1 fallback), to show the hub negotiates h2 by
// ALPN when a hook offers it. Usage: node h2_hook.mjs CERT KEY LOG; prints "PORT <n>"; appends
// {"httpVersion"} per request to LOG. Answers like transport_hook.py: one ConfigMap "<parent>-cm"
// carrying spec.greeting.
import fs from 'node:fs';
import http2 from 'node:http2';

const [certFile, keyFile, logFile] = process.argv.slice(2);
const server = http2.createSecureServer({
  cert: fs.readFileSync(certFile),
  key: fs.readFileSync(keyFile),
  allowHTTP1: false,
});
server.on('request', (req, res) => {
  const chunks = [];
  req.on('data', (chunk) => chunks.push(chunk));
  req.on('end', () => {
    fs.appendFileSync(logFile, JSON.stringify({ httpVersion: req.httpVersion }) + '\n');
    const parent = JSON.parse(Buffer.concat(chunks).toString()).parent;
    const greeting = parent.spec?.greeting ?? 'hi';
    res.writeHead(200, { 'content-type': 'application/json' });
    res.end(JSON.stringify({
      status: { greeting },
      children: [{ apiVersion: 'v1', kind: 'ConfigMap', metadata: { name: `${parent.metadata.name}-cm` }, data: { greeting } }],
    }));
  });
});
server.listen(0, '127.0.0.1', () => console.log(`PORT ${server.address().port}`));
