#!/usr/bin/python3
"""Generates kv_event_vectors.json: vLLM KV-event batches of every encoding
the gateway accepts, packed with Debian's python3-msgpack (not the Go
decoder's msgpack library), each with the decoded fields expected of it.

Complements internal/testutil/golden/vllm_golden.json (which has the map
events of PR #42892, the 12-, 7- and 6-element positional BlockStored, the
v0.9.0 two-element batch and a CPU-offload map event): the BlockStored
array of every other version length (8 lora_name, 9 extra_keys, 10
group_idx), BlockRemoved of 2 and 3 elements, non-zero and nil
data_parallel_rank, the defensive map batch, offload media (CPU, cpu,
STORAGE) with block_size 0 and empty token_ids, hybrid groups with their
spec kind and sliding window, locality (vLLM #48281, map events only) with
ownership and session_id beside it, and hashes as unsigned 64-bit ints
above 2^63, negative ints and bytes of every length.

The expected fields follow the wire rules of vLLM's schema
(vllm/distributed/kv_events.py, encoded by msgspec): an int hash is taken
as its two's-complement uint64; a bytes hash as its last 8 bytes,
big-endian, left-padded with zeros when shorter (vLLM's own int form of a
digest); parent_block_hash nil or 0 is no parent; absent optional fields
are None. msgspec writes floats as float64 and ints in their smallest form,
as msgpack.packb does here.

Run: /usr/bin/python3 kv_event_vectors.py > kv_event_vectors.json
"""
import json

import msgpack

MASK = (1 << 64) - 1
TS = 1767225600.25


def hash_value(h):
    """The uint64 a wire hash stands for."""
    if isinstance(h, bytes):
        return int.from_bytes(h[-8:].rjust(8, b"\0"), "big")
    return h & MASK


def stored(hashes, parent, tokens, block_size, **kw):
    """A BlockStored description: its fields by name, None when absent."""
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
          "token_ids": tokens, "block_size": block_size, "lora_id": None, "medium": None,
          "lora_name": None, "extra_keys": None, "group_idx": None, "kv_cache_spec_kind": None,
          "kv_cache_spec_sliding_window": None}
    ev.update(kw)
    return ev


def removed(hashes, **kw):
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": None, "group_idx": None}
    ev.update(kw)
    return ev


STORED_ORDER = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
REMOVED_ORDER = ["block_hashes", "medium", "group_idx"]


def as_array(ev, n):
    """The positional encoding of vLLM before #42892: tag, then the first
    n-1 fields of the version, every one written (nil when None)."""
    order = STORED_ORDER if ev["type"] == "BlockStored" else REMOVED_ORDER
    return [ev["type"]] + [ev[k] for k in order[: n - 1]]


def as_map(ev, extra=None):
    """The map encoding (#42892): "type" first, then the fields in
    declaration order; fields with a default are omitted when None
    (omit_defaults), lora_id, medium and lora_name never; extra pairs
    (fields added later) last."""
    out = {"type": ev["type"]}
    no_default = {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"}
    order = STORED_ORDER if ev["type"] == "BlockStored" else REMOVED_ORDER
    for k in order:
        if ev[k] is not None or k in no_default:
            out[k] = ev[k]
    out.update(extra or {})
    return out


def expect(ev, extra=None):
    """The decoded fields of one event, as the Go test reads them."""
    extra = extra or {}
    parent = ev.get("parent_block_hash")
    parent = None if parent is None or hash_value(parent) == 0 else hash_value(parent)
    return {
        "kind": ev["type"],
        "block_hashes": [hash_value(h) for h in ev.get("block_hashes") or []],
        "parent": parent,
        "token_ids": list(ev.get("token_ids") or []),
        "block_size": ev.get("block_size") or 0,
        "lora_id": ev.get("lora_id"),
        "medium": ev.get("medium") or "",
        "lora_name": ev.get("lora_name") or "",
        "extra_keys": ev.get("extra_keys"),
        "group_idx": ev.get("group_idx") or 0,
        "spec_kind": ev.get("kv_cache_spec_kind") or "",
        "sliding_window": ev.get("kv_cache_spec_sliding_window") or 0,
        "locality": extra.get("locality") or "",
    }


def vector(name, note, wire_events, expected, rank="absent", batch_map=False, unknown=0):
    """wire_events are the encoded events; rank "absent" makes the
    two-element batch of v0.9.0."""
    if batch_map:
        batch = {"ts": TS, "events": wire_events}
        if rank != "absent":
            batch["data_parallel_rank"] = rank
    elif rank == "absent":
        batch = [TS, wire_events]
    else:
        batch = [TS, wire_events, rank]
    return {
        "name": name,
        "note": note,
        "payload_hex": msgpack.packb(batch, use_bin_type=True).hex(),
        "ts": TS,
        "dp_rank": None if rank == "absent" else rank,
        "unknown": unknown,
        "events": expected,
    }


def arr(ev, n):
    return as_array(ev, n), expect(ev)


def mp(ev, extra=None):
    return as_map(ev, extra), expect(ev, extra)


def vec(name, note, pairs, **kw):
    return vector(name, note, [w for w, _ in pairs], [e for _, e in pairs if e is not None], **kw)


BIG = 0xFEDCBA9876543210  # above 2^63: a uint64 on the wire
TOP = MASK  # 2^64 - 1
D32 = bytes(range(0x10, 0x30))  # a 32-byte sha256 digest
D64 = bytes(range(0x40, 0x80))  # a hybrid group block: two sub-block digests
TOK4 = [1, 2, 3, 4, 5, 6, 7, 8]


def vectors():
    out = []
    ev = stored([BIG, TOP], None, TOK4, 4, medium="GPU", lora_name=None, extra_keys=[None, None],
                group_idx=0, kv_cache_spec_kind="full_attention")
    out.append(vec("batch_dp_rank_3", "data_parallel_rank 3 (rank 3's publisher, port + 3); hashes above 2^63",
                   [arr(ev, 12)], rank=3))
    out.append(vec("batch_dp_rank_nil", "a three-element batch whose data_parallel_rank is nil",
                   [arr(ev, 12)], rank=None))
    out.append(vec("batch_map_form", "the defensive map batch (an unreleased vLLM branch) with rank 2",
                   [mp(ev)], rank=2, batch_map=True))
    ev6 = stored([-1, -(1 << 63), 5], 0x8000000000000000, list(range(12)), 4, lora_id=7)
    out.append(vec("array_6_elements_negative_hashes",
                   "v0.9.x BlockStored (#16750): builtin hash() ints, negative ones two's complement",
                   [arr(ev6, 6), arr(removed([-1]), 2)]))
    ev8 = stored([11, 12], 10, TOK4, 4, medium="GPU", lora_name="adapter-a")
    out.append(vec("array_8_elements_lora_name", "BlockStored with lora_name (#27577); BlockRemoved with medium",
                   [arr(ev8, 8), arr(removed([12], medium="GPU"), 3)], rank=0))
    ev9 = stored([21, 22], None, TOK4, 4, medium="GPU", lora_name="adapter-a",
                 extra_keys=[["adapter-a", "salt-1"], ["adapter-a"]])
    out.append(vec("array_9_elements_extra_keys", "BlockStored with extra_keys (#33304)", [arr(ev9, 9)], rank=0))
    ev10 = stored([31], D32, [9, 9, 9, 9], 4, medium="GPU", extra_keys=[None], group_idx=1)
    out.append(vec("array_10_elements_group_idx", "BlockStored with group_idx (#37688), a bytes parent",
                   [arr(ev10, 10), arr(removed([31], medium="GPU", group_idx=1), 4)], rank=0))
    sw = stored([41, 42], None, TOK4, 4, medium="GPU", extra_keys=[None, None], group_idx=0,
                kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=4096)
    full = stored([41, 42], None, TOK4, 4, medium="GPU", extra_keys=[None, None], group_idx=1,
                  kv_cache_spec_kind="full_attention")
    out.append(vec("array_12_elements_hybrid", "GPT-OSS-like: sliding-window group 0 (window 4096), full attention group 1",
                   [arr(sw, 12), arr(full, 12)], rank=0))
    mamba = stored([D64], None, TOK4[:4], 4, medium="GPU", extra_keys=[None], group_idx=2, kv_cache_spec_kind="mamba")
    out.append(vec("map_hybrid_groups", "map events of three groups; a 64-byte hybrid hash is its last 8 bytes",
                   [mp(sw), mp(full), mp(mamba)], rank=0))
    cpu = stored([D32, b"\x01\x02\x03"], None, [], 0, medium="CPU")
    out.append(vec("array_7_elements_cpu_offload", "OffloadingConnector CPU tier of v0.11: raw digests, "
                   "block_size 0, empty token_ids; a 3-byte hash is left-padded",
                   [arr(cpu, 7), arr(removed([D32], medium="CPU"), 3)], rank=0))
    gpu0 = stored([D32, TOP], None, [], 0, medium="GPU")
    out.append(vec("array_7_elements_gpu_hash_only", "a GPU store without tokens (block_size 0), as offload "
                   "events of old releases have them: decoded as is, never divided by", [arr(gpu0, 7)], rank=0))
    cpu_lower = stored([D32], None, [], 0, medium="cpu")
    storage = stored([D32], None, [], 0, medium="STORAGE", group_idx=0, kv_cache_spec_kind="full_attention")
    out.append(vec("map_offload_media", "Mooncake's lower-case cpu and a STORAGE tier without tokens",
                   [mp(cpu_lower), mp(storage), mp(removed([D32], medium="STORAGE"))], rank=0))
    rich = stored([BIG], D32, TOK4[:4], 4, medium="STORAGE", extra_keys=[None], group_idx=0,
                  kv_cache_spec_kind="full_attention")
    out.append(vec("map_storage_self_describing", "a STORAGE store with tokens and parent (#43468)", [mp(rich)], rank=0))
    remote = {"locality": "REMOTE", "ownership": "shared", "session_id": "sess-9"}
    out.append(vec("map_locality_remote", "locality REMOTE (#48281) with ownership and session_id beside it",
                   [mp(rich, remote), mp(removed([BIG], medium="STORAGE"), {"locality": "REMOTE", "ownership": None})],
                   rank=0))
    local = stored([51], None, [1, 2], 2, medium="GPU", extra_keys=[None], group_idx=0,
                   kv_cache_spec_kind="full_attention")
    out.append(vec("map_locality_local", "locality LOCAL, session_id nil", [mp(local, {"locality": "LOCAL", "session_id": None})],
                   rank=0))
    unknown = (["FutureEvent", 1, 2], None)
    out.append(vec("array_unknown_event_skipped", "an unknown tag is counted and skipped",
                   [unknown, arr({"type": "AllBlocksCleared"}, 1)], rank=0, unknown=1))
    return out


def main():
    doc = {
        "generator": "kvindex/testdata/kv_event_vectors.py (python3-msgpack " + ".".join(map(str, msgpack.version)) + ")",
        "vectors": vectors(),
    }
    print(json.dumps(doc, indent=1))


if __name__ == "__main__":
    main()
