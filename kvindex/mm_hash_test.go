package kvindex

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
)

// TestImageBytesIDVectors: ImageBytesID reproduces, byte for byte, the
// identifiers testdata/mm_image_hash.py computes by re-stating vLLM's
// framed serialization (sha256 and sha512 from hashlib, blake3 from
// Debian's b3sum) for PNG, random and empty images, four model ids and
// the three algorithms.
func TestImageBytesIDVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/mm_image_hash.json")
	if err != nil {
		t.Fatal(err)
	}
	var vec struct {
		Cases []struct {
			Name, Algorithm, URL, ID string
			ModelID                  string `json:"model_id"`
		}
	}
	if err := json.Unmarshal(raw, &vec); err != nil {
		t.Fatal(err)
	}
	if len(vec.Cases) < 12 {
		t.Fatalf("%d vectors", len(vec.Cases))
	}
	for _, c := range vec.Cases {
		_, b64, _ := strings.Cut(c.URL, ",")
		data, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ImageBytesID(c.Algorithm, c.ModelID, ImageBytes{Size: int64(len(data)), R: bytes.NewReader(data)})
		if err != nil || got != c.ID {
			t.Errorf("%s, %s, %s: %s, %v; want %s", c.Name, c.ModelID, c.Algorithm, got, err, c.ID)
		}
	}
}

// TestImageBytesIDErrors: a size the reader does not keep to, and an
// algorithm vLLM does not offer, are errors; "" is blake3.
func TestImageBytesIDErrors(t *testing.T) {
	img := func(size int64, data string) ImageBytes { return ImageBytes{Size: size, R: strings.NewReader(data)} }
	for _, c := range []struct {
		name string
		size int64
		alg  string
	}{{"short", 5, ""}, {"long", 3, ""}, {"negative", -1, ""}, {"md5", 4, "md5"}} {
		if id, err := ImageBytesID(c.alg, "m", img(c.size, "abcd")); err == nil {
			t.Errorf("%s: %s, want an error", c.name, id)
		}
	}
	if err := ValidMMHashAlgorithm("md5"); !errors.Is(err, errMMHashAlgorithm) {
		t.Errorf("md5: %v", err)
	}
	def, err1 := ImageBytesID("", "m", img(4, "abcd"))
	b3, err2 := ImageBytesID(MMHashBlake3, "m", img(4, "abcd"))
	if err1 != nil || err2 != nil || def != b3 || len(def) != 64 {
		t.Errorf("default %s (%v), blake3 %s (%v)", def, err1, b3, err2)
	}
}

// BenchmarkImageBytesID hashes an 8 MiB image (max_body) as it decodes
// from base64, the gateway's work for an image prompt without a uuid.
func BenchmarkImageBytesID(b *testing.B) {
	data := bytes.Repeat([]byte{1, 2, 3, 250}, 2<<20)
	enc := base64.StdEncoding.EncodeToString(data)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		r := base64.NewDecoder(base64.StdEncoding, strings.NewReader(enc))
		if _, err := ImageBytesID("", "Qwen/Qwen2-VL-2B-Instruct", ImageBytes{Size: int64(len(data)), R: r}); err != nil {
			b.Fatal(err)
		}
	}
}
