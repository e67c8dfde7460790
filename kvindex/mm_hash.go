package kvindex

import (
	"crypto/sha256"
	"crypto/sha512"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/zeebo/blake3"
)

// vLLM's identifier of an image given as bytes. Checked against
// vllm/multimodal/hasher.py (the framed MultiModalHasher: _framed,
// iter_item_to_bytes, iter_value_to_bytes, hash_kwargs taking the
// algorithm) and vllm/multimodal/processing/inputs.py
// (ProcessorInputs.get_mm_hashes, both the version with get_mm_item_hash
// and the one before it) of vLLM main in late 2026, for which the code
// index they were read from records no commit; against parse.py
// (ProcessorBatchItems.get_item_for_hash hands the MediaWithBytes itself
// to the hasher), media/base.py at ca3fff65 and media/image.py at 24cfad52
// (ImageMediaIO.load_base64: pybase64.b64decode(data, validate=True), the
// result kept as original_bytes) and MediaConnector._load_data_url. An
// image that arrived as bytes (a base64 data: URL, or a fetched http URL)
// is a MediaWithBytes whose original_bytes are the encoded file as
// received; without a uuid, and without media_io_kwargs or
// mm_processor_kwargs (and without the MediaWithBytes io_config of the
// newest hasher, whose source the index did not show), its identifier is
//
//	hash_kwargs(algorithm, model_id=<engine's --model>, image=<MediaWithBytes>)
//
// hex-encoded: the keyword arguments sorted by name ("image" before
// "model_id"), each fed as framed(name), then its value tagged as a leaf.
// The image's value serializes as iter_item_to_bytes("image",
// original_bytes), the model id as its UTF-8 bytes. framed(b) is b's
// length as 8 little-endian bytes, then b. (An image whose EXIF ImageID
// is a uuid.UUID object is hashed by that instead; Pillow never decodes
// one from a file, so bytes from a request never are.)

// MM hash algorithms vLLM offers (--mm-hasher-algorithm).
const (
	MMHashBlake3 = "blake3"
	MMHashSHA256 = "sha256"
	MMHashSHA512 = "sha512"
)

// tagLeaf is vLLM's tag before a value that is not a container.
const tagLeaf = 0x03

var errMMHashAlgorithm = errors.New("kvindex: unknown multimodal hash algorithm")

// newMMHasher is the hash vLLM's algorithm name stands for ("" is the
// default, blake3, whose hexdigest is 32 bytes).
func newMMHasher(algorithm string) (hash.Hash, error) {
	switch algorithm {
	case "", MMHashBlake3:
		return blake3.New(), nil
	case MMHashSHA256:
		return sha256.New(), nil
	case MMHashSHA512:
		return sha512.New(), nil
	}
	return nil, fmt.Errorf("%w %q (want %s, %s or %s)", errMMHashAlgorithm, algorithm,
		MMHashBlake3, MMHashSHA256, MMHashSHA512)
}

// ValidMMHashAlgorithm reports whether algorithm is one ImageBytesID
// takes ("" meaning blake3).
func ValidMMHashAlgorithm(algorithm string) error {
	_, err := newMMHasher(algorithm)
	return err
}

// ImageBytes is an image's encoded bytes as vLLM received them, read
// from R: exactly Size bytes, which the hash frames with their length
// before reading them.
type ImageBytes struct {
	Size int64
	R    io.Reader
}

// ImageBytesID returns the identifier vLLM gives an image of img's bytes
// (see above) when the engine's model is modelID and its multimodal hash
// algorithm is algorithm. It reads img.R as a stream; fewer or more than
// img.Size bytes are an error.
func ImageBytesID(algorithm, modelID string, img ImageBytes) (string, error) {
	h, err := newMMHasher(algorithm)
	if err != nil {
		return "", err
	}
	if img.Size < 0 {
		return "", fmt.Errorf("kvindex: image of negative size %d", img.Size)
	}
	writeFramed(h, "image")
	h.Write([]byte{tagLeaf})
	writeFramed(h, "image")
	h.Write([]byte{tagLeaf})
	writeLength(h, uint64(img.Size))
	n, err := io.Copy(h, io.LimitReader(img.R, img.Size+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("kvindex: reading the image: %w", err)
	case n != img.Size:
		return "", fmt.Errorf("kvindex: image of %d bytes, not the %d announced", n, img.Size)
	}
	writeFramed(h, "model_id")
	h.Write([]byte{tagLeaf})
	writeFramed(h, modelID)
	return hex.EncodeToString(h.Sum(nil)), nil
}

// writeFramed writes s as vLLM's _framed does: its length, then it.
func writeFramed(w io.Writer, s string) {
	writeLength(w, uint64(len(s)))
	_, _ = io.WriteString(w, s) // a hash.Hash never fails a write
}

// writeLength writes n as 8 little-endian bytes.
func writeLength(w io.Writer, n uint64) {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], n)
	_, _ = w.Write(b[:])
}
