#!/usr/bin/python3
"""libzmq peer for zmqsub's interop tests (Debian python3-zmq).

  zmqpeer.py pub [--xpub] [--heartbeat MS] (--bind EP | --connect EP)
      A PUB socket like vLLM's ZmqEventPublisher (SNDHWM 100000); with
      --heartbeat, ZMTP heartbeats every MS ms, a peer silent for 3 MS
      dropped (vLLM leaves them off). Prints
      "PORT <n>" once bound (or "READY" once connecting), then obeys stdin:
        waitsub SECS          (--xpub) wait for a subscription: "SUB <hex>" / "TIMEOUT"
        pub N TOPIC SIZE      publish N batches [TOPIC, seq(8 BE), payload(seq,SIZE)]: "OK <last seq>"
        raw HEX|- ...         publish one multipart message, "-" = empty frame: "OK"
        stream TOPIC SIZE MS  publish a batch every MS ms until the next command: "OK"
        exit
  zmqpeer.py router --layout old|new|silent|garbage|shortseq --count N --size S --bind EP
      vLLM's replay ROUTER: holds batches seq 0..N-1; a request must be
      exactly [id, "", start_seq(8 BE)], otherwise it is ignored (as vLLM
      does). Replies every batch with seq >= start_seq then the end marker.
      Prints "PORT <n>", serves until killed.

payload(seq, size) = bytes((seq + i) % 251 for i in range(size)); the Go test
computes the same bytes.
"""
import argparse
import os
import select
import sys

import zmq

END_SEQ = (-1).to_bytes(8, "big", signed=True)
TOPIC = b"kv@pod-1@model"


def payload(seq, size):
    return bytes((seq + i) % 251 for i in range(size))


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def port_of(sock):
    ep = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    return int(ep.rsplit(":", 1)[1])


def run_pub(args):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.XPUB if args.xpub else zmq.PUB)
    sock.setsockopt(zmq.SNDHWM, 100000)
    sock.setsockopt(zmq.LINGER, 0)
    if args.heartbeat:
        sock.setsockopt(zmq.HEARTBEAT_IVL, args.heartbeat)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * args.heartbeat)
    if args.bind:
        sock.bind(args.bind)
        say("PORT", port_of(sock))
    else:
        sock.connect(args.connect)
        say("READY")
    seq = 0
    stream = None  # (topic, size, interval seconds)
    buf = b""
    stdin = sys.stdin.fileno()
    while True:
        timeout = stream[2] if stream else None
        ready, _, _ = select.select([stdin], [], [], timeout)
        if not ready:
            sock.send_multipart([stream[0], seq.to_bytes(8, "big"), payload(seq, stream[1])])
            seq += 1
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            break
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            words = line.decode().split()
            if not words:
                continue
            cmd = words[0]
            stream = None
            if cmd == "exit":
                sock.close()
                ctx.term()
                return
            if cmd == "waitsub":
                if sock.poll(int(float(words[1]) * 1000)):
                    say("SUB", sock.recv().hex())
                else:
                    say("TIMEOUT")
            elif cmd == "pub":
                n, topic, size = int(words[1]), words[2].encode(), int(words[3])
                if topic == b"-":
                    topic = b""
                for _ in range(n):
                    sock.send_multipart([topic, seq.to_bytes(8, "big"), payload(seq, size)])
                    seq += 1
                say("OK", seq - 1)
            elif cmd == "raw":
                frames = [b"" if w == "-" else bytes.fromhex(w) for w in words[1:]]
                sock.send_multipart(frames)
                say("OK")
            elif cmd == "stream":
                topic = words[1].encode()
                stream = (b"" if topic == b"-" else topic, int(words[2]), int(words[3]) / 1000.0)
                say("OK")
            else:
                say("ERR unknown command", cmd)


def run_router(args):
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(args.bind)
    say("PORT", port_of(sock))
    batches = [(s, payload(s, args.size)) for s in range(args.count)]
    while True:
        frames = sock.recv_multipart()
        if len(frames) != 3 or frames[1] != b"":
            sys.stderr.write("ignored replay request with %d frames\n" % len(frames))
            continue
        ident = frames[0]
        start = int.from_bytes(frames[2], "big")
        if args.layout == "silent":
            continue
        if args.layout == "garbage":
            sock.send_multipart([ident, b"", b"not a batch"])
            continue
        if args.layout == "shortseq":
            sock.send_multipart([ident, b"", b"\x00" * 7, b"payload"])
            continue
        for seq, data in batches:
            if seq < start:
                continue
            if args.layout == "old":
                sock.send_multipart([ident, b"", seq.to_bytes(8, "big"), data])
            else:
                sock.send_multipart([ident, b"", TOPIC, seq.to_bytes(8, "big"), data])
        if args.layout == "old":
            sock.send_multipart([ident, b"", END_SEQ, b""])
        else:
            sock.send_multipart([ident, b"", b"", END_SEQ, b""])


def main():
    p = argparse.ArgumentParser()
    sub = p.add_subparsers(dest="mode", required=True)
    pp = sub.add_parser("pub")
    pp.add_argument("--xpub", action="store_true")
    pp.add_argument("--heartbeat", type=int, default=0)
    g = pp.add_mutually_exclusive_group(required=True)
    g.add_argument("--bind")
    g.add_argument("--connect")
    rp = sub.add_parser("router")
    rp.add_argument("--layout", choices=["old", "new", "silent", "garbage", "shortseq"], required=True)
    rp.add_argument("--count", type=int, default=10)
    rp.add_argument("--size", type=int, default=100)
    rp.add_argument("--bind", required=True)
    args = p.parse_args()
    if args.mode == "pub":
        run_pub(args)
    else:
        run_router(args)


if __name__ == "__main__":
    main()
