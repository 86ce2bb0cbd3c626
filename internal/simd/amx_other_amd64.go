//go:build amd64 && !linux && !purego

package simd

import "errors"

// amxPermission reports that the amx family is not offered outside
// Linux: the ways other systems enable the tile state are untested here.
func amxPermission() error {
	return errors.New("the amx kernels are enabled on Linux only")
}
