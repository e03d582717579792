"""Request bodies: Content-Length or chunked, and the size limit, over raw sockets (so the test sends
exactly the bytes it means, including malformed ones)."""

import http.client
import json
import socket

import pytest

from metahook_hooks import DEFAULT_MAX_BODY, composite_response, start_server
from metahook_hooks.body import max_body_from_env, parse_size

LIMIT = 200


def sync(request):
    return composite_response(children=[], status={"parent": request["parent"]["metadata"]["name"]})


@pytest.fixture(scope="module")
def server():
    server = start_server({"/sync": sync}, max_body=LIMIT)
    yield server
    server.shutdown()
    server.server_close()


def head(headers, path="/sync"):
    lines = [f"POST {path} HTTP/1.1", "Host: hook", *headers]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


CHUNKED = "Transfer-Encoding: chunked"
BODY = json.dumps({"parent": {"metadata": {"name": "chunky"}}}).encode()


def exchange(sock):
    """(status, headers, text) of the next response on `sock`."""
    response = http.client.HTTPResponse(sock)
    response.begin()
    return response.status, response.headers, response.read().decode()


def connect(server):
    return socket.create_connection(("127.0.0.1", server.port), timeout=5)


def closed_by_server(sock):
    return sock.recv(1) == b""


def test_chunked_body_with_extensions_and_trailers_is_read_whole(server):
    pieces = [BODY[:7], BODY[7:8], BODY[8:]]
    chunks = b"".join(f"{len(p):x}".encode() + ext + b"\r\n" + p + b"\r\n" for p, ext in
                      zip(pieces, [b"", b";name=value", b' ; a="b c";d']))
    last = b"0;done\r\nX-Checksum: 1234\r\nX-Other: 5\r\n\r\n"
    with connect(server) as sock:
        sock.sendall(head([CHUNKED]) + chunks + last)
        status, _, text = exchange(sock)
        assert (status, json.loads(text)["status"]) == (200, {"parent": "chunky"})
        # The trailers were consumed: the same connection carries the next request.
        sock.sendall(head([f"Content-Length: {len(BODY)}"]) + BODY)
        assert exchange(sock)[0] == 200


def test_upper_case_hex_and_a_bare_last_chunk(server):
    body = json.dumps({"parent": {"metadata": {"name": "x" * 20}}}).encode()
    with connect(server) as sock:
        sock.sendall(head([CHUNKED]) + f"{len(body):X}\r\n".encode() + body + b"\r\n0\r\n\r\n")
        assert exchange(sock)[0] == 200


def test_chunked_body_over_the_limit_is_413_before_the_chunk_is_sent(server):
    with connect(server) as sock:
        # Only the size line: a server that tried to read the 4096 bytes would never answer.
        sock.sendall(head([CHUNKED]) + b"1000\r\n" + b"x" * 10)
        status, headers, text = exchange(sock)
        assert (status, headers["Connection"]) == (413, "close")
        assert text.startswith(f"request body larger than the hook's limit of {LIMIT} bytes")
        assert closed_by_server(sock)


def test_chunks_adding_up_over_the_limit_are_413(server):
    chunk = b"64\r\n" + b"x" * 100 + b"\r\n"
    with connect(server) as sock:
        sock.sendall(head([CHUNKED]) + chunk + chunk + b"1\r\n")
        assert exchange(sock)[0] == 413


def test_content_length_over_the_limit_is_413_without_reading_the_body(server):
    with connect(server) as sock:
        sock.sendall(head(["Content-Length: 1000000000000"]))
        status, headers, text = exchange(sock)
        assert (status, headers["Connection"]) == (413, "close")
        assert f"limit of {LIMIT} bytes" in text
        assert closed_by_server(sock)


def test_over_limit_with_expect_continue_gets_413_not_100(server):
    with connect(server) as sock:
        sock.sendall(head([f"Content-Length: {LIMIT + 1}", "Expect: 100-continue"]))
        assert exchange(sock)[0] == 413


def test_a_body_of_exactly_the_limit_is_read():
    body = json.dumps({"parent": {"metadata": {"name": "edge"}}}).encode()
    for limit, expected in [(len(body), 200), (len(body) - 1, 413)]:
        server = start_server({"/sync": sync}, max_body=limit)
        try:
            with connect(server) as sock:
                sock.sendall(head([f"Content-Length: {len(body)}"]) + body)
                assert exchange(sock)[0] == expected, limit
        finally:
            server.shutdown()
            server.server_close()


def test_a_client_that_sends_the_whole_over_limit_body_still_reads_the_413(server):
    # http.client sends the whole body before it reads the answer. Closing the socket with its input
    # unread would reset the connection and the client would see ECONNRESET, not why it was refused.
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    conn.request("POST", "/sync", body=b"x" * (16 * 1024 * 1024))
    response = conn.getresponse()
    assert response.status == 413
    assert b"larger than the hook's limit" in response.read()
    conn.close()


@pytest.mark.parametrize("size_line", [b"xyz", b"-5", b"0x10", b"+a", b"", b" ", b"1_0", b"12345678901234567", b";ext"])
def test_malformed_chunk_sizes_are_400(server, size_line):
    with connect(server) as sock:
        sock.sendall(head([CHUNKED]) + size_line + b"\r\nabc\r\n0\r\n\r\n")
        status, headers, text = exchange(sock)
        assert (status, headers["Connection"]) == (400, "close")
        assert text.startswith("bad chunk size line")


def test_chunk_data_longer_than_its_size_is_400(server):
    with connect(server) as sock:
        sock.sendall(head([CHUNKED]) + b"3\r\nabcdef\r\n0\r\n\r\n")
        status, _, text = exchange(sock)
        assert (status, text.strip()) == (400, "chunk of 3 bytes is not followed by CRLF")


def test_transfer_codings_other_than_chunked_are_501(server):
    with connect(server) as sock:
        sock.sendall(head(["Transfer-Encoding: gzip, chunked"]))
        status, _, text = exchange(sock)
        assert status == 501 and "'gzip, chunked' is not supported" in text


def test_transfer_encoding_with_content_length_is_400(server):
    with connect(server) as sock:
        sock.sendall(head([CHUNKED, "Content-Length: 3"]) + b"0\r\n\r\n")
        status, _, text = exchange(sock)
        assert (status, text.strip()) == (400, "the request has both Transfer-Encoding and Content-Length")


def test_the_limit_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv("METAHOOK_MAX_BODY", raising=False)
    assert max_body_from_env() == DEFAULT_MAX_BODY == 64 * 1024 * 1024
    for text, expected in [("1048576", 1048576), ("512Ki", 512 * 1024), ("8Mi", 8 << 20), ("1Gi", 1 << 30)]:
        monkeypatch.setenv("METAHOOK_MAX_BODY", text)
        assert max_body_from_env() == expected, text
    for bad in ["64MB", "-1", "0", "lots"]:
        monkeypatch.setenv("METAHOOK_MAX_BODY", bad)
        with pytest.raises(ValueError, match="METAHOOK_MAX_BODY"):
            max_body_from_env()


def test_parse_size_names_the_accepted_forms():
    with pytest.raises(ValueError, match="64Mi"):
        parse_size("64 megabytes")
