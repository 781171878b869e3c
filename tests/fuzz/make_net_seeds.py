#!/usr/bin/env python3
"""Write the seed corpora of fuzz_http (seeds/http/) and fuzz_ws (seeds/ws/).

http: requests as a client sends them, from the first byte of the connection.
ws: what a client sends after the upgrade request (fuzz_ws.c sends that
itself): masked frames carrying docs/protocol.md's frames, a ping, a
fragmented message, a close. Run it again after changing it; the output is
deterministic (fixed masking keys).
"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))

UPGRADE = (b"GET /v1/ws HTTP/1.1\r\nHost: gw\r\nUpgrade: websocket\r\n"
           b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
           b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: converger.v1\r\n\r\n")


def frame(opcode, payload, fin=True, mask=b"\x37\xfa\x21\x3d"):
    """One client frame (RFC 6455 section 5.2), masked unless mask is None."""
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    bit = 0x80 if mask is not None else 0
    if n < 126:
        head += bytes([bit | n])
    elif n < 65536:
        head += bytes([bit | 126]) + struct.pack(">H", n)
    else:
        head += bytes([bit | 127]) + struct.pack(">Q", n)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def text(obj):
    return frame(1, json.dumps(obj, separators=(",", ":")).encode())


def close(code, reason=b""):
    return frame(8, struct.pack(">H", code) + reason)


HELLO = {"type": "hello", "token": "eyJhbGciOiJIUzI1NiJ9.e30.c2ln",
         "subs": [{"conv": "support-42", "watermark": 17},
                  {"conv": "support-43", "watermark": None}],
         "client": "acme-web/2.3.1"}
SEND = {"type": "send", "conv": "support-42",
        "id": "6f1c2e1a-3b7d-4c55-9a3e-0d2f4b8c9e11",
        "body": {"text": "Is my order on its way?"}}
SYNC = {"type": "sync", "conv": "support-42", "watermark": 17, "epoch": "9c4e01af"}

BODY = b'{"id":"m-1","sender":"bot","body":{"text":"hi"}}'
POST = (b"POST /v1/conversations/support-42/messages HTTP/1.1\r\nHost: gw\r\n"
        b"Authorization: Bearer key\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(BODY)) + BODY

HTTP = {
    "healthz.txt": b"GET /healthz HTTP/1.1\r\nHost: gw\r\n\r\n",
    "readyz.txt": b"GET /readyz?verbose=1 HTTP/1.0\r\n\r\n",
    "post.txt": POST,
    "pipelined.txt": b"GET /livez HTTP/1.1\r\nHost: gw\r\nConnection: keep-alive\r\n\r\n"
                     + POST + b"GET /healthz HTTP/1.1\r\nHost: gw\r\nConnection: close\r\n\r\n",
    "chunked.txt": b"POST /v1/conversations/c1/messages HTTP/1.1\r\nHost: gw\r\n"
                   b"Transfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n"
                   b"f\r\n{\"body\":{\"a\":1}\r\n1\r\n}\r\n0\r\n\r\n",
    "upgrade.txt": UPGRADE + text({"type": "ping"}) + close(1000),
    "upgrade_bad.txt": b"POST /v1/ws HTTP/1.1\r\nHost: gw\r\n\r\n"
                       b"GET /v1/ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                       b"Sec-WebSocket-Key: short\r\nSec-WebSocket-Version: 8\r\n\r\n",
    "notfound.txt": b"DELETE /nope HTTP/1.1\r\nHost: gw\r\nContent-Length: 0\r\n\r\n",
    # Server-Sent Events (docs/protocol.md section 12): the watermarks in
    # Last-Event-ID, a stream that ends with a drain event, one that ends
    # with a close, and Last-Event-IDs that are refused with 400
    "sse.txt": b"GET /v1/sse?conv=support-42&conv=support-43&drain=1 HTTP/1.1\r\nHost: gw\r\n"
               b"Accept: text/event-stream\r\nAuthorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.c2ln\r\n"
               b"Last-Event-ID: support-42 17 9c4e01af,support-43 4 51d0b7e2\r\n\r\n",
    "sse_close.txt": b"GET /v1/sse?conv=support-42&close=1&token=t HTTP/1.1\r\nHost: gw\r\n"
                     b"Last-Event-ID: support-42 0\r\n\r\n",
    "sse_bad_id.txt": b"GET /v1/sse?conv=support-42 HTTP/1.1\r\nHost: gw\r\n"
                      b"Last-Event-ID: support-42 5abc,,support-43 -1\r\n\r\n"
                      b"GET /v1/sse?conv=support-42 HTTP/1.1\r\nHost: gw\r\n"
                      b"Last-Event-ID: support-42 99999999999999999999 9c4e01af\r\n\r\n",
    # a conversation named twice: refused (400) like any malformed id
    "sse_dup_id.txt": b"GET /v1/sse?conv=support-42 HTTP/1.1\r\nHost: gw\r\n"
                      b"Last-Event-ID: support-43 4 51d0b7e2,support-42 17 9c4e01af,"
                      b"support-43 5 51d0b7e2\r\n\r\n",
}

WS = {
    "hello.bin": text(HELLO),
    "session.bin": text(HELLO) + text(SEND) + text(SYNC) + text({"type": "ping"}) + close(1000),
    "ping.bin": frame(9, b"are you there") + frame(10, b"") + text({"type": "ping"}),
    "fragmented.bin": frame(1, b'{"type":', fin=False) + frame(9, b"mid")
                      + frame(0, b'"ping"', fin=False) + frame(0, b"}"),
    "close.bin": close(1000, b"bye"),
    "close_token.bin": text({"type": "hello", "token": "close",
                             "subs": [{"conv": "a"}]}) + text({"type": "ping"}),
    "bad_json.bin": text({"type": "send", "conv": "x"}) + frame(1, b"{not json") + close(1001),
    "unmasked.bin": frame(1, b'{"type":"ping"}', mask=None),
    "binary.bin": frame(2, b"\x00\x01\x02"),
    "long.bin": frame(1, json.dumps({"type": "send", "conv": "c", "id": "i",
                                     "body": "x" * 300}).encode()),
}


def write(folder, files):
    os.makedirs(os.path.join(HERE, "seeds", folder), exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(HERE, "seeds", folder, name), "wb") as f:
            f.write(data)


write("http", HTTP)
write("ws", WS)
