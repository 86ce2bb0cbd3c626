package tensorio

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"
)

// maxSafetensorsHeader is the header limit of the reference implementation
// (huggingface/safetensors, MAX_HEADER_SIZE): files it refuses, we refuse.
const maxSafetensorsHeader = 100_000_000

// metadataKey is the reserved header key holding free-form string metadata.
const metadataKey = "__metadata__"

// safetensorsTypes maps the dtypes we read to element types. The format
// defines more (BOOL, U8, I8, I16, U16, I32, U32, I64, U64, F8_E5M2,
// F8_E4M3, ...); those are rejected by name.
var safetensorsTypes = map[string]*elemType{
	"F32":  &elemF32,
	"F64":  &elemF64,
	"F16":  &elemF16,
	"BF16": &elemBF16,
}

// stEntry is one tensor as the header describes it.
type stEntry struct {
	name       string
	et         *elemType
	shape      []int
	begin, end int64 // byte offsets into the data section
}

// ReadSafetensors reads a safetensors file of size bytes from r and returns
// its tensors by name, converted to float32, and its "__metadata__" map
// (nil if the file has none). Supported dtypes are F32, F64, F16 and BF16.
//
// The checks follow the reference implementation: a header of at most
// 100,000,000 bytes of valid utf-8 JSON; every tensor's data_offsets within
// the data section, end >= begin, and end-begin equal to the shape's element
// count times the element size; and the tensors, sorted by offset, covering
// the data section exactly, without gaps or overlaps. Duplicate names are
// rejected; unknown fields inside a tensor's entry are ignored, as the
// reference implementation does. All such errors wrap ErrFormat.
//
// size must be the true size of the data behind r (os.FileInfo.Size for a
// file): it bounds what is allocated, so a file cannot make ReadSafetensors
// allocate more than size bytes of header or a little over twice size of
// tensor data.
func ReadSafetensors(r io.ReaderAt, size int64) (map[string]*Tensor, map[string]string, error) {
	tensors, meta, err := readSafetensors(r, size)
	if err != nil {
		return nil, nil, fmt.Errorf("tensorio: safetensors: %w", err)
	}
	return tensors, meta, nil
}

// ReadSafetensorsFile reads the safetensors file at path, as
// ReadSafetensors does.
func ReadSafetensorsFile(path string) (map[string]*Tensor, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("tensorio: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("tensorio: %w", err)
	}
	tensors, meta, err := readSafetensors(f, fi.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("tensorio: safetensors %s: %w", path, err)
	}
	return tensors, meta, nil
}

func readSafetensors(r io.ReaderAt, size int64) (map[string]*Tensor, map[string]string, error) {
	var nbuf [8]byte
	if size < 8 {
		return nil, nil, fmt.Errorf("%w: %d bytes is too short for the header length: %w", ErrFormat, size, io.ErrUnexpectedEOF)
	}
	if err := readAt(r, nbuf[:], 0); err != nil {
		return nil, nil, readError("header length", err)
	}
	n := binary.LittleEndian.Uint64(nbuf[:])
	if n > maxSafetensorsHeader {
		return nil, nil, fmt.Errorf("%w: header length %d exceeds %d", ErrFormat, n, maxSafetensorsHeader)
	}
	if n > uint64(size-8) {
		return nil, nil, fmt.Errorf("%w: header length %d exceeds the %d bytes after it", ErrFormat, n, size-8)
	}
	hdr := make([]byte, n)
	if err := readAt(r, hdr, 8); err != nil {
		return nil, nil, readError("header", err)
	}
	entries, meta, err := parseSafetensorsHeader(hdr)
	if err != nil {
		return nil, nil, err
	}
	dataStart := 8 + int64(n)
	if err := checkLayout(entries, size-dataStart); err != nil {
		return nil, nil, err
	}

	tensors := make(map[string]*Tensor, len(entries))
	var buf []byte
	for _, e := range entries {
		t := &Tensor{Shape: e.shape, DType: e.et.dtype}
		// checkLayout made end-begin = elements·size <= size, so this
		// allocation is paid for by bytes the caller says exist.
		t.Data = make([]float32, (e.end-e.begin)/int64(e.et.size))
		step := ioChunk / e.et.size
		for i := 0; i < len(t.Data); i += step {
			k := min(step, len(t.Data)-i)
			buf = slices.Grow(buf[:0], k*e.et.size)[:k*e.et.size]
			off := dataStart + e.begin + int64(i*e.et.size)
			if err := readAt(r, buf, off); err != nil {
				return nil, nil, readError(fmt.Sprintf("data of %q", clipText(e.name)), err)
			}
			e.et.decode(t.Data[i:i+k], buf)
		}
		tensors[e.name] = t
	}
	return tensors, meta, nil
}

// readAt fills p from r at off. It exists because io.ReaderAt may return
// io.EOF along with a full read at the end of the data, which is success.
func readAt(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// parseSafetensorsHeader decodes the JSON header into tensor entries, sorted
// by name, and the metadata map. It walks the top-level object member by
// member (see jsonscan.go) because decoding into a Go map would silently
// keep the last of two entries with the same name. Errors quote at most
// the start of a name or value.
func parseSafetensorsHeader(hdr []byte) ([]stEntry, map[string]string, error) {
	if !utf8.Valid(hdr) {
		return nil, nil, fmt.Errorf("%w: header is not valid utf-8", ErrFormat)
	}
	if !json.Valid(hdr) {
		// Unmarshal into a RawMessage validates again, to say where,
		// before it would copy anything.
		err := json.Unmarshal(hdr, new(json.RawMessage))
		if err != nil && strings.Contains(err.Error(), "after top-level value") {
			err = errors.New("unexpected data after the JSON object")
		}
		return nil, nil, fmt.Errorf("%w: header: %w", ErrFormat, err)
	}
	// Every entry takes at least minEntry bytes and names data_offsets:
	// counting the name bounds the entries, so that they are allocated
	// once, at most a header's worth.
	const minEntry = len(`"":{"dtype":"F32","shape":[],"data_offsets":[0,0]}`)
	n := min(bytes.Count(hdr, []byte(`"data_offsets"`)), len(hdr)/minEntry+1)
	entries := make([]stEntry, 0, n)
	var meta map[string]string
	hasMeta := false
	err := members(hdr, func(name string, raw []byte) error {
		if name == metadataKey {
			if hasMeta {
				return fmt.Errorf("duplicate key %q", name)
			}
			hasMeta = true
			var err error
			meta, err = parseMetadata(raw)
			return err
		}
		e, err := parseEntry(name, raw)
		if err != nil {
			return err
		}
		entries = append(entries, e)
		return nil
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w: header: %w", ErrFormat, err)
	}
	// Sorted, two entries of one name are neighbours: no set of names
	// needed.
	slices.SortFunc(entries, func(a, b stEntry) int { return strings.Compare(a.name, b.name) })
	for i := 1; i < len(entries); i++ {
		if entries[i].name == entries[i-1].name {
			return nil, nil, fmt.Errorf("%w: header: duplicate key %q", ErrFormat, clipText(entries[i].name))
		}
	}
	return entries, meta, nil
}

func parseMetadata(raw []byte) (map[string]string, error) {
	if string(raw) == "null" {
		return nil, nil // the reference reader treats null as absent
	}
	meta := map[string]string{}
	err := members(raw, func(k string, v []byte) error {
		if _, dup := meta[k]; dup {
			return fmt.Errorf("duplicate metadata key %q", clipText(k))
		}
		s, err := unquote(v)
		if err != nil {
			return fmt.Errorf("metadata %q: value is not a string", clipText(k))
		}
		meta[k] = s
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", metadataKey, err)
	}
	return meta, nil
}

// parseEntry decodes one tensor's {"dtype", "shape", "data_offsets"}
// object. Field names match exactly (encoding/json alone would also accept
// "DTYPE"), each at most once; null is as absent; a shape has at most
// maxSafetensorsDims dimensions.
func parseEntry(name string, raw []byte) (stEntry, error) {
	var (
		dtype, shape, offsets []byte
		known                 [3]bool
		others                map[string]bool // made for the rare entry with unknown fields
	)
	qname := clipText(name)
	err := members(raw, func(k string, v []byte) error {
		var dup bool
		switch k {
		case "dtype":
			dup, known[0] = known[0], true
		case "shape":
			dup, known[1] = known[1], true
		case "data_offsets":
			dup, known[2] = known[2], true
		default:
			if others == nil {
				others = map[string]bool{}
			}
			dup, others[k] = others[k], true
		}
		if dup {
			return fmt.Errorf("duplicate field %q", clipText(k))
		}
		if string(v) == "null" {
			return nil
		}
		switch k {
		case "dtype":
			dtype = v
		case "shape":
			shape = v
		case "data_offsets":
			offsets = v
		}
		return nil // unknown fields are ignored, as the reference does
	})
	if err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: %w", qname, err)
	}
	switch {
	case dtype == nil:
		return stEntry{}, fmt.Errorf("tensor %q: missing dtype", qname)
	case shape == nil:
		return stEntry{}, fmt.Errorf("tensor %q: missing shape", qname)
	case offsets == nil:
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets must be [begin, end], not missing", qname)
	}
	dt, err := unquote(dtype)
	if err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: dtype is not a string", qname)
	}
	et, ok := safetensorsTypes[dt]
	if !ok {
		return stEntry{}, fmt.Errorf("tensor %q: unsupported dtype %q (want F32, F64, F16 or BF16)", qname, clipText(dt))
	}
	dims, err := uintArray(shape, maxSafetensorsDims, math.MaxInt64)
	if err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: shape: %w", qname, err)
	}
	off, err := uintArray(offsets, 2, math.MaxInt64)
	if err == nil && len(off) != 2 {
		err = fmt.Errorf("%d offsets", len(off))
	}
	if err != nil {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets must be [begin, end]: %w", qname, err)
	}
	sdims := make([]int64, len(dims))
	for i, d := range dims {
		sdims[i] = int64(d)
	}
	n, ok := numElems(sdims)
	if !ok {
		return stEntry{}, fmt.Errorf("tensor %q: shape %v has too many elements", qname, sdims)
	}
	begin, end := int64(off[0]), int64(off[1])
	if end < begin {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] are not an increasing pair of offsets", qname, begin, end)
	}
	if want := int64(n) * int64(et.size); end-begin != want {
		return stEntry{}, fmt.Errorf("tensor %q: data_offsets [%d, %d] span %d bytes, shape %v of %s needs %d",
			qname, begin, end, end-begin, sdims, dt, want)
	}
	sh := make([]int, len(dims))
	for i, d := range dims {
		sh[i] = int(d) // numElems checked d <= maxElems
	}
	return stEntry{name: name, et: et, shape: sh, begin: begin, end: end}, nil
}

// checkLayout sorts the entries by offset (stably) and checks that they
// tile the data section [0, dataLen) exactly: no tensor outside it, no
// overlap, no gap, no trailing bytes. This is the reference
// implementation's rule; it also guarantees that the total allocated is
// bounded by the file size.
func checkLayout(entries []stEntry, dataLen int64) error {
	byOffset := entries
	slices.SortStableFunc(byOffset, func(a, b stEntry) int {
		return cmp.Or(cmp.Compare(a.begin, b.begin), cmp.Compare(a.end, b.end))
	})
	var pos int64
	prev := ""
	for _, e := range byOffset {
		switch {
		case e.end > dataLen:
			return fmt.Errorf("%w: tensor %q: data_offsets [%d, %d] exceed the %d-byte data section",
				ErrFormat, clipText(e.name), e.begin, e.end, dataLen)
		case e.begin < pos:
			return fmt.Errorf("%w: tensor %q at [%d, %d] overlaps tensor %q", ErrFormat, clipText(e.name), e.begin, e.end, clipText(prev))
		case e.begin > pos:
			return fmt.Errorf("%w: %d unused bytes before tensor %q at offset %d", ErrFormat, e.begin-pos, clipText(e.name), e.begin)
		}
		pos, prev = e.end, e.name
	}
	if pos != dataLen {
		return fmt.Errorf("%w: %d bytes after the last tensor's data", ErrFormat, dataLen-pos)
	}
	return nil
}

// WriteSafetensors writes tensors as a safetensors file with dtype F32 (the
// DType fields are ignored), laid out as the reference implementation lays
// out float32 tensors: names sorted, data in that order, "__metadata__" first
// in the header and omitted when meta is empty, the header padded with
// spaces to a multiple of 8 bytes so the data is aligned.
func WriteSafetensors(w io.Writer, tensors map[string]*Tensor, meta map[string]string) error {
	pre, names, err := safetensorsPreamble(tensors, meta)
	if err != nil {
		return fmt.Errorf("tensorio: safetensors: %w", err)
	}
	if _, err := w.Write(pre); err != nil {
		return fmt.Errorf("tensorio: safetensors: %w", err)
	}
	for _, name := range names {
		if err := writeFloats(w, tensors[name].Data, false); err != nil {
			return fmt.Errorf("tensorio: safetensors: %w", err)
		}
	}
	return nil
}

// WriteSafetensorsFile writes tensors to a new file at path (truncating any
// old one) as WriteSafetensors does.
func WriteSafetensorsFile(path string, tensors map[string]*Tensor, meta map[string]string) error {
	if _, _, err := safetensorsPreamble(tensors, meta); err != nil {
		return fmt.Errorf("tensorio: safetensors %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("tensorio: %w", err)
	}
	bw := bufio.NewWriter(f)
	err = WriteSafetensors(bw, tensors, meta)
	if err == nil {
		err = bw.Flush()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tensorio: safetensors %s: %w", path, err)
	}
	return nil
}

// safetensorsPreamble checks the tensors and returns the header length and
// padded header, and the tensor names in data order.
func safetensorsPreamble(tensors map[string]*Tensor, meta map[string]string) ([]byte, []string, error) {
	names := make([]string, 0, len(tensors))
	for name, t := range tensors {
		if err := t.check(); err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		if name == metadataKey {
			return nil, nil, fmt.Errorf("%w: %q is reserved and cannot name a tensor", ErrInvalidTensor, name)
		}
		names = append(names, name)
	}
	sort.Strings(names)

	var h strings.Builder
	h.WriteByte('{')
	if len(meta) > 0 {
		keys := make([]string, 0, len(meta))
		for k := range meta {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		h.WriteString(`"` + metadataKey + `":{`)
		for i, k := range keys {
			if i > 0 {
				h.WriteByte(',')
			}
			ks, err := jsonString(k)
			if err != nil {
				return nil, nil, err
			}
			vs, err := jsonString(meta[k])
			if err != nil {
				return nil, nil, err
			}
			h.WriteString(ks + ":" + vs)
		}
		h.WriteByte('}')
		if len(names) > 0 {
			h.WriteByte(',')
		}
	}
	var off int64
	for i, name := range names {
		if i > 0 {
			h.WriteByte(',')
		}
		ns, err := jsonString(name)
		if err != nil {
			return nil, nil, err
		}
		t := tensors[name]
		end := off + 4*int64(len(t.Data))
		dims := make([]string, len(t.Shape))
		for j, d := range t.Shape {
			dims[j] = fmt.Sprint(d)
		}
		fmt.Fprintf(&h, `%s:{"dtype":"F32","shape":[%s],"data_offsets":[%d,%d]}`, ns, strings.Join(dims, ","), off, end)
		off = end
	}
	h.WriteByte('}')
	// Pad so the data, which follows the 8-byte length and the header,
	// starts 8-byte aligned.
	if r := h.Len() % 8; r != 0 {
		h.WriteString(strings.Repeat(" ", 8-r))
	}
	if h.Len() > maxSafetensorsHeader {
		return nil, nil, fmt.Errorf("%w: header of %d bytes exceeds %d", ErrInvalidTensor, h.Len(), maxSafetensorsHeader)
	}
	pre := binary.LittleEndian.AppendUint64(make([]byte, 0, 8+h.Len()), uint64(h.Len()))
	return append(pre, h.String()...), names, nil
}

// jsonString quotes s as a JSON string. It refuses invalid utf-8, which
// encoding/json would silently replace with U+FFFD, changing the name.
func jsonString(s string) (string, error) {
	if !utf8.ValidString(s) {
		return "", fmt.Errorf("%w: name or metadata %q is not valid utf-8", ErrInvalidTensor, s)
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return r < 0x20 || r > 0x7e || r == '"' || r == '\\' }) {
		return `"` + s + `"`, nil // plain ASCII, the usual case, needs no escapes
	}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // keep <, > and & as they are, like serde_json
	_ = enc.Encode(s)        // encoding a string cannot fail
	return strings.TrimSuffix(b.String(), "\n"), nil
}
