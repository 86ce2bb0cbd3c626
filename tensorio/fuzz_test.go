package tensorio

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// checkTensor fails unless t is something a reader may return: a known
// dtype, no negative dimension, and exactly as many values as its shape.
func checkTensor(t *testing.T, name string, x *Tensor) {
	t.Helper()
	switch x.DType {
	case F32, F64, F16, BF16:
	default:
		t.Fatalf("%s: dtype %q", name, x.DType)
	}
	if err := x.check(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
}

// addFixtures seeds f with the numpy fixtures besides the committed corpus.
func addFixtures(f *testing.F, pattern string) {
	files, _ := filepath.Glob(filepath.Join("testdata", pattern))
	for _, file := range files {
		if b, err := os.ReadFile(file); err == nil {
			f.Add(b)
		}
	}
}

func FuzzReadNPY(f *testing.F) {
	addFixtures(f, "*.npy")
	f.Fuzz(func(t *testing.T, data []byte) {
		seekable, err := ReadNPY(bytes.NewReader(data))
		// The path for streams of unknown length must agree exactly.
		stream, serr := ReadNPY(streamOnly{bytes.NewReader(data)})
		if (err == nil) != (serr == nil) {
			t.Fatalf("seekable: %v; stream: %v", err, serr)
		}
		if err != nil {
			if err != io.EOF && !errors.Is(err, ErrFormat) {
				t.Fatalf("error without ErrFormat: %v", err)
			}
			return
		}
		checkTensor(t, "npy", seekable)
		if !slices.Equal(seekable.Shape, stream.Shape) || !sameBits(seekable.Data, stream.Data) {
			t.Fatal("seekable and stream reads differ")
		}
		// Whatever we read, we can write as float32 and read back unchanged.
		var buf bytes.Buffer
		if err := WriteNPY(&buf, seekable); err != nil {
			t.Fatalf("WriteNPY: %v", err)
		}
		back, err := ReadNPY(bytes.NewReader(buf.Bytes()))
		if err != nil || !slices.Equal(back.Shape, seekable.Shape) || !sameBits(back.Data, seekable.Data) {
			t.Fatalf("rewritten file reads back as %v, %v", back, err)
		}
	})
}

func FuzzReadSafetensors(f *testing.F) {
	f.Fuzz(func(t *testing.T, data []byte) {
		tensors, meta, err := ReadSafetensors(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrFormat) {
				t.Fatalf("error without ErrFormat: %v", err)
			}
			return
		}
		total := 0
		for name, x := range tensors {
			checkTensor(t, name, x)
			total += len(x.Data)
		}
		// The tensors tile the data section, so they cannot hold more
		// values than the file has bytes.
		if total > len(data) {
			t.Fatalf("%d values from %d bytes", total, len(data))
		}
		// Names and metadata came from valid utf-8 JSON, so the writer
		// accepts them, and the result reads back the same.
		var buf bytes.Buffer
		if err := WriteSafetensors(&buf, tensors, meta); err != nil {
			t.Fatalf("WriteSafetensors: %v", err)
		}
		back, backMeta, err := ReadSafetensors(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
		if err != nil || len(back) != len(tensors) || len(backMeta) != len(meta) {
			t.Fatalf("rewritten file reads back as %v, %v, %v", back, backMeta, err)
		}
		for name, x := range tensors {
			y := back[name]
			if y == nil || !slices.Equal(x.Shape, y.Shape) || !sameBits(x.Data, y.Data) {
				t.Fatalf("%q changed in the round trip", name)
			}
		}
		for k, v := range meta {
			if backMeta[k] != v {
				t.Fatalf("metadata %q changed in the round trip", k)
			}
		}
	})
}
