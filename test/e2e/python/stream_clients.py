"""Streams chat completions through the proxy with Python's HTTP clients, as Python applications do.

httpx is the transport of the official `openai` and `anthropic` Python SDKs; aiohttp is the
asyncio client most other Python LLM libraries use. Each request prints one JSON line with the
client's own observations on the monotonic clock (time.monotonic_ns(), CLOCK_MONOTONIC: the clock
Node's process.hrtime reads), so the test can bound the proxy's timings by what the client saw.

usage: stream_clients.py MODE URL N [MODEL]
  httpx    N sequential streams on one httpx.Client (its pool keeps the connection)
  aiohttp  N sequential streams on one aiohttp.ClientSession
  cancel   N streams, each closed after its third content event, as `stream.close()` in the
           openai SDK does (h11 cannot reuse a connection with an unread body: it closes it)
"""
import asyncio
import hashlib
import json
import sys
import time


class Sse:
    """Incremental SSE reader over raw bytes: stamps each content event as it is complete."""

    def __init__(self):
        self.buf = b""
        self.hash = hashlib.sha256()
        self.bytes = 0
        self.first = None
        self.last = None
        self.contents = 0
        self.done = False

    def feed(self, chunk):
        now = time.monotonic_ns()
        self.hash.update(chunk)
        self.bytes += len(chunk)
        self.buf += chunk
        while True:
            i = self.buf.find(b"\n\n")
            if i < 0:
                return
            event, self.buf = self.buf[:i], self.buf[i + 2 :]
            data = b"\n".join(l[5:].lstrip(b" ") for l in event.split(b"\n") if l.startswith(b"data:"))
            if data == b"[DONE]":
                self.done = True
            elif data:
                choices = json.loads(data).get("choices") or []
                if choices and (choices[0].get("delta") or {}).get("content"):
                    if self.first is None:
                        self.first = now
                    self.last = now
                    self.contents += 1

    def result(self, sent, port, version, status):
        return {
            "sent": sent, "first": self.first, "last": self.last, "contents": self.contents,
            "sha256": self.hash.hexdigest(), "bytes": self.bytes, "done": self.done,
            "localPort": port, "httpVersion": version, "status": status,
        }


def body(model):
    return {"model": model, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "hi"}]}


def run_httpx(url, n, model, cancel_after=None):
    import httpx

    # trust_env=False: no HTTP(S)_PROXY for loopback requests (aiohttp's default already)
    with httpx.Client(timeout=60, trust_env=False) as client:
        for _ in range(n):
            sse = Sse()
            sent = time.monotonic_ns()
            with client.stream("POST", url, json=body(model)) as r:
                port = r.extensions["network_stream"].get_extra_info("client_addr")[1]
                closing = None
                for chunk in r.iter_raw():
                    sse.feed(chunk)
                    if cancel_after is not None and sse.contents >= cancel_after:
                        closing = time.monotonic_ns()
                        break
            out = sse.result(sent, port, r.http_version, r.status_code)
            if cancel_after is not None:
                out["closing"] = closing
            print(json.dumps(out), flush=True)


async def run_aiohttp(url, n, model):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            sse = Sse()
            sent = time.monotonic_ns()
            async with session.post(url, json=body(model)) as r:
                port = r.connection.transport.get_extra_info("sockname")[1]
                async for chunk in r.content.iter_any():
                    sse.feed(chunk)
            print(json.dumps(sse.result(sent, port, "HTTP/%d.%d" % r.version, r.status)), flush=True)


def main():
    mode, url, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    model = sys.argv[4] if len(sys.argv) > 4 else "py-" + mode
    if mode == "httpx":
        run_httpx(url, n, model)
    elif mode == "cancel":
        run_httpx(url, n, model, cancel_after=3)
    elif mode == "aiohttp":
        asyncio.run(run_aiohttp(url, n, model))
    else:
        sys.exit("unknown mode " + mode)


if __name__ == "__main__":
    main()
