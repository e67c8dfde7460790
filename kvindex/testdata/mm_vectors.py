#!/usr/bin/env python3
"""Generates mm_block_hashes.json: vLLM sha256_cbor block hashes of prompts
with multimodal items, computed independently of the Go code.

Only the standard library: hashlib and a small canonical CBOR encoder for
the values a block hash holds (unsigned and negative ints, byte and text
strings, arrays, null), as cbor2.dumps(x, canonical=True) writes them.

The multimodal rule follows vllm/v1/core/kv_cache_utils.py after #36708
(_gen_mm_extra_hash_keys): block [start, end) gets (identifier,
offset - start) for every item with offset < end and start < offset+length;
a block's extra keys are (LoRA name, mm tuples..., cache salt on block 0),
or null when there are none. NONE_HASH is sha256_cbor(PYTHONHASHSEED).

Run: python3 mm_vectors.py > mm_block_hashes.json
"""
import hashlib
import json
import struct


def head(major, n):
    if n < 24:
        return bytes([major << 5 | n])
    if n < 1 << 8:
        return bytes([major << 5 | 24, n])
    if n < 1 << 16:
        return bytes([major << 5 | 25]) + struct.pack(">H", n)
    if n < 1 << 32:
        return bytes([major << 5 | 26]) + struct.pack(">I", n)
    return bytes([major << 5 | 27]) + struct.pack(">Q", n)


def cbor(v):
    if v is None:
        return b"\xf6"
    if isinstance(v, bool):
        raise TypeError("bool")
    if isinstance(v, int):
        return head(0, v) if v >= 0 else head(1, -1 - v)
    if isinstance(v, bytes):
        return head(2, len(v)) + v
    if isinstance(v, str):
        b = v.encode("utf-8")
        return head(3, len(b)) + b
    if isinstance(v, (list, tuple)):
        return head(4, len(v)) + b"".join(cbor(x) for x in v)
    raise TypeError(type(v))


def sha256_cbor(v):
    return hashlib.sha256(cbor(v)).digest()


def extra_keys(start, end, items, lora, salt):
    keys = []
    if lora:
        keys.append(lora)
    for ident, off, length in items:
        if off < end and start < off + length:
            keys.append((ident, off - start))
    if start == 0 and salt:
        keys.append(salt)
    return tuple(keys) if keys else None


def case(name, note, bs, seed, tokens, items, lora="", salt=""):
    parent = sha256_cbor(seed)
    extras, hexes, u64 = [], [], []
    for i in range(len(tokens) // bs):
        ex = extra_keys(i * bs, (i + 1) * bs, items, lora, salt)
        d = sha256_cbor((parent, tuple(tokens[i * bs:(i + 1) * bs]), ex))
        extras.append(None if ex is None else [list(k) if isinstance(k, tuple) else k for k in ex])
        hexes.append(d.hex())
        u64.append(int.from_bytes(d[24:], "big"))
        parent = d
    return {
        "name": name, "note": note, "block_size": bs, "seed": seed,
        "tokens": tokens,
        "items": [{"id": i, "offset": o, "length": n} for i, o, n in items],
        "lora": lora, "salt": salt,
        "extra_keys": extras, "block_hashes_hex": hexes, "block_hashes_uint64": u64,
    }


def main():
    cases = [
        case("golden_abc123hash", "vllm_golden.json's bs16_seed42_mm_offset, derived from the item",
             16, "42", [7] * 48, [("abc123hash", 5, 20)]),
        case("two_images_lora_salt", "two items, LoRA and salt: block 0 is (lora, item a, salt)",
             4, "0", list(range(100, 124)), [("img-a", 2, 5), ("img-b", 9, 6)], "sql-lora", "s1"),
        case("item_ends_on_boundary", "an item ending where a block starts is not that block's",
             4, "0", list(range(16)), [("u-1", 4, 4)]),
        case("item_spans_blocks", "an item covering whole blocks: offsets 3, -1, -5, -9",
             4, "vllm-none-hash", [151655] * 3 + [151656] * 12 + [9, 9, 9, 9, 9],
             [("8f0c2b1e-uuid", 3, 13)]),
        case("adjacent_items", "two items back to back in one block",
             8, "1234", list(range(24)), [("x", 1, 3), ("y", 4, 6)]),
    ]
    print(json.dumps({"generator": "kvindex/testdata/mm_vectors.py", "cases": cases}, indent=1))


if __name__ == "__main__":
    main()
