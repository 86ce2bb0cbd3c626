package tokenizer

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"

	"github.com/attnkit/attn"
)

// maxPieceLen bounds one piece of a tokenizer.bin; real ones are under 64
// bytes.
const maxPieceLen = 1 << 16

// MaxVocab bounds the vocabulary size the readers accept.
const MaxVocab = 1 << 24

// ReadLlama2C reads llama2.c's tokenizer.bin with vocab pieces (the
// vocabulary size is in the checkpoint, not in this file). Its pieces
// hold spaces where SentencePiece has "▁"; they are turned back into "▁".
// By llama2.c's convention piece 0 is unknown, 1 is BOS and 2 is EOS;
// pieces of the form <0xXX> are byte pieces. Bytes after the last piece
// are an error.
func ReadLlama2C(r io.Reader, vocab int) (*Tokenizer, error) {
	if vocab <= 0 || vocab > MaxVocab {
		return nil, fmt.Errorf("%w: vocabulary size %d outside [1, %d]", ErrFormat, vocab, MaxVocab)
	}
	br := bufio.NewReader(r)
	var maxLen int32
	if err := binary.Read(br, binary.LittleEndian, &maxLen); err != nil {
		return nil, fmt.Errorf("%w: tokenizer.bin header: %v", ErrFormat, eof(err))
	}
	if maxLen < 0 || maxLen > maxPieceLen {
		return nil, fmt.Errorf("%w: tokenizer.bin longest piece %d bytes, want 0 to %d", ErrFormat, maxLen, maxPieceLen)
	}
	var pieces []string
	var scores []float32
	var hdr [8]byte
	for i := range vocab {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return nil, fmt.Errorf("%w: tokenizer.bin piece %d of %d: %v", ErrFormat, i, vocab, eof(err))
		}
		score := math.Float32frombits(binary.LittleEndian.Uint32(hdr[:]))
		n := int32(binary.LittleEndian.Uint32(hdr[4:]))
		if n < 0 || n > maxLen {
			return nil, fmt.Errorf("%w: tokenizer.bin piece %d has length %d, want 0 to %d (the file's longest)", ErrFormat, i, n, maxLen)
		}
		b := make([]byte, n)
		if _, err := io.ReadFull(br, b); err != nil {
			return nil, fmt.Errorf("%w: tokenizer.bin piece %d of %d: %v", ErrFormat, i, vocab, eof(err))
		}
		if math.IsNaN(float64(score)) {
			return nil, fmt.Errorf("%w: tokenizer.bin piece %d has score NaN", ErrFormat, i)
		}
		pieces = append(pieces, string(b))
		scores = append(scores, score)
	}
	if _, err := br.ReadByte(); err == nil {
		return nil, fmt.Errorf("%w: tokenizer.bin has bytes after its %d pieces (wrong vocabulary size?)", ErrFormat, vocab)
	}
	kinds := make([]Kind, vocab)
	for i, p := range pieces {
		switch {
		case i == 0:
			kinds[i] = Unknown
		case i == 1 || i == 2:
			kinds[i] = Control
		default:
			if _, ok := parseByte(p); ok {
				kinds[i] = Byte
			} else {
				kinds[i] = Normal
				pieces[i] = strings.ReplaceAll(p, " ", Space)
			}
		}
	}
	t, err := New(pieces, scores, kinds)
	if err != nil {
		return nil, err
	}
	t.Unknown = 0
	t.BOS, t.EOS = -1, -1
	if vocab > 1 {
		t.BOS = 1
	}
	if vocab > 2 {
		t.EOS = 2
	}
	return t, nil
}

func eof(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

// WriteLlama2C writes t as llama2.c's tokenizer.bin: "▁" in pieces becomes
// a space, and BOS and EOS are written as llama2.c's export writes them,
// "\n<s>\n" and "\n</s>\n". A byte-level BPE tokenizer is an error
// wrapping attn.ErrUnsupported.
func (t *Tokenizer) WriteLlama2C(w io.Writer) error {
	if t.bpe != nil {
		return fmt.Errorf("%w: tokenizer.bin holds SentencePiece vocabularies, not byte-level BPE (write a GGUF file)", attn.ErrUnsupported)
	}
	out := make([][]byte, len(t.pieces))
	maxLen := 0
	for i, p := range t.pieces {
		switch {
		case i == t.BOS:
			p = "\n<s>\n"
		case i == t.EOS:
			p = "\n</s>\n"
		case t.kinds[i] != Byte:
			p = strings.ReplaceAll(p, Space, " ")
		}
		out[i] = []byte(p)
		maxLen = max(maxLen, len(p))
	}
	if maxLen > maxPieceLen {
		return fmt.Errorf("%w: a piece of %d bytes is longer than tokenizer.bin allows (%d)", ErrFormat, maxLen, maxPieceLen)
	}
	bw := bufio.NewWriter(w)
	var b [8]byte
	binary.LittleEndian.PutUint32(b[:], uint32(maxLen))
	bw.Write(b[:4])
	for i, p := range out {
		binary.LittleEndian.PutUint32(b[:], math.Float32bits(t.scores[i]))
		binary.LittleEndian.PutUint32(b[4:], uint32(len(p)))
		bw.Write(b[:])
		bw.Write(p)
	}
	return bw.Flush()
}
