#!/usr/bin/env python3
"""Writes mm_image_hash.json: vLLM's identifiers of images given as bytes.

Independent of the Go code: it re-states the serialization of vLLM's framed
MultiModalHasher (vllm/multimodal/hasher.py, vLLM main, late 2026) for the
values an image-bytes hash meets -- strings, bytes, and the MediaWithBytes
wrapper an image decoded from a data: or http URL is -- and the call
ProcessorInputs.get_mm_hashes makes without uuid and hash factors
(vllm/multimodal/processing/inputs.py):

    hash_kwargs(algorithm, model_id=model_id, image=MediaWithBytes(...))

sha256 and sha512 come from hashlib; blake3 from Debian's b3sum (package
b3sum) fed the same byte stream, as the blake3 Python module is not
installed here. Run: python3 mm_image_hash.py > mm_image_hash.json
"""
import base64
import hashlib
import json
import random
import struct
import subprocess
import zlib

TAG_NONE, TAG_SEQUENCE, TAG_MAPPING, TAG_LEAF = b"\x00", b"\x01", b"\x02", b"\x03"


class MediaWithBytes:
    """Stand-in for vllm.multimodal.media.MediaWithBytes (media unused)."""

    def __init__(self, original_bytes):
        self.original_bytes = original_bytes


def length(n):
    return n.to_bytes(8, "little")


def framed(chunk):
    yield length(len(chunk))
    yield chunk


def serialize_item(obj):
    if isinstance(obj, bytes):
        return framed(obj)
    if isinstance(obj, str):
        return framed(obj.encode("utf-8"))
    if isinstance(obj, MediaWithBytes):
        # no EXIF uuid, no io_config: the image's original bytes
        return iter_item_to_bytes("image", obj.original_bytes)
    raise TypeError(type(obj))


def iter_value_to_bytes(obj):
    if obj is None:
        yield TAG_NONE
    elif isinstance(obj, (list, tuple)):
        yield TAG_SEQUENCE
        yield length(len(obj))
        for e in obj:
            yield from iter_value_to_bytes(e)
    elif isinstance(obj, dict):
        yield TAG_MAPPING
        yield length(len(obj))
        for k, v in obj.items():
            yield from framed(str(k).encode("utf-8"))
            yield from iter_value_to_bytes(v)
    else:
        yield TAG_LEAF
        yield from serialize_item(obj)


def iter_item_to_bytes(key, obj):
    yield from framed(key.encode("utf-8"))
    yield from iter_value_to_bytes(obj)


def stream(**kwargs):
    out = b""
    for k, v in sorted(kwargs.items(), key=lambda kv: kv[0]):
        for chunk in iter_item_to_bytes(k, v):
            out += bytes(chunk)
    return out


def digest(algorithm, data):
    if algorithm == "sha256":
        return hashlib.sha256(data).hexdigest()
    if algorithm == "sha512":
        return hashlib.sha512(data).hexdigest()
    out = subprocess.run(["b3sum", "--no-names"], input=data, check=True, capture_output=True)
    return out.stdout.decode().strip()


def png(width, height, seed):
    """A small RGB PNG (written by hand: no Pillow needed)."""
    rng = random.Random(seed)
    raw = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * width)) for _ in range(height))

    def chunk(kind, body):
        return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def main():
    images = [
        ("png 4x3", "image/png", png(4, 3, 1)),
        ("png 64x48", "image/png", png(64, 48, 2)),
        ("random 6000 bytes", "image/jpeg", random.Random(3).randbytes(6000)),
        ("empty", "image/png", b""),
    ]
    models = ["Qwen/Qwen2-VL-2B-Instruct", "sim-model", "/models/llava-1.5-7b-hf", "modèle"]
    cases = []
    for i, (name, mime, data) in enumerate(images):
        model = models[i % len(models)]
        for algorithm in ("blake3", "sha256", "sha512"):
            s = stream(model_id=model, image=MediaWithBytes(data))
            cases.append({
                "name": name,
                "model_id": model,
                "algorithm": algorithm,
                "url": f"data:{mime};base64," + base64.b64encode(data).decode(),
                "id": digest(algorithm, s),
            })
    json.dump({"cases": cases}, __import__("sys").stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
