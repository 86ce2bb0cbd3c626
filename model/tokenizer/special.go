package tokenizer

import (
	"cmp"
	"slices"
	"strings"
)

// specials are the pieces matched in a text before it is encoded, as
// llama.cpp's tokenizer_st_partition matches them: user-defined pieces
// always, control and unknown pieces with parseSpecial.
type specials struct {
	list []special // longest first, then by id
	// trie finds which specials occur in a text in one pass, so that only
	// those cost a pass of their own.
	trie  []trieNode
	first [256]bool
}

type special struct {
	text string
	id   int32
	ctl  bool // control or unknown: matched only with parseSpecial
}

type trieNode struct {
	next map[byte]int32
	ends []int32 // indices into list of the specials ending here
}

func newSpecials(pieces []string, kinds []Kind) specials {
	var sp specials
	for i, p := range pieces {
		k := kinds[i]
		if p == "" || k != Control && k != Unknown && k != UserDefined {
			continue
		}
		sp.list = append(sp.list, special{text: p, id: int32(i), ctl: k != UserDefined})
	}
	slices.SortFunc(sp.list, func(a, b special) int {
		return cmp.Or(cmp.Compare(len(b.text), len(a.text)), cmp.Compare(a.id, b.id))
	})
	if len(sp.list) == 0 {
		return sp
	}
	sp.trie = []trieNode{{}}
	for i, s := range sp.list {
		sp.first[s.text[0]] = true
		n := int32(0)
		for j := range len(s.text) {
			c := s.text[j]
			nx, ok := sp.trie[n].next[c]
			if !ok {
				if sp.trie[n].next == nil {
					sp.trie[n].next = map[byte]int32{}
				}
				nx = int32(len(sp.trie))
				sp.trie[n].next[c] = nx
				sp.trie = append(sp.trie, trieNode{})
			}
			n = nx
		}
		sp.trie[n].ends = append(sp.trie[n].ends, int32(i))
	}
	return sp
}

// fragment is text[start:end], or the special piece id when id >= 0.
type fragment struct {
	start, end int
	id         int32
}

// partition splits text at the specials it holds: for each special,
// longest first, every leftmost non-overlapping occurrence in the text not
// yet taken becomes a fragment of its own (llama.cpp's order, so that the
// result is llama.cpp's where specials overlap).
func (sp *specials) partition(text string, parseSpecial bool) []fragment {
	if text == "" {
		return nil
	}
	frags := []fragment{{0, len(text), -1}}
	if len(sp.list) == 0 {
		return frags
	}
	var present []bool
	for i := 0; i < len(text); i++ {
		if !sp.first[text[i]] {
			continue
		}
		for n, j := int32(0), i; j < len(text); j++ {
			nx, ok := sp.trie[n].next[text[j]]
			if !ok {
				break
			}
			n = nx
			for _, k := range sp.trie[n].ends {
				if parseSpecial || !sp.list[k].ctl {
					if present == nil {
						present = make([]bool, len(sp.list))
					}
					present[k] = true
				}
			}
		}
	}
	for k, s := range sp.list {
		if present == nil || !present[k] {
			continue
		}
		var out []fragment
		for _, f := range frags {
			if f.id >= 0 {
				out = append(out, f)
				continue
			}
			a := f.start
			for {
				j := strings.Index(text[a:f.end], s.text)
				if j < 0 {
					break
				}
				if j > 0 {
					out = append(out, fragment{a, a + j, -1})
				}
				out = append(out, fragment{a + j, a + j + len(s.text), s.id})
				a += j + len(s.text)
			}
			if a < f.end {
				out = append(out, fragment{a, f.end, -1})
			}
		}
		frags = out
	}
	return frags
}
