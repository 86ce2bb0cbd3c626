package model

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"

	"github.com/attnkit/attn"
)

// llama2cHeader is the size of run.c's Config: seven int32.
const llama2cHeader = 7 * 4

// llama2cMagic starts llama2.c's newer export formats ("ak42"), which
// run.c does not read.
const llama2cMagic = 0x616b3432

// ReadLlama2C reads a checkpoint in the format of llama2.c's run.c: a
// header of seven int32 (dim, hidden_dim, n_layers, n_heads, n_kv_heads,
// vocab_size, seq_len; a negative vocab_size means the output layer is
// stored after the other weights, not shared with the embedding), then the
// float32 weights: embedding, attention norms, wq, wk, wv, wo, MLP norms,
// w1, w2, w3 (each for all layers), the final norm, two rotary tables of
// seq_len·head_size/2 values (skipped: they are recomputed), and the
// output layer when not shared. The file's size must be exactly what the
// header describes. The rotary base is 10000 and RMSNorm's epsilon 1e-5,
// as in run.c.
func ReadLlama2C(r io.ReaderAt, size int64) (*Weights, error) {
	var hdr [llama2cHeader]byte
	if size < llama2cHeader {
		return nil, fmt.Errorf("%w: llama2.c checkpoint of %d bytes, shorter than its %d-byte header", ErrFormat, size, llama2cHeader)
	}
	if _, err := r.ReadAt(hdr[:], 0); err != nil {
		return nil, fmt.Errorf("%w: llama2.c header: %v", ErrFormat, err)
	}
	var h [7]int32
	for i := range h {
		h[i] = int32(binary.LittleEndian.Uint32(hdr[4*i:]))
	}
	if uint32(h[0]) == llama2cMagic {
		return nil, fmt.Errorf("%w: llama2.c export format \"ak42\" (version %d); run.c reads the legacy format (export --version 0)", attn.ErrUnsupported, h[1])
	}
	c := Config{
		Dim: int(h[0]), Hidden: int(h[1]), Layers: int(h[2]), Heads: int(h[3]), KVHeads: int(h[4]),
		Vocab: int(h[5]), SeqLen: int(h[6]), RopeBase: 10000, NormEps: 1e-5, TiedOutput: h[5] > 0,
	}
	if c.Vocab < 0 {
		c.Vocab = -c.Vocab
	}
	if c.KVHeads <= 0 || c.SeqLen <= 0 {
		return nil, fmt.Errorf("%w: llama2.c header n_kv_heads = %d, seq_len = %d, want > 0", ErrFormat, c.KVHeads, c.SeqLen)
	}
	if c.SeqLen > maxWidth {
		return nil, fmt.Errorf("%w: llama2.c header seq_len = %d is too large", ErrFormat, c.SeqLen)
	}
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("llama2.c header %v: %w", h, err)
	}
	w := &Weights{Config: c, Layers: make([]Layer, c.Layers)}
	plan := llama2cPlan(w)
	var need int64 = llama2cHeader
	for _, p := range plan {
		need += 4 * int64(p.n)
	}
	if size != need {
		return nil, fmt.Errorf("%w: llama2.c checkpoint has %d bytes; its header %v needs %d (wrong file, or not the legacy format?)", ErrFormat, size, h, need)
	}
	off := int64(llama2cHeader)
	buf := make([]byte, 1<<20)
	for _, p := range plan {
		for _, dst := range p.dst {
			if dst == nil {
				off += 4 * int64(p.n/max(len(p.dst), 1))
				continue
			}
			*dst = make([]float32, p.n/len(p.dst))
			if err := readFloats(r, off, *dst, buf); err != nil {
				return nil, err
			}
			off += 4 * int64(len(*dst))
		}
	}
	if err := w.Validate(); err != nil {
		return nil, err
	}
	return w, nil
}

// llama2cRun is a run of float32 in a llama2.c checkpoint: n values split
// evenly over dst (one slice per layer, or one), nil entries skipped.
type llama2cRun struct {
	n   int
	dst []*[]float32
}

// llama2cPlan lists the runs of a checkpoint in file order.
func llama2cPlan(w *Weights) []llama2cRun {
	c := w.Config.WithDefaults()
	perLayer := func(f func(L *Layer) *[]float32, n int) llama2cRun {
		r := llama2cRun{n: n * c.Layers}
		for l := range w.Layers {
			r.dst = append(r.dst, f(&w.Layers[l]))
		}
		return r
	}
	kv, hd := c.KVDim(), c.HeadDim()
	runs := []llama2cRun{
		{c.Vocab * c.Dim, []*[]float32{&w.Embed}},
		perLayer(func(L *Layer) *[]float32 { return &L.AttnNorm }, c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.Wq }, c.Dim*c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.Wk }, kv*c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.Wv }, kv*c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.Wo }, c.Dim*c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.MLPNorm }, c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.W1 }, c.Hidden*c.Dim),
		perLayer(func(L *Layer) *[]float32 { return &L.W2 }, c.Dim*c.Hidden),
		perLayer(func(L *Layer) *[]float32 { return &L.W3 }, c.Hidden*c.Dim),
		{c.Dim, []*[]float32{&w.Norm}},
		{c.SeqLen * hd, []*[]float32{nil}}, // freq_cis_real and _imag
	}
	if !c.TiedOutput {
		runs = append(runs, llama2cRun{c.Vocab * c.Dim, []*[]float32{&w.Output}})
	}
	return runs
}

// readFloats reads len(dst) little-endian float32 at off through buf.
func readFloats(r io.ReaderAt, off int64, dst []float32, buf []byte) error {
	for i := 0; i < len(dst); {
		n := min(len(dst)-i, len(buf)/4)
		b := buf[:4*n]
		if _, err := r.ReadAt(b, off+4*int64(i)); err != nil {
			return fmt.Errorf("%w: reading weights at byte %d: %v", ErrFormat, off+4*int64(i), err)
		}
		for j := range n {
			dst[i+j] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*j:]))
		}
		i += n
	}
	return nil
}

// WriteLlama2C writes w in run.c's checkpoint format (see ReadLlama2C),
// with the rotary tables llama2.c's legacy export writes. The format fixes
// the rotary base at 10000 and RMSNorm's epsilon at 1e-5 and needs a
// SeqLen; weights with other values are an error wrapping
// attn.ErrUnsupported.
func WriteLlama2C(out io.Writer, w *Weights) error {
	if err := w.Validate(); err != nil {
		return err
	}
	c := w.Config.WithDefaults()
	if c.RopeBase != 10000 || c.NormEps != 1e-5 || c.SeqLen == 0 {
		return fmt.Errorf("%w: llama2.c checkpoints fix RopeBase = 10000 and NormEps = 1e-5 and need a SeqLen; have %v, %v, %d",
			attn.ErrUnsupported, c.RopeBase, c.NormEps, c.SeqLen)
	}
	bw := bufio.NewWriterSize(out, 1<<20)
	vocab := int32(c.Vocab)
	if !c.TiedOutput {
		vocab = -vocab
	}
	for _, v := range []int32{int32(c.Dim), int32(c.Hidden), int32(c.Layers), int32(c.Heads), int32(c.KVHeads), vocab, int32(c.SeqLen)} {
		binary.Write(bw, binary.LittleEndian, v)
	}
	var b [4]byte
	put := func(xs []float32) {
		for _, x := range xs {
			binary.LittleEndian.PutUint32(b[:], math.Float32bits(x))
			bw.Write(b[:])
		}
	}
	hd := c.HeadDim()
	for _, p := range llama2cPlan(w) {
		if p.dst[0] == nil {
			// freqs_cos then freqs_sin, [seq_len][head_size/2] each.
			cos, sin := ropeTable(0, c.SeqLen, hd, c.RopeBase)
			put(cos)
			put(sin)
			continue
		}
		for _, d := range p.dst {
			put(*d)
		}
	}
	return bw.Flush()
}
