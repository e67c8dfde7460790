#!/usr/bin/python3
"""A vLLM-like KV-event publisher on real libzmq (Debian python3-zmq and
python3-msgpack), independent of the Go code under test.

  vllm_publisher.py --buffer N [--pub-port P --replay-port R]

Binds an XPUB (like vLLM's PUB, but it can report subscriptions) and a replay
ROUTER on 127.0.0.1, prints "PORTS <pub> <replay>", then obeys stdin, one
command per line, each publishing ONE batch [ts, [event], 0] as the multipart
message [topic, seq (8 bytes BE), msgpack payload] and answering "OK <seq>":

  waitsub                           block until a subscriber joins: "SUB"
  store NAME N FIRST SHAPE ENC      BlockStored of chain NAME: N blocks of 16
                                    tokens FIRST, FIRST+1, ...; block i's hash
                                    is sha256(NAME:i); parent = block i-1
  remove NAME I SHAPE ENC           BlockRemoved of block I of chain NAME
  clear                             AllBlocksCleared
  drop                              the next batch is buffered for replay
                                    but not sent (a lost message)
  exit

SHAPE is "array" (positional, 12-element BlockStored) or "map" (vLLM >=
PR #42892); ENC is "int" (last 8 digest bytes, big-endian) or "bytes" (the
32-byte digest). The ROUTER keeps the last N batches and answers vLLM's
request [id, "", start_seq] with every buffered batch seq >= start_seq in the
new layout [id, "", topic, seq, payload], then [id, "", "", ff*8, ""].
"""
import argparse
import hashlib
import os
import sys
import time

import msgpack
import zmq

TOPIC = b""
END_SEQ = b"\xff" * 8
BLOCK = 16


def say(*words):
    sys.stdout.write(" ".join(str(w) for w in words) + "\n")
    sys.stdout.flush()


def digest(name, i):
    return hashlib.sha256(("%s:%d" % (name, i)).encode()).digest()


def wire(d, enc):
    return int.from_bytes(d[24:], "big") if enc == "int" else d


def stored(name, n, first, shape, enc):
    hashes = [wire(digest(name, i), enc) for i in range(n)]
    tokens = list(range(first, first + n * BLOCK))
    if shape == "array":
        return ["BlockStored", hashes, None, tokens, BLOCK, None, "GPU", None,
                [None] * n, 0, "full_attention", None]
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
            "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
            "lora_name": None, "extra_keys": [None] * n, "group_idx": 0,
            "kv_cache_spec_kind": "full_attention"}


def removed(name, i, shape, enc):
    h = [wire(digest(name, i), enc)]
    if shape == "array":
        return ["BlockRemoved", h, "GPU", 0]
    return {"type": "BlockRemoved", "block_hashes": h, "medium": "GPU", "group_idx": 0}


def cleared(shape):
    return ["AllBlocksCleared"] if shape == "array" else {"type": "AllBlocksCleared"}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--buffer", type=int, default=10000)
    ap.add_argument("--pub-port", type=int, default=0)
    ap.add_argument("--replay-port", type=int, default=0)
    args = ap.parse_args()

    ctx = zmq.Context()
    pub = ctx.socket(zmq.XPUB)
    pub.setsockopt(zmq.SNDHWM, 100000)
    pub.setsockopt(zmq.LINGER, 0)
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    if args.pub_port:
        pub.bind("tcp://127.0.0.1:%d" % args.pub_port)
    else:
        pub_port = pub.bind_to_random_port("tcp://127.0.0.1")
    if args.replay_port:
        router.bind("tcp://127.0.0.1:%d" % args.replay_port)
    else:
        replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    pub_port = args.pub_port or pub_port
    replay_port = args.replay_port or replay_port
    say("PORTS", pub_port, replay_port)

    seq = 0
    ring = []  # (seq, payload)
    drop_next = False
    waiting_sub = False
    subscribed = False
    poller = zmq.Poller()
    poller.register(router, zmq.POLLIN)
    poller.register(pub, zmq.POLLIN)
    stdin = sys.stdin.fileno()
    poller.register(stdin, zmq.POLLIN)
    buf = b""
    while True:
        for sock, _ in poller.poll():
            if sock is router:
                frames = router.recv_multipart()
                if len(frames) != 3 or frames[1] != b"" or len(frames[2]) != 8:
                    continue  # vLLM ignores anything else
                ident, start = frames[0], int.from_bytes(frames[2], "big")
                for s, p in ring:
                    if s >= start:
                        router.send_multipart([ident, b"", TOPIC, s.to_bytes(8, "big"), p])
                router.send_multipart([ident, b"", b"", END_SEQ, b""])
            elif sock is pub:
                msg = pub.recv()
                subscribed = msg[:1] == b"\x01"
                if subscribed and waiting_sub:
                    waiting_sub = False
                    say("SUB")
            else:
                chunk = os.read(stdin, 65536)
                if not chunk:
                    return
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    w = line.decode().split()
                    if not w:
                        continue
                    if w[0] == "exit":
                        return
                    if w[0] == "waitsub":
                        if subscribed:
                            say("SUB")
                        else:
                            waiting_sub = True
                        continue
                    if w[0] == "drop":
                        drop_next = True
                        say("OK", "-")
                        continue
                    if w[0] == "store":
                        ev = stored(w[1], int(w[2]), int(w[3]), w[4], w[5])
                    elif w[0] == "remove":
                        ev = removed(w[1], int(w[2]), w[3], w[4])
                    elif w[0] == "clear":
                        ev = cleared("array")
                    else:
                        say("ERR", w[0])
                        continue
                    payload = msgpack.packb([time.time(), [ev], 0], use_bin_type=True)
                    ring.append((seq, payload))
                    del ring[:-args.buffer]
                    if not drop_next:
                        pub.send_multipart([TOPIC, seq.to_bytes(8, "big"), payload])
                    drop_next = False
                    say("OK", seq)
                    seq += 1


if __name__ == "__main__":
    main()
