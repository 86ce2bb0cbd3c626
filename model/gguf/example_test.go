package gguf_test

import (
	"bytes"
	"fmt"

	"github.com/attnkit/attn/model/gguf"
)

func Example() {
	var buf bytes.Buffer
	kv := []gguf.KV{{Key: "general.architecture", Value: "demo"}, {Key: "demo.sizes", Value: []uint32{2, 3}}}
	ts := []gguf.Tensor{{Name: "w", Dims: []uint64{3, 2}, Type: gguf.F16, Data: []float32{1, 2, 3, 4, 5, 6.001}}}
	if err := gguf.Write(&buf, kv, ts); err != nil {
		panic(err)
	}
	f, err := gguf.Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	if err != nil {
		panic(err)
	}
	arch, _ := f.String("general.architecture")
	w, _ := f.ReadTensor("w")
	fmt.Println(arch, f.Tensors[0].Type, f.Tensors[0].Dims, w)
	// Output:
	// demo F16 [3 2] [1 2 3 4 5 6]
}
