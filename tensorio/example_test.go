package tensorio_test

import (
	"bytes"
	"fmt"
	"log"
	"strings"

	"github.com/attnkit/attn/tensorio"
)

func ExampleWriteNPY() {
	x := &tensorio.Tensor{Shape: []int{2, 3}, Data: []float32{1, 2, 3, 4, 5, 6}}
	var buf bytes.Buffer
	if err := tensorio.WriteNPY(&buf, x); err != nil {
		log.Fatal(err)
	}
	b := buf.Bytes()
	// Magic and version 1.0, the header dict numpy writes, and 6 float32
	// values starting at byte 128.
	fmt.Printf("%q\n", b[:8])
	fmt.Println(strings.TrimSpace(string(b[10:128])))
	fmt.Println(len(b))
	// Output:
	// "\x93NUMPY\x01\x00"
	// {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
	// 152
}

func ExampleReadNPY() {
	// A float64 file, as numpy.save(f, numpy.array([0.5, 0.1])) writes it.
	var buf bytes.Buffer
	if err := tensorio.WriteNPYFloat64(&buf, &tensorio.Tensor{Shape: []int{2}, Data: []float32{0.5, 0.1}}); err != nil {
		log.Fatal(err)
	}
	x, err := tensorio.ReadNPY(&buf)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(x.Shape, x.DType, x.Data, x.Len())
	// Output:
	// [2] f64 [0.5 0.1] 2
}

func ExampleReadSafetensors() {
	var buf bytes.Buffer
	err := tensorio.WriteSafetensors(&buf, map[string]*tensorio.Tensor{
		"q": {Shape: []int{1, 2}, Data: []float32{1, 2}},
		"k": {Shape: []int{2}, Data: []float32{3, 4}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		log.Fatal(err)
	}
	tensors, meta, err := tensorio.ReadSafetensors(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(tensors["q"].Shape, tensors["q"].Data, tensors["k"].Data, meta["format"])
	// Output:
	// [1 2] [1 2] [3 4] pt
}
