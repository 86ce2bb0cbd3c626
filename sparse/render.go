package sparse

import (
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"

	"github.com/attnkit/attn"
	"github.com/attnkit/attn/flash"
)

// maxDense bounds the pairs Dense and WritePNG visit.
const maxDense = 1 << 28

// Dense returns the pattern of n queries against m keys as a row-major
// n×m table, true where query i (at position m-n+i) sees key j, before
// the causal and padding masks. It asks the pattern the way the kernel
// does (KeyRanges for the row, then Visible inside ranges that are not
// Full), so it shows what the kernel computes, not only what Visible
// says. It allocates n·m bools: for tests and pictures of small sizes
// only; n·m above 2^28 is an error.
func Dense(pat flash.Pattern, n, m int) ([]bool, error) {
	if err := checkRender(pat, n, m); err != nil {
		return nil, err
	}
	mask := make([]bool, n*m)
	var rs []flash.Range
	for i := range n {
		p := m - n + i
		rs = pat.KeyRanges(rs[:0], p, p+1, m)
		row := mask[i*m : (i+1)*m]
		for _, r := range rs {
			for j := max(r.Lo, 0); j < min(r.Hi, m); j++ {
				row[j] = r.Full || pat.Visible(p, j)
			}
		}
	}
	return mask, nil
}

func checkRender(pat flash.Pattern, n, m int) error {
	switch {
	case pat == nil:
		return fmt.Errorf("%w: sparse: nil pattern", attn.ErrInput)
	case n < 0 || m < 0:
		return fmt.Errorf("%w: sparse: %d×%d pattern", attn.ErrShape, n, m)
	case m > 0 && n > maxDense/m:
		return fmt.Errorf("%w: sparse: %d×%d pattern is too large to render (more than 2^28 pairs)", attn.ErrShape, n, m)
	}
	return nil
}

// WritePNG writes the block layout of the pattern of n queries against m
// keys as a grayscale PNG: one pixel per cell×cell block of (query, key)
// pairs, white where the block has no visible pair, black where all are
// visible and gray in between by the fraction visible; queries run down,
// keys across. With cell equal to the kernel's tile (64), it is the map of
// the tiles the kernel runs. Like Dense it visits at most 2^28 pairs.
func WritePNG(w io.Writer, pat flash.Pattern, n, m, cell int) error {
	if err := checkRender(pat, n, m); err != nil {
		return err
	}
	if cell < 1 {
		return fmt.Errorf("%w: sparse: WritePNG cell = %d, want >= 1", attn.ErrInput, cell)
	}
	cols, rows := (m+cell-1)/cell, (n+cell-1)/cell
	if cols == 0 || rows == 0 {
		return fmt.Errorf("%w: sparse: WritePNG of an empty %d×%d pattern", attn.ErrShape, n, m)
	}
	count := make([]int, cols)
	img := image.NewGray(image.Rect(0, 0, cols, rows))
	var rs []flash.Range
	for y := range rows {
		clear(count)
		i0, i1 := y*cell, min((y+1)*cell, n)
		for i := i0; i < i1; i++ {
			p := m - n + i
			rs = pat.KeyRanges(rs[:0], p, p+1, m)
			for _, r := range rs {
				for j := max(r.Lo, 0); j < min(r.Hi, m); j++ {
					if r.Full || pat.Visible(p, j) {
						count[j/cell]++
					}
				}
			}
		}
		for x := range cols {
			pairs := (i1 - i0) * (min((x+1)*cell, m) - x*cell)
			img.SetGray(x, y, color.Gray{Y: uint8(255 - 255*count[x]/pairs)})
		}
	}
	return png.Encode(w, img)
}
