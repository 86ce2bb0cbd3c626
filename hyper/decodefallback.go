package hyper

import (
	"fmt"

	"github.com/attnkit/attn"
)

// Fallback says when a decode step is exact attention rather than the
// decode rule: a query that sees s.M positions (its own included) attends
// to all of them exactly below Min, and whenever its recent block holds
// every position it sees.
func (d *Decoder) Fallback(s attn.Shape, o attn.Options) string {
	if s.M <= 0 || d.older(s.M) > 0 {
		return ""
	}
	if d.a.min > 0 && s.M < d.a.min {
		return fmt.Sprintf("M = %d positions < min = %d: the decoder attended exactly", s.M, d.a.min)
	}
	return fmt.Sprintf("M = %d positions fit the recent block of %d: the decoder attended exactly", s.M, d.window)
}

var _ attn.Fallbacker = (*Decoder)(nil)
