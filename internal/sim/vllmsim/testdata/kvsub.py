#!/usr/bin/python3
"""Independent KV-event client for the vllmsim tests (libzmq via pyzmq, msgpack).

  kvsub.py sub ENDPOINT TOPIC COUNT TIMEOUT_S      connect a SUB, print COUNT messages
  kvsub.py bindsub TOPIC COUNT TIMEOUT_S           bind a SUB on 127.0.0.1 (PUB connects), print COUNT
  kvsub.py replay ENDPOINT START TIMEOUT_S         DEALER replay request, print replies until the end marker

Each message is printed as one JSON line: {"frames": n, "topic": str, "seq": int,
"batch": decoded payload}; bytes become {"bytes_hex": "..."}. Replay lines carry
"layout": "new" (topic frame present) or "legacy".
"""
import json
import sys

import msgpack
import zmq

END = b"\xff" * 8


def plain(v):
    if isinstance(v, (bytes, bytearray)):
        return {"bytes_hex": bytes(v).hex()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    return v


def decode(payload):
    return plain(msgpack.unpackb(payload, raw=False, strict_map_key=False))


def out(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def recv_print(sock, count, timeout_ms):
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    for _ in range(count):
        if not poller.poll(timeout_ms):
            out({"error": "timeout"})
            return 1
        frames = sock.recv_multipart()
        if len(frames) != 3 or len(frames[1]) != 8:
            out({"error": "bad frames", "frames": len(frames)})
            return 1
        out({"frames": len(frames), "topic": frames[0].decode(), "seq": int.from_bytes(frames[1], "big"),
             "batch": decode(frames[2])})
    return 0


def main():
    ctx = zmq.Context()
    mode = sys.argv[1]
    try:
        if mode == "sub":
            ep, topic, count, timeout = sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep)
            s.setsockopt_string(zmq.SUBSCRIBE, topic)
            out({"ready": True})
            return recv_print(s, count, int(timeout * 1000))
        if mode == "bindsub":
            topic, count, timeout = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
            s = ctx.socket(zmq.SUB)
            s.setsockopt(zmq.LINGER, 0)
            port = s.bind_to_random_port("tcp://127.0.0.1")
            s.setsockopt_string(zmq.SUBSCRIBE, topic)
            out({"ready": True, "endpoint": "tcp://127.0.0.1:%d" % port})
            return recv_print(s, count, int(timeout * 1000))
        if mode == "replay":
            ep, start, timeout = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
            s = ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            s.connect(ep)
            s.send_multipart([b"", start.to_bytes(8, "big")])
            poller = zmq.Poller()
            poller.register(s, zmq.POLLIN)
            while True:
                if not poller.poll(int(timeout * 1000)):
                    out({"error": "timeout"})
                    return 1
                frames = s.recv_multipart()
                if frames[0] != b"":
                    out({"error": "no empty delimiter"})
                    return 1
                rest = frames[1:]
                if len(rest) == 3:
                    if rest[0] == b"" and rest[1] == END:
                        out({"end": True, "layout": "new", "frames": len(frames)})
                        return 0
                    if rest[0] == END:
                        out({"error": "legacy end marker with 3 frames"})
                        return 1
                    out({"layout": "new", "frames": len(frames), "topic": rest[0].decode(),
                         "seq": int.from_bytes(rest[1], "big"), "batch": decode(rest[2])})
                    continue
                if len(rest) == 2:
                    if rest[0] == END:
                        out({"end": True, "layout": "legacy", "frames": len(frames)})
                        return 0
                    out({"layout": "legacy", "frames": len(frames), "seq": int.from_bytes(rest[0], "big"),
                         "batch": decode(rest[1])})
                    continue
                out({"error": "unexpected frame count", "frames": len(frames)})
                return 1
        out({"error": "unknown mode " + mode})
        return 2
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    sys.exit(main())
