package tensorio

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

const (
	npyMagic = "\x93NUMPY"

	// maxNPYHeader bounds the header we read (and write, so every file
	// WriteNPY makes can be read back). numpy itself refuses headers over
	// 10000 bytes by default; a 32-dimensional shape needs about 300.
	maxNPYHeader = 1 << 20

	// npyAlign is numpy's ARRAY_ALIGN: data starts at a multiple of it.
	npyAlign = 64

	// npyGrowthDigits is numpy's GROWTH_AXIS_MAX_DIGITS (numpy >= 1.23):
	// spare spaces it leaves after the dict so the first dimension can grow
	// in place. Matching it makes WriteNPY's output byte-identical.
	npyGrowthDigits = 21

	// ioChunk is how many bytes are read or written at a time. Reading in
	// chunks is what keeps a header that claims 2^40 elements from
	// allocating more than the data actually present.
	ioChunk = 1 << 16
)

// npyTypes maps the descr strings we accept to element types. numpy writes
// '<' for little-endian multi-byte types; '|' (no byte order) only appears
// with one-byte types, so it never applies to floats and is rejected.
var npyTypes = map[string]elemType{
	"<f4": elemF32,
	"<f8": elemF64,
	"<f2": elemF16,
}

// ReadNPY reads one array in NumPy .npy format (versions 1.0, 2.0 and 3.0)
// with dtype '<f4', '<f8' or '<f2' in C order. The values are converted to
// float32 and Tensor.DType records the stored type.
//
// ReadNPY consumes exactly the array's bytes and leaves whatever follows
// unread, so several arrays saved one after another to the same stream (as
// repeated numpy.save calls on one file object do) can be read by repeated
// calls. On a stream that is already at its end it returns io.EOF itself.
//
// If r is also an io.Seeker, ReadNPY uses it to learn how many bytes
// remain, allocating the whole tensor at once and failing early on a file
// shorter than its header claims; it seeks back before reading. Otherwise
// it grows the tensor as data arrives, so memory use never exceeds a small
// multiple of the bytes actually read.
func ReadNPY(r io.Reader) (*Tensor, error) {
	avail := int64(-1)
	if s, ok := r.(io.Seeker); ok {
		var err error
		if avail, err = remaining(s); err != nil {
			return nil, fmt.Errorf("tensorio: npy: %w", err)
		}
	}
	t, _, err := readNPY(r, avail)
	if err == io.EOF {
		return nil, io.EOF
	}
	if err != nil {
		return nil, fmt.Errorf("tensorio: npy: %w", err)
	}
	return t, nil
}

// ReadNPYFile reads the .npy file at path, as ReadNPY does. Unlike ReadNPY
// it rejects an empty file and, for a regular file, bytes after the array,
// with ErrFormat: a file is meant to hold exactly one array, and anything
// else is more likely a corrupt or mislabelled file than a deliberate
// stream. A path that is not a regular file (a pipe, /dev/stdin) is read as
// a stream, which stops after the first array.
func ReadNPYFile(path string) (*Tensor, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("tensorio: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("tensorio: %w", err)
	}
	// A pipe or device reports size 0; read it as a stream of unknown
	// length.
	size := int64(-1)
	if fi.Mode().IsRegular() {
		size = fi.Size()
	}
	t, used, err := readNPY(f, size)
	switch {
	case err == io.EOF:
		err = fmt.Errorf("%w: empty file: %w", ErrFormat, io.ErrUnexpectedEOF)
	case err == nil && size >= 0 && used != size:
		err = fmt.Errorf("%w: %d bytes after the array data", ErrFormat, size-used)
	}
	if err != nil {
		return nil, fmt.Errorf("tensorio: npy %s: %w", path, err)
	}
	return t, nil
}

// remaining returns the bytes from the current offset of s to its end, or
// -1 if s cannot seek (a pipe behind an *os.File, say).
func remaining(s io.Seeker) (int64, error) {
	cur, err := s.Seek(0, io.SeekCurrent)
	if err != nil {
		return -1, nil
	}
	end, err := s.Seek(0, io.SeekEnd)
	if err != nil {
		return -1, nil
	}
	if _, err := s.Seek(cur, io.SeekStart); err != nil {
		// We moved the stream and cannot move it back: reading on would
		// return the wrong bytes.
		return 0, fmt.Errorf("seeking back after measuring the stream: %w", err)
	}
	return max(end-cur, 0), nil
}

// readNPY reads one array from r. avail is the number of bytes r holds, or
// -1 if unknown. It returns the bytes consumed, and io.EOF unwrapped if r
// held nothing at all. Errors carry no "tensorio:" prefix; callers add it.
func readNPY(r io.Reader, avail int64) (*Tensor, int64, error) {
	var pre [12]byte
	if _, err := io.ReadFull(r, pre[:8]); err != nil {
		if err == io.EOF {
			return nil, 0, io.EOF
		}
		return nil, 0, readError("magic", err)
	}
	if string(pre[:6]) != npyMagic {
		return nil, 0, fmt.Errorf("%w: not a .npy file (magic %q)", ErrFormat, pre[:6])
	}
	major, minor := pre[6], pre[7]
	var hlen, preLen int
	switch {
	case major == 1 && minor == 0:
		preLen = 10
		if _, err := io.ReadFull(r, pre[8:preLen]); err != nil {
			return nil, 0, readError("header length", err)
		}
		hlen = int(binary.LittleEndian.Uint16(pre[8:]))
	case (major == 2 || major == 3) && minor == 0:
		preLen = 12
		if _, err := io.ReadFull(r, pre[8:preLen]); err != nil {
			return nil, 0, readError("header length", err)
		}
		h := binary.LittleEndian.Uint32(pre[8:])
		if h > maxNPYHeader {
			return nil, 0, fmt.Errorf("%w: header length %d exceeds %d", ErrFormat, h, maxNPYHeader)
		}
		hlen = int(h)
	default:
		return nil, 0, fmt.Errorf("%w: unsupported format version %d.%d", ErrFormat, major, minor)
	}
	hdr := make([]byte, hlen)
	if _, err := io.ReadFull(r, hdr); err != nil {
		return nil, 0, readError("header", err)
	}
	// Version 3.0 headers are utf-8; 1.0 and 2.0 are latin-1, where every
	// byte is valid.
	if major == 3 && !utf8.Valid(hdr) {
		return nil, 0, fmt.Errorf("%w: version 3.0 header is not valid utf-8", ErrFormat)
	}
	et, shape, err := parseNPYHeader(string(hdr), major < 3)
	if err != nil {
		return nil, 0, err
	}
	used := int64(preLen + hlen)
	if avail >= 0 {
		avail -= used
	}
	data, err := readData(r, shape, et, avail)
	if err != nil {
		return nil, 0, err
	}
	used += int64(len(data)) * int64(et.size)
	return &Tensor{Shape: shape, Data: data, DType: et.dtype}, used, nil
}

// readError classifies a failed read: running out of bytes means the file
// is truncated (ErrFormat and io.ErrUnexpectedEOF); anything else is the
// reader's own failure and is passed on as is.
func readError(what string, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("%w: truncated %s: %w", ErrFormat, what, io.ErrUnexpectedEOF)
	}
	return fmt.Errorf("reading %s: %w", what, err)
}

// clipValue is a header value as an error message shows it: at most its
// start.
func clipValue(v any) string { return clipText(fmt.Sprint(v)) }

// parseNPYHeader checks the header dict and returns the element type and
// shape it declares.
func parseNPYHeader(hdr string, longInts bool) (elemType, []int, error) {
	d, err := parsePyDict(hdr, longInts)
	if err != nil {
		return elemType{}, nil, err
	}
	// numpy writes exactly these three keys and itself rejects any other
	// set, so an extra key means a file we might misread.
	var extra []string
	for k := range d {
		if k != "descr" && k != "fortran_order" && k != "shape" {
			extra = append(extra, k)
		}
	}
	if len(extra) > 0 {
		sort.Strings(extra)
		return elemType{}, nil, fmt.Errorf("%w: unexpected header key %q", ErrFormat, clipText(extra[0]))
	}
	for _, k := range []string{"descr", "fortran_order", "shape"} {
		if _, ok := d[k]; !ok {
			return elemType{}, nil, fmt.Errorf("%w: header lacks %q", ErrFormat, k)
		}
	}

	descr, ok := d["descr"].(string)
	if !ok {
		return elemType{}, nil, fmt.Errorf("%w: descr %s is not a dtype string (structured dtypes are not supported)", ErrFormat, clipValue(d["descr"]))
	}
	et, ok := npyTypes[descr]
	if !ok {
		return elemType{}, nil, fmt.Errorf("%w: unsupported dtype %q (want '<f4', '<f8' or '<f2')", ErrFormat, clipText(descr))
	}

	switch fo := d["fortran_order"].(type) {
	case bool:
		if fo {
			return elemType{}, nil, fmt.Errorf("%w: fortran_order is True; only C-order arrays are supported (save numpy.ascontiguousarray(a))", ErrFormat)
		}
	default:
		return elemType{}, nil, fmt.Errorf("%w: fortran_order %s is not a bool", ErrFormat, clipValue(fo))
	}

	tup, ok := d["shape"].(pyTuple)
	if !ok {
		return elemType{}, nil, fmt.Errorf("%w: shape %s is not a tuple", ErrFormat, clipValue(d["shape"]))
	}
	dims := make([]int64, len(tup))
	for i, v := range tup {
		n, ok := v.(int64)
		if !ok {
			return elemType{}, nil, fmt.Errorf("%w: shape element %s is not an integer", ErrFormat, clipValue(v))
		}
		dims[i] = n
	}
	if _, ok := numElems(dims); !ok {
		return elemType{}, nil, fmt.Errorf("%w: shape %s has a negative dimension or too many elements", ErrFormat, clipValue(dims))
	}
	shape := make([]int, len(dims))
	for i, n := range dims {
		shape[i] = int(n) // numElems checked n <= maxElems
	}
	return et, shape, nil
}

// readData reads the elements of a tensor of the given shape. If avail is
// known, the whole tensor is allocated at once after checking the bytes are
// there; if not, memory grows with the bytes read, never ahead of them by
// more than one chunk.
func readData(r io.Reader, shape []int, et elemType, avail int64) ([]float32, error) {
	n := (&Tensor{Shape: shape}).Len()
	need := int64(n) * int64(et.size) // n <= maxElems, so no overflow
	capacity := min(n, ioChunk)
	if avail >= 0 {
		if avail < need {
			return nil, fmt.Errorf("%w: truncated data: shape %s needs %d bytes, %d remain: %w",
				ErrFormat, clipValue(shape), need, avail, io.ErrUnexpectedEOF)
		}
		capacity = n
	}
	data := make([]float32, 0, capacity)
	buf := make([]byte, min(need, ioChunk))
	for len(data) < n {
		k := min(n-len(data), len(buf)/et.size)
		b := buf[:k*et.size]
		if _, err := io.ReadFull(r, b); err != nil {
			return nil, readError("data", err)
		}
		data = slices.Grow(data, k)
		et.decode(data[len(data):len(data)+k], b)
		data = data[:len(data)+k]
	}
	return data, nil
}

// WriteNPY writes t as a NumPy .npy file with dtype '<f4' in C order,
// byte for byte as numpy.save (NumPy >= 1.23) writes the same array: format
// 1.0 (2.0 if the header does not fit in 65535 bytes), the header padded
// with spaces and a final '\n' so the data starts at a multiple of 64.
func WriteNPY(w io.Writer, t *Tensor) error {
	return writeNPY(w, t, "<f4")
}

// WriteNPYFloat64 is WriteNPY with dtype '<f8'. Every float32 widens to
// float64 exactly, so ReadNPY returns the same values.
func WriteNPYFloat64(w io.Writer, t *Tensor) error {
	return writeNPY(w, t, "<f8")
}

// WriteNPYFile writes t to a new file at path (truncating any old one) as
// WriteNPY does.
func WriteNPYFile(path string, t *Tensor) error {
	if err := t.check(); err != nil {
		return fmt.Errorf("tensorio: npy %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("tensorio: %w", err)
	}
	bw := bufio.NewWriter(f)
	err = WriteNPY(bw, t)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tensorio: npy %s: %w", path, err)
	}
	return nil
}

func writeNPY(w io.Writer, t *Tensor, descr string) error {
	if err := t.check(); err != nil {
		return fmt.Errorf("tensorio: npy: %w", err)
	}
	pre, err := npyPreamble(descr, t.Shape)
	if err != nil {
		return fmt.Errorf("tensorio: npy: %w", err)
	}
	if _, err := w.Write(pre); err != nil {
		return fmt.Errorf("tensorio: npy: %w", err)
	}
	if err := writeFloats(w, t.Data, descr == "<f8"); err != nil {
		return fmt.Errorf("tensorio: npy: %w", err)
	}
	return nil
}

// npyPreamble returns magic, version, header length and header, laid out
// as numpy's _write_array_header does: the dict with keys sorted, spare
// spaces for the first dimension to grow, then spaces and '\n' up to a
// multiple of npyAlign. numpy always pads with at least one space, so a
// header that would end exactly on the boundary gets 64 more bytes.
func npyPreamble(descr string, shape []int) ([]byte, error) {
	var h strings.Builder
	h.WriteString("{'descr': '" + descr + "', 'fortran_order': False, 'shape': ")
	h.WriteString(pyShape(shape))
	h.WriteString(", }")
	if len(shape) > 0 {
		h.WriteString(strings.Repeat(" ", npyGrowthDigits-len(strconv.Itoa(shape[0]))))
	}
	dict := h.String()

	for _, v := range []struct {
		major  byte
		preLen int
		max    int
	}{{1, 10, math.MaxUint16}, {2, 12, maxNPYHeader}} {
		hlen := len(dict) + 1 // the final '\n'
		pad := npyAlign - (v.preLen+hlen)%npyAlign
		if hlen+pad > v.max {
			continue
		}
		b := make([]byte, 0, v.preLen+hlen+pad)
		b = append(b, npyMagic...)
		b = append(b, v.major, 0)
		if v.major == 1 {
			b = binary.LittleEndian.AppendUint16(b, uint16(hlen+pad))
		} else {
			b = binary.LittleEndian.AppendUint32(b, uint32(hlen+pad))
		}
		b = append(b, dict...)
		b = append(b, strings.Repeat(" ", pad)...)
		return append(b, '\n'), nil
	}
	return nil, fmt.Errorf("%w: %d dimensions make the header longer than %d bytes", ErrInvalidTensor, len(shape), maxNPYHeader)
}

// pyShape formats shape as Python's repr of a tuple: (), (5,), (2, 3).
func pyShape(shape []int) string {
	parts := make([]string, len(shape))
	for i, d := range shape {
		parts[i] = strconv.Itoa(d)
	}
	if len(shape) == 1 {
		return "(" + parts[0] + ",)"
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// writeFloats writes data little-endian as float32 or float64, a chunk at a
// time so the copy stays small.
func writeFloats(w io.Writer, data []float32, f64 bool) error {
	size := 4
	if f64 {
		size = 8
	}
	buf := make([]byte, 0, min(len(data)*size, ioChunk))
	for len(data) > 0 {
		k := min(len(data), cap(buf)/size)
		buf = buf[:0]
		for _, v := range data[:k] {
			if f64 {
				buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(float64(v)))
			} else {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
			}
		}
		if _, err := w.Write(buf); err != nil {
			return err
		}
		data = data[k:]
	}
	return nil
}
